"""Time ``attnverify certify`` on the Triton examples (examples/triton/), as a user runs it.

Each example is certified by the command itself (a subprocess: the zygote, the worker, Triton's
interpreter where no GPU is visible), on the ci profile unless told otherwise, and its wall time
is compared with its target (issue #26): the one-block row softmax within 5 minutes, the online
(multi-block) row softmax within 8, the flash-attention forward within 15. Prints one line per
example (verdict, what ran it, wall seconds, CPU seconds of the command and its workers, the
load average, the target) and exits 1 when one fails or runs over. Not a timed unit test: run
it by hand; the README cites its figures.

    python benchmarks/triton_certify.py [--profile ci] [--only NAME …] [--json PATH]

Without triton it says so and exits 0 (nothing to time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "triton"
#: name -> (certify arguments, target seconds)
CASES = {
    "softmax_rows": (["examples/triton/softmax_rows.py:softmax", "--reference", "softmax"], 300),
    "softmax_online": (["examples/triton/softmax_online.py:softmax", "--reference", "softmax"],
                       480),
    "flash_attention": (["--attention", "examples/triton/flash_attention.py:spec"], 900),
}


def run_one(name: str, profile: str) -> dict:
    args, target = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cert.json"
        cmd = [sys.executable, "-m", "attnverify", "certify", *args, "--profile", profile,
               "--quiet", "--json", str(out)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        data = json.loads(out.read_text()) if out.exists() else {}
    targets = data.get("targets") or [{}]
    t = targets[0]
    bad = [f"{r['property']} {r['status']}" for r in t.get("results", [])
           if r.get("status") in ("violated", "error")]
    return {"name": name, "command": "attnverify certify " + " ".join(args[:1] + args[1:])
            + f" --profile {profile}", "exit": proc.returncode, "verdict": t.get("verdict"),
            "execution": t.get("execution"), "seconds": round(wall, 1), "target_s": target,
            # CPU time of the command, its zygote and its workers (what a loaded machine's wall
            # time hides), and the load average when it ended
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                           1), "load_average": [round(x, 1) for x in os.getloadavg()],
            "within": wall <= target, "failing": bad,
            "per_call": (t.get("coverage") or {}).get("per_call"),
            "row_count": (t.get("coverage") or {}).get("row_count"),
            "row_length": (t.get("coverage") or {}).get("row_length"),
            "stderr": proc.stderr.strip().splitlines()[-1:] if proc.returncode == 2 else []}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="ci")
    p.add_argument("--only", nargs="*", choices=sorted(CASES), default=None)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    try:
        import triton  # noqa: F401 - only whether it is there
    except ImportError:
        print("triton is not installed (pip install -c constraints.txt -e '.[triton]'): "
              "nothing to time")
        return 0
    rows, ok = [], True
    for name in args.only or list(CASES):
        row = run_one(name, args.profile)
        rows.append(row)
        ok &= row["verdict"] == "certified" and row["within"]
        print(f"{name}: {row['verdict']} ({row['execution']}) in {row['seconds']:.0f} s "
              f"({row['cpu_s']:.0f} s of CPU, load {row['load_average'][0]}), "
              f"target {row['target_s']} s{'' if row['within'] else ' OVER'}"
              + (f"; failing: {', '.join(row['failing'])}" if row["failing"] else ""),
              flush=True)
    if args.json:
        report = {"profile": args.profile, "machine": f"{platform.system()} "
                  f"{platform.machine()}, {os.cpu_count()} cores, Python "
                  f"{platform.python_version()}", "results": rows}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
