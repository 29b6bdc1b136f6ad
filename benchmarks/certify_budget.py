"""Check the certify budget: ``attnverify certify`` on every built-in with the ci profile.

Runs what the command runs (every target in a worker process of its own, the checks in this
process; ``--no-isolation`` loads them here instead), including the start of the worker
processes. Prints the wall time per target and per property (summed over targets), the total
against the 60-second budget (references and gradients included), and exits 1 when over it. Not
a timed unit test: run it by hand or in a perf job.

    python benchmarks/certify_budget.py [--profile ci] [--budget 60] [--no-isolation] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="ci")
    p.add_argument("--budget", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument("--json", default=None)
    p.add_argument("--no-isolation", action="store_true",
                   help="load the targets in this process (the figure without the boundary)")
    args = p.parse_args(argv)
    from attnverify.certify import make_context  # not at asv discovery
    from attnverify.isolation import certify_all
    from attnverify.registry import builtin_ids

    ctx = make_context(args.profile, isolation=False if args.no_isolation else None)
    per_target, per_property = {}, defaultdict(float)
    examples = defaultdict(int)
    start = time.perf_counter()
    marks = {"t": start}

    def progress(target, result):  # per target: from its first property to its last
        marks[target] = time.perf_counter()

    results = certify_all(builtin_ids(), {}, None, ctx, progress=progress)
    last = start
    for res in results:
        per_target[res.target] = (marks.get(res.target, last) - last, res.verdict)
        last = marks.get(res.target, last)
        for r in res.results:
            per_property[r.property] += r.elapsed_s
            examples[r.property] += r.examples
    total = time.perf_counter() - start
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
        f"profile {ctx.profile}, {ctx.max_examples} examples/property, seed {ctx.seed}, "
        f"{'targets in worker processes' if ctx.isolation else 'targets in this process'}"
    )
    print("\nper target:")
    for name, (secs, verdict) in per_target.items():
        print(f"  {name:14s} {secs:7.1f} s  {verdict}")
    print("\nper property (all targets):")
    for prop, secs in sorted(per_property.items(), key=lambda kv: -kv[1]):
        rate = examples[prop] / secs if secs > 0 else float("inf")
        print(f"  {prop:28s} {secs:7.2f} s  {examples[prop]:6d} examples  {rate:8.0f} ex/s")
    ok = total <= args.budget
    print(
        f"\ntotal {total:.1f} s against a budget of {args.budget:.0f} s: "
        f"{'within' if ok else 'OVER'} budget"
    )
    if args.json:
        from attnverify.atomic import write_text_atomic

        summary = {
            "total_s": total,
            "budget_s": args.budget,
            "per_target": {k: v[0] for k, v in per_target.items()},
            "per_property": dict(per_property),
        }
        write_text_atomic(Path(args.json), json.dumps(summary, indent=2))
    failed = [n for n, (_, v) in per_target.items() if v != "certified"]
    if failed:
        print(f"not certified: {', '.join(failed)}", file=sys.stderr)
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
