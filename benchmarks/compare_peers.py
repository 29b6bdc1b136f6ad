"""Ours against the peers, side by side in one run: the ratio table of the README.

    python benchmarks/compare_peers.py [--rows 96] [--L 4096] [--dtype float32] [--device cpu]
        [--repeats 25] [--threads N] [--alpha 1.25,1.5] [--bandwidth] [--json PATH]

For each pair (softmax / torch.softmax, softmax_fused / torch.softmax, sparsemax /
entmax.sparsemax, entmax15 / entmax.entmax15, entmax_alpha / entmax.entmax_bisect at each α of
``--alpha``) and each direction, ours and theirs are timed interleaved (ours, theirs, theirs,
ours, …) so that load from other processes falls on both alike. Each row gives the median time
per call with its interquartile range, and the ratio ours / theirs as the median of the
per-repetition ratios with their IQR.

``softmax_fused`` (the fused CPU kernel) and ``softmax`` (on ``torch.softmax``) forward are also
compared with a same-size ``copy_`` (the bandwidth proxy), and α-entmax "at equal accuracy": the
largest absolute error of each against a float64 bisection with 200 iterations. ``--bandwidth``
adds every normalizer's fraction of copy bandwidth.
Exit status 0 whatever the numbers; the verdict column says whether each target is met.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

#: The issue's targets for ours / theirs (pairs from ``grid.PEER_OF``): 1.0 unless listed.
TARGETS = {"softmax": 1.15, "softmax_fused": 1.15}
#: softmax_fused forward may take at most this many times a same-size copy.
COPY_TARGET = 3.0
REFERENCE_ITERATIONS = 200


def _import_suite():
    if __package__ in (None, ""):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import devices, grid, measure, subjects

    return devices, grid, measure, subjects


def _stats(measure, xs: list[float]) -> dict:
    lo, hi = measure.iqr(xs)
    return {"median": measure.median(xs), "q1": lo, "q3": hi, "n": len(xs)}


def _ratio_stats(measure, ours: list[float], theirs: list[float]) -> dict:
    return _stats(measure, [a / b for a, b in zip(ours, theirs)])


def _alpha_fn(subjects, name: str, alpha: float):
    """ours / theirs α-entmax at ``alpha`` as ``f(z)`` along the last dimension."""
    import functools

    if name == "entmax.entmax_bisect":
        import entmax

        return functools.partial(entmax.entmax_bisect, alpha=alpha, dim=-1)
    from attnverify.registry import load_target

    return functools.partial(load_target("entmax_alpha", {"alpha": alpha}), dim=-1)


def _case(subjects, name, args, fn=None, backward=True):
    case = subjects.Case(
        "torch.softmax" if fn else name, args.rows, args.L, args.dtype, args.device, backward=False
    )
    if fn is not None:
        case.name, case.fn = name, fn
        case.forward()
    if backward:
        case._prepare_backward(args.rows, args.L, args.dtype)
        case.backward()
    return case


def compare_pair(mods, args, ours: str, theirs: str, label: str, fns=(None, None),
                 directions=("forward", "backward")) -> list[dict]:
    devices, grid, measure, subjects = mods
    a = _case(subjects, ours, args, fns[0], "backward" in directions)
    b = _case(subjects, theirs, args, fns[1], "backward" in directions)
    rows = []
    for direction in directions:
        body_a = a.forward if direction == "forward" else a.backward
        body_b = b.forward if direction == "forward" else b.backward
        s = measure.interleaved(
            {"ours": body_a, "theirs": body_b}, repeats=args.repeats, min_time=args.min_time
        )
        ratio = _ratio_stats(measure, s["ours"], s["theirs"])
        target = TARGETS.get(ours, 1.0)
        rows.append(
            {
                "normalizer": label,
                "peer": theirs,
                "direction": direction,
                "ours_s": _stats(measure, s["ours"]),
                "theirs_s": _stats(measure, s["theirs"]),
                "ratio": ratio,
                "target": target,
                "meets_target": None if target is None else ratio["median"] <= target,
            }
        )
    return rows


def compare_copy(mods, args, name: str = "softmax_fused") -> dict:
    devices, grid, measure, subjects = mods
    case = subjects.Case(name, args.rows, args.L, args.dtype, args.device)
    s = measure.interleaved(
        {"softmax": case.forward, "copy": case.copy}, repeats=args.repeats, min_time=args.min_time
    )
    ratio = _ratio_stats(measure, s["softmax"], s["copy"])
    return {
        "normalizer": name,
        "softmax_s": _stats(measure, s["softmax"]),
        "copy_s": _stats(measure, s["copy"]),
        "ratio": ratio,
        "target": COPY_TARGET,
        "meets_target": ratio["median"] <= COPY_TARGET,
        "copy_gb_per_s": case.bytes_moved("copy") / measure.median(s["copy"]) / 1e9,
    }


def accuracy(mods, args, alpha: float) -> dict:
    """Largest |error| of ours and of entmax_bisect against a float64, 200-step bisection."""
    import entmax
    import torch

    devices, grid, measure, subjects = mods
    z = subjects.scores(args.rows, args.L, args.dtype, args.device)
    ref = entmax.entmax_bisect(z.double(), alpha=alpha, dim=-1, n_iter=REFERENCE_ITERATIONS)
    out = {"alpha": alpha, "reference": f"entmax_bisect float64, n_iter={REFERENCE_ITERATIONS}"}
    for name in ("entmax_alpha", "entmax.entmax_bisect"):
        with torch.no_grad():
            y = _alpha_fn(subjects, name, alpha)(z)
        out[name] = float((y.double() - ref).abs().max())
    return out


def bandwidth(mods, args) -> list[dict]:
    """Every normalizer's fraction of copy bandwidth, measured as ``bench_bandwidth`` does."""
    from benchmarks.bench_bandwidth import measure_fraction

    devices, grid, measure, subjects = mods
    rows = []
    for name in grid.NORMALIZERS:
        try:
            case = subjects.Case(name, args.rows, args.L, args.dtype, args.device, backward=True)
        except NotImplementedError:
            continue
        row = {"normalizer": name, "design": grid.NOT_MEMORY_BOUND.get(name, "memory-bound")}
        for direction in ("forward", "backward"):
            m = measure_fraction(case, direction, repeats=9, min_time=0.02)
            frac, secs = m["fraction"], m["seconds"]
            row[direction] = {"fraction": frac, "multiple_of_bound": 1.0 / frac, "time_s": secs}
        rows.append(row)
    return rows


def machine(mods, args) -> dict:
    import torch

    devices = mods[0]
    return {
        "device": args.device,
        "device_name": devices.device_label(args.device),
        "cpus": _cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# --------------------------------------------------------------------------------------------
# Printing


def _ms(st: dict) -> str:
    return f"{st['median'] * 1e3:.3f} [{st['q1'] * 1e3:.3f}–{st['q3'] * 1e3:.3f}]"


def _ratio(st: dict) -> str:
    return f"{st['median']:.2f} [{st['q1']:.2f}–{st['q3']:.2f}]"


def _verdict(ok) -> str:
    return "" if ok is None else ("meets" if ok else "MISSES")


def render(report: dict) -> str:
    m, c = report["machine"], report["config"]
    lines = [
        f"rows={c['rows']} L={c['L']} dtype={c['dtype']} device={c['device']} "
        f"({m['device_name']}, {m['cpus']} CPUs, torch {m['torch']}, {m['torch_threads']} threads)",
        "",
        "| normalizer | peer | direction | ours ms median [IQR] | theirs ms median [IQR] "
        "| ratio ours/theirs [IQR] | target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["peers"]:
        target = "" if r["target"] is None else f"≤ {r['target']:.2f} {_verdict(r['meets_target'])}"
        lines.append(
            f"| {r['normalizer']} | {r['peer']} | {r['direction']} | {_ms(r['ours_s'])} "
            f"| {_ms(r['theirs_s'])} | {_ratio(r['ratio'])} | {target} |"
        )
    for cp in (report["copy"], report.get("copy_softmax")):
        if not cp:
            continue
        lines.append(
            f"| {cp.get('normalizer', 'softmax')} | same-size copy_ | forward "
            f"| {_ms(cp['softmax_s'])} | {_ms(cp['copy_s'])} | {_ratio(cp['ratio'])} "
            f"| ≤ {cp['target']:.2f} {_verdict(cp['meets_target'])} |"
        )
    for sk in report.get("skipped") or []:
        lines.append(f"| {sk['name']} | torch.softmax | skipped: {sk['reason']} | | | | |")
    cp = report["copy"]
    lines += ["", f"copy bandwidth: {cp['copy_gb_per_s']:.1f} GB/s (read + write)", ""]
    lines += [
        "| α-entmax accuracy | α | max abs error, ours | max abs error, entmax_bisect |",
        "| --- | --- | --- | --- |",
    ]
    for a in report["accuracy"]:
        lines.append(
            f"| vs {a['reference']} | {a['alpha']} | {a['entmax_alpha']:.2e} "
            f"| {a['entmax.entmax_bisect']:.2e} |"
        )
    if report.get("bandwidth"):
        lines += [
            "",
            "| normalizer | design | forward fraction of copy bw | backward fraction "
            "| forward × bound | backward × bound |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in report["bandwidth"]:
            f, b = r["forward"], r["backward"]
            lines.append(
                f"| {r['normalizer']} | {r['design']} | {f['fraction']:.3f} | {b['fraction']:.3f} "
                f"| {f['multiple_of_bound']:.1f} | {b['multiple_of_bound']:.1f} |"
            )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=96, help="rows = batch·heads (default 96)")
    p.add_argument("--L", type=int, default=4096, help="row length (default 4096)")
    p.add_argument("--dtype", default="float32", help="float32, float64, bfloat16, float16")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--repeats", type=int, default=25, help="interleaved samples per candidate")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per sample (min)")
    p.add_argument("--alpha", default="1.25,1.5", help="α values for entmax_alpha / entmax_bisect")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--bandwidth", action="store_true", help="add every normalizer's fraction")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    mods = _import_suite()
    devices, grid = mods[0], mods[1]
    try:
        devices.require(args.device)
    except NotImplementedError as exc:
        print(f"compare_peers: device {args.device} unavailable: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        import os

        os.environ[devices.THREADS_ENV] = str(args.threads)
    alphas = [float(a) for a in args.alpha.split(",") if a.strip()]
    peers = []
    for ours, theirs in grid.PEER_OF.items():
        if ours != "entmax_alpha":  # compared per α below
            peers += compare_pair(mods, args, ours, theirs, ours)
    for alpha in alphas:
        fns = (
            _alpha_fn(mods[3], "entmax_alpha", alpha),
            _alpha_fn(mods[3], "entmax.entmax_bisect", alpha),
        )
        peers += compare_pair(
            mods, args, "entmax_alpha", "entmax.entmax_bisect", f"entmax_alpha α={alpha}", fns
        )
    skipped = []
    for name in grid.TRITON_EXAMPLES:  # Triton kernels: on a GPU only
        if args.device != "cuda":
            skipped.append({"name": name, "reason": mods[3].TRITON_SKIP})
            print(f"compare_peers: {name} skipped: {mods[3].TRITON_SKIP}", file=sys.stderr)
            continue
        try:
            # forward kernels: no backward to time
            peers += compare_pair(mods, args, name, "torch.softmax", name,
                                  directions=("forward",))
        except NotImplementedError as exc:  # triton missing
            skipped.append({"name": name, "reason": str(exc)})
            print(f"compare_peers: {name} skipped: {exc}", file=sys.stderr)
    report = {
        "config": {
            "rows": args.rows,
            "L": args.L,
            "dtype": args.dtype,
            "device": args.device,
            "repeats": args.repeats,
        },
        "machine": machine(mods, args),
        "peers": peers,
        "skipped": skipped,
        "copy": compare_copy(mods, args, "softmax_fused"),
        "copy_softmax": compare_copy(mods, args, "softmax"),
        "accuracy": [accuracy(mods, args, a) for a in alphas],
        "bandwidth": bandwidth(mods, args) if args.bandwidth else [],
    }
    print(render(report))
    if args.json:
        from attnverify.atomic import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
