"""``attnverify falsify``: search for the smallest input that breaks a proposed inequality.

Two passes over the same seeded strategy of logit rows (and temperatures):

1. **search** — Hypothesis explores and ``hypothesis.target`` maximises LHS/RHS; nothing is
   raised, so the worst ratio over the whole budget is known;
2. **shrink** — if any case failed, a second run raises on failure so that Hypothesis shrinks
   to a minimal witness (shortest row, simplest kind, temperature 1). Should that run not meet
   a failure (rare failures), the smallest failing case of the search stands as the witness.

A case fails when ``LHS > RHS + atol + rtol·|RHS|`` with the float64 row of the tolerance table;
a strict ``LHS < RHS`` fails when ``LHS ≥ RHS − atol − rtol·|RHS|`` (equality falsifies it: the
tolerance never counts for a strict claim); a NaN quantity (the normalizer's output) fails.
Where the expression itself has no value (0·log 0, log of a negative, 0/0) the case is counted as
*undefined*, not as a failure, and the first such case is reported. Quantities are defined over
the unmasked keys (:mod:`attnverify.quantities`). ``--params temperature=…`` fixes T for every
case. Quantities that need a Jacobian limit the row length (see :data:`JACOBIAN_MAX_L`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import hypothesis
import torch
from hypothesis import Phase, given
from hypothesis import strategies as st

from attnverify import heartbeat
from attnverify import strategies as S
from attnverify.checks.base import Context
from attnverify.errors import UsageError
from attnverify.expr import Inequality, parse_inequality
from attnverify.quantities import QUANTITIES, evaluate_quantities
from attnverify.registry import NormalizerSpec
from attnverify.runconfig import hypothesis_settings
from attnverify.serialize import encode_tensor, jsonable, number, repro_command
from attnverify.tolerances import tol_for

F64 = torch.float64
#: Longest row when an expression names an entry-wise Jacobian quantity (O(L²) work).
JACOBIAN_MAX_L = 256
ENTRYWISE = frozenset(name for name, q in QUANTITIES.items() if q.quadratic)
KINDS = tuple(k for k in S.ALL_KINDS if k not in ("fully_masked", "mixed_scale"))


class FalsifyCase(NamedTuple):
    scores: torch.Tensor  # [L], float64
    temperature: float | None
    kind: str
    seed: int


@dataclass
class Evaluation:
    case: FalsifyCase
    values: dict[str, float]
    lhs: float
    rhs: float
    ratio: float
    fails: bool
    undefined: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "L": int(self.case.scores.shape[-1]),
            "masked": int((self.case.scores == -math.inf).sum()),
            "scores": [_num(v) for v in self.case.scores.tolist()],
            "temperature": self.case.temperature,
            "kind": self.case.kind,
            "shape": shape_of(self.case.scores),
            "seed": self.case.seed,
            "quantities": {k: _num(v) for k, v in self.values.items()},
            "lhs": _num(self.lhs),
            "rhs": _num(self.rhs),
            "ratio": _num(self.ratio),
        }

    def case_json(self, params: dict[str, Any]) -> dict[str, Any]:
        """The case as ``attnverify repro --inequality`` reads it."""
        return {"scores": encode_tensor(self.case.scores), "dtype": "float64",
                "temperature": self.case.temperature, "kind": self.case.kind,
                "seed": self.case.seed, "params": jsonable(params)}


@dataclass
class FalsifyResult:
    target: str
    inequality: Inequality
    falsified: bool
    examples: int
    elapsed_s: float
    worst: Evaluation | None
    witness: Evaluation | None
    params: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    #: Cases where the expression had no value (0·log 0, …), and the first of them.
    undefined: int = 0
    undefined_example: Evaluation | None = None


class _Failed(AssertionError):
    pass


def case_strategy(spec: NormalizerSpec, ctx: Context, ineq: Inequality):
    max_length = ctx.max_length
    if ineq.names & ENTRYWISE:
        max_length = min(max_length, JACOBIAN_MAX_L)
    temperature = S.temperatures() if spec.takes_temperature else st.none()
    if spec.takes_temperature and ctx.temperature is not None:
        temperature = st.just(ctx.temperature)
    return st.builds(
        lambda rows, t: FalsifyCase(rows.scores[0], t, rows.kind, rows.seed),
        S.logit_rows(min_length=1, max_length=max_length, batch=1, dtypes=(F64,), kinds=KINDS,
                     device="cpu"),
        temperature,
    )


def explicit_cases(spec: NormalizerSpec, ctx: Context | None = None) -> list[FalsifyCase]:
    """Small adversarial rows every search tries first (one key, one key beside a masked one,
    ties, a two-way tie, a peak, …), at T = 1 or the fixed temperature."""
    t = None
    if spec.takes_temperature:
        t = 1.0 if ctx is None or ctx.temperature is None else ctx.temperature
    single = S.build_rows("single", length=1, batch=1, dtype=F64, seed=1)
    out = [FalsifyCase(single.scores[0], t, "single", 1)]
    for length in (2, 3, 8):
        for kind in KINDS:
            if kind == "single":
                continue
            rows = S.build_rows(kind, length=length, batch=1, dtype=F64, seed=1)
            out.append(FalsifyCase(rows.scores[0], t, kind, 1))
    return out


def evaluate(spec, ineq: Inequality, case: FalsifyCase, params) -> Evaluation:
    heartbeat.example_started(case)  # the watchdog's clock (no-op outside a worker)
    try:
        values = evaluate_quantities(ineq.names, spec, case.scores, case.temperature, params)
    finally:
        heartbeat.example_finished()
    lhs, rhs = ineq.evaluate(values)
    ratio = float(ineq.ratio(values))
    t = tol_for(F64)
    verdict = ineq.verdict(values, rtol=t.rtol, atol=t.atol)
    if verdict == "undefined":
        ratio = math.nan  # no value: neither the worst case nor a failure
    return Evaluation(case, values, float(lhs), float(rhs), ratio, verdict == "fails",
                      verdict == "undefined")


def falsify(spec: NormalizerSpec, text: str, ctx: Context, *, label: str | None = None,
            params: dict[str, Any] | None = None) -> FalsifyResult:
    """Search for a case where the inequality ``text`` fails (see the module docstring)."""
    ineq = parse_inequality(text, QUANTITIES)
    params = dict(params or {})
    if params.get("temperature") is not None and ctx.temperature is None:
        from attnverify.certify import fix_temperature

        ctx = fix_temperature(ctx, params)
    start = time.perf_counter()
    strategy = case_strategy(spec, ctx, ineq)
    found: dict[str, Any] = {"n": 0, "worst": None, "smallest": None, "undefined": 0,
                             "undefined_example": None}

    def record(ev: Evaluation) -> None:
        found["n"] += 1
        if ev.undefined:
            found["undefined"] += 1
            found["undefined_example"] = found["undefined_example"] or ev
        if (found["worst"] is None or _key(ev) > _key(found["worst"])
                or (found["worst"].undefined and not ev.undefined)):
            found["worst"] = ev
        if ev.fails and (found["smallest"] is None
                         or _size(ev) < _size(found["smallest"])):
            found["smallest"] = ev

    def better(a: Evaluation | None, b: Evaluation | None) -> Evaluation | None:
        if a is None or b is None:
            return a or b
        return a if _size(a) <= _size(b) else b

    def search(case: FalsifyCase) -> None:
        ev = evaluate(spec, ineq, case, params)
        record(ev)
        if math.isfinite(ev.ratio):
            hypothesis.target(max(min(ev.ratio, 1e12), -1e12), label="lhs/rhs")

    test = given(strategy)(search)
    for case in explicit_cases(spec, ctx):
        test = hypothesis.example(case)(test)
    phases = (Phase.explicit, Phase.generate, Phase.target)
    hypothesis.seed(ctx.seed)(hypothesis_settings(ctx, phases=phases)(test))()
    witness = found["smallest"]
    if witness is not None:
        witness = better(_shrink(spec, ineq, strategy, ctx, params), witness)
    return FalsifyResult(
        target=label or spec.id, inequality=ineq, falsified=witness is not None,
        examples=found["n"], elapsed_s=time.perf_counter() - start, worst=found["worst"],
        witness=witness, params=dict(params), undefined=found["undefined"],
        undefined_example=found["undefined_example"],
    )


def _shrink(spec, ineq, strategy, ctx, params) -> Evaluation | None:
    last: dict[str, Evaluation] = {}

    def must_hold(case: FalsifyCase) -> None:
        ev = evaluate(spec, ineq, case, params)
        if ev.fails:
            last["ev"] = ev
            raise _Failed()

    test = given(strategy)(must_hold)
    try:
        hypothesis.seed(ctx.seed)(hypothesis_settings(ctx)(test))()
    except _Failed:
        return last.get("ev")
    return None


def _key(ev: Evaluation) -> float:
    return -math.inf if math.isnan(ev.ratio) else ev.ratio


def _size(ev: Evaluation) -> tuple[int, float, int]:
    """Witness order: shortest row first, then the largest violation, then the simplest kind."""
    kind = KINDS.index(ev.case.kind) if ev.case.kind in KINDS else len(KINDS)
    return (int(ev.case.scores.shape[-1]), -_key(ev), kind)


def _num(v: float) -> Any:
    return number(v)


# --------------------------------------------------------------------------------------------
# Command


def result_json(res: FalsifyResult, ctx: Context) -> dict[str, Any]:
    from attnverify import __version__

    return {
        "schema_version": 1,
        "attnverify_version": __version__,
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
        "worst_ratio": _num(res.worst.ratio) if res.worst else None,
        "worst_case": res.worst.to_json() if res.worst else None,
        "witness": res.witness.to_json() if res.witness else None,
        "undefined": res.undefined,
        "undefined_example": res.undefined_example.to_json() if res.undefined_example else None,
        "repro": repro(res, ctx),
        "rerun": rerun(res, ctx),
    }


def repro(res: FalsifyResult, ctx: Context) -> str:
    """The witness's repro (:func:`attnverify.serialize.repro_command`): re-evaluates the
    inequality on the witness and exits 1; without a witness, the search again."""
    if res.witness is None:
        return rerun(res, ctx)
    return repro_command(res.target, res.witness.case_json(res.params),
                         inequality=res.inequality.text)


def rerun(res: FalsifyResult, ctx: Context) -> str:
    """The command that runs the same search again."""
    params = ",".join(f"{k}={v}" for k, v in res.params.items() if v is not None)
    extra = f" --params {params}" if params else ""
    return (f"attnverify falsify {res.target} \"{res.inequality.text}\"{extra} "
            f"--profile {ctx.profile} --seed {ctx.seed}")


def shape_of(scores: torch.Tensor) -> str:
    """A plain name for a witness row: "two-way tie", "all tied", or its generator kind."""
    live = scores[torch.isfinite(scores)]
    if live.numel() >= 2:
        top = live.max()
        ties = int((live == top).sum())
        if ties == live.numel():
            return "all tied" if ties > 2 else "two-way tie"
        if ties == 2:
            return "two-way tie"
    return ""


def summary(res: FalsifyResult, ctx: Context) -> str:
    lines = []
    head = "FALSIFIED" if res.falsified else "not falsified"
    lines.append(f"{head}: {res.inequality.normalized}  [{res.target}]  "
                 f"({res.examples} cases, {res.elapsed_s:.1f}s, profile {ctx.profile}, "
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
                     f"ratio={w.ratio:.4g}")
    if res.worst:
        lines.append(f"  worst ratio LHS/RHS found: {res.worst.ratio:.6g} "
                     f"(L={res.worst.case.scores.numel()}, kind {res.worst.case.kind})")
    if res.undefined_example is not None:
        u = res.undefined_example
        vals = ", ".join(f"{k}={v:.6g}" for k, v in u.values.items())
        lines.append(f"  undefined on {res.undefined} cases (the expression has no value there, "
                     f"not a violation), e.g. at {vals}")
    lines.append(f"  repro: {repro(res, ctx)}")
    return "\n".join(lines)


def run_falsify_command(args, isolated=None) -> int:
    """The ``falsify`` command. ``isolated(target, params, text, ctx)`` runs the search in a
    worker process (:func:`attnverify.isolation.falsify_in_worker`; the command line passes it)
    and returns the result, or ``(message, case)`` when the code under test stopped it."""
    from attnverify.certify import make_context
    from attnverify.registry import load_target, parse_params
    from attnverify.report import check_writable, write_json

    ctx = make_context(args.profile, max_examples=args.max_examples, seed=args.seed,
                       timeout=args.timeout, isolation=False if args.no_isolation else None)
    check_writable(args.json_path, "--json")
    params = parse_params(args.params)
    from attnverify.certify import fix_temperature

    ctx = fix_temperature(ctx, params)  # a bad temperature is exit 2, before any work
    parse_inequality(args.inequality, QUANTITIES)  # a usage error before any work
    if isolated is not None:  # loaded in a worker process (in this one under --no-isolation)
        res = isolated(args.target, params, args.inequality, ctx)
        if isinstance(res, tuple):
            print(_stopped(*res))
            return 1
        res.params = params
    else:
        spec = load_target(args.target, params)
        try:
            res = falsify(spec, args.inequality, ctx, label=args.target, params=params)
            res.params = params
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - most likely the normalizer raising on a case
            print(f"error: the search stopped on {type(exc).__name__}: {exc}".splitlines()[0])
            return 1
    print(summary(res, ctx))
    if args.json_path:
        write_json(args.json_path, result_json(res, ctx))
    return 1 if res.falsified else 0


def _stopped(message: str, case: dict | None) -> str:
    """The report of a search that the code under test stopped (exit 1)."""
    line = f"error: the search stopped: {message}"
    if case:
        scores = ", ".join(f"{v:.6g}" for v in case["scores"][:16])
        more = " …" if len(case["scores"]) > 16 else ""
        t = "" if case["temperature"] is None else f", T={case['temperature']:g}"
        line += f"\n  input: L={case['L']}{t}, kind {case['kind']}, scores=[{scores}{more}]"
    return line
