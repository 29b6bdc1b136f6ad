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
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnverify import heap, heartbeat, sequence, triton_runtime
from attnverify.checks import PROPERTIES, Property, Violation, properties_for
from attnverify.checks.base import (
    Context,
    Deferred,
    NormalizerError,
    monitor_of,
    positive_temperature,
)
from attnverify.checks.layout import space_of
from attnverify.checks.reference import reference_label, reference_owner
from attnverify.checks.shrink import Hung, shrink
from attnverify.checks.universal import event_case
from attnverify.coverage import Coverage, certified_for, target_block
from attnverify.coverage import merge as merge_coverage
from attnverify.coverage import recording as coverage_recording
from attnverify.errors import (
    Interrupted,
    TargetFailedInFull,
    UsageError,
    WorkerFailed,
    interrupt_word,
    raise_if_swallowed,
    reraise_interrupt,
)
from attnverify.exampledb import database_key, open_database
from attnverify.registry import NormalizerSpec, load_target
from attnverify.runconfig import (  # noqa: F401 - re-exported: the run configuration's home
    DTYPES,
    PROFILE_ENV,
    PROFILES,
    hypothesis_settings,
    make_context,
    parse_dtypes,
    seeded_generation,
    unseeded_globals,
)
from attnverify.serialize import encode_case, jsonable, number, repro_command  # noqa: F401
from attnverify.shard import dtype_name


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
    #: Its units (:mod:`attnverify.shard`), one per dtype, in order: ``(dtype, result)``, the
    #: result ``None`` for a unit not run (another shard's, or a missing shard's).
    units: list = field(default_factory=list)
    #: Where the target raised, in its own code (an ``error`` because it raised): the lines of
    #: its traceback without attnverify's frames, as its worker sent them (``certify
    #: --traceback`` shows them); ``None``: it did not raise. In the JSON only when set.
    traceback: list[str] | None = None

    def to_json(self, *, partial: bool = False) -> dict[str, Any]:
        """The result; ``partial``: each unit with its whole result, for ``merge``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "units"}  # plain JSON values already; units below
        if out["traceback"] is None:
            del out["traceback"]
        if out["worst_ratio"] is not None:
            out["worst_ratio"] = number(out["worst_ratio"])  # one encoding: "inf", not 1e308
        out["elapsed_s"] = round(self.elapsed_s, 4)
        out["units"] = [_unit_json(d, r, partial) for d, r in self.units]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PropertyResult:
        """The result :meth:`to_json` wrote (``partial``: with its units' results)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"units"}
        out = cls(**{k: v for k, v in data.items() if k in known})
        if isinstance(out.worst_ratio, str):
            out.worst_ratio = float(out.worst_ratio)
        out.units = [(u["dtype"], cls.from_json(u["result"]) if u.get("result") else None)
                     for u in data.get("units") or []]
        return out


def _unit_json(dtype: str, r: PropertyResult | None, partial: bool) -> dict[str, Any]:
    if r is None:
        return {"dtype": dtype, "status": "not_checked"}
    out = {"dtype": dtype, "status": r.status, "examples": r.examples,
           "worst_ratio": None if r.worst_ratio is None else number(r.worst_ratio),
           "elapsed_s": round(r.elapsed_s, 4)}
    if partial:
        out["result"] = r.to_json()
    return out


#: Status precedence when units combine: the first unit with the highest wins.
_RANK = {"violated": 4, "error": 3, "not_checked": 2, "holds": 1, "not_applicable": 0}


def combine(prop_id: str, claimed: bool, units: list, *, missing: str = "") -> PropertyResult:
    """One property's result from its units ``[(dtype, result or None)]``: a failing unit's
    status, message and counterexample (a violation before an error, then the first in order);
    else ``not_checked`` when a unit did not run (``missing`` says why); else ``holds`` when a
    unit ran, ``not_applicable`` when none applied. Examples and seconds add up, the worst ratio
    is the largest, the coverage the union. The same function serves an unsharded run and
    ``merge``, so both give the same result."""

    ran = [r for _, r in units if r is not None]
    statuses = [r.status if r is not None else "not_checked" for _, r in units]
    top = max(statuses, key=lambda s: _RANK[s]) if statuses else "not_applicable"
    chosen = next((r for _, r in units if r is not None and r.status == top), None)
    if top == "not_checked":
        absent = [d for d, r in units if r is None]
        message = (f"not run: the {', '.join(absent)} unit{'s' if len(absent) > 1 else ''} "
                   f"{missing or 'belong to another shard'}")
    elif top == "holds":
        message = ""
    else:
        message = chosen.message if chosen is not None else ""
    worst = [r.worst_ratio for r in ran if r.worst_ratio is not None]
    blocks = [r.coverage for r in ran if r.coverage]
    return PropertyResult(
        property=prop_id, claimed=claimed, status=top,
        examples=sum(r.examples for r in ran),
        worst_ratio=_largest(worst) if worst else None,
        counterexample=chosen.counterexample if top in ("violated", "error") else None,
        message=message,
        elapsed_s=sum(r.elapsed_s for r in ran),
        coverage=merge_coverage(blocks),
        units=list(units),
        traceback=chosen.traceback if top in ("violated", "error") and chosen else None,
    )


def unfinished_reason(exc: KeyboardInterrupt) -> str:
    """Why a unit of a stopped run has no result: ``did not finish: the run was interrupted``
    (or ``terminated (SIGTERM)``)."""
    return f"did not finish: the run was {interrupt_word(exc)}"


def fill_unfinished(result: TargetResult, planned: list[tuple[str, list[str]]],
                    why: str) -> None:
    """``result`` of a target whose run stopped part-way: its finished properties kept, every
    other property of ``planned`` (``[(property id, its unit dtypes)]`` in run order) added as
    ``not_checked`` with its units not run (``why``), in plan order; so its verdict is
    ``not_checked`` unless a finished property failed, and a stopped shard's part still lines
    up with the others' in ``merge``."""
    done = {r.property: r for r in result.results}
    ids = {prop_id for prop_id, _ in planned}
    kept = [r for r in result.results if r.property not in ids]
    result.results = kept + [done.get(prop_id) or _unfinished(prop_id, dtypes, why)
                             for prop_id, dtypes in planned]


def _unfinished(prop_id: str, dtypes: list[str], why: str) -> PropertyResult:
    """``prop_id`` not run: ``not_checked``, its units (``dtypes``) not run, saying ``why``."""
    if dtypes:
        return combine(prop_id, True, [(dtype, None) for dtype in dtypes], missing=why)
    return PropertyResult(property=prop_id, claimed=True, status="not_checked",
                          message=f"not run: {why}")


def planned_units(props, spec, ctx) -> list[tuple[str, list[str]]]:
    """``[(property id, its unit dtypes)]`` of ``props`` on ``spec``, in run order."""
    return [(p.id, [dtype_name(d) for d in p.unit_dtypes(spec, ctx)]) for p in props]


def keep_finished(result: TargetResult, planned: list[tuple[str, list[str]]],
                  exc: KeyboardInterrupt) -> None:
    """``result`` of a target whose run ``exc`` stopped: the property in progress as far as it
    got (``exc.result``, :func:`run_property`), then :func:`fill_unfinished`."""
    if getattr(exc, "result", None) is not None:
        result.results.append(exc.result)
    fill_unfinished(result, planned, unfinished_reason(exc))


def _prepared(spec: NormalizerSpec, claims, ctx: Context, label: str | None):
    """``(ctx, spec, properties, result)`` of certifying ``spec`` as ``label``: the context
    capped for an interpreted Triton kernel, the plan (:func:`plan`) and the target's result
    before any property ran."""
    execution, cap = triton_execution(spec.fn, ctx)
    if cap:
        ctx = dataclasses.replace(ctx, max_rows=cap["rows"])
    spec, props = plan(spec, claims, ctx)
    result = TargetResult(target=label or spec.id, claims=list(spec.claims),
                          params=dict(spec.params), reference=reference_label(spec),
                          reference_owner=reference_owner(spec), execution=execution,
                          call_cap=cap)
    return ctx, spec, props, result


def not_started(spec: NormalizerSpec, claims, ctx: Context, label: str,
                why: str) -> TargetResult:
    """A target a stopped run never reached: every planned property ``not_checked``."""
    ctx, spec, props, result = _prepared(spec, claims, ctx, label)
    fill_unfinished(result, planned_units(props, spec, ctx), why)
    return result


def progress_line(target: str, result: PropertyResult) -> None:
    """The console's line for a property as it ends, on standard error. In a shard (a job of
    ``--jobs``) only what ran there: a property none of whose units ran prints nothing, one
    that ran some of its units names their dtypes and says how those went."""
    units = result.units or []
    ran = [(dtype, r) for dtype, r in units if r is not None]
    label = ""
    if len(ran) < len(units):
        if not ran:
            return
        result = combine(result.property, result.claimed, ran)
        label = f" [{', '.join(dtype for dtype, _ in ran)}]"
    # one write of the whole line: the jobs of a run share standard error, and print's
    # separate write of the newline would let another job's line in before it
    sys.stderr.write(f"  {target}: {result.property}{label} … {result.status} "
                     f"({result.examples} examples, {result.elapsed_s:.2f}s)\n")
    sys.stderr.flush()


def _largest(ratios: list) -> float:
    """The largest of ``ratios``, NaN when one is NaN (``max`` would skip it by position)."""
    values = [float(r) for r in ratios]
    return math.nan if any(math.isnan(v) for v in values) else max(values)


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
    #: What those processes ran under (:mod:`attnverify.sandbox`), each phrase once.
    sandbox: list[str] = field(default_factory=list)
    #: What the worker reported of its runtime (``softmax_kernel``); not written per target.
    runtime: dict[str, Any] = field(default_factory=dict)
    #: What ran the target's Triton kernels, when it has any (``"cpu, Triton interpreter"``).
    execution: str | None = None
    #: The cap on each call's size its cases kept to (``{"rows": 8}``; attention:
    #: ``{"batch_heads": 4, "queries": 17}`` too), the time limit's factor and why; ``None``:
    #: no cap.
    call_cap: dict[str, Any] | None = None
    #: Warnings the target's own calls raised in its worker, once each (issue #28.1).
    target_warnings: list[str] = field(default_factory=list)
    #: An attention target's record (:func:`attnverify.attention.run.kernel_record`): the
    #: normalizer and score modification it declares, the reference and who named it.
    attention: dict[str, Any] | None = None
    #: A partial certificate's record of the side effects its worker saw (:func:`side_effects`):
    #: ``merge`` fails ``no_side_effects`` on them wherever that property's units ran.
    side_effects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``failed`` when a claimed property is violated or raised; ``not_checked`` when no
        property could run here (every one not applicable, e.g. a CUDA-only kernel on a CPU
        machine): nothing was certified, or when a unit of work did not run (a partial
        certificate's other shards, a merge missing a shard); else ``certified``."""
        bad = [r for r in self.results if r.claimed and r.status in ("violated", "error")]
        if bad:
            return "failed"
        if self.results and all(r.status == "not_applicable" for r in self.results):
            return "not_checked"
        if any(r.status == "not_checked" for r in self.results):
            return "not_checked"  # a unit did not run (another shard's, or a missing shard's)
        return "certified"

    def to_json(self, *, partial: bool = False) -> dict[str, Any]:
        coverage = target_block(self.results)
        declared = (coverage or {}).get("declared")
        if coverage is not None and self.call_cap:
            coverage["per_call"] = dict(self.call_cap)
        return {
            "target": self.target,
            "claims": list(self.claims),
            "params": {k: jsonable(v) for k, v in self.params.items()},
            "reference": self.reference,
            "reference_owner": self.reference_owner,
            **({"attention": dict(self.attention)} if self.attention is not None else {}),
            **({"execution": self.execution} if self.execution else {}),
            "worker_pids": list(self.worker_pids),
            "sandbox": " | ".join(self.sandbox) if self.sandbox else None,
            "target_warnings": list(self.target_warnings),
            "verdict": self.verdict,
            "certified_for": certified_for(declared) if coverage else None,
            "coverage": coverage,
            "results": [r.to_json(partial=partial) for r in self.results],
            **({"side_effects": list(self.side_effects)} if partial else {}),
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

    load_target(reference)
    return dataclasses.replace(ctx, reference=reference.strip())


def with_reference(spec: NormalizerSpec, claims: list[str] | None, ctx: Context):
    """``(spec, claims)`` with the reference applied: ``--reference REF`` (``ctx.reference``)
    replaces the spec's own and adds ``matches_reference`` to any claims; a spec with a reference
    of its own (or a kernel) claims ``matches_reference`` unless ``claims`` replace its own."""

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
    ``skip``, by id). Ctrl-C or a terminating signal raises :class:`Interrupted` with the
    result: the properties that finished, the others ``not_checked``."""
    ctx, spec, props, result = _prepared(spec, claims, ctx or make_context(), label)
    monitor = monitor_of(spec)
    shard = getattr(ctx, "shard", None)
    props = [prop for prop in props if prop.id not in skip]
    stopped = None
    try:
        for prop in props:
            select = None if shard is None else shard.selector(result.target, prop.id,
                                                               ctx.device)
            result.results.append(run_property(prop, spec, ctx, claimed=True, select=select))
            if progress is not None:
                progress(result.target, result.results[-1])
    except KeyboardInterrupt as exc:  # Ctrl-C or a terminating signal: keep what finished
        stopped = exc
        keep_finished(result, planned_units(props, spec, ctx), exc)
    if monitor is not None:
        result.worker_pids = list(dict.fromkeys(monitor.pids))
        result.sandbox = list(dict.fromkeys(monitor.sandboxes))
        result.target_warnings = list(getattr(monitor, "warnings", []))
        if shard is not None:
            result.side_effects = side_effects(monitor, spec.params)
    result.runtime = dict(getattr(spec.fn, "runtime", None) or {})
    if stopped is not None:
        raise Interrupted(stopped, targets=[result])
    return result


def triton_execution(fn, ctx: Context, attention: bool = False):
    """``(execution, call cap)`` of a target whose worker found Triton kernels
    (:mod:`attnverify.triton_runtime`): what ran them (``"cpu, Triton interpreter"``) and, for
    the interpreter, the few program instances per call its cases keep to; ``(None, None)``
    for any other target."""
    runtime = getattr(fn, "runtime", None) or {}
    if not runtime.get("triton"):
        return None, None
    execution = triton_runtime.execution(ctx.device, runtime)
    if not triton_runtime.interpreted(runtime):
        return execution, None
    why = "Triton interpreter: each program instance runs in Python"
    cap = {"rows": triton_runtime.MAX_ROWS, "reason": why,
           "time_limit_factor": triton_runtime.TIME_FACTOR}
    if attention:
        cap.update(batch_heads=triton_runtime.MAX_PROGRAMS, queries=triton_runtime.MAX_QUERIES)
    return execution, cap


def side_effects(monitor, params: dict, limit: int = 8) -> list[dict[str, Any]]:
    """The first side effects a target's worker reported (what changed, on which request, and
    the input as a case when known), as JSON."""
    out = []
    for event in monitor.effects[:limit]:
        entry: dict[str, Any] = {"what": event.what, "op": event.op, "call": event.call,
                                 "case": None}

        case = event_case(event)
        if case is not None:
            try:
                entry["case"] = encode_case(case, params)
            except Exception:  # noqa: BLE001 - a record, not a check
                entry["case"] = None
        out.append(entry)
    return out


class _State:
    def __init__(self) -> None:
        self.examples = 0
        self.worst = 0.0
        self.last: Any = None
        self.reproduces = True
        self.coverage = Coverage()
        #: Cases the check could not judge alone (:class:`~attnverify.checks.base.Deferred`:
        #: no autograd graph, float64 refused, too few rows judged), by kind, in order.
        self.deferred: dict[type, list] = {}
        #: The earlier examples the failure needs (:mod:`attnverify.sequence`), oldest first.
        self.sequence: tuple = ()
        #: The budget of Hypothesis's shrink of this unit's failure (:class:`ShrinkBudget`).
        self.shrink = ShrinkBudget()
        #: The calls after which that budget stopped the shrink (``None``: it was not stopped).
        self.shrink_stopped: int | None = None


#: Cases Hypothesis's shrink of a unit's failure may draw (the calls of the search after its
#: first failure, rejected draws included; it stops at the next check past them): the budget
#: that binds in practice, so the reported case is the same on every machine. attnverify's own
#: shrinker (:mod:`attnverify.checks.shrink`) goes on from the smallest case it reached, in a
#: budget of its own.
SHRINK_CALLS = 8
#: ... and at most this many seconds, or the unit's time before its first failure when longer: a
#: safety net for a target slower on the shrink's cases than on the search's, far above what the
#: draws cost on a loaded machine, so that it does not bind in practice (the calls bound a slow
#: target's shrink in proportion to its search already).
SHRINK_S = 30.0


class ShrinkStopped(BaseException):
    """Raised into Hypothesis when its shrink has spent its budget (:class:`ShrinkBudget`): not
    an ``Exception``, so Hypothesis does not take it for a failure of the test but ends its run,
    and the smallest failure the shrink reached is reported (:func:`_run_property`)."""


class ShrinkBudget:
    """What one unit's Hypothesis shrink has spent: the calls of the search after its first
    failure (:data:`SHRINK_CALLS`), and the seconds (:data:`SHRINK_S`, or the unit's time before
    that failure when longer); and the smallest failure like the first it has seen."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.failed_at: float | None = None
        self.calls = 0
        self.best: tuple[Any, BaseException] | None = None

    def drawn(self) -> None:
        """Count a case the shrink draws (:func:`_budgeted`), whether or not it reaches the
        test's body."""
        if self.failed_at is not None:
            self.calls += 1

    def check(self) -> None:
        """Stop the shrink (:class:`ShrinkStopped`) before the body checks a case past the
        budget. Raised from the body, not the strategy: a draw cut short would make Hypothesis
        take its data generation for inconsistent."""
        if self.failed_at is None:
            return
        allowed = max(SHRINK_S, self.failed_at - self.began)
        if self.calls > SHRINK_CALLS or time.monotonic() - self.failed_at > allowed:
            raise ShrinkStopped()

    @property
    def spent(self) -> int:
        """The calls the shrink made before it was stopped."""
        return max(self.calls - 1, 0)

    def failed(self, case: Any, exc: BaseException) -> None:
        """Record a failing call: the first starts the shrink; a later one is kept when it fails
        like the first (the same exception type) on a case no larger than the one kept."""
        if self.best is None:
            self.failed_at, self.best = time.monotonic(), (case, exc)
        elif type(exc) is type(self.best[1]) and _size(case) <= _size(self.best[0]):
            self.best = (case, exc)


#: Cases of more entries than this report no ``hypothesis.target``: Hypothesis's target phase
#: climbs from the worst case it saw, by cases like it, and a climb from a case of the profile's
#: most entries would repeat such cases at hundreds of times the cost of a small one.
CLIMB_ENTRIES = 1 << 15


def _size(case: Any) -> int:
    scores = getattr(case, "scores", None)
    if not isinstance(scores, torch.Tensor):  # an attention case: the queries' scores
        scores = getattr(case, "q", None)
        keys = getattr(case, "k", None)
        if isinstance(scores, torch.Tensor) and isinstance(keys, torch.Tensor):
            return int(scores[..., 0].numel()) * int(keys.shape[-2])
    return int(scores.numel()) if isinstance(scores, torch.Tensor) else 0


def run_property(
    prop: Property, spec: NormalizerSpec, ctx: Context, *, claimed: bool = True,
    select=None, skip_reason: str = "",
) -> PropertyResult:
    """Run one property, unit by unit (one per dtype its cases take, :mod:`attnverify.shard`;
    ``select(dtype name)`` says which units to run here, ``None``: all), and combine the units
    (:func:`combine`). ``skip_reason``: every unit is ``not_applicable`` for that reason.

    Each unit has a share of the property's examples and its own seeded search; see
    :func:`run_unit`. Ctrl-C or a terminating signal raises :class:`Interrupted` with the
    property's result so far: its finished units, the unit in progress where it had a failure
    in hand (:func:`_run_property`), the others not run."""
    units = []
    planned = unit_contexts(prop, spec, ctx)
    try:
        for name, uctx in planned:
            if select is not None and not select(name):
                units.append((name, None))
            elif skip_reason:
                units.append((name, PropertyResult(prop.id, claimed, "not_applicable",
                                                   message=skip_reason)))
            else:
                units.append((name, run_unit(prop, spec, uctx, claimed=claimed)))
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted) and exc.result is not None:
            units.append((planned[len(units)][0], exc.result))  # its failure in hand
        units += [(name, None) for name, _ in planned[len(units):]]
        raise Interrupted(exc, result=combine(prop.id, claimed, units,
                                              missing=unfinished_reason(exc))) from None
    return combine(prop.id, claimed, units)


def unit_contexts(prop: Property, spec: NormalizerSpec, ctx: Context) -> list:
    """``[(dtype name, context)]`` of ``prop``'s units in ``ctx``, in order: a property whose
    cases have a dtype of their own runs once in ``ctx``; any other once per dtype, with
    ``unit_dtype`` set, its seed (:func:`unit_seed`) and its share of the examples."""
    dtypes = prop.unit_dtypes(spec, ctx)
    if prop.own_dtype:
        return [(dtype_name(dtypes[0]), ctx)]
    share = max(1, int(round(ctx.max_examples / len(dtypes))))
    return [(dtype_name(d), dataclasses.replace(ctx, unit_dtype=d, seed=unit_seed(ctx.seed, i),
                                                max_examples=share))
            for i, d in enumerate(dtypes)]


def unit_seed(seed: int, index: int) -> int:
    """The seed of a property's ``index``-th unit: the run's for the first, a fixed odd step
    further for each next one, so that the float32 and float64 units of a property do not draw
    the same rows (their repro lines carry the unit's seed)."""
    return seed if index == 0 else (seed + index * 0x9E3779B97F4A7C15) % 2**64


def run_unit(
    prop: Property, spec: NormalizerSpec, ctx: Context, *, claimed: bool = True
) -> PropertyResult:
    """Run one unit of a property: the adversarial battery first, then Hypothesis; never raises
    for the normalizer's faults. A failure is reported on the smallest failing case found (the
    battery's, or Hypothesis's shrunk one). A worker that dies, hangs or breaks the protocol
    (:class:`~attnverify.errors.WorkerFailed`) ends the property at once with the case in
    flight; an output refused at the process boundary fails it even where a check swallowed the
    refusal."""
    raise_if_swallowed()
    start = time.perf_counter()
    state = _State()
    monitor = monitor_of(spec)
    mark = len(monitor.refused) if monitor is not None else 0
    try:
        with checker_threads(_behind_boundary(spec, ctx)):
            result = _run_property(prop, spec, ctx, claimed, state, start)
    except TargetFailedInFull as exc:  # no case reached the target: none is reported
        return _finish(prop, claimed, "error", _State(), start, f"the normalizer {exc.reason}",
                       None, spec, ctx)
    except WorkerFailed as exc:
        where = f" on example {state.examples}" if state.examples else ""
        if exc.timed_out and state.last is not None:  # shrunk like any failure, in a budget
            try:
                state.last, note = shrink_hang(prop, spec, ctx, state.last)
            except KeyboardInterrupt as stop:  # the hang in hand is kept, as it was found
                raise Interrupted(stop, result=_finish(
                    prop, claimed, "error", state, start,
                    f"the normalizer {exc.reason}{where}{_as_found(stop)}", None, spec,
                    ctx)) from None
            where += note
        return _finish(prop, claimed, "error", state, start,
                       f"the normalizer {exc.reason}{where}", None, spec, ctx)
    finally:
        # a unit's large cases are freed when it ends, but the heap keeps much of what they
        # used (attnverify.heap); without this the checker of an attention kernel kept growing
        heap.trim()
    if monitor is not None and result.status in ("holds", "not_applicable"):
        refused = monitor.refused[mark:]
        if refused:
            event = refused[0]
            state.last = event.case if event.case is not None else state.last
            _in_sequence(prop, spec, ctx, state, state.last, None)
            return _finish(prop, claimed, "violated", state, start, refusal_text(event.what),
                           None, spec, ctx)
    return result


#: Per-example time limits a time-limit failure's shrink may spend on candidates that hang
#: again (each costs one whole limit): the shrink stops there with the smallest hang so far.
HANG_SHRINK_LIMITS = 4
#: ... and at most this many seconds in all, whatever the limit.
HANG_SHRINK_S = 120.0


def shrink_hang(prop: Property, spec, ctx, case) -> tuple[Any, str]:
    """``(case, note)``: the case that ran past the per-example time limit, shrunk like any
    failure (:func:`attnverify.checks.shrink.shrink`) to the smallest that still runs past it.
    A candidate that hangs costs the whole limit (and a fresh worker), so the shrinks of one
    target's run stop after :data:`HANG_SHRINK_LIMITS` limits or :data:`HANG_SHRINK_S` seconds
    in all (a later property that hangs reports its case as it was); candidates that return
    cost what they take. ``note`` says what was done, for the result's message."""
    limit = float(getattr(ctx, "timeout_s", 0.0) or 0.0)
    # one budget per target (its worker's monitor), so a target that hangs on every input
    # costs a few limits more in all, not a few per property
    monitor = monitor_of(spec)
    spent = getattr(monitor, "hang_shrink_s", 0.0)
    budget = min(HANG_SHRINK_LIMITS * limit, HANG_SHRINK_S) - spent
    if limit <= 0 or budget < limit:
        return case, ""
    began = time.monotonic()
    deadline = began + budget
    tried = []

    def recheck(candidate):
        if time.monotonic() + limit > deadline:
            raise _ShrinkStopped()  # another hang would overrun the budget
        tried.append(candidate)
        heartbeat.example_started(candidate)
        try:
            prop.recheck(spec, candidate, ctx)
        except WorkerFailed as failed:
            if failed.timed_out:
                raise Hung(failed.reason) from None
            raise _ShrinkStopped() from None  # died another way: not the same failure
        finally:
            heartbeat.example_finished()

    try:
        with heartbeat.budgeted_retries():  # bounded here, not by the failures in a row
            small, _ = shrink(recheck, case, Hung("the case in flight"), vary_temperature=False,
                              budget_s=budget)
    finally:
        if monitor is not None:
            monitor.hang_shrink_s = spent + time.monotonic() - began
    if small is case:
        return case, ""
    return small, f"; shrunk in {len(tried)} re-checks to the smallest case that still runs " \
                  "past it"


def refusal_text(what: str) -> str:
    """How a refusal at the boundary reads in a result (a written input says so itself)."""
    if what.startswith("the target wrote into its input"):
        return what
    return f"the output was refused at the process boundary: {what}"


def _behind_boundary(spec, ctx) -> bool:
    """Whether ``spec`` runs in a worker process, not in this one."""
    return monitor_of(spec) is not None and getattr(ctx, "isolation", True)


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
    try:
        for case in prop.explicit(spec, ctx):
            try:
                _evaluate(prop, spec, ctx, state, case)
            except Exception as exc:  # noqa: BLE001 - classified below
                reraise_interrupt(exc)  # a stop that a library turned into another error
                failures.append((case, exc))
        try:
            # the same cases in every process for one seed; no global generator to seed
            # where the target runs in a worker
            with seeded_generation(), unseeded_globals(_behind_boundary(spec, ctx)):
                _hypothesis_test(prop, spec, ctx, state)()
        except ShrinkStopped:  # the smallest failure the shrink reached in its budget
            failures.append(state.shrink.best)
            state.shrink_stopped = state.shrink.spent
        except Exception as exc:  # noqa: BLE001 - classified below
            reraise_interrupt(exc)  # Hypothesis interrupted before its engine began, say
            exc = _unwrap(exc)
            failures.append((getattr(exc, "attnverify_case", state.last), exc))
        raise_if_swallowed()  # a stop that something caught and went on from
    except KeyboardInterrupt as stop:  # a failure in hand (the battery's, the shrink's): kept
        in_hand = failures + ([state.shrink.best] if state.shrink.best is not None else [])
        if not in_hand:
            raise
        state.last, exc = _smallest(in_hand)
        raise Interrupted(stop, result=_failed(prop, spec, ctx, claimed, state, start, exc,
                                               interrupted=stop)) from None
    if state.deferred and not failures:
        verdict = _decide_deferred(state)
        if verdict is not None and verdict[0] == "not_applicable":
            return _finish(prop, claimed, "not_applicable", state, start, verdict[1], None,
                           spec, ctx)
        if verdict is not None:
            failures.append(verdict[1:])
    if not failures:
        return _finish(prop, claimed, "holds", state, start, "", None, spec, ctx)
    case, exc = _smallest(failures)
    found = exc
    try:
        sequence.prepare(prop, spec, exc)  # the fresh worker of _in_sequence, loaded meanwhile
        case, exc, state.reproduces = _exact_and_minimal(prop, spec, ctx, case, exc)
        if isinstance(found, Deferred) and type(exc) is type(found):
            exc = found  # the unit-wide message (how many other inputs were judged)
        state.last = case
        _in_sequence(prop, spec, ctx, state, case, exc)
        raise_if_swallowed()
    except KeyboardInterrupt as stop:  # the failure in hand is kept, as it was found
        state.last = case
        raise Interrupted(stop, result=_failed(prop, spec, ctx, claimed, state, start, exc,
                                               interrupted=stop)) from None
    return _failed(prop, spec, ctx, claimed, state, start, exc)


def _smallest(failures: list) -> tuple:
    """The normalizer's failures before any fault of the search (a flaky run, no valid case),
    then the smallest case, a violation before a raise."""
    return min(failures, key=lambda f: (not isinstance(f[1], (Violation, NormalizerError)),
                                         _size(f[0]), not isinstance(f[1], Violation)))


def _as_found(stop: KeyboardInterrupt) -> str:
    """What a failure's message adds when ``stop`` came before its case was shrunk."""
    return f" (as found: the run was {interrupt_word(stop)} before it was shrunk)"


def _failed(prop, spec, ctx, claimed, state, start, exc, interrupted=None) -> PropertyResult:
    """The result of a unit that failed with ``exc`` on ``state.last``; ``interrupted``: the
    run was stopped before that case was made exact, minimal and checked alone, which the
    message says."""
    note = "" if interrupted is None else _as_found(interrupted)
    if isinstance(exc, Violation):
        return _finish(prop, claimed, "violated", state, start, exc.message + note, exc, spec,
                       ctx)
    if isinstance(exc, NormalizerError):
        message = f"the normalizer raised {exc}"
    elif isinstance(exc, hypothesis.errors.Unsatisfiable):
        message = f"no valid case: {exc}"
    else:
        message = f"internal error in attnverify ({type(exc).__name__}: {_first_line(exc)})"
    result = _finish(prop, claimed, "error", state, start, message + note, None, spec, ctx)
    if isinstance(exc, NormalizerError):  # where in its own code (remote.TargetRaised)
        result.traceback = getattr(exc.cause, "traceback", None) or None
    return result


def _decide_deferred(state: _State):
    """The unit's verdict on the cases deferred to it (:class:`Deferred`), kind by kind: the
    first failure (its case the smallest of that kind's), else ``("not_applicable", why)`` when
    a kind says so, else ``None``."""
    verdicts = []
    for kind, hits in state.deferred.items():
        elsewhere = sum(len(h) for k, h in state.deferred.items() if k is not kind)
        smallest_first = sorted(hits, key=lambda hit: _size(hit[0]))
        verdict = kind.decide(smallest_first, state.examples, elsewhere)
        if verdict is not None:
            verdicts.append(verdict)
    failed = [v for v in verdicts if v[0] == "failed"]
    if failed:
        return failed[0]
    return verdicts[0] if verdicts else None


def _evaluate(prop: Property, spec, ctx, state: _State, case) -> float:
    state.examples += 1
    state.last = case
    state.coverage.add(case)
    heartbeat.example_started(case, sequence.step_of(prop.id))  # the watchdog's clock
    try:
        with coverage_recording(state.coverage):  # what the check exercised (shifts)
            ratio = float(prop.check(spec, case, ctx))
    except Deferred as exc:  # decided over every case of the unit (_decide_deferred)
        state.deferred.setdefault(type(exc), []).append((case, exc))
        return 0.0
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
        raise_if_swallowed()  # not one more case after a stop that something swallowed
        if not fuzz:
            state.shrink.check()
        try:
            ratio = _evaluate(prop, spec, ctx, state, case)
        except WorkerFailed as exc:
            if not fuzz:
                raise
            raise WorkerStopped(f"the normalizer {exc.reason}") from None
        except Exception as exc:
            reraise_interrupt(exc)  # a stop, never a failure to shrink
            if not fuzz:
                state.shrink.failed(case, exc)
            raise
        if math.isfinite(ratio) and _size(case) <= CLIMB_ENTRIES:
            hypothesis.target(min(ratio, 1e12), label=label)

    cases = prop.cases(spec, ctx)
    if not fuzz:  # certify bounds the shrink (HypoFuzz shrinks what it files in full)
        cases = _budgeted(cases, state.shrink)
    return given(cases)(body)


@st.composite
def _budgeted(draw, cases, budget: ShrinkBudget):
    """``cases``, each draw counted by ``budget`` first: a call of the test that the shrink
    makes whether or not its case reaches the body (:meth:`ShrinkBudget.drawn`)."""
    budget.drawn()
    return draw(cases)


def database_key_of(prop: Property, spec: NormalizerSpec, ctx: Context) -> bytes:
    """The example-database key of ``prop``'s search on ``spec`` under ``ctx``: the target
    string, its parameters, the property and the dtypes the cases take (the unit's one, else the
    run's), with attnverify's version (:func:`attnverify.exampledb.database_key`). ``certify
    --database`` and :mod:`attnverify.fuzz` file and replay examples under it."""

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
    if getattr(exc, "case", None) is not None:  # the failure is another case's (an earlier call)
        case = exc.case
    elif prop.verify is not None and isinstance(given, torch.Tensor) and "scores" in fields:
        case = case._replace(scores=given.detach().clone())
    if not isinstance(exc, (Violation, NormalizerError)):
        return case, exc, True

    stopped: list[WorkerFailed] = []

    def recheck(candidate):
        if stopped:  # the worker died or hung on a candidate: shrink no further
            raise _ShrinkStopped()
        # shrinking runs under the same time limit
        heartbeat.example_started(candidate, sequence.step_of(prop.id, "recheck"))
        try:
            return prop.recheck(spec, candidate, ctx)
        except WorkerFailed as failed:
            stopped.append(failed)
            raise _ShrinkStopped() from None
        finally:
            heartbeat.example_finished()

    small, small_exc = (prop.shrink or shrink)(recheck, case, exc,
                                               vary_temperature=ctx.temperature is None)
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


def _in_sequence(prop, spec, ctx, state: _State, case, exc) -> None:
    """Whether ``case`` fails again alone in a fresh worker, else the fewest earlier examples
    it needs (:func:`attnverify.sequence.find`): ``state.sequence`` and ``state.reproduces``.
    ``exc`` ``None``: an output refused at the border."""
    if case is None:
        return
    found = sequence.find(prop, spec, ctx, case, exc)
    if found is not None:
        state.sequence, state.reproduces = found.steps, found.reproduces


def repro_for(spec: NormalizerSpec, case_json: dict, prop_id: str, seed: int = 0) -> str:
    """The ``attnverify repro`` line that re-checks ``prop_id`` on ``case_json`` (with the
    spec's reference when it names one, and the run's seed)."""
    attention = getattr(spec.fn, "attention", None)
    if attention is not None and case_json.get("sequence"):
        return attention_repro_for(attention, case_json, prop_id, seed)
    reference = getattr(spec, "reference", None)
    return repro_command(spec.target or spec.id, case_json, property=prop_id,
                         reference=reference if isinstance(reference, str) else None,
                         seed=seed)


def attention_repro_for(a, case_json: dict, prop_id: str, seed: int = 0) -> str:
    """The ``attnverify repro TARGET --attention`` line of an attention kernel ``a``'s failure
    that needs earlier calls: the kernel in one fresh worker of its own (as certify ran it),
    the earlier calls replayed there, lifted or attention-level alike, then the case (an
    attention case by its recipe) re-checked."""
    if case_json.get("case") == "AttnCase":
        case_json = {"case": "AttnCase", "recipe": case_json["recipe"],
                     "sequence": case_json["sequence"]}
    case_json = {**case_json, "params": {k: jsonable(v) for k, v in dict(a.params).items()}}
    return repro_command(a.target or a.id, case_json, property=prop_id, attention=True,
                         reference=a.reference or None, seed=seed)


def _finish(prop, claimed, status, state, start, message, violation, spec, ctx) -> PropertyResult:
    worst = state.worst
    counterexample = None
    if status in ("violated", "error") and state.last is not None:
        counterexample = describe_case(state.last, spec)
        case_json = dict(counterexample)
        if violation is not None:  # a ratio that is not a number (NaN weights) stays one
            worst = _largest([worst, violation.ratio])
            counterexample.update(jsonable({
                "observed": violation.observed, "bound": violation.bound,
                "ratio": violation.ratio, **violation.details,
            }))
        if state.sequence:
            counterexample["sequence"] = case_json["sequence"] = sequence.encode(
                state.sequence, spec.params)
        if not state.reproduces:
            counterexample["reproduces"] = False
        if state.shrink_stopped is not None:
            counterexample["shrink_stopped_after"] = state.shrink_stopped
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
