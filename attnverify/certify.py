"""Run properties against a normalizer and collect results.

Every property runs in two steps: a fixed battery of adversarial cases, then Hypothesis, whose
``hypothesis.target`` steers the search towards the worst ratio observed / allowed and whose
shrinker minimises any failure. The smallest failing case of the two is reported. A normalizer
that raises is a result with status ``error``, never a crash of the suite.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

import hypothesis
import torch
from hypothesis import given

from attnverify import heartbeat
from attnverify.checks import PROPERTIES, Property, Violation, properties_for
from attnverify.checks.base import Context, NormalizerError, monitor_of, positive_temperature
from attnverify.checks.layout import space_of
from attnverify.checks.shrink import shrink
from attnverify.coverage import Coverage
from attnverify.errors import UsageError, WorkerFailed
from attnverify.registry import NormalizerSpec
from attnverify.runconfig import (  # noqa: F401 - re-exported: the run configuration's home
    DTYPES,
    PROFILE_ENV,
    PROFILES,
    hypothesis_settings,
    make_context,
    parse_dtypes,
)
from attnverify.serialize import encode_case, jsonable, number, repro_command  # noqa: F401


@dataclass
class PropertyResult:
    property: str
    claimed: bool
    status: str  # holds | violated | error | not_applicable
    examples: int = 0
    worst_ratio: float | None = None
    counterexample: dict[str, Any] | None = None
    message: str = ""
    elapsed_s: float = 0.0
    #: The inputs it was checked on (:mod:`attnverify.coverage`); ``None``: no case ran.
    coverage: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if out["worst_ratio"] is not None:
            out["worst_ratio"] = number(out["worst_ratio"])  # one encoding: "inf", not 1e308
        out["elapsed_s"] = round(self.elapsed_s, 4)
        return out


@dataclass
class TargetResult:
    target: str
    claims: list[str]
    results: list[PropertyResult] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    #: What ``matches_reference`` compared with (``None``: no reference).
    reference: str | None = None
    #: Where the reference ran: ``"checker"`` (attnverify's formula, a built-in, ``--reference``)
    #: or ``"target"`` (declared by the target's own module: code under test, run in its worker).
    reference_owner: str | None = None
    #: The process ids of the worker processes the target ran in (none: in the checker's own).
    worker_pids: list[int] = field(default_factory=list)
    #: What the worker reported of its runtime (``softmax_kernel``); not written per target.
    runtime: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """``failed`` when a claimed property is violated or raised; ``not_checked`` when no
        property could run here (every one not applicable, e.g. a CUDA-only kernel on a CPU
        machine): nothing was certified; else ``certified``."""
        bad = [r for r in self.results if r.claimed and r.status in ("violated", "error")]
        if bad:
            return "failed"
        if self.results and all(r.status == "not_applicable" for r in self.results):
            return "not_checked"
        return "certified"

    def to_json(self) -> dict[str, Any]:
        from attnverify.coverage import certified_for, target_block

        coverage = target_block(self.results)
        declared = (coverage or {}).get("declared")
        return {
            "target": self.target,
            "claims": list(self.claims),
            "params": {k: jsonable(v) for k, v in self.params.items()},
            "reference": self.reference,
            "reference_owner": self.reference_owner,
            "worker_pids": list(self.worker_pids),
            "verdict": self.verdict,
            "certified_for": certified_for(declared) if coverage else None,
            "coverage": coverage,
            "results": [r.to_json() for r in self.results],
        }


def fix_temperature(ctx: Context, params, option: str = "--params") -> Context:
    """``ctx`` with the temperature that ``params`` fix, validated (positive and finite, else a
    usage error naming ``option``): every case then uses that T wherever it would draw one, and
    every bound the same T. Without ``temperature`` in ``params``, ``ctx`` unchanged."""
    value = (params or {}).get("temperature")
    if value is None:
        return ctx
    return dataclasses.replace(ctx, temperature=positive_temperature(value, option))


def resolve_claims(spec: NormalizerSpec, claims: list[str] | None) -> list[str]:
    """The non-universal claims to check: ``claims`` when given, else the spec's own."""
    chosen = list(spec.claims if claims is None else claims)
    unknown = [c for c in chosen if c not in PROPERTIES]
    if unknown:
        raise UsageError(
            f"unknown property id {unknown[0]!r}: run 'attnverify properties' for the list"
        )
    universal = [c for c in chosen if PROPERTIES[c].universal]
    if universal:
        raise UsageError(f"{universal[0]!r} is universal: it is always checked, not claimed")
    return list(dict.fromkeys(chosen))


def plan(spec: NormalizerSpec, claims: list[str] | None, ctx: Context):
    """``(spec with its checked claims, the properties certify runs on it, in order)``."""
    spec, claims = with_reference(spec, claims, ctx)
    chosen = resolve_claims(spec, claims)
    return spec.with_claims(chosen), list(properties_for(chosen, ctx))


def fix_reference(ctx: Context, reference: str | None) -> Context:
    """``ctx`` comparing every target with ``reference`` (a target string, loaded here so that a
    bad one is a usage error before any work); ``None`` leaves ``ctx`` unchanged."""
    if not reference:
        return ctx
    from attnverify.registry import load_target

    load_target(reference)
    return dataclasses.replace(ctx, reference=reference.strip())


def with_reference(spec: NormalizerSpec, claims: list[str] | None, ctx: Context):
    """``(spec, claims)`` with the reference applied: ``--reference REF`` (``ctx.reference``)
    replaces the spec's own and adds ``matches_reference`` to any claims; a spec with a reference
    of its own (or a kernel) claims ``matches_reference`` unless ``claims`` replace its own."""
    from attnverify.checks.reference import reference_label

    if getattr(ctx, "reference", None):
        spec = spec.with_reference(ctx.reference)
        if claims is not None and "matches_reference" not in claims:
            claims = [*claims, "matches_reference"]
    elif claims is None and "matches_reference" not in spec.claims and reference_label(spec):
        claims = [*spec.claims, "matches_reference"]
    return spec, claims


def certify_target(
    spec: NormalizerSpec,
    claims: list[str] | None = None,
    ctx: Context | None = None,
    *,
    label: str | None = None,
    progress=None,
    skip: Collection[str] = (),
) -> TargetResult:
    """Check the universal properties and the claims of one normalizer (except those in
    ``skip``, by id)."""
    ctx = ctx or make_context()
    spec, props = plan(spec, claims, ctx)
    from attnverify.checks.reference import reference_label, reference_owner

    result = TargetResult(target=label or spec.id, claims=list(spec.claims),
                          params=dict(spec.params), reference=reference_label(spec),
                          reference_owner=reference_owner(spec))
    monitor = monitor_of(spec)
    for prop in props:
        if prop.id in skip:
            continue
        result.results.append(run_property(prop, spec, ctx, claimed=True))
        if progress is not None:
            progress(result.target, result.results[-1])
    if monitor is not None:
        result.worker_pids = list(dict.fromkeys(monitor.pids))
    result.runtime = dict(getattr(spec.fn, "runtime", None) or {})
    return result


class _State:
    def __init__(self) -> None:
        self.examples = 0
        self.worst = 0.0
        self.last: Any = None
        self.reproduces = True
        self.coverage = Coverage()


def _size(case: Any) -> int:
    scores = getattr(case, "scores", None)
    return int(scores.numel()) if isinstance(scores, torch.Tensor) else 0


def run_property(
    prop: Property, spec: NormalizerSpec, ctx: Context, *, claimed: bool = True
) -> PropertyResult:
    """Run one property: the adversarial battery first, then Hypothesis; never raises for the
    normalizer's faults. A failure is reported on the smallest failing case found (the
    battery's, or Hypothesis's shrunk one). A worker that dies, hangs or breaks the protocol
    (:class:`~attnverify.errors.WorkerFailed`) ends the property at once with the case in
    flight; an output refused at the process boundary fails it even where a check swallowed the
    refusal."""
    start = time.perf_counter()
    state = _State()
    monitor = monitor_of(spec)
    mark = len(monitor.refused) if monitor is not None else 0
    try:
        with checker_threads(monitor is not None and getattr(ctx, "isolation", True)):
            result = _run_property(prop, spec, ctx, claimed, state, start)
    except WorkerFailed as exc:
        where = f" on example {state.examples}" if state.examples else ""
        return _finish(prop, claimed, "error", state, start,
                       f"the normalizer {exc.reason}{where}", None, spec, ctx)
    if monitor is not None and result.status in ("holds", "not_applicable"):
        refused = monitor.refused[mark:]
        if refused:
            event = refused[0]
            state.last = event.case if event.case is not None else state.last
            return _finish(prop, claimed, "violated", state, start,
                           f"the output was refused at the process boundary: {event.what}",
                           None, spec, ctx)
    return result


@contextlib.contextmanager
def checker_threads(single: bool):
    """One intra-op thread for the checks while the target runs in a worker process: the checks
    make many small tensor operations, whose parallel regions cost more in thread wake-ups than
    they save on a shared CPU, and the checker and the worker take turns anyway. Restored
    afterwards (the plugin runs inside a user's pytest process)."""
    before = torch.get_num_threads()
    if single and before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _run_property(prop, spec, ctx, claimed, state, start) -> PropertyResult:
    reason = prop.applies(spec, ctx)
    if reason:
        return PropertyResult(prop.id, claimed, "not_applicable", message=reason)
    failures: list[tuple[Any, BaseException]] = []
    for case in prop.explicit(spec, ctx):
        try:
            _evaluate(prop, spec, ctx, state, case)
        except Exception as exc:  # noqa: BLE001 - classified below
            failures.append((case, exc))
    try:
        _hypothesis_test(prop, spec, ctx, state)()
    except Exception as exc:  # noqa: BLE001 - classified below
        exc = _unwrap(exc)
        failures.append((getattr(exc, "attnverify_case", state.last), exc))
    if not failures:
        return _finish(prop, claimed, "holds", state, start, "", None, spec, ctx)
    # the normalizer's failures before any fault of the search (a flaky run, no valid case), then
    # the smallest case, a violation before a raise
    case, exc = min(failures, key=lambda f: (not isinstance(f[1], (Violation, NormalizerError)),
                                             _size(f[0]), not isinstance(f[1], Violation)))
    case, exc, state.reproduces = _exact_and_minimal(prop, spec, ctx, case, exc)
    state.last = case
    if isinstance(exc, Violation):
        return _finish(prop, claimed, "violated", state, start, exc.message, exc, spec, ctx)
    if isinstance(exc, NormalizerError):
        message = f"the normalizer raised {exc}"
    elif isinstance(exc, hypothesis.errors.Unsatisfiable):
        message = f"no valid case: {exc}"
    else:
        message = f"internal error in attnverify ({type(exc).__name__}: {_first_line(exc)})"
    return _finish(prop, claimed, "error", state, start, message, None, spec, ctx)


def _evaluate(prop: Property, spec, ctx, state: _State, case) -> float:
    state.examples += 1
    state.last = case
    state.coverage.add(case)
    heartbeat.example_started(case)  # the watchdog's clock (no-op outside a worker)
    try:
        ratio = float(prop.check(spec, case, ctx))
    except Exception as exc:
        exc.attnverify_case = case  # the failing case, whatever Hypothesis runs after it
        raise
    finally:
        heartbeat.example_finished()
    if math.isfinite(ratio):
        state.worst = max(state.worst, ratio)
    return ratio


class WorkerStopped(Exception):
    """The target's worker died, hung or broke the protocol on this case
    (:class:`~attnverify.errors.WorkerFailed`), raised where a search goes on after it: an
    ordinary failure, which Hypothesis shrinks and files (:mod:`attnverify.fuzz`)."""


def search_test(prop: Property, spec: NormalizerSpec, ctx: Context, state: _State, *,
                fuzz: bool = False):
    """The Hypothesis test of ``prop`` on ``spec`` (its strategy and its body), before settings
    and seed: certify runs it seeded under the profile's settings (:func:`_hypothesis_test`).
    :mod:`attnverify.fuzz` gives the same test to HypoFuzz (``fuzz``), where a failing worker is
    a :class:`WorkerStopped` failure instead of the end of the search, and the target is
    unlabelled: HypoFuzz buckets an unlabelled target by its power of two (a case that reaches
    a new power is new behaviour, kept and mutated) but counts every value of a labelled one as
    new behaviour."""
    label = "" if fuzz else prop.id

    def body(case):
        try:
            ratio = _evaluate(prop, spec, ctx, state, case)
        except WorkerFailed as exc:
            if not fuzz:
                raise
            raise WorkerStopped(f"the normalizer {exc.reason}") from None
        if math.isfinite(ratio):
            hypothesis.target(min(ratio, 1e12), label=label)

    return given(prop.cases(spec, ctx))(body)


def database_key_of(prop: Property, spec: NormalizerSpec, ctx: Context) -> bytes:
    """The example-database key of ``prop``'s search on ``spec`` under ``ctx``: the target
    string, its parameters, the property and the dtypes the cases take (the unit's one, else the
    run's), with attnverify's version (:func:`attnverify.exampledb.database_key`). ``certify
    --database`` and :mod:`attnverify.fuzz` file and replay examples under it."""
    from attnverify.exampledb import database_key
    from attnverify.serialize import dtype_name

    unit = getattr(ctx, "unit_dtype", None)
    dtypes = ",".join(dtype_name(d) for d in ((unit,) if unit is not None else ctx.dtypes))
    params = ",".join(f"{k}={v!r}" for k, v in sorted(dict(spec.params).items()))
    return database_key("certify", spec.target or spec.id, params, prop.id, dtypes)


def _hypothesis_test(prop: Property, spec: NormalizerSpec, ctx: Context, state: _State):
    examples = max(1, int(round(ctx.max_examples * prop.examples_scale)))
    conf = hypothesis_settings(ctx, examples)
    # seeded first: @seed drops any database of the settings applied before it
    test = hypothesis.seed(ctx.seed)(search_test(prop, spec, ctx, state))
    database = getattr(ctx, "database", None)
    if database:  # certify --database: replay what is stored (HypoFuzz's finds first), then search
        conf = hypothesis.settings(conf, database=example_database(database),
                                   phases=[hypothesis.Phase.reuse, *conf.phases])
        test._hypothesis_internal_database_key = database_key_of(prop, spec, ctx)
    return conf(test)


@functools.cache
def example_database(text: str):
    """The example database ``text`` names (``certify --database``), opened once per process and
    checked (:func:`attnverify.exampledb.open_database`: exit 2 on a bad one)."""
    from attnverify.exampledb import open_database

    return open_database(text, option="--database")


def _unwrap(exc: Exception) -> Exception:
    """The normalizer's own failure inside a Hypothesis exception group (a flaky failure wraps
    the violation it could not reproduce), else ``exc``."""
    for inner in getattr(exc, "exceptions", ()):
        if isinstance(inner, (Violation, NormalizerError)):
            return inner
    return exc


def _exact_and_minimal(prop: Property, spec, ctx, case, exc):
    """``(case, exception, reproduces)``: the input the normalizer was actually given (for a
    property that builds its input from the case, :attr:`Violation.input`), shrunk to the fewest
    rows, fewest keys and simplest values that still fail the same way
    (:mod:`attnverify.checks.shrink`), re-checked as the repro will re-check it."""
    given = getattr(exc, "input", None)
    fields = getattr(case, "_fields", ())
    if prop.verify is not None and isinstance(given, torch.Tensor) and "scores" in fields:
        case = case._replace(scores=given.detach().clone())
    if not isinstance(exc, (Violation, NormalizerError)):
        return case, exc, True

    stopped: list[WorkerFailed] = []

    def recheck(candidate):
        if stopped:  # the worker died or hung on a candidate: shrink no further
            raise _ShrinkStopped()
        heartbeat.example_started(candidate)  # shrinking runs under the same time limit
        try:
            return prop.recheck(spec, candidate, ctx)
        except WorkerFailed as failed:
            stopped.append(failed)
            raise _ShrinkStopped() from None
        finally:
            heartbeat.example_finished()

    small, small_exc = shrink(recheck, case, exc, vary_temperature=ctx.temperature is None)
    if small_exc is not exc:
        return small, small_exc, True
    if stopped:
        return case, exc, False
    try:  # nothing smaller failed: confirm that the repro fails on the case itself
        recheck(case)
    except (Violation, NormalizerError) as again:
        return case, again if type(again) is type(exc) else exc, type(again) is type(exc)
    except Exception:  # noqa: BLE001
        return case, exc, False
    return case, exc, False


class _ShrinkStopped(Exception):
    """A shrinking step met a dead or hung worker: that candidate does not count."""


def repro_for(spec: NormalizerSpec, case_json: dict, prop_id: str, seed: int = 0) -> str:
    """The ``attnverify repro`` line that re-checks ``prop_id`` on ``case_json`` (with the
    spec's reference when it names one, and the run's seed)."""
    reference = getattr(spec, "reference", None)
    return repro_command(spec.target or spec.id, case_json, property=prop_id,
                         reference=reference if isinstance(reference, str) else None,
                         seed=seed)


def _finish(prop, claimed, status, state, start, message, violation, spec, ctx) -> PropertyResult:
    worst = state.worst
    counterexample = None
    if status in ("violated", "error") and state.last is not None:
        counterexample = describe_case(state.last, spec)
        case_json = dict(counterexample)
        if violation is not None:
            worst = max(worst, violation.ratio)
            counterexample.update(jsonable({
                "observed": violation.observed, "bound": violation.bound,
                "ratio": violation.ratio, **violation.details,
            }))
        if not state.reproduces:
            counterexample["reproduces"] = False
        counterexample["repro"] = repro_for(spec, case_json, prop.id, seed=ctx.seed)
    return PropertyResult(
        property=prop.id,
        claimed=claimed,
        status=status,
        examples=state.examples,
        worst_ratio=worst,
        counterexample=counterexample,
        message=message,
        elapsed_s=time.perf_counter() - start,
        coverage=state.coverage.to_json(declared=space_of(spec).to_json()),
    )


def describe_case(case: Any, spec: NormalizerSpec) -> dict[str, Any]:
    """The case as JSON (:func:`attnverify.serialize.encode_case`): every field, the scores in
    full with their masks, their dtype and shape, and the normalizer's parameters."""
    return encode_case(case, spec.params)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
