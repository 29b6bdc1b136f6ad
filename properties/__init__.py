"""The attnverify property suite, installed as ``attnverify.properties``.

``test_properties.py`` is the suite itself: one pytest test per (target, property). In this
repository ``pytest properties`` collects it; in an installed attnverify the pytest plugin
(:mod:`attnverify.pytest_plugin`) appends its path to pytest's arguments when
``--attnverify-target`` is given. ``pyproject.toml`` maps this folder into the package
(``[tool.setuptools] package-dir``).

The two names that both the plugin and the suite need live here, so that neither imports the
other at module level.
"""

from __future__ import annotations

from pathlib import Path

#: The suite module's file, as pytest is given it.
SUITE = Path(__file__).with_name("test_properties.py")

#: Key of the per-test result record in a test report's ``user_properties``.
RESULT_KEY = "attnverify_result"
#: ... of the attention suite's (``attnverify/attention/suite.py``).
ATTENTION_RESULT_KEY = "attnverify_attention_result"

#: Why a planned ``target::property`` has no result when a pytest session writes its
#: certificate (the suites' certificates list it ``not_checked``).
NOT_RUN = ("were not run in this pytest session (deselected, or the session stopped before "
           "them: -x, Ctrl-C, an error)")


def option(config, name: str):
    """The value of ``--attnverify-<name>`` (``_`` in ``name`` read as ``-``)."""
    return config.getoption(f"--attnverify-{name.replace('_', '-')}")
