"""Check the certify budget: ``attnverify certify`` on every built-in with the ci profile.

Prints the wall time per target and per property (summed over targets), the total against the
60-second budget (references and gradients included), and exits 1 when over it. Not a timed unit
test: run it by hand or in a perf job.

    python benchmarks/certify_budget.py [--profile ci] [--budget 60] [--json PATH]
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
    args = p.parse_args(argv)
    from attnverify.certify import certify_target, make_context  # not at asv discovery
    from attnverify.registry import builtin_ids, load_target

    ctx = make_context(args.profile)
    per_target, per_property = {}, defaultdict(float)
    examples = defaultdict(int)
    start = time.perf_counter()
    for name in builtin_ids():
        t0 = time.perf_counter()
        res = certify_target(load_target(name), None, ctx)
        per_target[name] = (time.perf_counter() - t0, res.verdict)
        for r in res.results:
            per_property[r.property] += r.elapsed_s
            examples[r.property] += r.examples
    total = time.perf_counter() - start
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
        f"profile {ctx.profile}, {ctx.max_examples} examples/property, seed {ctx.seed}"
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
