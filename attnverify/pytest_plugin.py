"""pytest plugin (entry point ``pytest11``): the property suite against a user's normalizer.

    pytest --attnverify-target=mypkg.norms:my_softmax --attnverify-json=cert.json

runs every universal property and every claim of the target as one test each, with ids
``<target>::<property>`` (the same ids as ``--xfails`` files), and writes the JSON certificate of
docs/INTERFACES.md. Settings come from options or environment variables (``ATTNVERIFY_TARGET``,
``ATTNVERIFY_PROFILE``, ...). Without a target the suite in ``properties/`` checks every
built-in. The suite module is ``properties/test_properties.py`` in the repository, installed as
``attnverify.properties.test_properties``. Works under pytest-xdist: results travel to the
controller, which writes the file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import pytest

import attnverify
from attnverify.atomic import check_output_paths
from attnverify.errors import UsageError, interrupt_signal, terminating_as_interrupt
from attnverify.runconfig import DEFAULT_PROFILE, PROFILE_NAMES, register_profiles


def _source_properties() -> None:
    """Make ``attnverify.properties`` importable when ``attnverify`` itself was imported from a
    source checkout (``python -m pytest`` in the repository puts the checkout's ``attnverify/``
    ahead of the installed package): the suite then lives in the checkout's ``properties/``,
    which only the install maps into the package (``pyproject.toml``, package-dir)."""

    folder = Path(attnverify.__file__).resolve().parent.parent / "properties"
    spec = importlib.util.spec_from_file_location(
        "attnverify.properties", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None or not (folder / "__init__.py").is_file():
        raise ImportError(f"attnverify.properties: no suite in {folder}; reinstall attnverify")
    module = importlib.util.module_from_spec(spec)
    sys.modules["attnverify.properties"] = module
    spec.loader.exec_module(module)


try:
    import attnverify.properties  # noqa: F401 - installed (or mapped by an editable install)
except ModuleNotFoundError:
    _source_properties()

from attnverify.properties import (  # noqa: E402, F401 - re-exported
    ATTENTION_RESULT_KEY,  # noqa: E402
    RESULT_KEY,
    SUITE,
    option,
)

_OPTIONS = [
    ("target", "ATTNVERIFY_TARGET", "normalizer(s) under test, comma-separated: built-in id, "
     "module:attr or file.py:attr (default: every built-in)"),
    ("claims", "ATTNVERIFY_CLAIMS", "claims replacing the target's own, comma-separated"),
    ("params", "ATTNVERIFY_PARAMS", "normalizer parameters k=v,k=v"),
    ("profile", "ATTNVERIFY_PROFILE", f"{' | '.join(PROFILE_NAMES)} (default {DEFAULT_PROFILE})"),
    ("seed", "ATTNVERIFY_SEED", "search seed (default 0)"),
    ("max-examples", "ATTNVERIFY_MAX_EXAMPLES", "examples Hypothesis draws per property, "
     "after the fixed battery of edge cases, which this does not bound (as certify "
     "--max-examples)"),
    ("timeout", "ATTNVERIFY_TIMEOUT", "per-example time limit in seconds of the worker process "
     "each target runs in (default per profile)"),
    ("dtypes", "ATTNVERIFY_DTYPES", "default float32,float64"),
    ("device", "ATTNVERIFY_DEVICE", "cpu | cuda"),
    ("json", "ATTNVERIFY_JSON", "write the JSON certificate here"),
    ("markdown", "ATTNVERIFY_MARKDOWN", "write a Markdown certificate here"),
    ("xfails", "ATTNVERIFY_XFAILS", "file of TARGET::PROPERTY patterns expected to fail "
     "(attnverify.xfails: strict; * ? [] allowed)"),
    ("reference", "ATTNVERIFY_REFERENCE", "compare every target with this normalizer (a target "
     "string), evaluated in float64: adds the claim matches_reference"),
    ("shard", "ATTNVERIFY_SHARD", "run shard K/N of the units (as certify --shard) and "
     "write a partial certificate for 'attnverify merge'"),
    ("attention", "ATTNVERIFY_ATTENTION", "attention kernel(s) with SDPA's signature, "
     "comma-separated: built-in id, module:attr or file.py:attr (attnverify.attention.suite)"),
]


def pytest_addoption(parser):
    group = parser.getgroup("attnverify", "attnverify property suite")
    for name, env, help_text in _OPTIONS:
        group.addoption(f"--attnverify-{name}", default=os.environ.get(env),
                        help=f"{help_text} [env {env}]")


def pytest_configure(config):
    config.addinivalue_line("markers", "attnverify: a property of the attnverify suite")
    config._attnverify_results = []
    register_profiles()  # the profiles, as Hypothesis profiles attnverify-dev, -ci, -thorough
    target = option(config, "target")
    if target:
        _validate(config, target)
        # A target given on the command line brings the suite with it, wherever pytest runs.
        if not _suite_in_args(config):
            config.args.append(str(SUITE))
    if option(config, "attention"):  # the attention suite (attnverify/attention/suite.py)
        from attnverify.attention.suite import SUITE as ATTENTION_SUITE  # dispatch: see below
        from attnverify.attention.suite import validate  # dispatch: a test module, collected

        validate(config)
        if str(ATTENTION_SUITE) not in map(str, config.args):
            config.args.append(str(ATTENTION_SUITE))
    _STOPPED_BY.clear()
    config._attnverify_signals = contextlib.ExitStack()
    if (target or option(config, "attention")) and not hasattr(config, "workerinput") and (
            option(config, "json") or option(config, "markdown")):
        # SIGTERM and SIGHUP (a cancelled CI job) end the session as Ctrl-C does, so that the
        # certificate of what ran is written (what did not run is not_checked); where the caller
        # ignores or handles them itself, nothing changes
        config._attnverify_signals.enter_context(terminating_as_interrupt())


@pytest.hookimpl(tryfirst=True)
def pytest_keyboard_interrupt(excinfo):
    """Which signal stopped the session (Ctrl-C, or SIGTERM/SIGHUP above), for the
    certificate's ``interrupted``: noted before pytest's own reporter, which can itself fail on
    the interrupt's traceback (then pytest ends with exit status 1, not 2)."""
    if isinstance(excinfo.value, KeyboardInterrupt):
        _STOPPED_BY.append(interrupt_signal(excinfo.value))


def pytest_unconfigure(config):
    stack = getattr(config, "_attnverify_signals", None)
    if stack is not None:
        stack.close()


def _validate(config, target: str) -> None:
    """Bad targets, parameters or claims stop pytest with a one-line usage error (exit 4). The
    targets load in worker processes (the suite's own loading, cached for this process)."""
    # torch-free: loaded in every pytest run
    from attnverify.properties.test_properties import _key, _load

    try:
        _load(_key(config))

        check_output_paths({"--attnverify-json": option(config, "json"),
                            "--attnverify-markdown": option(config, "markdown")})
    except UsageError as exc:
        raise pytest.UsageError(f"attnverify: {exc}") from None


def _suite_in_args(config) -> bool:
    for arg in config.args:
        path = Path(str(arg).split("::")[0]).resolve()
        if path == SUITE.resolve() or path.name == "properties" or "properties" in path.parts:
            return True
    return False


def _suite_ids() -> dict[Path, str]:
    """The suites the plugin brings, each with the path its test ids start with when pytest
    runs outside the tree that holds it (``attnverify/properties/test_properties.py::…``)."""
    attention = Path(attnverify.__file__).resolve().parent / "attention" / "suite.py"
    return {SUITE.resolve(): "attnverify/properties/test_properties.py",
            attention: "attnverify/attention/suite.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    """A suite the plugin added from outside pytest's root directory gets a node id that names
    it: pytest would otherwise give a path it was handed alone the empty id, and every test id
    would start with ``::`` (``::test_property[mypkg.mynorms:fn::finite]``)."""
    path = Path(module_path).resolve()
    name = _suite_ids().get(path)
    if name is None:
        return None
    try:
        path.relative_to(parent.config.rootpath)
        return None  # inside the root: pytest's own id (properties/test_properties.py::…)
    except ValueError:
        return pytest.Module.from_parent(parent, path=Path(module_path), nodeid=name)


#: Per-test result records, gathered on the controller (or the only process when serial).
_COLLECTED: list = []
#: ... of the attention suite.
_ATTENTION: list = []
#: The signal that stopped the session, where one did (:func:`pytest_keyboard_interrupt`).
_STOPPED_BY: list = []


def pytest_runtest_logreport(report):
    for key, value in getattr(report, "user_properties", []):
        if key == RESULT_KEY and report.when == "call":
            _COLLECTED.append(json.loads(value))
        elif key == ATTENTION_RESULT_KEY and report.when == "call":
            _ATTENTION.append(json.loads(value))


def pytest_sessionfinish(session, exitstatus):
    """The certificate, written once by the controller (or the only process when serial) from
    the records every test's report carried: the normalizer suite's when a target is given,
    else the attention suite's."""
    config = session.config
    if hasattr(config, "workerinput"):
        return  # xdist worker: the controller writes the certificate
    json_path, md_path = option(config, "json"), option(config, "markdown")
    records = _COLLECTED if option(config, "target") else _ATTENTION
    if not (json_path or md_path) or not records:
        return
    from attnverify import remote, report  # torch-free: loaded in every pytest run

    remote.shutdown()  # no process of the code under test outlives the run's results
    if records is _COLLECTED:
        # torch-free: loaded in every pytest run
        from attnverify.properties.test_properties import certificate_from_records
    else:
        # dispatch: the attention suite, collected only when --attnverify-attention is given
        from attnverify.attention.suite import certificate_from_records
    data = certificate_from_records(config, records)
    # stopped by a signal (what did not run is not_checked); exit status 2 is
    # pytest.ExitCode.INTERRUPTED
    stop = _STOPPED_BY[-1] if _STOPPED_BY else signal.SIGINT if exitstatus == 2 else None
    if stop is not None:
        data["interrupted"] = signal.Signals(stop).name
    if json_path:
        report.write_json(json_path, data)
    if md_path:
        report.write_atomic(md_path, report.markdown(data))
