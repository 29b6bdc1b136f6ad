"""The search behind ``attnverify falsify``: extremal battery, stratified Hypothesis, numeric
polish, then shrinking of the first case that crosses the bound.

Every evaluation of the inequality goes through one :class:`Search`, which counts it against the
budget (evaluations, and seconds as a safety net), files it under its *stratum* (a band of
unmasked row lengths, masked or not) and stops the search at the first case that fails. What
the search climbs is the signed *margin* of a case (:func:`attnverify.expr.margin`:
``(LHS − RHS − slack)/(|LHS| + |RHS| + slack)``, positive beyond the bound), which ranks cases
whatever the signs of the sides: a bound whose right-hand side is ≤ 0 is searched like any other.
The phases, in order, each with a share of the evaluations the previous ones left:

1. **battery** (:func:`battery`): rows whose logits take two or three levels (``k`` keys at
   ``+a``, the rest at ``−a``, at ``0``, …), ties, a zero row and one-hot-like rows (one key
   ``+a`` above ``L − 1`` at ``−a``, at large ``a/T``), for the row lengths of
   :data:`LENGTH_GRID` and ``a/T`` on the log grid :data:`RATIO_GRID` (1e-3 … 3e2), with masked
   variants (1, L, 3L and 15L masked keys: :data:`PAD_GRID`) and temperatures well below and
   above 1 (:data:`TEMPERATURE_GRID`). Bounds over logits in ``[−a, a]`` take their extremes at
   vertices of the box and at ties, whatever the normalizer and the quantity. Sweeps come first
   (:func:`sweeps`): one meets every (length, a/T) pair once, the next every (length,
   temperature) and (length, padding) pair; then the lengths are covered in full, a few cases
   of each length in turn.
2. **strata** (:func:`stratum_cases`): one seeded Hypothesis run per stratum with its own
   ``hypothesis.target`` label, so a stratum where the bound is trivially tight (``L = 1``) cannot
   take the whole search. Rows are drawn as a few levels with counts, as free values (short rows)
   or as one of the adversarial kinds of :func:`attnverify.strategies.logit_rows`, scaled so that
   ``a`` is the drawn magnitude; masked strata add up to 15·L masked keys.
3. **polish** (:func:`run_polish`): from the best few distinct cases of each stratum
   (:data:`TOP_PER_STRATUM`), and from two-level splits of a tied or nearly tied one (``k`` keys
   up, ``L − k`` down, for ``k`` = 1, L/2, L − 1, 2), a bounded Nelder–Mead
   (``scipy.optimize.minimize``) maximises the margin over the row's levels (keys of a group
   move together; rows with many distinct values move in eight quantile groups), ``a/T`` and
   the temperature where it is free, at fixed ``L`` and mask.

A failing case ends the search and goes to shrinking (:func:`shrink_witness`, the greedy shrinker
of :mod:`attnverify.checks.shrink`: fewer keys, simpler values, temperature 1). A case fails only
beyond the tolerance and beyond the rounding of its quantities
(:meth:`attnverify.expr.Inequality.judge` with :func:`attnverify.quantities.rounding_errors`).
The same seed gives the same evaluations in the same order, so the count budget, not the clock,
decides what is found (the clock only stops a search that runs far past its profile's time).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import hypothesis
import numpy as np
import torch
from hypothesis import Phase, given
from hypothesis import strategies as st

from attnverify import heartbeat, precise
from attnverify import strategies as S
from attnverify.checks.base import Violation
from attnverify.checks.shrink import shrink
from attnverify.errors import WorkerFailed
from attnverify.exampledb import database_key
from attnverify.expr import Inequality, margin
from attnverify.quantities import (
    QUANTITIES,
    WEIGHTED,
    evaluate_quantities,
    rounding_errors,
    weights_many,
)
from attnverify.runconfig import hypothesis_settings, seeded_generation
from attnverify.serialize import encode_tensor, jsonable, number
from attnverify.tolerances import tol_for

F64 = torch.float64
NEG_INF = -math.inf
#: Longest row when an expression names an entry-wise Jacobian quantity (O(L²) work).
JACOBIAN_MAX_L = 256
ENTRYWISE = frozenset(name for name, q in QUANTITIES.items() if q.quadratic)
#: Adversarial kinds of :func:`attnverify.strategies.build_rows` the strata draw (masks are added
#: by the strata themselves).
KINDS = tuple(k for k in S.ALL_KINDS if k not in ("fully_masked", "mixed_scale", "masked"))

#: Row lengths (unmasked keys) of the battery, shortest first, up to the longest row allowed.
LENGTH_GRID = (1, 2, 3, 4, 5, 8, 16, 64, 256, 1024, 4096, 16384, 65536)
#: ``a/T`` of the battery's rows, in the order tried (a log grid over 1e-3 … 3e2; above 300 a
#: softmax-like weight ``e^{-2a/T}`` would come near the float64 underflow, where an exact zero
#: and a rounded one look alike).
RATIO_GRID = (0.3, 3.0, 0.1, 1.0, 10.0, 0.01, 100.0, 0.001, 30.0, 0.03, 300.0, 0.003)
#: ``a/T`` of the battery's masked variants and of its rows at other temperatures.
MASKED_RATIOS = (0.3, 3.0, 0.01, 100.0)
TEMPERED_RATIOS = (0.3, 3.0, 0.01)
#: Temperatures of the battery besides 1 (when the normalizer takes one and it is not fixed).
TEMPERATURE_GRID = (0.1, 10.0, 0.01, 100.0, 0.03, 30.0, 0.3, 3.0)
#: Masked keys the battery adds to a row of L unmasked keys (within the longest row).
PAD_GRID = ("1", "L", "3L", "15L")
#: Ranges the strata and the polish draw from: log10(a/T) and log10(T).
LOG_RATIO_RANGE = (-3.5, 2.5)
LOG_T_RANGE = (-2.0, 2.0)
#: Masked strata draw up to this many masked keys per unmasked key.
MAX_PAD_FACTOR = 15
#: Shares of the evaluations left: the battery's cap, then the strata's (the polish gets the rest).
BATTERY_SHARE = 0.4
STRATA_SHARE = 0.5
#: Polish: evaluations per start (at least), evaluations without a better case after which a
#: start is left (at least; three simplex sizes: a plateau of equal margins, a local maximum),
#: groups of keys moved together,
#: distinct cases kept per stratum, and what counts as nearly tied (the spread of the live
#: logits against their largest magnitude).
POLISH_MIN_EVALS = 40
POLISH_PATIENCE = 12
POLISH_GROUPS = 8
TOP_PER_STRATUM = 3
NEAR_TIE = 0.1
#: What the benchmark's other searches return for a case without a margin (kept for them).
CLAMP = 1e12


class FalsifyCase(NamedTuple):
    scores: torch.Tensor  # [L_padded], float64, -inf = masked
    temperature: float | None
    kind: str
    seed: int


@dataclass
class Evaluation:
    case: FalsifyCase
    values: dict[str, float]
    lhs: float
    rhs: float
    #: LHS/RHS where RHS > 0; NaN where RHS ≤ 0 (no meaningful ratio) or the case is undefined.
    ratio: float
    fails: bool
    undefined: bool = False
    #: The signed violation margin (:func:`attnverify.expr.margin`); computed from the sides when
    #: not given.
    margin: float = math.nan
    #: The values break the bound by no more than the rounding of the quantities explains.
    rounding: bool = False
    #: Which precision decided the case (issue #25.7): ``"float64"``, ``"mpmath"`` (a case
    #: float64 could not decide, decided on the same input in higher precision:
    #: :mod:`attnverify.precise`) or ``"undecided"`` (neither could: not a violation).
    decided_by: str = "float64"
    #: The higher-precision decision (:class:`attnverify.precise.Decision`), or why there is none.
    precise: Any = None
    undecided_reason: str = ""

    def __post_init__(self) -> None:
        if math.isnan(self.margin):
            self.margin = margin(float(self.lhs), float(self.rhs))

    def to_json(self) -> dict[str, Any]:
        return {
            "L": int(self.case.scores.shape[-1]),
            "masked": int((self.case.scores == -math.inf).sum()),
            "scores": [number(v) for v in self.case.scores.tolist()],
            "temperature": self.case.temperature,
            "kind": self.case.kind,
            "shape": shape_of(self.case.scores),
            "seed": self.case.seed,
            "quantities": {k: number(v) for k, v in self.values.items()},
            "lhs": number(self.lhs),
            "rhs": number(self.rhs),
            "ratio": None if math.isnan(self.ratio) else number(self.ratio),
            "margin": None if math.isnan(self.margin) else number(self.margin),
            "within_rounding": self.rounding,
            "decided_by": self.decided_by,
            "high_precision": None if self.precise is None else self.precise.to_json(),
            "undecided_reason": self.undecided_reason or None,
        }

    def case_json(self, params: dict[str, Any]) -> dict[str, Any]:
        """The case as ``attnverify repro --inequality`` reads it."""
        return {"scores": encode_tensor(self.case.scores), "dtype": "float64",
                "temperature": self.case.temperature, "kind": self.case.kind,
                "seed": self.case.seed, "params": jsonable(params)}

    @property
    def infinite_side(self) -> bool:
        """A side is ±inf (and the other is not NaN)."""
        return not self.undefined and (math.isinf(self.lhs) or math.isinf(self.rhs))


def shape_of(scores: torch.Tensor) -> str:
    """A plain name for a witness row: "two-way tie", "all tied", or "" (then its kind says)."""
    live = scores[torch.isfinite(scores)]
    if live.numel() >= 2:
        top = live.max()
        ties = int((live == top).sum())
        if ties == live.numel():
            return "all tied" if ties > 2 else "two-way tie"
        if ties == 2:
            return "two-way tie"
    return ""


def scale_of(case: FalsifyCase) -> float:
    """``a/T`` of a case: the largest unmasked ``|logit|`` over the temperature (1 without one)."""
    row = case.scores.detach().numpy()  # numpy: two small passes, no torch dispatch
    live = row[np.isfinite(row)]
    if not live.size:
        return 0.0
    return float(np.abs(live).max()) / (1.0 if case.temperature is None else case.temperature)


def evaluate(spec, ineq: Inequality, case: FalsifyCase, params,
             weights: torch.Tensor | None = None) -> Evaluation:
    """The inequality at one case (the normalizer called once, between heartbeat marks), judged
    beyond the tolerance and the rounding of the quantities. ``weights``: the normalizer's
    output on the case, computed already with others in one request (:func:`prefetch`)."""
    heartbeat.example_started(case)  # the watchdog's clock (no-op outside a worker)
    try:
        values = evaluate_quantities(ineq.names, spec, case.scores, case.temperature, params,
                                     weights=weights)
    finally:
        heartbeat.example_finished()
    t = tol_for(F64)
    errors = rounding_errors(values, int(case.scores.numel()), scale_of(case))
    j = ineq.judge(values, rtol=t.rtol, atol=t.atol, errors=errors)
    verdict, rounding, decided_by, decision, reason = j.verdict, j.rounding, "float64", None, ""
    # float64 could not decide: the values break the bound only within their rounding, or the
    # expression might have no value within it (finite sides, no NaN quantity)
    singular = (verdict == "undefined" and not math.isnan(j.lhs) and not math.isnan(j.rhs)
                and not any(math.isnan(float(v)) for v in values.values()))
    if rounding or singular:
        try:
            decision = precise.decide(ineq, spec, case.scores, case.temperature, params,
                                      rtol=t.rtol, atol=t.atol)
        except precise.Undecided as exc:
            decided_by, reason = "undecided", str(exc)
        else:
            decided_by, verdict = "mpmath", decision.verdict
            rounding = rounding and verdict == "holds"
    ratio = math.nan if verdict == "undefined" else j.ratio
    return Evaluation(case, values, j.lhs, j.rhs, ratio, verdict == "fails",
                      verdict == "undefined", j.margin, rounding, decided_by, decision, reason)


def merit(ev: Evaluation) -> float:
    """What the search maximises: the margin, in ``[−1, 1]`` (> 0 fails); a case that breaks the
    bound only within rounding counts as equality (0); an undefined case is −inf."""
    if ev.undefined or math.isnan(ev.margin):
        return -math.inf
    return min(ev.margin, 0.0) if ev.rounding else ev.margin


# --------------------------------------------------------------------------------------------
# Budget, strata and the record of the search


@dataclass(frozen=True)
class Budget:
    """What a search may spend: evaluations (binding), seconds (safety net), row length."""

    evaluations: int
    seconds: float
    max_length: int


@dataclass(frozen=True)
class Stratum:
    """Rows with ``lo ≤ L ≤ hi`` unmasked keys, with masked keys or without."""

    lo: int
    hi: int
    masked: bool = False

    @property
    def name(self) -> str:
        span = f"L={self.lo}" if self.lo == self.hi else f"L={self.lo}-{self.hi}"
        return span + (" masked" if self.masked else "")

    def holds(self, live: int, masked: bool) -> bool:
        return self.masked == masked and self.lo <= live <= self.hi


def strata(max_length: int) -> list[Stratum]:
    """The strata of a search whose rows have at most ``max_length`` keys (masked ones included):
    L = 1, 2, 3, 4–5, 6–8, then bands ×4 wide (9–16, 17–64, …); masked: 1–3, 4–16, 17–256, …"""
    bands, lo = [(1, 1), (2, 2), (3, 3), (4, 5), (6, 8)], 9
    while lo <= max_length:
        bands.append((lo, min(4 * (lo - 1), max_length)))
        lo = 4 * (lo - 1) + 1
    out = [Stratum(a, min(b, max_length)) for a, b in bands if a <= max_length]
    masked, lo = [(1, 3), (4, 16)], 17
    while lo <= max_length - 1:
        masked.append((lo, 16 * (lo - 1)))
        lo = 16 * (lo - 1) + 1
    out += [Stratum(a, min(b, max_length - 1), True) for a, b in masked if a <= max_length - 1]
    return out


@dataclass
class StratumRecord:
    stratum: Stratum
    evaluations: int = 0
    best: Evaluation | None = None
    #: The best few distinct cases, best first: the polish's starts. Distinct: another shape or
    #: decade of a/T (:func:`signature`) and another margin (a plateau of equal margins, such as
    #: ties of every scale holding with equality, counts once).
    top: list[Evaluation] = field(default_factory=list)
    #: :func:`signature` of each case of ``top`` (computed once per case).
    signatures: list[tuple] = field(default_factory=list)

    def consider(self, ev: Evaluation) -> None:
        """Count ``ev`` and keep it if it ranks among the stratum's best distinct cases."""
        self.evaluations += 1
        if self.best is None or _key(ev) > _key(self.best):
            self.best = ev
        if ev.undefined:
            return
        if len(self.top) >= TOP_PER_STRATUM and _key(ev) <= _key(self.top[-1]):
            return  # ranks below every kept case (``top`` is sorted): it would not be kept
        sig, level = signature(ev.case), _level(ev)
        same = next((i for i, (other, other_sig) in enumerate(zip(self.top, self.signatures))
                     if other_sig == sig or _level(other) == level), None)
        if same is not None:
            if _key(ev) <= _key(self.top[same]):
                return
            del self.top[same], self.signatures[same]
        # stable: among equal merits the earlier case stays first, as a sort of ``top`` would
        at = next((i for i, other in enumerate(self.top) if _key(other) < _key(ev)),
                  len(self.top))
        self.top.insert(at, ev)
        self.signatures.insert(at, sig)
        del self.top[TOP_PER_STRATUM:], self.signatures[TOP_PER_STRATUM:]

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {"stratum": self.stratum.name, "L_min": self.stratum.lo, "L_max": self.stratum.hi,
                "masked": self.stratum.masked, "evaluations": self.evaluations,
                "best_ratio": None if best is None or math.isnan(best.ratio)
                else number(best.ratio),
                "best_margin": None if best is None or math.isnan(best.margin)
                else number(best.margin)}


def _level(ev: Evaluation) -> float:
    """The merit rounded to 9 significant digits: cases on one plateau share it."""
    m = merit(ev)
    return float(f"{m:.9g}") if math.isfinite(m) else m


def signature(case: FalsifyCase) -> tuple:
    """The shape of a case and the decade of its a/T: unmasked and padded lengths, the decade
    (log10 a/T rounded), and the levels of the live logits over their largest magnitude (to 0.1)
    with their counts (up to six levels; more read as "many"). Two ties of a similar scale, or
    two such two-level rows with the same counts, share one; the same shape a decade apart
    does not (a start's scale decides where the polish can climb)."""
    row = case.scores.detach().numpy()  # numpy: a few small passes, no torch dispatch
    live = row[np.isfinite(row)]
    head = (int(live.size), int(row.size))
    top = float(np.abs(live).max()) if live.size else 0.0
    if top == 0.0:
        return head + ("zero",)
    head += (round(math.log10(top / (1.0 if case.temperature is None else case.temperature))),)
    levels, counts = np.unique(np.round(live / top * 10.0), return_counts=True)
    if len(levels) > 6:
        return head + ("many",)
    return head + tuple(zip(levels.tolist(), counts.tolist()))


class _Crossed(BaseException):
    """A case failed: the search stops (a BaseException, so Hypothesis lets it through)."""


class _Spent(BaseException):
    """The phase (or the whole search) has spent its evaluations or its time."""


@dataclass
class Search:
    """One search: counts every evaluation, keeps the worst case per stratum and overall, and
    stops at the first failure (:class:`_Crossed`) or when a cap is reached (:class:`_Spent`)."""

    ctx: Any
    spec: Any
    ineq: Inequality
    params: dict[str, Any]
    budget: Budget
    takes_temperature: bool
    fixed_temperature: float | None
    start: float = field(default_factory=time.perf_counter)
    evaluations: int = 0
    phase: str = ""
    phase_cap: int = 0
    by_phase: dict[str, int] = field(default_factory=dict)
    records: list[StratumRecord] = field(default_factory=list)
    worst: Evaluation | None = None
    witness: Evaluation | None = None
    witness_evaluation: int = 0
    witness_s: float = 0.0
    witness_phase: str = ""
    undefined: int = 0
    undefined_example: Evaluation | None = None
    #: The case on which attnverify's own work (the quantities: a Jacobian's Lanczos run) took
    #: longest, as ``(checker seconds, target seconds, row length)`` (behind the process
    #: boundary only: there the target's time is charged apart, :mod:`attnverify.heartbeat`).
    slowest_checker: tuple[float, float, int] | None = None
    #: Cases where a side was ±inf, and cases float64 could not decide (within rounding).
    infinite: int = 0
    within_rounding: int = 0
    rounding_example: Evaluation | None = None
    #: Of those, the cases decided in higher precision (:mod:`attnverify.precise`) and the
    #: first, and those it could not decide either, the first and why.
    precise_decided: int = 0
    precise_example: Evaluation | None = None
    precise_undecided: int = 0
    undecided_example: Evaluation | None = None
    stopped: str = "budget"
    #: The target's slowest time per call so far, in seconds (what :func:`batch_room` sizes a
    #: request of several cases by).
    per_call: float = 0.0
    #: Asked before each evaluation: True stops the search at once (``stopped = "stopped"``;
    #: ``falsify --workers``: another worker has a witness).
    stop: Any = None

    def __post_init__(self) -> None:
        self.records = [StratumRecord(s) for s in strata(self.budget.max_length)]

    # -- accounting

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self) -> bool:
        return self.elapsed() > self.budget.seconds

    def left(self) -> int:
        return self.budget.evaluations - self.evaluations

    def begin(self, phase: str, share: float | None = None) -> None:
        """Start ``phase`` with ``share`` of the evaluations left (None: all of them)."""
        left = self.left()
        self.phase = phase
        self.phase_cap = self.evaluations + (left if share is None else int(left * share))
        self.by_phase.setdefault(phase, 0)

    def phase_left(self) -> int:
        return self.phase_cap - self.evaluations

    def record_of(self, case: FalsifyCase) -> StratumRecord | None:
        live = int(np.isfinite(case.scores.detach().numpy()).sum())
        masked = live < case.scores.numel()
        return next((r for r in self.records if r.stratum.holds(live, masked)), None)

    def evaluate(self, case: FalsifyCase, weights: torch.Tensor | None = None) -> Evaluation:
        """Evaluate ``case`` (counted); raises :class:`_Crossed` when it fails. ``weights``:
        the normalizer's output on it, computed already (:func:`prefetch`)."""
        if self.evaluations >= min(self.phase_cap, self.budget.evaluations):
            raise _Spent()
        if self.out_of_time():
            self.stopped = "time"
            raise _Spent()
        if self.stop is not None and self.stop():
            self.stopped = "stopped"
            raise _Crossed()
        self.evaluations += 1
        self.by_phase[self.phase] = self.by_phase.get(self.phase, 0) + 1
        ev = evaluate(self.spec, self.ineq, case, self.params, weights)
        timing = heartbeat.last_example()
        if timing is not None and (self.slowest_checker is None
                                   or timing.checker_s > self.slowest_checker[0]):
            self.slowest_checker = (timing.checker_s, timing.target_s, int(case.scores.numel()))
        record = self.record_of(case)
        if record is not None:
            record.consider(ev)
        if ev.undefined:
            self.undefined += 1
            self.undefined_example = self.undefined_example or ev
        if ev.infinite_side:
            self.infinite += 1
        if ev.rounding or ev.decided_by != "float64":
            self.within_rounding += 1
            self.rounding_example = self.rounding_example or ev
        if ev.decided_by == "mpmath":
            self.precise_decided += 1
            self.precise_example = self.precise_example or ev
        elif ev.decided_by == "undecided":
            self.precise_undecided += 1
            self.undecided_example = self.undecided_example or ev
        if self.worst is None or _key(ev) > _key(self.worst):
            self.worst = ev
        if ev.fails:
            self.witness, self.witness_phase = ev, self.phase
            self.witness_evaluation, self.witness_s = self.evaluations, self.elapsed()
            self.stopped = "witness"
            raise _Crossed()
        return ev

    # -- cases

    @property
    def free_temperature(self) -> bool:
        return self.takes_temperature and self.fixed_temperature is None

    def defined(self) -> int:
        """Evaluations where the expression had a value."""
        return self.evaluations - self.undefined

    def vacuous(self) -> bool:
        """Every case with a value had a side at ±inf (``max_weight <= 1/0``): the bound, as
        searched, says nothing."""
        return self.defined() > 0 and self.infinite == self.defined()

    def temperatures(self) -> tuple[float | None, ...]:
        """The battery's temperatures: the fixed one, none, or 1 then the grid."""
        if not self.takes_temperature:
            return (None,)
        if self.fixed_temperature is not None:
            return (self.fixed_temperature,)
        return (1.0, *TEMPERATURE_GRID)

    def case(self, unit: torch.Tensor, ratio: float, temperature: float | None, kind: str,
             pad: int = 0, front: bool = False, seed: int = 0) -> FalsifyCase:
        """The row ``a·unit`` (``a = ratio·T``) with ``pad`` masked keys at the end (or front)."""
        row = unit.to(F64) * (ratio * (1.0 if temperature is None else temperature))
        if pad:
            mask = torch.full((pad,), NEG_INF, dtype=F64)
            row = torch.cat([mask, row] if front else [row, mask])
        return FalsifyCase(row, temperature, kind, seed)


def _key(ev: Evaluation) -> float:
    return merit(ev)


def max_length_for(ineq: Inequality, max_length: int) -> int:
    """The longest row a search of ``ineq`` draws (entry-wise Jacobians: at most 256)."""
    if ineq.names & ENTRYWISE:
        return min(max_length, JACOBIAN_MAX_L)
    return max_length


# --------------------------------------------------------------------------------------------
# 1. The battery


def unit_rows(length: int) -> list[tuple[str, torch.Tensor]]:
    """Row shapes with entries in ``[−1, 1]`` and largest ``|entry|`` 1 (the zero row aside):
    ties, two levels (``k`` keys at ``+1``, the rest at ``−1``, for ``k`` = 1, 2, L/2, L − 1),
    three levels (a peak over zeros, a dip under zeros, peak/zero/floor, top/middle/bottom)."""
    n = length
    out: list[tuple[str, list[float]]] = [("tie", [1.0] * n), ("tie_low", [-1.0] * n)]
    for k in sorted({1, 2, n // 2, n - 1}):
        if 1 <= k <= n - 1:
            out.append((f"two_level_{k}", [1.0] * k + [-1.0] * (n - k)))
    if n >= 2:
        out.append(("peak_over_zero", [1.0] + [0.0] * (n - 1)))
        out.append(("dip_under_zero", [0.0] * (n - 1) + [-1.0]))
    if n >= 3:
        out.append(("peak_zero_floor", [1.0, 0.0] + [-1.0] * (n - 2)))
        out.append(("top_mid_bottom", [1.0] + [0.0] * (n - 2) + [-1.0]))
    seen, rows = set(), []
    for name, values in out:
        if tuple(values) not in seen:
            seen.add(tuple(values))
            rows.append((name, torch.tensor(values, dtype=F64)))
    return rows


#: The shapes of the masked and tempered variants (the rest of the battery's shapes are tried at
#: T = 1 unmasked only).
VARIANT_SHAPES = ("tie", "two_level_1", "peak_over_zero", "two_level_last")


#: The sweeps' order of lengths (alternating short and long rows, from the shortest row whose
#: two-level shapes differ) and of shapes (single outliers first).
SCOUT_LENGTHS = (3, 16, 5, 256, 2, 64, 4, 4096, 8, 1024, 1, 16384, 65536)
SCOUT_SHAPES = ("two_level_1", "two_level_2", "peak_over_zero", "tie", "top_mid_bottom",
                "two_level_last", "dip_under_zero", "peak_zero_floor", "two_level_half",
                "tie_low")


def _shape(shapes: dict[str, torch.Tensor], name: str, length: int) -> tuple[str, torch.Tensor]:
    """A shape by its generic name (``two_level_last``: L − 1 keys at +1)."""
    alias = {"two_level_last": f"two_level_{length - 1}", "two_level_half":
             f"two_level_{length // 2}"}.get(name, name)
    if alias in shapes:
        return alias, shapes[alias]
    return "tie", shapes["tie"]


def pad_of(which: str, length: int, longest: int) -> int:
    """Masked keys of the padding ``which`` (:data:`PAD_GRID`) for ``length`` unmasked keys, within
    ``longest`` keys in all (0: no room)."""
    want = {"1": 1, "L": length, "3L": 3 * length, "15L": 15 * length}[which]
    return max(0, min(want, longest - length))


def _pairs(rows: int, columns: int) -> Iterator[tuple[int, int]]:
    """Every ``(i, j)`` of a ``rows × columns`` grid once, by diagonals: each run of ``rows``
    pairs meets every row once, with the column moving on (whatever the sizes' common factors)."""
    for n in range(rows * columns):
        i, block = n % rows, n // rows
        yield i, (i + block) % columns


def sweeps(search: Search) -> Iterator[tuple[tuple, FalsifyCase]]:
    """The battery's first passes, each across the whole design: every (length, a/T) pair once
    (shape, temperature and mask varying between them), then every (length, temperature) pair
    and every (length, padding) pair once (a/T and shape varying), before any length is covered
    in full. Yields ``(key, case)``; the key says which planned case it is."""
    temps = search.temperatures()
    longest = search.budget.max_length
    lengths = [n for n in SCOUT_LENGTHS if n <= longest]
    tables = {n: dict(unit_rows(n)) for n in lengths}
    for n, (li, ri) in enumerate(_pairs(len(lengths), len(RATIO_GRID))):
        length, ratio = lengths[li], RATIO_GRID[ri]
        name, unit = _shape(tables[length], SCOUT_SHAPES[n % len(SCOUT_SHAPES)], length)
        t = temps[(n // 3) % len(temps)] if n % 3 == 2 else temps[0]
        pad = pad_of(PAD_GRID[(n // 4) % len(PAD_GRID)], length, longest) if n % 4 == 3 else 0
        yield (length, name, ratio, t, pad), _labelled(search, unit, ratio, t, name, pad)
    variants = VARIANT_SHAPES + ("two_level_half",)
    for n, (li, ti) in enumerate(_pairs(len(lengths), len(temps) - 1)):
        length, t = lengths[li], temps[1 + ti]
        name, unit = _shape(tables[length], variants[n % len(variants)], length)
        ratio = TEMPERED_RATIOS[n % len(TEMPERED_RATIOS)]
        yield (length, name, ratio, t, 0), _labelled(search, unit, ratio, t, name, 0)
    for n, (li, pi) in enumerate(_pairs(len(lengths), len(PAD_GRID))):
        length = lengths[li]
        pad = pad_of(PAD_GRID[pi], length, longest)
        if pad < 1:
            continue
        name, unit = _shape(tables[length], variants[n % len(variants)], length)
        ratio = MASKED_RATIOS[n % len(MASKED_RATIOS)]
        yield (length, name, ratio, temps[0], pad), _labelled(search, unit, ratio, temps[0],
                                                                name, pad)


def _labelled(search: Search, unit, ratio, t, name: str, pad: int) -> FalsifyCase:
    label = f"battery:{name}" + ("+masked" if pad else "")
    return search.case(unit, ratio, t, label, pad=pad)


def scout(search: Search) -> Iterator[tuple[tuple, FalsifyCase]]:
    """The first sweep of :func:`sweeps` (every (length, a/T) pair once)."""
    longest = search.budget.max_length
    count = len([n for n in SCOUT_LENGTHS if n <= longest]) * len(RATIO_GRID)
    for n, item in enumerate(sweeps(search)):
        if n >= count:
            return
        yield item


def planned(search: Search, length: int) -> list[tuple]:
    """Every case the battery plans for ``length`` unmasked keys, as ``(name, unit, ratio, T,
    pad)``: the zero row; each shape at each a/T (T = 1, or the fixed T); the variant shapes
    masked (each padding of :data:`PAD_GRID`) and at every other temperature."""
    temps = search.temperatures()
    base_t, other_t = temps[0], temps[1:]
    longest = search.budget.max_length
    shapes = unit_rows(length)
    table = dict(shapes)
    out = [("zero", torch.zeros(length, dtype=F64), 1.0, base_t, 0)]
    out += [(name, unit, ratio, base_t, 0) for ratio in RATIO_GRID for name, unit in shapes]
    variants = list(dict.fromkeys(_shape(table, v, length) for v in VARIANT_SHAPES))
    pads = sorted({p for p in (pad_of(w, length, longest) for w in PAD_GRID) if p >= 1})
    out += [(name, unit, ratio, base_t, pad) for pad in pads for ratio in MASKED_RATIOS
            for name, unit in variants]
    out += [(name, unit, ratio, t, 0) for t in other_t for ratio in TEMPERED_RATIOS
            for name, unit in variants]
    return out


def battery(search: Search) -> Iterator[FalsifyCase]:
    """The battery's cases in the order tried (see the module docstring): the sweeps, then the
    planned cases of every length, a few of each length in turn (shortest first), so that a cap
    on the battery leaves no length out (a case the sweeps met is not repeated)."""
    seen = set()
    for key, case in sweeps(search):
        seen.add(key)
        yield case
    longest = search.budget.max_length
    lengths = [n for n in LENGTH_GRID if n <= longest]
    plans = {n: planned(search, n) for n in lengths}
    step = 8
    for start in range(0, max(len(p) for p in plans.values()), step):
        for length in lengths:
            for name, unit, ratio, t, pad in plans[length][start:start + step]:
                if (length, name, ratio, t, pad) in seen:
                    continue
                seen.add((length, name, ratio, t, pad))
                label = "battery:zero" if name == "zero" else None
                if label is not None:
                    yield search.case(unit, ratio, t, label)
                else:
                    yield _labelled(search, unit, ratio, t, name, pad)
    if longest >= 2:
        shapes = unit_rows(1)
        yield search.case(shapes[0][1], 1.0, search.temperatures()[0], "battery:tie+masked_front",
                          pad=1, front=True)


#: The battery's cases go to a normalizer behind the process boundary in requests of several
#: cases (:func:`prefetch`): one case, then two, four, … up to this many, while the request's
#: rows hold at most :data:`BATCH_ELEMENTS` logits and its calls took (by the last request's
#: time per call) at most :data:`BATCH_TIME_SHARE` of the per-example time limit.
BATCH_MAX = 64
BATCH_ELEMENTS = 1 << 20
BATCH_TIME_SHARE = 0.1


def run_battery(search: Search) -> None:
    """The battery's cases (:func:`battery`), evaluated in order until the first that fails.
    Their rows do not depend on what the target answers, so where the expression needs the
    weights and the normalizer runs behind the process boundary, the weights of the next few
    cases are computed in one request (:func:`prefetch`): the same calls on the same rows, the
    same evaluations in the same order; a request that fails is done again a case at a time,
    so an error is reported on its own case."""
    cases = battery(search)
    batched = batchable(search)
    size = 1
    while True:
        room = max(1, min(size, search.phase_left(), search.left()))
        chunk, elements = [], 0
        for case in cases:
            chunk.append(case)
            elements += int(case.scores.numel())
            if len(chunk) >= room or elements >= BATCH_ELEMENTS:
                break
        if not chunk:
            return
        weights = prefetch(search, chunk) if batched and len(chunk) >= 2 else None
        for i, case in enumerate(chunk):
            search.evaluate(case, None if weights is None else weights[i])
            if weights is None:  # one request per case: its target time is the heartbeat's
                timing = heartbeat.last_example()
                search.per_call = max(search.per_call, 0.0 if timing is None
                                      else timing.target_s)
        size = max(1, min(2 * size, BATCH_MAX, batch_room(search)))


def batchable(search: Search) -> bool:
    """Whether the search can have the weights of several cases computed in one request: the
    expression needs the weights (:data:`attnverify.quantities.WEIGHTED`) and the normalizer
    offers the request (a proxy of one behind the process boundary)."""
    fn = getattr(search.spec, "fn", None)
    return bool(search.ineq.names & WEIGHTED) and callable(getattr(fn, "many", None))


def batch_room(search: Search) -> int:
    """How many calls one request may hold by the target's slowest time per call so far:
    :data:`BATCH_TIME_SHARE` of the per-example time limit (:data:`BATCH_MAX` before any)."""
    if search.per_call <= 0:
        return BATCH_MAX
    limit = BATCH_TIME_SHARE * float(getattr(search.ctx, "timeout_s", None) or 30.0)
    return min(BATCH_MAX, int(limit / search.per_call))


def prefetch(search: Search, chunk: list[FalsifyCase]) -> list | None:
    """The normalizer's weights on each case of ``chunk`` in one request
    (:func:`attnverify.quantities.weights_many`), and the time per call noted in
    ``search.per_call``; ``None`` where the request failed (the target raised, refused, died or
    hung on one of them): the cases are then evaluated one at a time, where the failure is met
    again on its own case."""
    start = time.monotonic()
    try:
        weights = weights_many(search.spec, [(c.scores, c.temperature) for c in chunk],
                               search.params)
    except (Exception, WorkerFailed):  # noqa: BLE001 - met again, and reported, on its own case
        weights = None
    search.per_call = max(search.per_call, (time.monotonic() - start) / len(chunk))
    return weights


# --------------------------------------------------------------------------------------------
# 2. Stratified Hypothesis search

_UNIT = st.one_of(st.sampled_from((1.0, -1.0, 0.0)), st.floats(-1.0, 1.0))


def _levels(draw, length: int) -> torch.Tensor:
    """A row of up to four levels with drawn counts, in blocks or shuffled by a drawn seed."""
    m = draw(st.integers(1, min(4, length)))
    values = [draw(_UNIT) for _ in range(m)]
    counts, left = [], length
    for j in range(m - 1):
        c = draw(st.integers(1, left - (m - 1 - j)))
        counts.append(c)
        left -= c
    counts.append(left)
    row = torch.cat([torch.full((c,), v, dtype=F64) for v, c in zip(values, counts)])
    if draw(st.booleans()):
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
        row = row[torch.randperm(length, generator=g)]
    return row


def _unit(row: torch.Tensor) -> torch.Tensor:
    top = float(row.abs().max()) if row.numel() else 0.0
    return row / top if top > 0 and math.isfinite(top) else torch.zeros_like(row)


@st.composite
def stratum_cases(draw, stratum: Stratum, search: Search):
    """Cases of one stratum: L in its band, ``a/T`` and T log-uniform (shrinking to 1), the row
    as levels, free values (L ≤ 16) or an adversarial kind, scaled so that max |logit| = a;
    masked strata add 1 … 15·L masked keys (within the longest row) at the end, the front or
    seeded positions."""
    longest = search.budget.max_length
    length = draw(st.integers(stratum.lo, stratum.hi))
    ratio = 10.0 ** draw(st.floats(*LOG_RATIO_RANGE))
    t = None
    if search.takes_temperature:
        t = search.fixed_temperature or 10.0 ** draw(st.floats(*LOG_T_RANGE))
    styles = ["levels", "kind"] + (["values"] if length <= 16 else [])
    style = draw(st.sampled_from(styles))
    seed = 0
    if style == "levels":
        unit = _levels(draw, length)
    elif style == "values":
        unit = torch.tensor(draw(st.lists(_UNIT, min_size=length, max_size=length)), dtype=F64)
    else:
        kinds = [k for k in KINDS if (k == "single") == (length == 1)]
        kind = draw(st.sampled_from(kinds))
        seed = draw(st.integers(0, 2**32 - 1))
        unit = S.build_rows(kind, length=length, batch=1, dtype=F64, seed=seed).scores[0]
        style = f"kind:{kind}"
    row = _unit(unit) * (ratio * (1.0 if t is None else t))
    if stratum.masked:
        pad = draw(st.integers(1, max(1, min(MAX_PAD_FACTOR * length, longest - length))))
        where = draw(st.sampled_from(("end", "front", "seeded")))
        full = torch.full((length + pad,), NEG_INF, dtype=F64)
        if where == "end":
            full[:length] = row
        elif where == "front":
            full[pad:] = row
        else:
            g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
            full[torch.randperm(length + pad, generator=g)[:length].sort().values] = row
        row = full
    return FalsifyCase(row, t, f"strata:{style}", seed)


def run_strata(search: Search, seed: int, key: str, database=None) -> None:
    """One seeded Hypothesis run per stratum, each with its share of the phase's evaluations and
    its own ``hypothesis.target`` label (generate, then hill-climb on the label). With an example
    ``database`` (``falsify --database``) each stratum's run first replays what the database holds
    for it (Phase.reuse) and leaves its best cases there (Hypothesis's own Pareto front of the
    targeted merit), under :func:`attnverify.exampledb.database_key` of ``key`` and the stratum."""
    records = list(search.records)
    for i, record in enumerate(records):
        share = search.phase_left() // (len(records) - i)
        if share < 1:
            break
        label = record.stratum.name
        probe = _probe(search, label, search.evaluations + share)
        test = given(stratum_cases(record.stratum, search))(probe)
        run_hypothesis(test, ctx=search.ctx, seed=_stratum_seed(seed, label),
                       max_examples=share, key=f"{key}|{label}", database=database)


def _probe(search: Search, label: str, cap: int):
    """The test body of one stratum: evaluate, and target the merit under the stratum's label."""

    def probe(case: FalsifyCase) -> None:
        if search.evaluations >= cap:
            return  # this stratum's share is spent; Hypothesis winds down
        score = merit(search.evaluate(case))
        if math.isfinite(score):
            hypothesis.target(score, label=label)

    return probe


def _stratum_seed(seed: int, label: str) -> int:
    digest = hashlib.sha256(f"{seed}|{label}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


#: The Hypothesis settings of the strata: the run's profile (:func:`hypothesis_settings`).
#: Phase.reuse replays what an example database holds (none unless the settings give one).
STRATA_PHASES = (Phase.reuse, Phase.generate, Phase.target)


def run_hypothesis(test, *, ctx, seed: int, max_examples: int, key: str, database=None) -> None:
    """Run one stratum's Hypothesis test under the profile's settings, seeded, with a database
    key of its own (the target, the inequality and the stratum, and with a ``database`` the
    attnverify version: :func:`attnverify.exampledb.database_key`), so that an example database
    keeps each stratum's best cases apart. Without ``database`` the profile's (none) stands."""
    test = hypothesis.seed(seed)(test)
    settings = hypothesis_settings(ctx, max_examples=max(1, max_examples), phases=STRATA_PHASES)
    if database is not None:
        settings = hypothesis.settings(settings, database=database)
        digest = database_key("strata", key)
    else:
        digest = hashlib.sha256(key.encode()).digest()
    wrapped = settings(test)
    wrapped._hypothesis_internal_database_key = digest

    with seeded_generation():  # the same cases in every process for one seed
        wrapped()


# --------------------------------------------------------------------------------------------
# 3. Numeric polish


class _Polish:
    """The continuous parameters of one start at fixed L and mask: the level of each group of
    keys in ``[−1, 1]`` (``groups``: given, else tied keys, else eight quantile groups moving by
    offsets from the start's values), ``log10(a/T)`` within :data:`LOG_RATIO_RANGE`, and
    ``log10 T`` within :data:`LOG_T_RANGE` where the temperature is free. A row is
    ``levels[group] · (a/T) · T``."""

    def __init__(self, case: FalsifyCase, free_temperature: bool,
                 groups: torch.Tensor | None = None, levels: list[float] | None = None,
                 kind: str = "polish") -> None:
        self.case, self.kind = case, kind
        self.live = torch.isfinite(case.scores)
        t0 = 1.0 if case.temperature is None else case.temperature
        values = case.scores[self.live] / t0
        self.t0 = case.temperature
        self.free_t = free_temperature and case.temperature is not None
        scale = float(values.abs().max()) if values.numel() else 0.0
        self.unit = values / scale if scale > 0 else torch.zeros_like(values)
        self.log_ratio0 = _clip(math.log10(scale), LOG_RATIO_RANGE) if scale > 0 else -1.0
        if groups is not None:
            self.mode, self.groups = "levels", groups
            self.base = list(levels) if levels is not None else [0.0] * (int(groups.max()) + 1)
        else:
            distinct, inverse = torch.unique(self.unit, return_inverse=True)
            if len(distinct) <= POLISH_GROUPS:
                self.mode, self.groups, self.base = "levels", inverse, distinct.tolist()
            else:
                order = torch.argsort(self.unit)
                groups = torch.empty_like(order)
                groups[order] = torch.arange(len(self.unit)) * POLISH_GROUPS // len(self.unit)
                self.mode, self.groups, self.base = "offsets", groups, [0.0] * POLISH_GROUPS
        self.n = len(self.base)

    def start(self) -> tuple[list[float], list[tuple[float, float]]]:
        # a level computed as a mean of tied keys may round a unit past ±1: the start lies in
        # the box (scipy warns about a start outside its bounds, and would clip it anyway)
        x = [_clip(float(v), (-1.0, 1.0)) for v in self.base] + [self.log_ratio0]
        bounds = [(-1.0, 1.0)] * self.n + [LOG_RATIO_RANGE]
        if self.free_t:
            x.append(_clip(math.log10(self.t0), LOG_T_RANGE))
            bounds.append(LOG_T_RANGE)
        return x, bounds

    def build(self, x) -> FalsifyCase:
        x = [float(v) for v in x]
        shape = torch.tensor(x[:self.n], dtype=F64)
        ratio = 10.0 ** _clip(x[self.n], LOG_RATIO_RANGE)
        t = self.t0
        if self.free_t:
            t = 10.0 ** _clip(x[self.n + 1], LOG_T_RANGE)
        unit = shape[self.groups] if self.mode == "levels" else self.unit + shape[self.groups]
        row = self.case.scores.clone()
        row[self.live] = unit * (ratio * (1.0 if t is None else t))
        return FalsifyCase(row, t, self.kind, self.case.seed)


def _clip(v: float, bounds: tuple[float, float]) -> float:
    return min(max(v, bounds[0]), bounds[1])


def near_tie(case: FalsifyCase) -> bool:
    """Whether the live logits are all equal or spread by at most :data:`NEAR_TIE` of their
    largest magnitude (a zero row included)."""
    live = case.scores[torch.isfinite(case.scores)]
    if live.numel() < 2:
        return False
    top = float(live.abs().max())
    return float(live.max() - live.min()) <= NEAR_TIE * top


def splits(case: FalsifyCase) -> list[tuple[str, torch.Tensor, list[float]]]:
    """Two-level splits of a (nearly) tied row of L live keys, as ``(kind, groups, levels)``: for
    ``k`` = 1, L/2, L − 1, 2 (distinct, ``1 ≤ k < L``), ``k`` keys in one group and ``L − k`` in
    the other (the keys taken in the order of the start's logits, largest first), each split two
    ways: ``split_k`` starts both groups at the tie's level (the polish then moves them apart by
    a little: a tie perturbed), ``spread_k`` starts them at ``+1`` and ``−1`` (k keys at ``+a``,
    the rest at ``−a``)."""
    live = case.scores[torch.isfinite(case.scores)]
    n = live.numel()
    top = float(live.abs().max()) if n else 0.0
    level = _clip(float(live.mean()) / top, (-1.0, 1.0)) if top > 0 else 0.0
    order = torch.argsort(live, descending=True, stable=True)
    out = []
    for k in dict.fromkeys((1, n // 2, n - 1, 2)):
        if 1 <= k < n:
            groups = torch.ones(n, dtype=torch.long)
            groups[order[:k]] = 0
            out.append((f"polish:split_{k}", groups, [level, level]))
            out.append((f"polish:spread_{k}", groups, [1.0, -1.0]))
    return out


@dataclass
class Start:
    """One start of the polish: a case, and how its keys are grouped (None: by its values)."""

    ev: Evaluation
    kind: str = "polish"
    groups: torch.Tensor | None = None
    levels: list[float] | None = None


def _interleave(lists: list[list]) -> list:
    """The first item of every list, then the second of every list, and so on."""
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def polish_starts(search: Search) -> list[Start]:
    """The starts of the polish, in the order tried: round after round over the strata (a stratum
    whose best case ranks higher first within a round), each stratum giving its next start. A
    stratum's starts come from its best distinct cases (:attr:`StratumRecord.top`: shapes and
    scales differ), in turn: each case itself, unless its keys are all tied (they would move as
    one level), then, for a tied or nearly tied case (:func:`near_tie`), its two-level splits
    (:func:`splits`)."""
    queues = []
    for record in sorted((r for r in search.records if r.top), key=lambda r: -_key(r.top[0])):
        per_case = []
        for ev in record.top:
            if ev.fails or not math.isfinite(merit(ev)):
                continue
            own = []
            live = ev.case.scores[torch.isfinite(ev.case.scores)]
            if len(set(live.tolist())) > 1:
                own.append(Start(ev))
            if near_tie(ev.case):
                own += [Start(ev, *split) for split in splits(ev.case)]
            per_case.append(own)
        queues.append(_interleave(per_case))
    return _interleave(queues)


def run_polish(search: Search) -> None:
    """Nelder–Mead from each start of :func:`polish_starts` in turn, each with its share of the
    phase's evaluations and left after :data:`POLISH_PATIENCE` evaluations without a better
    case; then, where the expression names a count (``n_support``) that changed along the way,
    the boundary between the best case and the nearest with another count is bisected
    (:func:`_bisect_boundary`): a bound on a piecewise-constant quantity is tightest where the
    piece changes, often in a band narrower than any simplex step."""
    from scipy.optimize import minimize  # heavy: scipy.optimize, only the polish

    starts = polish_starts(search)
    counts = sorted(search.ineq.names & DISCRETE)
    batched = batchable(search)
    for i, start in enumerate(starts):
        left = search.phase_left()
        if left < 2:
            return
        share = max(POLISH_MIN_EVALS, left // (len(starts) - i))
        cap = search.evaluations + min(share, left)
        shape = _Polish(start.ev.case, search.free_temperature, start.groups, start.levels,
                        start.kind)
        x0, bounds = shape.start()
        simplex = _simplex(x0, bounds)
        ahead = _prefetch_simplex(search, shape, simplex, cap) if batched else {}
        progress = {"best": -math.inf, "since": 0, "seen": []}
        patience = max(POLISH_PATIENCE, 3 * (len(x0) + 1))

        def objective(x, shape=shape, cap=cap, progress=progress, patience=patience,
                      ahead=ahead) -> float:
            if search.evaluations >= cap or progress["since"] >= patience:
                raise _Spent()
            ev = search.evaluate(shape.build(x), ahead.pop(_point(x), None))
            score = merit(ev)
            progress["seen"].append((list(x), score, tuple(ev.values.get(n) for n in counts)))
            if score > progress["best"] + 1e-12:
                progress["best"], progress["since"] = score, 0
            else:
                progress["since"] += 1
            return -score if math.isfinite(score) else 2.0

        try:
            minimize(objective, x0, method="Nelder-Mead", bounds=bounds,
                     options={"maxfev": cap - search.evaluations,
                              "initial_simplex": simplex,
                              "xatol": 1e-9, "fatol": 1e-15, "adaptive": len(x0) > 4})
        except _Spent:
            if search.evaluations >= search.phase_cap or search.out_of_time():
                raise
        if counts:
            _bisect_boundary(search, shape, progress["seen"], counts)


def _point(x) -> tuple[float, ...]:
    return tuple(float(v) for v in x)


def _prefetch_simplex(search: Search, shape: _Polish, simplex: list[list[float]],
                      cap: int) -> dict[tuple[float, ...], torch.Tensor]:
    """The weights at the points of a start's simplex (Nelder–Mead evaluates them first, in
    order, whatever they give), in one request (:func:`prefetch`), by point; the objective
    takes a point's weights from here instead of a request of its own. Empty where one request
    per point it is (fewer than two points within the cap, or calls too slow to group)."""
    n = min(len(simplex), cap - search.evaluations, search.phase_left(), batch_room(search))
    points = simplex[:n]
    cases = [shape.build(x) for x in points]
    if n < 2 or sum(int(c.scores.numel()) for c in cases) > BATCH_ELEMENTS:
        return {}
    weights = prefetch(search, cases)
    if weights is None:
        return {}
    return {_point(x): w for x, w in zip(points, weights)}


#: Quantities that take integer values: where they change, a bound on them has its edges.
DISCRETE = frozenset(name for name, q in QUANTITIES.items() if q.count)
#: Bisection steps on a boundary between two counts (the parameter interval shrinks 2**-steps).
BOUNDARY_STEPS = 24


def _bisect_boundary(search: Search, shape: _Polish, seen: list, counts: list[str]) -> None:
    """Between the best case a polish start met and the nearest one (in its parameters) whose
    counts differ, halve the segment :data:`BOUNDARY_STEPS` times, keeping the half whose ends
    still differ, so both sides of the boundary are evaluated at its edge."""
    usable = [s for s in seen if math.isfinite(s[1])]
    if not usable:
        return
    best = max(usable, key=lambda s: s[1])
    other = [s for s in usable if s[2] != best[2]]
    if not other:
        return
    far = min(other, key=lambda s: sum((a - b) ** 2 for a, b in zip(s[0], best[0])))
    lo, hi = best, far
    for _ in range(BOUNDARY_STEPS):
        if search.phase_left() < 1:
            raise _Spent()
        mid_x = [(a + b) / 2 for a, b in zip(lo[0], hi[0])]
        ev = search.evaluate(shape.build(mid_x))
        mid = (mid_x, merit(ev), tuple(ev.values.get(n) for n in counts))
        if mid[2] == lo[2]:
            lo = mid
        else:
            hi = mid


def _simplex(x0: list[float], bounds) -> list[list[float]]:
    """A start simplex of steps 0.25 per level and 0.3 per decade of a/T or T (a factor of 2),
    pointing into the box."""
    out = [list(x0)]
    for i, (lo, hi) in enumerate(bounds):
        x = list(x0)
        step = 0.25 if (lo, hi) == (-1.0, 1.0) else 0.3
        x[i] = x[i] + step if x[i] + step <= hi else x[i] - step
        out.append(x)
    return out


# --------------------------------------------------------------------------------------------
# Shrinking


class _ShrinkCase(NamedTuple):
    scores: torch.Tensor  # [1, L]: the shape checks.shrink works on
    temperature: float | None


def shrink_witness(search: Search, witness: Evaluation,
                   vary_temperature: bool) -> tuple[Evaluation, int]:
    """The smallest failing case the greedy shrinker finds from ``witness`` (fewest keys, then
    simplest values, then T = 1), and the evaluations it spent."""

    last = {"ev": witness, "n": 0}

    def recheck(candidate: _ShrinkCase) -> None:
        case = FalsifyCase(candidate.scores[0], candidate.temperature, witness.case.kind,
                           witness.case.seed)
        last["n"] += 1
        ev = evaluate(search.spec, search.ineq, case, search.params)
        if ev.fails:
            last["ev"] = ev
            raise Violation("fails", observed=ev.lhs, bound=ev.rhs, ratio=ev.ratio)

    start = _ShrinkCase(witness.case.scores.reshape(1, -1), witness.case.temperature)
    first = Violation("fails", observed=witness.lhs, bound=witness.rhs, ratio=witness.ratio)
    case, _ = shrink(recheck, start, first, vary_temperature=vary_temperature)
    ev = last["ev"]
    if not torch.equal(ev.case.scores, case.scores[0]) or ev.case.temperature != case.temperature:
        # the last failing re-check was not the case kept: evaluate the kept one again
        ev = evaluate(search.spec, search.ineq,
                      FalsifyCase(case.scores[0], case.temperature, witness.case.kind,
                                  witness.case.seed), search.params)
        last["n"] += 1
        if not ev.fails:  # cannot happen for a deterministic target; keep the original
            ev = witness
    return ev, last["n"]
