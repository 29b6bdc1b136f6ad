"""``attnverify falsify``: search for the smallest input that breaks a proposed inequality.

The search (:mod:`attnverify.falsify_search`) spends a budget of evaluations of the inequality:
an extremal battery (two- and three-level rows, ties, one-hot-like rows, on a grid of lengths
and of ``a/T``, masked, at temperatures below and above 1), then one seeded Hypothesis run per
stratum of row lengths with ``hypothesis.target`` on LHS/RHS, then a bounded Nelder–Mead polish
(``scipy.optimize``) from the best case of each stratum. The first case that fails ends the search
and is shrunk (fewest keys, simplest values, T = 1) into the reported witness. The result says how
hard the search looked: evaluations per phase, every stratum with its evaluations and best ratio,
the witness, where and when it was first met, and the time.

A case fails when ``LHS > RHS + atol + rtol·|RHS|`` with the float64 row of the tolerance table;
a strict ``LHS < RHS`` fails when ``LHS ≥ RHS`` (no tolerance either way); either only beyond
the rounding of the quantities: in interval arithmetic over each quantity's rounding interval
(:func:`attnverify.quantities.rounding_errors`), the whole LHS interval must lie past the whole
RHS interval (:meth:`attnverify.expr.Inequality.judge`). A NaN quantity (the normalizer's
output) fails. Where the expression itself has no value (0·log 0, log of a negative, 0/0), or
might have none within the rounding (``log1p(-sum_weight)`` with ``sum_weight`` rounded to 1),
the case is counted as *undefined*, not as a failure, and the first such case is reported.
Quantities are defined over the unmasked keys (:mod:`attnverify.quantities`). ``--params
temperature=…`` fixes T for every case. Quantities that need an entry-wise Jacobian limit the
row length (:data:`JACOBIAN_MAX_L`).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

import attnverify
from attnverify import campaign, precise
from attnverify.campaign import sharing, summary_lines
from attnverify.certify import fix_temperature, make_context
from attnverify.checks.base import Context
from attnverify.errors import UsageError, raise_if_swallowed, reraise_interrupt
from attnverify.exampledb import open_database
from attnverify.expr import Inequality, over_ranges, parse_inequality
from attnverify.falsify_search import (
    BATTERY_SHARE,
    ENTRYWISE,
    JACOBIAN_MAX_L,
    KINDS,
    STRATA_SHARE,
    Budget,
    Evaluation,
    FalsifyCase,
    Search,
    StratumRecord,
    _Crossed,
    _Spent,
    evaluate,
    max_length_for,
    merit,
    run_battery,
    run_polish,
    run_strata,
    shape_of,
    shrink_witness,
)
from attnverify.jacobian import intra_op_threads
from attnverify.quantities import (
    LAMBDA_PARAMS,
    OUTPUT_RANGES,
    QUANTITIES,
    RANGE_SPACE,
    quantity_ranges,
)
from attnverify.registry import NormalizerSpec, builtins, load_target, parse_params
from attnverify.report import check_writable, with_traceback, write_json
from attnverify.runconfig import PROFILES, falsify_budget
from attnverify.serialize import number, repro_command
from attnverify.tolerances import tol_for
from attnverify.worker import user_traceback

__all__ = ["ENTRYWISE", "JACOBIAN_MAX_L", "KINDS", "Evaluation", "FalsifyCase", "FalsifyResult",
           "SearchReport", "evaluate", "falsify", "make_search", "repro", "rerun", "result_json",
           "shape_of", "summary"]

#: The phases of a search, in order, with their share of the evaluations left (None: all).
PHASES = (("battery", BATTERY_SHARE, run_battery), ("strata", STRATA_SHARE, None),
          ("polish", None, run_polish))


@dataclass
class SearchReport:
    """How hard a search looked (added by issue #18)."""

    budget: Budget
    evaluations: int
    by_phase: dict[str, int]
    strata: list[StratumRecord]
    stopped: str  # "witness", "budget" (evaluations spent) or "time" (the time cap)
    search_s: float
    first_witness: Evaluation | None = None
    first_witness_evaluation: int = 0
    first_witness_s: float = 0.0
    first_witness_phase: str = ""
    shrink_evaluations: int = 0
    #: Cases with a side at ±inf, and whether every case with a value had one (a vacuous bound).
    infinite: int = 0
    vacuous: bool = False
    #: Cases float64 could not decide (the sides within the rounding of their quantities), and
    #: the first; of those, the ones decided in higher precision and the ones it could not
    #: decide either (issue #25.7), each with the first.
    within_rounding: int = 0
    rounding_example: Evaluation | None = None
    precise_decided: int = 0
    precise_example: Evaluation | None = None
    precise_undecided: int = 0
    undecided_example: Evaluation | None = None
    #: Set when attnverify's own work on one case (the quantities) took longer than the
    #: per-example limit of the target's calls: what, in a sentence.
    checker_overrun: str | None = None

    def to_json(self) -> dict[str, Any]:
        first = None
        if self.first_witness is not None:
            first = dict(self.first_witness.to_json(), evaluation=self.first_witness_evaluation,
                         seconds=round(self.first_witness_s, 3), phase=self.first_witness_phase)
        return {
            "budget": {"evaluations": self.budget.evaluations, "seconds": self.budget.seconds,
                       "max_length": self.budget.max_length},
            "evaluations": self.evaluations,
            "phases": dict(self.by_phase),
            "stopped": self.stopped,
            "search_s": round(self.search_s, 3),
            "strata": [r.to_json() for r in self.strata],
            "first_witness": first,
            "shrink_evaluations": self.shrink_evaluations,
            "infinite_side": self.infinite,
            "vacuous": self.vacuous,
            "within_rounding": self.within_rounding,
            "rounding_example": None if self.rounding_example is None
            else self.rounding_example.to_json(),
            "high_precision": {
                "decided": self.precise_decided,
                "undecided": self.precise_undecided,
                "undecided_reason": None if self.undecided_example is None
                else self.undecided_example.undecided_reason,
            },
        }


@dataclass
class FalsifyResult:
    target: str
    inequality: Inequality
    falsified: bool
    examples: int  # evaluations of the inequality by the search (shrinking not counted)
    elapsed_s: float
    worst: Evaluation | None
    witness: Evaluation | None
    params: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    #: Cases where the expression had no value (0·log 0, …), and the first of them.
    undefined: int = 0
    undefined_example: Evaluation | None = None
    #: How hard the search looked (issue #18).
    search: SearchReport | None = None
    #: The example database shared with other runs (``--database``, issue #19): where, what was
    #: replayed and saved, whether it was lost (:meth:`attnverify.campaign.Shared.to_json`).
    database: dict[str, Any] | None = None
    #: What the target's worker processes ran under (:mod:`attnverify.sandbox`); ``None``: the
    #: target ran in this process (``--no-isolation``, or a spec given in Python).
    sandbox: str | None = None
    #: The bound decided over the whole ranges of its quantities before any search (issue
    #: #28.13): ``None``, or what :func:`decide_by_ranges` found.
    ranges: RangeDecision | None = None
    #: Warnings the target's own calls raised in its worker (issue #28.1), once each.
    target_warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RangeDecision:
    """A bound that holds (or fails) at every point of its quantities' ranges."""

    verdict: str  # "holds" | "fails"
    ranges: dict[str, tuple[float, float]]
    lhs: tuple[float, float]
    rhs: tuple[float, float]
    #: Where the ranges of the weights come from: the built-in and its output space.
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "source": self.source or None,
                "ranges": {k: [number(a), number(b)] for k, (a, b) in self.ranges.items()},
                "lhs": [number(v) for v in self.lhs], "rhs": [number(v) for v in self.rhs]}

    def text(self) -> str:
        """``max_weight in [0, 1] (softmax: simplex): LHS in [0, 1], RHS in [1000, 1000]``."""
        where = ", ".join(f"{k} {_span(a, b)}" for k, (a, b) in self.ranges.items())
        return (f"{where}{f' ({self.source})' if self.source else ''}: LHS "
                f"{_span(*self.lhs)}, RHS {_span(*self.rhs)}")


def _span(lo: float, hi: float) -> str:
    """``= 1`` or ``in [0, 1]``."""
    return f"= {lo:.6g}" if lo == hi else f"in [{lo:.6g}, {hi:.6g}]"


def decide_by_ranges(spec: NormalizerSpec, ineq: Inequality, ctx: Context,
                     params: dict[str, Any]) -> RangeDecision | None:
    """The bound over the ranges its quantities take on every input
    (:func:`attnverify.quantities.quantity_ranges`: the input's own quantities for any target,
    the weights' only for a built-in, by its output space; ``T`` fixed or any positive number;
    ``lambda`` the parameter), in interval arithmetic (:func:`attnverify.expr.over_ranges`):
    a :class:`RangeDecision` where it holds (or fails) at every point, else None."""
    builtin = precise.builtin_of(spec)
    space = None
    if builtin is not None:
        space = RANGE_SPACE.get(builtin, builtins()[builtin].space)
    if spec.takes_temperature and ctx.temperature is None:
        temperature = (5e-324, sys.float_info.max)
    elif spec.takes_temperature:
        temperature = (float(ctx.temperature), float(ctx.temperature))
    else:
        temperature = (1.0, 1.0)
    merged = {**dict(spec.params), **dict(params or {})}
    lam = next((float(merged[k]) for k in LAMBDA_PARAMS if k in merged), 0.0)
    ranges = quantity_ranges(ineq.names, space=space, temperature=temperature, lam=lam)
    if ranges is None:
        return None
    t = tol_for(torch.float64)
    verdict, lhs, rhs = over_ranges(ineq, ranges, rtol=t.rtol, atol=t.atol)
    if verdict is None:
        return None
    source = ""
    if builtin is not None and ineq.names & set(OUTPUT_RANGES.get(space, {})):
        source = f"{builtin}'s output space: {space}"
    return RangeDecision(verdict, dict(ranges), lhs, rhs, source)


def search_budget(ctx: Context, ineq: Inequality) -> Budget:
    """The budget of a search of ``ineq`` under ``ctx``: evaluations and seconds from
    :func:`attnverify.runconfig.falsify_budget`, the longest row from the context (at most
    :data:`JACOBIAN_MAX_L` for entry-wise Jacobian quantities)."""
    evaluations, seconds = falsify_budget(ctx)
    return Budget(evaluations, seconds, max_length_for(ineq, ctx.max_length))


def make_search(spec: NormalizerSpec, ineq: Inequality, ctx: Context,
                params: dict[str, Any] | None = None) -> Search:
    """A fresh :class:`~attnverify.falsify_search.Search` of ``ineq`` on ``spec`` under ``ctx``
    (its budget from :func:`search_budget`; T fixed when ``ctx`` fixes it)."""
    return Search(ctx, spec, ineq, dict(params or {}), search_budget(ctx, ineq),
                  takes_temperature=bool(spec.takes_temperature),
                  fixed_temperature=ctx.temperature)


def falsify(spec: NormalizerSpec, text: str, ctx: Context, *, label: str | None = None,
            params: dict[str, Any] | None = None) -> FalsifyResult:
    """Search for a case where the inequality ``text`` fails (see the module docstring).

    Inside :func:`attnverify.campaign.sharing` (``--database``, ``--workers``) the search first
    replays what the database holds for this bound, keeps every witness (the moment it is met,
    then shrunk) and its best cases there, and gives the strata's Hypothesis runs the database;
    it also stops before an evaluation when the shared ``stop`` says so.

    The search runs on one torch thread (restored afterwards): its tensors are single rows, where
    a parallel op's thread barriers cost more than they save, and behind the process boundary
    the worker computes on the other core."""
    with intra_op_threads(1):
        return _falsify(spec, text, ctx, label=label, params=params)


def _falsify(spec: NormalizerSpec, text: str, ctx: Context, *, label: str | None,
             params: dict[str, Any] | None) -> FalsifyResult:

    ineq = parse_inequality(text, QUANTITIES)
    shared = campaign.current()
    params = dict(params or {})
    if params.get("temperature") is not None and ctx.temperature is None:
        ctx = fix_temperature(ctx, params)
    start = time.perf_counter()
    search = make_search(spec, ineq, ctx, params)
    ranged = decide_by_ranges(spec, ineq, ctx, params)
    key = "|".join([label or str(spec.id), ineq.normalized,
                    ",".join(f"{k}={v}" for k, v in sorted(params.items()))])
    database = None
    phases = PHASES
    if shared is not None:
        campaign.begin(shared, label or str(spec.id), ineq.normalized, params)
        search.stop = shared.stop
        database = shared.database
        phases = (("replay", None, lambda s: campaign.replay(shared, s)), *PHASES)
    if ranged is not None and ranged.verdict == "holds":
        phases, search.stopped = (), "ranges"  # nothing to search: every input holds
    for name, share, run in phases:
        raise_if_swallowed()
        if search.left() <= 0 or search.stopped in ("time", "stopped"):
            break
        search.begin(name, share)
        try:
            if run is None:
                run_strata(search, ctx.seed, key, database=database)
            else:
                run(search)
        except _Spent:
            continue
        except _Crossed:
            break
    if shared is not None and search.witness is not None:
        campaign.save_witness(shared, search.witness)  # before shrinking: an interrupt keeps it
        shared.witness_replayed = search.witness_phase == "replay"
    raise_if_swallowed()  # a stop that a phase's library caught and went on from
    search_s = time.perf_counter() - start
    report = SearchReport(search.budget, search.evaluations, dict(search.by_phase),
                          search.records, search.stopped, search_s, infinite=search.infinite,
                          vacuous=search.vacuous(), within_rounding=search.within_rounding,
                          rounding_example=search.rounding_example,
                          precise_decided=search.precise_decided,
                          precise_example=search.precise_example,
                          precise_undecided=search.precise_undecided,
                          undecided_example=search.undecided_example)
    report.checker_overrun = _checker_overrun(search, ctx)
    witness = search.witness
    if witness is not None:
        report.first_witness = witness
        report.first_witness_evaluation = search.witness_evaluation
        report.first_witness_s = search.witness_s
        report.first_witness_phase = search.witness_phase
        free_t = bool(spec.takes_temperature) and ctx.temperature is None
        witness, report.shrink_evaluations = shrink_witness(search, witness, free_t)
        if shared is not None:
            campaign.save_witness(shared, witness)
    elif shared is not None:
        campaign.save_near(shared, search)
    worst = search.worst
    if witness is not None and (worst is None or merit(witness) > merit(worst)):
        worst = witness  # the shrunk witness can break the bound by more than the first case
    return FalsifyResult(
        target=label or spec.id, inequality=ineq, falsified=witness is not None,
        examples=search.evaluations, elapsed_s=time.perf_counter() - start, worst=worst,
        witness=witness, params=dict(params), undefined=search.undefined,
        undefined_example=search.undefined_example, search=report,
        database=None if shared is None else shared.to_json(), ranges=ranged,
    )


def _num(v: float) -> Any:
    return number(v)


def _checker_overrun(search: Search, ctx: Context) -> str | None:
    """A sentence when attnverify's own computation on one case took longer than the target's
    per-example limit (``--timeout``), which only the target's calls are held to."""
    slow = search.slowest_checker
    if slow is None or not ctx.isolation or slow[0] <= ctx.timeout_s:
        return None
    checker_s, target_s, length = slow
    return (f"attnverify's own computation of the quantities took {checker_s:.1f}s on one case "
            f"(L={length}), longer than the per-example limit of the normalizer's calls "
            f"(--timeout {ctx.timeout_s:g}s), which took {target_s:.1f}s of it: the time is "
            "attnverify's, not the normalizer's (a lower --max-length shortens it)")


def _ratio_json(ev: Evaluation | None) -> Any:
    """LHS/RHS of a case, or None: no case, or RHS ≤ 0 there (no meaningful ratio)."""
    return None if ev is None or math.isnan(ev.ratio) else number(ev.ratio)


def _margin_json(ev: Evaluation | None) -> Any:
    return None if ev is None or math.isnan(ev.margin) else number(ev.margin)


def _ratio_text(ev: Evaluation) -> str:
    """``ratio 1.06``, or where RHS ≤ 0 ``margin 0.01 (RHS ≤ 0: no ratio)``."""
    if math.isnan(ev.ratio):
        return f"margin {ev.margin:.4g} (RHS <= 0: no ratio)"
    return f"ratio {ev.ratio:.4g}"


def notes(res: FalsifyResult) -> list[str]:
    """What the verdict alone does not say: no case evaluated, a vacuous bound, cases broken only
    within rounding, the checker's own time past the per-example limit (console and JSON)."""
    out = []
    report = res.search
    if report is None:
        return out
    if res.ranges is not None:
        word = {"holds": "holds for every input", "fails": "fails for every input"}
        out.append(f"{word[res.ranges.verdict]}, decided by the quantities' ranges before any "
                   f"search: {res.ranges.text()}")
    if report.evaluations == 0 and res.ranges is None:
        why = {"time": "the time cap (--budget) stopped the search before its first case",
               "stopped": "another worker's witness stopped it first"}.get(
            report.stopped, "the budget allowed none")
        out.append(f"no case was evaluated ({why}): nothing was checked")
    elif report.vacuous and not res.falsified:
        out.append(f"vacuous: a side was infinite on every one of the {report.infinite} cases "
                   "with a value (the bound, as written, says nothing there)")
    held = report.precise_decided - (1 if res.witness is not None
                                     and res.witness.decided_by == "mpmath" else 0)
    if report.precise_decided:
        ev = report.precise_example
        out.append(f"{_count(report.precise_decided, 'case')} within the rounding of the "
                   "quantities (float64 cannot decide there) "
                   f"{'was' if report.precise_decided == 1 else 'were'} decided in higher "
                   f"precision (mpmath, {ev.precise.bits}-bit intervals, on the same input)"
                   f"{'' if held <= 0 else f'; {held} held'}, e.g. L={_live(ev)}: "
                   f"{ev.precise.text()} ({ev.precise.verdict})")
    if report.precise_undecided:
        ev = report.undecided_example
        out.append(f"{_count(report.precise_undecided, 'case')} held or broke the bound by no "
                   "more than the rounding of the quantities can explain, and higher precision "
                   f"could not decide {'it' if report.precise_undecided == 1 else 'them'} "
                   f"({ev.undecided_reason}): read as holding, not as violations, e.g. "
                   f"L={_live(ev)}: LHS={ev.lhs:.6g} RHS={ev.rhs:.6g}")
    slow = getattr(report, "checker_overrun", None)
    if slow:
        out.append(slow)
    return out


# --------------------------------------------------------------------------------------------
# Command


def result_json(res: FalsifyResult, ctx: Context) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "attnverify_version": attnverify.__version__,
        "torch_version": torch.__version__,
        "target": res.target,
        "inequality": res.inequality.text,
        "normalized": res.inequality.normalized,
        "params": {k: v if not isinstance(v, float) else _num(v) for k, v in res.params.items()},
        "profile": ctx.profile,
        "seed": ctx.seed,
        "falsified": res.falsified,
        "examples": res.examples,
        "elapsed_s": round(res.elapsed_s, 3),
        "worst_ratio": _ratio_json(res.worst),
        "worst_margin": _margin_json(res.worst),
        "worst_case": res.worst.to_json() if res.worst else None,
        "witness": res.witness.to_json() if res.witness else None,
        "undefined": res.undefined,
        "undefined_example": res.undefined_example.to_json() if res.undefined_example else None,
        "repro": repro(res, ctx),
        "rerun": rerun(res, ctx),
        "search": res.search.to_json() if res.search else None,
        "decided_by_ranges": None if res.ranges is None else res.ranges.to_json(),
        "notes": notes(res),
        "database": res.database,
        "workers": None,
        # where the target ran: "process" (a worker process, sandboxed as "sandbox" says) or
        # "in-process" (--no-isolation)
        "isolation_mode": "process" if res.sandbox is not None else "in-process",
        "sandbox": res.sandbox,
        "target_warnings": list(res.target_warnings),
    }


def repro(res: FalsifyResult, ctx: Context) -> str:
    """The witness's repro (:func:`attnverify.serialize.repro_command`): re-evaluates the
    inequality on the witness and exits 1; without a witness, the search again."""
    if res.witness is None:
        return rerun(res, ctx)
    return repro_command(res.target, res.witness.case_json(res.params),
                         inequality=res.inequality.text)


def rerun(res: FalsifyResult, ctx: Context) -> str:
    """The command that runs the same search again (with the budget options that were set)."""

    params = ",".join(f"{k}={v}" for k, v in res.params.items() if v is not None)
    extra = f" --params {params}" if params else ""
    if getattr(ctx, "falsify_evaluations", None):
        extra += f" --max-examples {ctx.falsify_evaluations}"
    if getattr(ctx, "budget_s", None):
        extra += f" --budget {ctx.budget_s:g}"
    if ctx.max_length != PROFILES.get(ctx.profile, {}).get("max_length", ctx.max_length):
        extra += f" --max-length {ctx.max_length}"
    return (f"attnverify falsify {res.target} \"{res.inequality.text}\"{extra} "
            f"--profile {ctx.profile} --seed {ctx.seed}")


def summary(res: FalsifyResult, ctx: Context) -> str:
    lines = []
    head = "FALSIFIED" if res.falsified else "not falsified"
    if not res.falsified and res.ranges is not None and res.ranges.verdict == "holds":
        head = "holds for every input (decided by the quantities' ranges)"
    elif not res.falsified and res.examples == 0:
        head = "not checked"  # notes() says why
    lines.append(f"{head}: {res.inequality.text.strip()}  [{res.target}]  "
                 f"({_count(res.examples, 'evaluation')}, {res.elapsed_s:.1f}s, "
                 f"profile {ctx.profile}, "
                 f"seed {ctx.seed})")
    if res.witness:
        w = res.witness
        scores = ", ".join(f"{v:.6g}" for v in w.case.scores.tolist()[:16])
        more = " …" if w.case.scores.numel() > 16 else ""
        t = "" if w.case.temperature is None else f", T={w.case.temperature:g}"
        shape = shape_of(w.case.scores)
        kind = f"{shape} (kind {w.case.kind})" if shape else f"kind {w.case.kind}"
        lines.append(f"  minimal witness: L={w.case.scores.numel()}{t}, {kind}, "
                     f"scores=[{scores}{more}]")
        vals = ", ".join(f"{k}={v:.6g}" for k, v in w.values.items())
        lines.append(f"  at the witness: {vals}; LHS={w.lhs:.6g} RHS={w.rhs:.6g} "
                     f"{_ratio_text(w).replace('ratio ', 'ratio=', 1)}")
        if w.decided_by == "mpmath":
            lines.append(f"  decided in higher precision (float64 alone cannot tell there): "
                         f"mpmath, {w.precise.bits}-bit intervals on the same input: "
                         f"{w.precise.text()}")
    report = res.search
    if report is not None and report.first_witness is not None:
        first = report.first_witness
        lines.append(f"  first met by the {report.first_witness_phase} at evaluation "
                     f"{report.first_witness_evaluation} ({report.first_witness_s:.2f}s), "
                     f"L={first.case.scores.numel()}, {_ratio_text(first)}; shrunk in "
                     f"{_count(report.shrink_evaluations, 'evaluation')}")
    if res.worst:
        w = res.worst
        where = f"(L={w.case.scores.numel()}, kind {w.case.kind})"
        if math.isnan(w.ratio):
            lines.append(f"  worst case found: margin {w.margin:.6g}, LHS={w.lhs:.6g} "
                         f"RHS={w.rhs:.6g} (RHS <= 0 or no value: no ratio) {where}")
        else:
            lines.append(f"  worst ratio LHS/RHS found: {w.ratio:.6g} (margin {w.margin:.3g}) "
                         f"{where}")
    if res.undefined_example is not None:
        u = res.undefined_example
        vals = ", ".join(f"{k}={v:.6g}" for k, v in u.values.items())
        lines.append(f"  undefined on {res.undefined} cases (the expression has no value there, "
                     f"or only the rounding of the quantities gives it one: not a violation), "
                     f"e.g. at {vals}")
    lines.extend(f"  note: {n}" for n in notes(res))
    lines.extend(warning_lines(res.target_warnings))
    if report is not None:
        lines.extend(_search_lines(report))

    lines.extend(summary_lines(res.database))
    lines.append(f"  repro: {repro(res, ctx)}")
    return "\n".join(lines)


def warning_lines(warned: list[str], shown: int = 3) -> list[str]:
    """``the target warned: …`` for the first warnings the target's calls raised (issue #28.1:
    reported as the target's, never printed as attnverify's)."""
    out = [f"  the target warned: {w}" for w in warned[:shown]]
    if len(warned) > shown:
        out.append(f"  the target warned {len(warned) - shown} more time(s) (all in the JSON)")
    return out


def _live(ev: Evaluation) -> int:
    """The unmasked keys of a case (the ``L`` of the quantities)."""
    return int(torch.isfinite(ev.case.scores).sum())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


_STOPPED = {"witness": "stopped at the first witness", "budget": "evaluations spent",
            "time": "stopped by the time cap (--budget)",
            "stopped": "stopped: another worker found a witness",
            "ranges": "not searched: the quantities' ranges decide the bound"}


def _search_lines(report: SearchReport) -> list[str]:
    """The console's account of the search: phases, then one line per stratum explored."""
    phases = ", ".join(f"{name} {n}" for name, n in report.by_phase.items()) or "none"
    b = report.budget
    out = [f"  search: {report.evaluations} of {b.evaluations} evaluations ({phases}), "
           f"{report.search_s:.1f}s of {b.seconds:g}s, rows up to {b.max_length} keys; "
           f"{_STOPPED.get(report.stopped, report.stopped)}"]
    rows = [r for r in report.strata if r.evaluations]
    if rows:
        width = max(len("stratum"), *(len(r.stratum.name) for r in rows))
        out.append(f"    {'stratum'.ljust(width)}  evaluations  best ratio  best margin")
        for r in rows:
            best = "-" if r.best is None or math.isnan(r.best.ratio) else f"{r.best.ratio:.6g}"
            m = "-" if r.best is None or math.isnan(r.best.margin) else f"{r.best.margin:.3g}"
            out.append(f"    {r.stratum.name.ljust(width)}  {r.evaluations:>11}  "
                       f"{best:>10}  {m:>11}")
    return out


def run_search(target: str, params: dict[str, Any], text: str, ctx, shared=None, *,
               isolated=None, tracebacks: bool = False) -> FalsifyResult | str:
    """One search of ``text`` on ``target``: its result, or the report of a search that the code
    under test stopped (``tracebacks``: with the target's own traceback where it raised).
    ``isolated(target, params, text, ctx)`` runs it with the target in a worker process
    (:func:`attnverify.isolation.falsify_isolated`: a result or an
    :class:`~attnverify.isolation.Stopped`); None loads the target here. ``shared``
    (:class:`attnverify.campaign.Shared`): the database it replays and fills."""

    with sharing(shared):
        if isolated is not None:  # loaded in a worker process (in this one: --no-isolation)
            res = isolated(target, params, text, ctx)
            if isinstance(res, tuple):
                return _stopped(res.message, res.case, res.traceback, tracebacks)
        else:
            spec = load_target(target, params)
            try:
                res = falsify(spec, text, ctx, label=target, params=params)
            except UsageError:
                raise
            except Exception as exc:  # noqa: BLE001 - most likely the normalizer raising
                reraise_interrupt(exc)  # a stop that a library turned into another error
                line = f"error: the search stopped on {type(exc).__name__}: {exc}"
                return _with_traceback(line.splitlines()[0],
                                       user_traceback(exc.__cause__ or exc), tracebacks)
    res.params = params
    return res


def run_falsify_command(args, isolated=None) -> int:
    """The ``falsify`` command. ``isolated(target, params, text, ctx)`` runs the search in a
    worker process (:func:`attnverify.isolation.falsify_in_worker`; the command line passes it)
    and returns the result, or ``(message, case)`` when the code under test stopped it.
    ``--database`` and ``--workers``: :mod:`attnverify.campaign`."""

    ctx = make_context(args.profile, max_examples=args.max_examples, seed=args.seed,
                       timeout=args.timeout, isolation=False if args.no_isolation else None,
                       budget=args.budget, max_length=args.max_length)
    check_writable(args.json_path, "--json")
    params = parse_params(args.params)

    ctx = fix_temperature(ctx, params)  # a bad temperature is exit 2, before any work
    parse_inequality(args.inequality, QUANTITIES)  # a usage error before any work
    workers = campaign.check_workers(getattr(args, "workers", 1) or 1)
    database_text = getattr(args, "database", None)
    database = None if database_text is None else open_database(database_text)  # exit 2 here
    if workers > 1:
        if database is not None:
            database.close()  # checked; each worker opens its own connection
        args.workers = workers
        data, text, code = campaign.run_workers(args, ctx, params, database_text)
        print(text)
        if args.json_path and data:
            write_json(args.json_path, data)
        return code
    shared = None if database is None else campaign.Shared(database)
    try:
        res = run_search(args.target, params, args.inequality, ctx, shared, isolated=isolated,
                         tracebacks=bool(getattr(args, "traceback", False)))
    finally:
        if database is not None:
            database.close()
    if isinstance(res, str):
        print(res)
        return 1
    print(summary(res, ctx))
    if args.json_path:
        write_json(args.json_path, result_json(res, ctx))
    return 1 if res.falsified else 0


def _stopped(message: str, case: dict | None, traceback: list[str] | None = None,
             tracebacks: bool = False) -> str:
    """The report of a search that the code under test stopped (exit 1): why, the input in
    flight, and the target's own traceback where it raised (``tracebacks``; else a pointer to
    ``--traceback``)."""
    line = _with_traceback(f"error: the search stopped: {message}", traceback, tracebacks)
    if case:
        scores = ", ".join(f"{v:.6g}" for v in case["scores"][:16])
        more = " …" if len(case["scores"]) > 16 else ""
        t = "" if case["temperature"] is None else f", T={case['temperature']:g}"
        line += f"\n  input: L={case['L']}{t}, kind {case['kind']}, scores=[{scores}{more}]"
    return line


def _with_traceback(line: str, traceback: list[str] | None, tracebacks: bool) -> str:
    """``line`` with the target's own traceback (:func:`attnverify.report.with_traceback`)."""
    return "\n".join(with_traceback(line, traceback, tracebacks, "  "))
