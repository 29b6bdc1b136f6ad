"""Wall time of paper A's five algorithms through ``attnverify empirical``, against Table 1.

Paper A (arXiv:2508.17821, Table 1) reports, on a 10-core laptop: 24 min (Alg. 1), 37 min
(Alg. 2), 17 h 4 min (Alg. 3, parallel), 7 min (Alg. 4) and 1 min (Alg. 5) — about 18.2 h.
The target here: all five on ``gpt2-random`` (GPT-2 124M architecture, 144 heads, L = 1024) in
under 3 minutes and under 8 GB on a 2-core machine.

This is a script, not a timed test and not an asv benchmark (asv imports this module and finds
no ``time_*``/``track_*`` in it; the work runs only under ``__main__``)::

    python benchmarks/bench_empirical.py                      # gpt2-random, prints the table
    python benchmarks/bench_empirical.py --markdown docs/empirical/timing-gpt2-random.md

The total is the whole process: imports, building the model, the forward pass, the five
algorithms and writing the outputs. Peak memory is the process's maximum resident set size.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from attnverify.atomic import write_text_atomic  # noqa: E402
from attnverify.empirical.config import PAPER_A_EXPERIMENTS as PAPER_A  # noqa: E402

TARGET_SECONDS = 180
TARGET_MB = 8 * 1024


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from attnverify.empirical.config import PAPER_TABLE1_SECONDS, RunConfig
    from attnverify.empirical.pipeline import run

    out = Path(args.out or tempfile.mkdtemp(prefix="bench-empirical-"))
    config = RunConfig(
        model=args.model,
        experiments=PAPER_A,
        out=out,
        progress=False,
        threads=args.threads,
        text=args.text,
        **({"windows": args.windows} if args.windows else {}),
    )
    document = run(config)
    total = time.perf_counter() - START
    rows = _rows(document, PAPER_TABLE1_SECONDS)
    summary = _summary(document, rows, total, PAPER_TABLE1_SECONDS)
    print(render(summary))
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(summary, indent=1) + "\n")
    if args.markdown:
        write_text_atomic(Path(args.markdown), render(summary) + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-random")
    parser.add_argument("--text", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--windows", type=int, default=None,
                        help="text windows (default: the model check's own default)")
    parser.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the timing summary as JSON")
    parser.add_argument("--markdown", default=None, help="write the timing table as Markdown")
    return parser


def _rows(document: dict, paper: dict) -> list[dict]:
    ex = document["experiments"]
    return [
        {
            "experiment": name,
            "seconds": ex[name]["seconds"],
            "paper_seconds": paper[name],
            "speedup": paper[name] / ex[name]["seconds"],
        }
        for name in PAPER_A
    ]


def _summary(document: dict, rows: list[dict], total: float, paper: dict) -> dict:
    meta, env = document["model"], document["environment"]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak_mb = usage.ru_maxrss / 1024
    paper_total = sum(paper[name] for name in PAPER_A)
    return {
        "model": meta["name"],
        "weights": meta["weights"],
        "heads": meta["layers"] * meta["heads_per_layer"],
        "L": meta["max_length"],
        "windows": meta["windows"],
        "rows": rows,
        "load_seconds": meta["seconds"]["load"],
        "forward_seconds": meta["seconds"]["extract"],
        "total_seconds": total,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "load_average": os.getloadavg()[0],
        "paper_total_seconds": paper_total,
        "total_speedup": paper_total / total,
        "peak_rss_mb": peak_mb,
        "meets_target": total < TARGET_SECONDS and peak_mb < TARGET_MB,
        "machine": {
            "cpus": os.cpu_count(),
            "threads": env["cpu_threads"],
            "processor": platform.processor() or platform.machine(),
            "torch": env["torch_version"],
            "device": env["device"],
        },
    }


#: Paper A's workload: GPT-2 124M, 12 layers × 12 heads.
GPT2_HEADS = 144


def render(s: dict) -> str:
    lines = [
        f"Model {s['model']} ({s['weights']} weights), {s['heads']} heads, L = {s['L']}, "
        f"{s['windows']} window(s); {s['machine']['cpus']} CPU(s), "
        f"{s['machine']['threads']} torch thread(s), torch {s['machine']['torch']}.",
        "",
        "| step | this run | paper A, Table 1 | paper / this run |",
        "|---|---|---|---|",
        f"| build model | {s['load_seconds']:.1f} s | – | – |",
        f"| forward pass (all heads captured) | {s['forward_seconds']:.1f} s | – | – |",
    ]
    for row in s["rows"]:
        lines.append(
            f"| `{row['experiment']}` | {row['seconds']:.1f} s | "
            f"{_duration(row['paper_seconds'])} | {row['speedup']:,.0f}× |"
        )
    lines.append(
        f"| **total, whole process** | **{s['total_seconds']:.1f} s** | "
        f"**{_duration(s['paper_total_seconds'])}** | **{s['total_speedup']:,.0f}×** |"
    )
    verdict = "meets" if s["meets_target"] else "MISSES"
    if s["heads"] != GPT2_HEADS:
        lines += [
            "",
            f"This model has {s['heads']} heads, GPT-2 has {GPT2_HEADS}: the paper columns compare "
            "unequal work, and only a GPT-2-shaped run (gpt2, gpt2-random) is comparable.",
        ]
    lines += [
        "",
        f"CPU time of the process {s['cpu_seconds']:.1f} s (wall {s['total_seconds']:.1f} s; "
        f"1-minute load average {s['load_average']:.1f} at the end: a load above the machine's "
        "CPU count means other jobs shared it and the wall time is pessimistic).",
        "",
        f"Peak memory {s['peak_rss_mb']:.0f} MB. {verdict} the target "
        f"(< {TARGET_SECONDS} s and < {TARGET_MB // 1024} GB).",
    ]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    from attnverify.empirical.report import duration  # imports torch: not at module import

    return duration(seconds)


if __name__ == "__main__":
    raise SystemExit(main())
