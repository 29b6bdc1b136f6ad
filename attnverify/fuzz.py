"""Long campaigns on HypoFuzz: certify's searches as plain Hypothesis tests for ``hypothesis fuzz``.

``certify`` gives each property a fixed budget (the profile's examples, under a fixed seed).
HypoFuzz (``hypothesis fuzz``, the ``fuzz`` extra) runs Hypothesis tests for as long as it is let
run, on as many processes as it is given, spreading its time over the tests by how fast each
still finds new behaviour, and keeps what it finds in an example database. This module turns one
target into such tests: one per unit of ``certify``'s work (target × property × dtype), each
exactly the search ``certify`` runs (:func:`attnverify.certify.search_test`: the same strategy
``prop.cases(spec, ctx)``, the same check, the target behind the same process boundary,
:func:`attnverify.remote.open_normalizer`), filed in the database under the key ``certify`` uses
(:func:`attnverify.certify.database_key_of`). ``attnverify certify TARGET --database DB`` then
replays everything the campaign found before its own search, and fails on it.

``properties/test_fuzz.py`` (installed as ``attnverify.properties.test_fuzz``) is the module
pytest and HypoFuzz collect; it holds :func:`entry_tests`. HypoFuzz passes everything after
``--`` to pytest and its worker processes collect again on their own, so the configuration is
read from the environment (:data:`ENV`); without :data:`TARGET_ENV` the module holds one test,
skipped with the reason, so the default ``pytest`` run does no work there.

HypoFuzz files a test's entries under the digest of its function and pytest node id, whatever
the test asks for; :class:`UnitKeys` maps that digest, wherever it starts a key, to the unit's own
key (and back for the change events HypoFuzz's workers and dashboard listen to), so a campaign
and ``certify`` share entries whatever directory the campaign was started from.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import hypothesis
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.internal.reflection import function_digest

from attnverify import campaign, remote
from attnverify.certify import (
    WorkerStopped,
    _State,
    database_key_of,
    fix_reference,
    fix_temperature,
    plan,
    search_test,
    unit_contexts,
)
from attnverify.errors import UsageError, WorkerFailed
from attnverify.exampledb import database_key, open_database
from attnverify.expr import parse_inequality
from attnverify.falsify import make_search
from attnverify.falsify_search import Budget, _Crossed, merit, stratum_cases
from attnverify.isolation import close
from attnverify.quantities import QUANTITIES
from attnverify.registry import parse_params
from attnverify.runconfig import hypothesis_settings, make_context
from attnverify.serialize import dtype_name

TARGET_ENV = "ATTNVERIFY_FUZZ_TARGET"
DATABASE_ENV = "ATTNVERIFY_FUZZ_DATABASE"
EXPRESSION_ENV = "ATTNVERIFY_FUZZ_EXPRESSION"
#: Every variable the entry reads, with what it means (``--`` options of ``certify``).
ENV = {
    TARGET_ENV: "the target (as certify's TARGET: built-in id, module:attr, file.py:attr; several "
                "comma-separated)",
    DATABASE_ENV: "the example database (a directory or redis://HOST:PORT/DB) the campaign fills "
                  "and certify --database replays",
    "ATTNVERIFY_FUZZ_PARAMS": "as --params k=v,k=v",
    "ATTNVERIFY_FUZZ_CLAIMS": "as --claims (comma-separated; '' = none)",
    "ATTNVERIFY_FUZZ_DTYPES": "as --dtypes (default float32,float64)",
    "ATTNVERIFY_FUZZ_DEVICE": "as --device (default cpu)",
    "ATTNVERIFY_FUZZ_REFERENCE": "as --reference REF",
    "ATTNVERIFY_FUZZ_PROPERTIES": "only these property ids (comma-separated; default: every "
                                  "property certify runs on the target)",
    EXPRESSION_ENV: "falsify's inequality (as falsify TARGET EXPR): fuzz falsify's strata for "
                    "it instead of certify's properties",
    "ATTNVERIFY_FUZZ_MAX_LENGTH": "with an inequality: as falsify --max-length",
}
#: Also read, as certify reads them: ATTNVERIFY_PROFILE (the strategies' longest row) and
#: ATTNVERIFY_ISOLATION.
SKIP_REASON = (f"no target to fuzz: set {TARGET_ENV} and {DATABASE_ENV} "
               "(README, 'Long campaigns on HypoFuzz')")


def _env(name: str, environ) -> str | None:
    value = environ.get(name)
    return value if value is None else value.strip()


def _named(name: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with a usage error naming the variable ``name``."""
    try:
        return fn(*args, **kwargs)
    except UsageError as exc:
        raise UsageError(f"{name}: {exc}") from None


# --------------------------------------------------------------------------------------------
# Keys


class UnitKeys(ExampleDatabase):
    """``database`` seen through the keys of the units (:func:`add`): a key that starts with the
    digest Hypothesis or HypoFuzz gives a unit's test (:func:`hypothesis.internal.reflection.
    function_digest` of its function, which HypoFuzz salts with the pytest node id) starts with
    the unit's key instead; every other key passes unchanged. Change events of ``database`` come
    back with the digest, so HypoFuzz's workers and dashboard see their own keys."""

    def __init__(self, database: ExampleDatabase) -> None:
        super().__init__()
        self.database = database
        self.units: list[tuple[Any, bytes]] = []
        self._digests: dict[int, tuple[Any, bytes]] = {}

    def __repr__(self) -> str:
        return f"UnitKeys({self.database!r}, {len(self.units)} units)"

    def add(self, test, key: bytes) -> None:
        """File ``test``'s entries (a ``@given`` test) under ``key``."""
        self.units.append((test, key))

    def _pairs(self) -> list[tuple[bytes, bytes]]:
        pairs = []
        for test, key in self.units:
            inner = test.hypothesis.inner_test
            salt = getattr(inner, "_hypothesis_internal_add_digest", None)
            known = self._digests.get(id(inner))
            if known is None or known[0] != salt:  # HypoFuzz salts it at collection
                known = (salt, function_digest(inner))
                self._digests[id(inner)] = known
            pairs.append((known[1], key))
        return pairs

    def _mapped(self, key: bytes, back: bool = False) -> bytes:
        for digest, unit in self._pairs():
            old, new = (unit, digest) if back else (digest, unit)
            if key.startswith(old):
                return new + key[len(old):]
        return key

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.database.fetch(self._mapped(key))

    def save(self, key: bytes, value: bytes) -> None:
        self.database.save(self._mapped(key), value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.database.delete(self._mapped(key), value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.database.move(self._mapped(src), self._mapped(dest), value)

    def _listened(self) -> ExampleDatabase | None:
        # the database that tells changes: the backend of a ResilientDatabase (none once lost)
        return getattr(self.database, "backend", self.database)

    def _start_listening(self) -> None:
        source = self._listened()
        if source is not None:
            self._source = source
            source.add_listener(self._on_change)

    def _stop_listening(self) -> None:
        source = getattr(self, "_source", None)
        if source is not None:
            source.remove_listener(self._on_change)
            self._source = None

    def _on_change(self, event) -> None:
        kind, (key, value) = event
        self._broadcast_change((kind, (self._mapped(key, back=True), value)))


# --------------------------------------------------------------------------------------------
# certify's units as tests


def units(prop, spec, ctx) -> list:
    """The contexts of ``prop``'s units as ``certify`` runs them: one per dtype its cases take
    where the run is split by dtype (``Context.unit_dtype``), else the run's context."""

    return [unit_ctx for _, unit_ctx in unit_contexts(prop, spec, ctx)]


def unit_name(prop, ctx) -> str:
    """The test's name: ``test_<property>__<dtypes>``."""

    unit = getattr(ctx, "unit_dtype", None)
    dtypes = (unit,) if unit is not None else ctx.dtypes
    return f"test_{prop.id}__{'_'.join(dtype_name(d) for d in dtypes)}"


class _Uncounted:
    """No coverage record: a campaign runs for hours, and certify reports coverage, not this."""

    def add(self, case) -> None:
        pass


def certify_test(prop, spec, ctx, database: UnitKeys, *, label: str = ""):
    """The ``@given`` test of one unit: :func:`attnverify.certify.search_test` (the body and
    strategy certify runs) under the profile's settings with ``database`` (no seed: a campaign
    draws afresh), filed under :func:`attnverify.certify.database_key_of`. A worker that fails
    is a :class:`WorkerStopped` failure; a property that does not apply is skipped with its
    reason."""
    import pytest  # optional dependency (test extra)

    state = _State()
    state.coverage = _Uncounted()
    reason = prop.applies(spec, ctx)
    examples = max(1, int(round(ctx.max_examples * prop.examples_scale)))
    conf = hypothesis.settings(
        hypothesis_settings(ctx, examples), database=database,
        verbosity=hypothesis.Verbosity.normal,
        # HypoFuzz leaves out a test that suppresses nested_given (the profile suppresses all)
        suppress_health_check=[h for h in hypothesis.HealthCheck
                               if h is not hypothesis.HealthCheck.nested_given],
        phases=[hypothesis.Phase.reuse, hypothesis.Phase.generate, hypothesis.Phase.target,
                hypothesis.Phase.shrink])
    test = search_test(prop, spec, ctx, state, fuzz=True)
    key = database_key_of(prop, spec, ctx)
    test.hypothesis.inner_test._hypothesis_internal_add_digest = key  # distinct before HypoFuzz
    test._hypothesis_internal_database_key = key  # plain pytest: Hypothesis uses it as is
    test = conf(test)
    test.__name__ = test.__qualname__ = unit_name(prop, ctx)
    test.__doc__ = f"{label or spec.id}: {prop.id} ({prop.statement})"
    database.add(test, key)
    if reason:
        test = pytest.mark.skip(reason=f"{prop.id} does not apply: {reason}")(test)
    return test


def certify_tests(environ=None) -> dict[str, Any]:
    """``{name: test}`` for every unit of every target of the environment (:data:`ENV`), the
    targets loaded in workers (:func:`attnverify.remote.open_normalizer`) to plan, then closed
    (each test reopens its target on first use, in whatever process runs it)."""
    environ = os.environ if environ is None else environ
    cfg = _config(environ)

    params = _named("ATTNVERIFY_FUZZ_PARAMS", parse_params, cfg["params"])
    ctx = _context(cfg)
    _threads(ctx)
    ctx = _named("ATTNVERIFY_FUZZ_PARAMS", fix_temperature, ctx, params)
    ctx = _named("ATTNVERIFY_FUZZ_REFERENCE", fix_reference, ctx, cfg["reference"])
    database = UnitKeys(_named(DATABASE_ENV, _open, cfg["database"]))
    _load_profile(ctx, database)
    tests: dict[str, Any] = {}
    try:
        for target in cfg["targets"]:
            try:
                spec = remote.open_normalizer(target, params, ctx)
            except (WorkerFailed, remote.TargetRaised) as exc:
                what = getattr(exc, "reason", None) or f"raised {exc.remote_type}: {exc}"
                raise UsageError(f"{TARGET_ENV}: loading {target!r} {what}") from None
            spec, props = _named("ATTNVERIFY_FUZZ_CLAIMS", plan, spec, cfg["claims"], ctx)
            props = _chosen(props, cfg["properties"])
            close(spec)
            for prop in props:
                for uctx in units(prop, spec, ctx):
                    test = certify_test(prop, spec, uctx, database, label=target)
                    name = test.__name__ if len(cfg["targets"]) == 1 else \
                        f"{test.__name__}__{_ident(target)}"
                    tests[name] = test
    finally:
        remote.shutdown()  # the worker is closed; a test restarts it where it runs
    return tests


def _chosen(props: list, wanted: list[str] | None) -> list:
    if wanted is None:
        return props
    ids = [p.id for p in props]
    unknown = [w for w in wanted if w not in ids]
    if unknown:
        raise UsageError(f"ATTNVERIFY_FUZZ_PROPERTIES: {unknown[0]!r} is not among the "
                         f"properties certify runs on this target ({', '.join(ids)})")
    return [p for p in props if p.id in wanted]


def _ident(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _config(environ) -> dict[str, Any]:
    target = _env(TARGET_ENV, environ)
    if not target:
        raise UsageError(f"{TARGET_ENV} is not set")
    database = _env(DATABASE_ENV, environ)
    if not database:
        raise UsageError(f"{DATABASE_ENV} is not set: give the directory or redis://HOST:PORT/DB "
                         "that the campaign fills and certify --database replays")
    claims = environ.get("ATTNVERIFY_FUZZ_CLAIMS")
    props = _env("ATTNVERIFY_FUZZ_PROPERTIES", environ)
    return {
        "targets": [t.strip() for t in target.split(",") if t.strip()],
        "database": database,
        "params": _env("ATTNVERIFY_FUZZ_PARAMS", environ),
        "claims": None if claims is None else [c.strip() for c in claims.split(",")
                                               if c.strip()],
        "dtypes": _env("ATTNVERIFY_FUZZ_DTYPES", environ) or None,
        "device": _env("ATTNVERIFY_FUZZ_DEVICE", environ) or "cpu",
        "reference": _env("ATTNVERIFY_FUZZ_REFERENCE", environ) or None,
        "properties": None if not props else [p.strip() for p in props.split(",") if p.strip()],
    }


def _context(cfg):
    return make_context(dtypes=cfg["dtypes"], device=cfg["device"])


def _open(text: str):
    return open_database(text, option=DATABASE_ENV)


def _load_profile(ctx, database: UnitKeys) -> None:
    """Make ``database`` Hypothesis's default: HypoFuzz fuzzes only tests whose database is the
    default one, and its workers and dashboard open the default."""

    hypothesis.settings.register_profile(
        "attnverify-fuzz", hypothesis.settings(hypothesis_settings(ctx), database=database))
    hypothesis.settings.load_profile("attnverify-fuzz")


def _threads(ctx) -> None:
    """One intra-op thread for the checks while the target runs in its worker (see
    :func:`attnverify.certify.checker_threads`; a campaign's process does nothing else)."""
    if getattr(ctx, "isolation", True):
        torch.set_num_threads(1)


def entry_tests(environ=None) -> dict[str, Any]:
    """The tests of ``properties/test_fuzz.py``: the units of the environment's target
    (:func:`certify_tests`), the strata of falsify's search when :data:`EXPRESSION_ENV` names an
    inequality (:func:`falsify_tests`), or one test skipped with :data:`SKIP_REASON` when no
    target is set.
    A usage error (a bad variable, a target that does not load) is a collection error naming
    the variable."""
    import pytest  # optional dependency (test extra)

    environ = os.environ if environ is None else environ
    if not _env(TARGET_ENV, environ):
        @pytest.mark.skip(reason=SKIP_REASON)
        @given(st.none())
        def test_fuzz_entry(_):
            """Placeholder: the entry fuzzes nothing until a target is given."""

        return {"test_fuzz_entry": test_fuzz_entry}
    try:
        tests = falsify_tests(environ) if _env(EXPRESSION_ENV, environ) else \
            certify_tests(environ)
    except UsageError as exc:
        raise pytest.UsageError(f"attnverify fuzz: {exc}") from None
    return tests


# --------------------------------------------------------------------------------------------
# falsify's strata as tests


class Falsified(AssertionError):
    """The inequality failed on this case (falsify's witness)."""


def strata_key(label: str, normalized: str, params: dict[str, Any], stratum) -> bytes:
    """The key under which ``falsify TARGET EXPR --database`` keeps a stratum's Hypothesis corpus
    (:func:`attnverify.falsify_search.run_hypothesis`): the target as given, the normalized
    inequality, the parameters as given and the stratum's name."""

    bound = "|".join([label, normalized, ",".join(f"{k}={v}" for k, v in sorted(params.items()))])
    return database_key("strata", f"{bound}|{stratum.name}")


def falsify_test(search, record, database: UnitKeys, *, label: str, witness_key: bytes):
    """The ``@given`` test of one stratum of falsify's search: falsify's strategy
    (:func:`attnverify.falsify_search.stratum_cases`) and evaluation (``search.evaluate``,
    unlimited), the merit as an unlabelled target; a case that breaks the bound is a
    :class:`Falsified` failure, and (fewest keys so far in this process first) a witness under
    falsify's witness key, which ``falsify --database`` replays before it searches."""

    smallest: list[tuple[int, int]] = []

    def probe(case) -> None:
        try:
            score = merit(search.evaluate(case))
        except WorkerFailed as exc:
            raise WorkerStopped(f"the normalizer {exc.reason}") from None
        except _Crossed:
            ev = search.witness
            size = (int(ev.case.scores.isfinite().sum()), ev.case.scores.numel())
            if not smallest or size < smallest[0]:
                smallest[:] = [size]
                database.save(witness_key, campaign.encode(ev))
            raise Falsified(f"{search.ineq.text} fails: LHS = {ev.lhs!r}, RHS = {ev.rhs!r} "
                            f"(L = {ev.case.scores.numel()})") from None
        if math.isfinite(score):
            hypothesis.target(score)

    ctx = search.ctx
    conf = hypothesis.settings(
        hypothesis_settings(ctx), database=database, verbosity=hypothesis.Verbosity.normal,
        suppress_health_check=[h for h in hypothesis.HealthCheck
                               if h is not hypothesis.HealthCheck.nested_given],
        phases=[hypothesis.Phase.reuse, hypothesis.Phase.generate, hypothesis.Phase.target,
                hypothesis.Phase.shrink])
    test = given(stratum_cases(record.stratum, search))(probe)
    key = strata_key(label, search.ineq.normalized, search.params, record.stratum)
    test.hypothesis.inner_test._hypothesis_internal_add_digest = key
    test._hypothesis_internal_database_key = key
    test = conf(test)
    test.__name__ = test.__qualname__ = f"test_falsify__{_ident(record.stratum.name)}"
    test.__doc__ = f"{label}: {search.ineq.text} on stratum {record.stratum.name}"
    database.add(test, key)
    return test


def falsify_tests(environ=None) -> dict[str, Any]:
    """``{name: test}``: one test per stratum of falsify's search of the environment's inequality
    on its target (:data:`ENV`), the target loaded in a worker (as ``falsify`` loads it), the
    search's budget unlimited."""
    environ = os.environ if environ is None else environ
    cfg = _config(environ)
    if len(cfg["targets"]) != 1:
        raise UsageError(f"{TARGET_ENV}: falsify's strata take one target, got "
                         f"{len(cfg['targets'])}")

    (target,) = cfg["targets"]
    params = _named("ATTNVERIFY_FUZZ_PARAMS", parse_params, cfg["params"])
    text = _env(EXPRESSION_ENV, environ)
    ineq = _named(EXPRESSION_ENV, parse_inequality, text, QUANTITIES)
    ctx = _named("ATTNVERIFY_FUZZ_MAX_LENGTH", make_context,
                 max_length=_env("ATTNVERIFY_FUZZ_MAX_LENGTH", environ) or None)
    ctx = _named("ATTNVERIFY_FUZZ_PARAMS", fix_temperature, ctx, params)
    _threads(ctx)
    database = UnitKeys(_named(DATABASE_ENV, _open, cfg["database"]))
    _load_profile(ctx, database)
    try:
        try:
            spec = remote.open_normalizer(target, params, ctx)
        except (WorkerFailed, remote.TargetRaised) as exc:
            what = getattr(exc, "reason", None) or f"raised {exc.remote_type}: {exc}"
            raise UsageError(f"{TARGET_ENV}: loading {target!r} {what}") from None
        close(spec)
        search = make_search(spec, ineq, ctx, params)
    finally:
        remote.shutdown()  # the worker is closed; a test restarts it where it runs
    search.budget = Budget(2**62, math.inf, search.budget.max_length)
    search.begin("fuzz")
    witness_key, _near = campaign.keys(target, ineq.normalized, params)
    tests = {}
    for record in search.records:
        test = falsify_test(search, record, database, label=target, witness_key=witness_key)
        tests[test.__name__] = test
    return tests
