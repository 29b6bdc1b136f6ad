"""Falsification power: ``attnverify falsify`` against the searches a user would write instead.

Runs, side by side in one run and at the same budget of evaluations of the inequality, on every
bound of the labelled corpus (``benchmarks/falsify_corpus.py``: issue #18's first 45 bounds over
softmax, sparsemax, entmax15, sigmoid and ssmax, and the red team's 63 over every built-in),
each with the normalizer parameters the bound names:

- ``attnverify``: :func:`attnverify.falsify.falsify` under the profile (default ci), its
  evaluation budget set to the common one;
- ``hypothesis``: plain Hypothesis without targeting: ``@given`` rows of 1–64 logits drawn by
  ``st.floats(-100, 100)``, optionally followed by 1–L masked keys, the temperature by
  ``st.floats(0.1, 10)`` where it is free, generate phase only, seeded;
- ``differential_evolution``: ``scipy.optimize.differential_evolution`` (seeded, Latin-hypercube
  start, no polish) maximising the same LHS/RHS over ``log2 L``, ``log10(a/T)`` in [-3, 2],
  ``log10 T`` in [-1, 1] (where free), a mask fraction and eight shape values tiled over the row.

Every method evaluates the inequality with the same function (:func:`attnverify.falsify.evaluate`:
same quantities, tolerance and "undefined" semantics), stops at its first failing case, and may
spend at most the budget. Printed per method: false bounds found and missed, true bounds wrongly
falsified (false alarms), median evaluations and seconds to the first witness (a miss counts as
infinite). ``--json PATH`` writes ``{"methods": {name: {"found", "missed", "false_alarms",
"median_evaluations_to_witness", "median_seconds_to_witness"}}, "bounds": [...]}``.
``--isolated`` runs attnverify's search with the target behind the process boundary (a worker
process, as the command line runs it; the worker's start not timed). ``--speed`` also times the
command line (``attnverify falsify TARGET INEQUALITY --profile …``,
isolation included) on every bound and prints the medians with and without a Jacobian quantity,
with the wall and CPU seconds (user + system, the worker process included) and the one-minute
load average of the slowest runs.

    python benchmarks/falsify_power.py [--profile ci] [--evaluations N] [--seed S] [--only IDS]
        [--methods NAMES] [--isolated] [--speed] [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.falsify_corpus import CORPUS, Bound  # noqa: E402

METHODS = ("attnverify", "hypothesis", "differential_evolution")
#: The plain searches' row lengths and ranges (what a user would write).
PLAIN_MAX_L = 64
PLAIN_RANGE = 100.0
DE_SHAPES = 8


class _Found(BaseException):
    pass


class _Spent(BaseException):
    pass


class Probe:
    """Counts the evaluations of one method on one bound and stops it at the first failure."""

    def __init__(self, spec, ineq, budget: int, params=None) -> None:
        self.spec, self.ineq, self.budget = spec, ineq, budget
        self.params = dict(params or {})
        self.n, self.found_at, self.found_s = 0, None, None
        self.start = time.perf_counter()

    def __call__(self, scores, temperature):
        from attnverify.falsify import FalsifyCase, evaluate

        if self.n >= self.budget:
            raise _Spent()
        self.n += 1
        ev = evaluate(self.spec, self.ineq, FalsifyCase(scores, temperature, "bench", 0),
                      self.params)
        if ev.fails:
            self.found_at, self.found_s = self.n, time.perf_counter() - self.start
            raise _Found()
        return ev


def _free_temperature(spec) -> bool:
    return bool(spec.takes_temperature)


def run_attnverify(bound: Bound, spec, budget: int, profile: str, seed: int,
                   isolated: bool = False) -> dict:
    """``isolated``: the target behind the process boundary, in a worker process, as the
    command line runs it (the search of the same budget; the worker's start not timed)."""
    from attnverify import remote
    from attnverify.certify import make_context
    from attnverify.falsify import falsify

    ctx = make_context(profile, seed=seed, max_examples=budget, isolation=isolated)
    if isolated:
        spec = remote.open_normalizer(bound.target, dict(bound.params), ctx)
    start = time.perf_counter()
    try:
        res = falsify(spec, bound.inequality, ctx, label=bound.target, params=dict(bound.params))
    finally:
        if isolated:
            remote.channel_of(spec).close()
    report = res.search
    return {"falsified": res.falsified, "evaluations": res.examples,
            "evaluations_to_witness": report.first_witness_evaluation if res.falsified else None,
            "seconds_to_witness": report.first_witness_s if res.falsified else None,
            "seconds": time.perf_counter() - start,
            "found_by": report.first_witness_phase if res.falsified else None,
            "witness_L": int(res.witness.case.scores.numel()) if res.witness else None}


def run_hypothesis(bound: Bound, spec, ineq, budget: int, seed: int) -> dict:
    import hypothesis
    import torch
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    free_t = _free_temperature(spec)

    @st.composite
    def cases(draw):
        length = draw(st.integers(1, PLAIN_MAX_L))
        row = draw(st.lists(st.floats(-PLAIN_RANGE, PLAIN_RANGE), min_size=length,
                            max_size=length))
        if draw(st.booleans()):
            row += [-math.inf] * draw(st.integers(1, length))
        t = draw(st.floats(0.1, 10.0)) if free_t else None
        return torch.tensor(row, dtype=torch.float64), t

    probe = Probe(spec, ineq, budget, bound.params)

    @given(cases())
    def search(case):
        probe(*case)

    run = settings(max_examples=budget, phases=[Phase.generate], database=None, deadline=None,
                   suppress_health_check=list(HealthCheck))(search)
    return _finish(probe, lambda: hypothesis.seed(seed)(run)())


def run_differential_evolution(bound: Bound, spec, ineq, budget: int, seed: int,
                               max_length: int) -> dict:
    import numpy as np
    import torch
    from scipy.optimize import differential_evolution

    from attnverify.falsify_search import CLAMP, merit

    free_t = _free_temperature(spec)
    bounds = [(0.0, math.log2(max_length)), (-3.0, 2.0)]
    if free_t:
        bounds.append((-1.0, 1.0))
    bounds.append((0.0, 1.0))  # mask fraction: masked keys only above 0.5
    bounds += [(-1.0, 1.0)] * DE_SHAPES
    probe = Probe(spec, ineq, budget, bound.params)

    def objective(x) -> float:
        length = max(1, min(max_length, int(round(2.0 ** x[0]))))
        k = 2
        t = None
        if free_t:
            t, k = 10.0 ** x[2], 3
        pad = int(max(0.0, 2.0 * x[k] - 1.0) * length)
        pad = min(pad, max_length - length)
        shape = np.resize(np.asarray(x[k + 1:]), length)
        top = float(np.abs(shape).max())
        unit = shape / top if top > 0 else shape
        a = 10.0 ** x[1] * (1.0 if t is None else t)
        row = torch.tensor(np.concatenate([a * unit, np.full(pad, -np.inf)]), dtype=torch.float64)
        score = merit(probe(row, t))
        return -score if math.isfinite(score) else CLAMP

    return _finish(probe, lambda: differential_evolution(
        objective, bounds, seed=seed, popsize=15, maxiter=10**6, tol=0.0, atol=0.0, polish=False,
        init="latinhypercube", updating="immediate"))


def _finish(probe: Probe, run) -> dict:
    start = time.perf_counter()
    try:
        run()
    except (_Found, _Spent):
        pass
    found = probe.found_at is not None
    return {"falsified": found, "evaluations": probe.n,
            "evaluations_to_witness": probe.found_at, "seconds_to_witness": probe.found_s,
            "seconds": time.perf_counter() - start}


def run_cli(bound: Bound, profile: str, seed: int) -> dict:
    """The command a user runs (worker process included): exit code and wall time."""
    cmd = [sys.executable, "-m", "attnverify", "falsify", bound.target, bound.inequality,
           "--profile", profile, "--seed", str(seed)]
    if bound.params:
        cmd += ["--params", ",".join(f"{k}={v}" for k, v in bound.params.items())]
    start = time.perf_counter()
    before = os.times()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system
                                                          - before.children_system)
    return {"exit": proc.returncode, "seconds": time.perf_counter() - start, "cpu_s": cpu,
            "load": os.getloadavg()[0]}


def jacobian(bound: Bound) -> bool:
    return "jacobian_" in bound.inequality


def summarise(rows: list[dict], methods: list[str]) -> dict:
    out = {}
    for name in methods:
        false = [r for r in rows if r["false"]]
        found = [r for r in false if r["methods"][name]["falsified"]]
        alarms = [r for r in rows if not r["false"] and r["methods"][name]["falsified"]]
        evals = [r["methods"][name]["evaluations_to_witness"] or math.inf for r in false]
        secs = [r["methods"][name]["seconds_to_witness"] or math.inf for r in false]
        out[name] = {"found": len(found), "missed": len(false) - len(found),
                     "false_alarms": len(alarms),
                     "median_evaluations_to_witness": _median(evals),
                     "median_seconds_to_witness": _median(secs)}
    return out


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def _fmt(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-" if value is None or math.isnan(value) else "inf"
    return f"{value:.{digits}g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="ci", help="attnverify's profile (default ci)")
    p.add_argument("--evaluations", type=int, default=None,
                   help="budget per method and bound (default: the profile's falsify budget)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="comma-separated bound ids")
    p.add_argument("--false-only", action="store_true", help="only the false bounds")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--isolated", action="store_true",
                   help="run attnverify's search with the target behind the process boundary "
                   "(a worker process, as `attnverify falsify` runs it) instead of in this "
                   "process")
    p.add_argument("--speed", action="store_true",
                   help="also time `attnverify falsify` on the command line for every bound")
    p.add_argument("--json", dest="json_path", default=None)
    args = p.parse_args(argv)

    import torch

    from attnverify import __version__
    from attnverify.expr import parse_inequality
    from attnverify.falsify_search import max_length_for
    from attnverify.registry import load_target
    from attnverify.report import write_json
    from attnverify.runconfig import FALSIFY_BUDGETS, PROFILES
    from attnverify.serialize import jsonable

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"unknown method {unknown[0]!r}: expected some of {', '.join(METHODS)}")
    budget = args.evaluations or int(FALSIFY_BUDGETS[args.profile]["evaluations"])
    bounds = list(CORPUS)
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        bounds = [b for b in bounds if b.id in wanted]
    if args.false_only:
        bounds = [b for b in bounds if b.is_false]
    print(f"# falsify_power: {len(bounds)} bounds, {budget} evaluations per method and bound, "
          f"profile {args.profile}, seed {args.seed}"
          f"{', attnverify behind the process boundary' if args.isolated else ''}; "
          f"attnverify {__version__}, torch "
          f"{torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    rows = []
    for bound in bounds:
        spec = load_target(bound.target, bound.params)
        ineq = parse_inequality(bound.inequality)
        longest = max_length_for(ineq, PROFILES[args.profile]["max_length"])
        row = {"id": bound.id, "target": bound.target, "inequality": bound.inequality,
               "params": dict(bound.params), "false": bound.is_false,
               "jacobian": jacobian(bound), "methods": {}}
        for name in methods:
            if name == "attnverify":
                got = run_attnverify(bound, spec, budget, args.profile, args.seed,
                                     isolated=args.isolated)
            elif name == "hypothesis":
                got = run_hypothesis(bound, spec, ineq, budget, args.seed)
            else:
                got = run_differential_evolution(bound, spec, ineq, budget, args.seed, longest)
            row["methods"][name] = got
        if args.speed:
            row["cli"] = run_cli(bound, args.profile, args.seed)
        rows.append(row)
        cells = "  ".join(
            f"{name}: {'FOUND' if got['falsified'] else 'none '} "
            f"{_fmt(got['evaluations_to_witness'], 6):>5} ev {got['seconds']:6.1f}s"
            for name, got in row["methods"].items())
        cli = f"  cli {row['cli']['seconds']:.1f}s" if args.speed else ""
        print(f"{bound.id:32s} {'false' if bound.is_false else 'true '}  {cells}{cli}",
              flush=True)
    summary = summarise(rows, methods)
    print()
    print("| method | false bounds found | missed | false alarms (true bounds falsified) | "
          "median evaluations to witness | median seconds to witness |")
    print("| --- | --- | --- | --- | --- | --- |")
    n_false = sum(r["false"] for r in rows)
    for name, s in summary.items():
        print(f"| {name} | {s['found']}/{n_false} | {s['missed']} | {s['false_alarms']}/"
              f"{len(rows) - n_false} | {_fmt(s['median_evaluations_to_witness'], 6)} | "
              f"{_fmt(s['median_seconds_to_witness'])} |")
    if "attnverify" in methods:
        for label, pick in (("without a Jacobian quantity", False), ("with one", True)):
            secs = [r["methods"]["attnverify"]["seconds"] for r in rows if r["jacobian"] == pick]
            if secs:
                where = "behind the process boundary" if args.isolated else "in-process"
                print(f"attnverify falsify {where}, {label}: median {_median(secs):.1f}s, "
                      f"max {max(secs):.1f}s over {len(secs)} bounds")
    if args.speed:
        for label, pick in (("without a Jacobian quantity", False), ("with one", True)):
            runs = sorted((r for r in rows if r["jacobian"] == pick),
                          key=lambda r: -r["cli"]["seconds"])
            if runs:
                secs = [r["cli"]["seconds"] for r in runs]
                slow = ", ".join(f"{r['id']} {r['cli']['seconds']:.1f}s wall / "
                                 f"{r['cli']['cpu_s']:.1f}s CPU (load {r['cli']['load']:.1f})"
                                 for r in runs[:3])
                print(f"attnverify falsify (command line), {label}: median {_median(secs):.1f}s,"
                      f" max {max(secs):.1f}s over {len(secs)} bounds; slowest: {slow}")
    if args.json_path:
        write_json(args.json_path, jsonable({"methods": summary, "bounds": rows}))
    if args.isolated:
        from attnverify import remote

        remote.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
