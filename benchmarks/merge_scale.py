"""What ``attnverify merge`` costs as the run grows: time and part sizes for T targets in N shards.

Builds the partial certificates of a run of T targets split into N shards from one real partial
certificate's results (every target a copy of its first target, renamed; every unit's result the
real one), writes them, and times ``attnverify.merge`` reading, checking and merging them, the
way the merge job of ``docs/ci/attnverify-sharded.yml`` does. The figures feed docs/SCALE.md.

    python benchmarks/merge_scale.py PART.json [--targets 10,100,1000] [--shards 4,16]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path


def synthetic_parts(template: dict, targets: int, count: int) -> list[dict]:
    """``count`` partial certificates of ``targets`` copies of the template's first target."""
    from attnverify.shard import make_shard, unit_id

    head = template["targets"][0]
    full = {}  # (property, dtype) -> a unit's whole result, from whichever part ran it
    for r in head["results"]:
        for u in r["units"]:
            if u.get("result"):
                full[(r["property"], u["dtype"])] = u["result"]
    device = template.get("device", "cpu")
    names = [f"pkg.kernels:k{i:05d}" for i in range(targets)]
    units = [unit_id(n, r["property"], u["dtype"], device)
             for n in names for r in head["results"] for u in r["units"]]
    plan = dict(make_shard(1, count, units).plan)
    parts = []
    for k in range(1, count + 1):
        part = copy.deepcopy({key: v for key, v in template.items() if key != "targets"})
        part["shard"] = {"index": k, "count": count,
                         "units": [u for u, owner in plan.items() if owner == k], "plan": plan}
        part["targets"] = []
        for n in names:
            t = {key: v for key, v in head.items() if key != "results"}
            t["target"], t["results"], t["side_effects"] = n, [], []
            for r in head["results"]:
                entry = {key: v for key, v in r.items() if key != "units"}
                entry["units"] = []
                for u in r["units"]:
                    mine = plan[unit_id(n, r["property"], u["dtype"], device)] == k
                    result = full.get((r["property"], u["dtype"]))
                    entry["units"].append({"dtype": u["dtype"], "status": "not_checked"}
                                          if not mine or result is None else
                                          {**{x: result.get(x) for x in
                                              ("status", "examples", "worst_ratio",
                                               "elapsed_s")},
                                           "dtype": u["dtype"], "result": result})
                t["results"].append(entry)
            part["targets"].append(t)
        parts.append(part)
    return parts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="+", help="the partial certificates of one real run")
    p.add_argument("--targets", default="10,100,1000")
    p.add_argument("--shards", default="4,16")
    args = p.parse_args(argv)
    import attnverify.certify  # noqa: F401 - torch's import, outside the timings
    from attnverify.merge import check_together, load_part, merge_parts

    real = [load_part(x) for x in args.parts]
    template = copy.deepcopy(real[0])
    # every unit's whole result, gathered from every real part into the template
    for data in real[1:]:
        for r, other in zip(template["targets"][0]["results"], data["targets"][0]["results"]):
            for u, v in zip(r["units"], other["units"]):
                if v.get("result") and not u.get("result"):
                    u.update(v)
    print(f"{'targets':>8} {'shards':>6} {'units':>8} {'MB/part':>8} {'merge s':>8}")
    for targets in (int(x) for x in args.targets.split(",")):
        for count in (int(x) for x in args.shards.split(",")):
            parts = synthetic_parts(template, targets, count)
            with tempfile.TemporaryDirectory() as tmp:
                paths = []
                for i, part in enumerate(parts):
                    path = Path(tmp) / f"part-{i + 1}.json"
                    path.write_text(json.dumps(part))
                    paths.append(str(path))
                size = sum(Path(x).stat().st_size for x in paths) / len(paths) / 1e6
                start = time.perf_counter()
                loaded = [(x, load_part(x)) for x in paths]
                check_together(loaded)
                merged = merge_parts(loaded)
                json.dumps(merged)
                seconds = time.perf_counter() - start
            units = len(parts[0]["shard"]["plan"])
            print(f"{targets:>8} {count:>6} {units:>8} {size:>8.2f} {seconds:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
