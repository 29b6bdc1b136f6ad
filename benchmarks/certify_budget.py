"""Check the certify budget: ``attnverify certify`` on every built-in with the ci profile.

Runs what the command runs (every target in a worker process of its own, the checks in this
process; ``--no-isolation`` loads them here instead), including the start of the worker
processes. Prints the wall time per target and per property (summed over targets), the total
against the 60-second budget (references and gradients included), and exits 1 when over it. Not
a timed unit test: run it by hand or in a perf job.

    python benchmarks/certify_budget.py [--profile ci] [--budget 60] [--no-isolation] [--json PATH]

``--side-by-side BASE`` (issue #27) instead times whole command lines, as a user runs them, for this
checkout and for another one (``BASE``: a checkout of an older commit, e.g. made with ``git worktree
add /tmp/base7e 7e72048``; each runs with ``PYTHONPATH`` set to its own tree and this interpreter),
interleaved round by round so both meet the same load: certify of every built-in (ci; this checkout
with its default ``--jobs`` and with ``--jobs 1``), one normalizer ``file.py:fn`` (dev and ci; and
a failing one, ci, which exits 1, with its passing twin: the same sparsemax made right),
``certify --attention sdpa`` and of a user's eager kernel (ci)
and seven falsify bounds of the corpus (ci; true ones searched to the end of the budget and false
ones, with and without a Jacobian). For each it prints the median and best wall time, the CPU
time of the whole process
tree (``getrusage(RUSAGE_CHILDREN)``: checker, zygote and workers; a process its parent never waits
for, as a multiprocessing forkserver, is adopted by this process as their subreaper and waited
for here, so it is counted too), its peak memory and the ratios of the medians.

The timed rounds run with nothing else of this script awake: sampling memory is not free (each
sample lists the tree and reads every process's ``smaps_rollup``, which walks its page tables),
and its cost grows with the number of processes, so on a busy machine it slows a design of many
processes (checker, zygote, a worker per target) more than one of a single process and biases the
ratio. Their memory figure is the largest single process's peak resident size, which the kernel
keeps for free (``ru_maxrss`` of ``wait4``). After them, each command line runs once more for its
memory alone, with the proportional set size of checker, zygote and workers together sampled
every ``--sample-s`` seconds (default 1) with psutil; that round's time is printed but never
enters a median or a ratio. ``--sample-s 0`` (or no psutil) leaves the memory rounds out::

    python benchmarks/certify_budget.py --side-by-side /tmp/base7e [--rounds 2] [--only NAME,...]
        [--sample-s 1] [--cold]

Both packages are byte-compiled first (``compileall``), so the runs read ``.pyc`` files as a
user's second run does; ``--cold`` leaves that out (where ``PYTHONDONTWRITEBYTECODE`` is set, as
on our CI machines, every run then compiles the package's sources again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

#: Whole command lines timed by ``--side-by-side``: ``(name, argv, this checkout only)``;
#: ``{fn}`` is a one-function normalizer file written for the run.
SIDE_BY_SIDE = (
    ("builtins-ci", ["certify", "--profile", "ci", "--quiet"], False),
    ("builtins-ci-jobs1", ["certify", "--profile", "ci", "--quiet", "--jobs", "1"], True),
    # the same checks with every target in the checker's process, one job: what the checks
    # cost without the boundary (the ratio with 7e72048 splits into the checks' growth, this
    # run against the base, and the boundary's cost, builtins-ci-jobs1 against this run)
    ("builtins-ci-noiso", ["certify", "--profile", "ci", "--quiet", "--no-isolation"], True),
    ("file-fn-dev", ["certify", "{fn}", "--profile", "dev", "--quiet"], False),
    ("file-fn-ci", ["certify", "{fn}", "--profile", "ci", "--quiet"], False),
    ("failing-fn-ci", ["certify", "{bad}", "--profile", "ci", "--quiet"], False),
    ("sparsemax-fn-ci", ["certify", "{twin}", "--profile", "ci", "--quiet"], False),
    ("attention-sdpa-ci", ["certify", "--attention", "sdpa", "--profile", "ci", "--quiet"], False),
    ("attention-eager-ci", ["certify", "--attention", "{attn}", "--profile", "ci", "--quiet"],
     False),
    # one checker and one worker (the default forks a job a core): the peak of the pair alone
    ("attention-sdpa-ci-jobs1", ["certify", "--attention", "sdpa", "--profile", "ci", "--quiet",
                                 "--jobs", "1"], False),
    ("attention-eager-ci-jobs1", ["certify", "--attention", "{attn}", "--profile", "ci",
                                  "--quiet", "--jobs", "1"], False),
    ("falsify-ci", ["falsify", "softmax", "max_weight <= exp(2*a/T)/L", "--profile", "ci"], False),
    ("falsify-jacobian-ci", ["falsify", "softmax", "jacobian_spectral <= 1/(2*T)", "--profile",
                             "ci"], False),
    # more of benchmarks/falsify_corpus.py: true bounds searched to the end of their budget
    # (sparsemax, entmax15, an entry-wise Jacobian) and false ones found at once (one with a
    # Jacobian)
    ("falsify-sparsemax-ci", ["falsify", "sparsemax", "sum_sq_weight <= 1/L + L*(a/T)**2",
                              "--profile", "ci"], False),
    ("falsify-entmax15-ci", ["falsify", "entmax15", "max_weight <= (1/sqrt(L) + a/T)**2",
                             "--profile", "ci"], False),
    ("falsify-entry-ci", ["falsify", "softmax", "jacobian_entry <= 1/(4*T)", "--profile", "ci"],
     False),
    ("falsify-false-ci", ["falsify", "softmax", "max_weight <= exp(a/T)/L", "--profile", "ci"],
     False),
    ("falsify-jacobian-false-ci", ["falsify", "sparsemax", "jacobian_spectral <= 1/(2*T)",
                                   "--profile", "ci"], False),
)
USER_FILE = "import torch\n\n\ndef fn(scores, dim=-1):\n    return torch.softmax(scores, dim)\n"
#: ``{bad}``: the planted defect ``wrong_threshold_sparsemax`` of the test fixtures (sparsemax with
#: its threshold off by one: it fails most properties, and raises on a one-entry row of a large
#: value), as a user's file: a failing target timed beside the passing ones.
FAILING_TARGET = (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "planted.py",
                  "wrong_threshold_sparsemax")
#: ``{twin}``: the failing target's passing twin, written for the run: the same sparsemax with
#: the threshold right (and the row's maximum subtracted first, so that a one-entry row of a large
#: value keeps its support), the same per-call work; it is certified with the same properties, so
#: the failing target's time beside it is what failing costs, not what its sort costs.
TWIN_FILE = """import torch


def sparsemax(scores, dim=-1):
    z = scores.movedim(dim, -1)
    z = z - z.amax(-1, keepdim=True).nan_to_num(0.0, 0.0, 0.0)
    srt, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cs = srt.cumsum(-1) - 1
    size = (k * srt > cs).sum(-1, keepdim=True).clamp_min(1)
    tau = cs.gather(-1, size - 1) / size.to(z.dtype)
    return (z - tau).clamp_min(0).movedim(-1, dim)
"""
#: ``{attn}``: a user's eager attention kernel (scores, mask, softmax, weighted values in torch
#: ops, no fused kernel), written for the run.
ATTENTION_FILE = '''import math

import torch


def attn(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], -3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], -3)
    work = torch.promote_types(query.dtype, torch.float32)  # float16/bfloat16 in float32
    scores = query.to(work) @ key.to(work).transpose(-2, -1) * scale
    if is_causal:
        keep = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(work)
    dead = (scores == float("-inf")).all(-1, keepdim=True)  # a query that sees no key: zeros
    weights = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return (weights @ value.to(work)).to(query.dtype)
'''


def _pss(p) -> int:
    """The proportional set size of the psutil process ``p`` in bytes, from
    ``/proc/PID/smaps_rollup`` (one summed record, far less to read at every sample than the
    whole ``smaps`` that ``memory_full_info`` parses), else psutil's."""
    try:
        with open(f"/proc/{p.pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    info = p.memory_full_info()
    return getattr(info, "pss", info.rss)


def _adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants (Linux ``prctl``): a process whose
    parent exits without waiting for it (a ``multiprocessing`` forkserver, which 7e72048's
    workers ran under) is re-parented here instead of to init, so :func:`_reap_orphans` waits
    for it and its CPU time (its own reaped children's included) reaches
    ``getrusage(RUSAGE_CHILDREN)``. False where that is not available."""
    try:
        import ctypes  # optional: no ctypes, no prctl (the CPU of orphans is then not counted)

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _reap_orphans(wait_s: float = 15.0) -> None:
    """Wait for every remaining child (orphans adopted by :func:`_adopt_orphans`: they exit once
    they find their parent gone), killing what is left after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in Path("/proc").glob("[0-9]*"):
                try:
                    if int((child / "stat").read_text().rsplit(")", 1)[1].split()[1]) == \
                            os.getpid():
                        os.kill(int(child.name), 9)
                except (OSError, ValueError, IndexError):
                    pass
            deadline = time.monotonic() + 5
        time.sleep(0.05)


def _measure(argv: list[str], tree: str, cwd: str,
             sample_s: float = 1.0) -> tuple[float, float, float, int]:
    """``(wall seconds, CPU seconds, peak MiB, exit code)`` of ``python -m attnverify argv`` run
    from ``tree``. The CPU seconds are those of the whole process tree: every descendant is
    reaped by its parent, or adopted and reaped here (:func:`_adopt_orphans`), so its time is in
    ``getrusage(RUSAGE_CHILDREN)``; the memory is the peak of the tree's proportional set size
    (a forked worker's pages shared with its zygote counted once), sampled with psutil every
    ``sample_s`` seconds; with ``sample_s`` 0 (or no psutil) the largest single process's peak
    resident size, which the kernel keeps (``ru_maxrss`` of ``wait4``: the command's process
    and the descendants it waited for)."""
    env = dict(os.environ, PYTHONPATH=tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "attnverify", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    psutil = _psutil() if sample_s > 0 else None  # none: the largest process, after it ends
    if psutil is not None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            total = 0
            try:
                for p in [root, *root.children(recursive=True)]:
                    try:
                        total += _pss(p)
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            peak = max(peak, total)
            try:  # a wait, not a sleep: the wall time ends when the command does
                proc.wait(sample_s)
            except subprocess.TimeoutExpired:
                pass
    if psutil is None:  # wait4: the peak RSS of this run's process and the children it reaped
        _, status, usage = os.wait4(proc.pid, 0)
        code = proc.returncode = os.waitstatus_to_exitcode(status)
        peak = usage.ru_maxrss * 1024
    else:
        code = proc.wait()
    wall = time.perf_counter() - start
    _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak / 2**20, code


def _trees(here: str, base: str, mine: bool, r: int) -> list[tuple[str, str]]:
    """The checkouts a run is timed in, in round ``r``'s order (who goes first alternates)."""
    trees = [("this", here)] + ([] if mine else [("base", base)])
    return trees[::-1] if r % 2 else trees


def _psutil():
    """The ``psutil`` module, or ``None`` where it is not installed (the tree's PSS needs it)."""
    try:
        import psutil  # optional: without it, no sampled memory
    except ImportError:
        return None
    return psutil


def _compile(tree: str) -> None:
    """Byte-compile ``tree``'s package (``compileall``; written even where
    ``PYTHONDONTWRITEBYTECODE`` is set, which only stops imports from writing), so that a run
    reads ``.pyc`` files as a user's second run does, not the sources a first run compiles."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "attnverify")],
                   check=True, stdout=subprocess.DEVNULL)


def side_by_side(base: str, rounds: int, only: list[str], json_path: str | None,
                 sample_s: float = 1.0, cold: bool = False) -> int:
    _adopt_orphans()
    here = str(Path(__file__).resolve().parents[1])
    base = str(Path(base).resolve())
    if not cold:
        for tree in (here, base):
            _compile(tree)
    rows: dict[tuple[str, str], list] = defaultdict(list)
    memory: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="attnverify-bench-") as tmp:
        user = Path(tmp) / "user_fn.py"
        user.write_text(USER_FILE)
        attn = Path(tmp) / "user_attention.py"
        attn.write_text(ATTENTION_FILE)
        bad = ":".join(map(str, FAILING_TARGET))
        twin = Path(tmp) / "user_sparsemax.py"
        twin.write_text(TWIN_FILE)
        files = {"fn": f"{user}:fn", "attn": f"{attn}:attn", "bad": bad,
                 "twin": f"{twin}:sparsemax"}
        runs = [(n, [a.format(**files) for a in argv], mine)
                for n, argv, mine in SIDE_BY_SIDE if not only or n in only]
        for r in range(rounds):
            for name, argv, mine in runs:
                for label, tree in _trees(here, base, mine, r):
                    wall, cpu, rss, code = _measure(argv, tree, tmp, 0.0)
                    rows[(name, label)].append((wall, cpu, rss, code))
                    print(f"  round {r + 1} {name:22s} {label:4s} {wall:7.1f} s wall "
                          f"{cpu:7.1f} s cpu {rss:7.0f} MiB largest process, exit {code}",
                          flush=True)
        if sample_s > 0 and _psutil() is not None:
            for name, argv, mine in runs:
                for label, tree in _trees(here, base, mine, 0):
                    wall, cpu, pss, code = _measure(argv, tree, tmp, sample_s)
                    memory[(name, label)] = pss
                    print(f"  memory  {name:22s} {label:4s} {wall:7.1f} s wall (not timed) "
                          f"{pss:7.0f} MiB tree PSS, exit {code}", flush=True)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cpus, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end; base: {base}")
    print("largest MiB: the largest single process's peak RSS in the timed rounds (unsampled)")
    print("tree MiB: " + (f"the process tree's PSS, sampled every {sample_s:g} s in a memory "
                          "round of its own (not timed)" if memory else "not measured"))
    print("bytecode: " + ("as the environment leaves it (--cold: no .pyc written beforehand)"
                          if cold else "both packages byte-compiled beforehand (warm runs)"))
    print(f"{'run':22s} {'tree':4s} {'median s':>9s} {'best s':>8s} {'cpu s':>7s} "
          f"{'largest MiB':>11s} {'tree MiB':>9s} {'wall this/base':>15s} {'cpu this/base':>14s}")
    summary = {}
    for name, _, _ in runs:
        for label in ("this", "base"):
            got = rows.get((name, label))
            if not got:
                continue
            entry = {"median_s": statistics.median(g[0] for g in got),
                     "best_s": min(g[0] for g in got),
                     "cpu_s": statistics.median(g[1] for g in got),
                     "largest_mib": max(g[2] for g in got),
                     "tree_pss_mib": memory.get((name, label)), "exit": [g[3] for g in got]}
            summary[f"{name}/{label}"] = entry
            ratios = ""
            if label == "this" and (name, "base") in rows:
                other = rows[(name, "base")]
                wall_ratio = entry["median_s"] / statistics.median(g[0] for g in other)
                cpu_ratio = entry["cpu_s"] / statistics.median(g[1] for g in other)
                summary[f"{name}/ratio"] = {"wall": wall_ratio, "cpu": cpu_ratio}
                ratios = f"{wall_ratio:15.2f} {cpu_ratio:14.2f}"
            tree_mib = entry["tree_pss_mib"]
            print(f"{name:22s} {label:4s} {entry['median_s']:9.1f} {entry['best_s']:8.1f} "
                  f"{entry['cpu_s']:7.1f} {entry['largest_mib']:11.0f} "
                  f"{'-' if tree_mib is None else f'{tree_mib:.0f}':>9s} {ratios}")
    if json_path:
        from attnverify.atomic import write_text_atomic

        summary["memory"] = {"largest_mib": "largest process's peak RSS, timed rounds",
                             "tree_pss_mib": "tree PSS sampled in a memory round of its own",
                             "sample_s": sample_s if memory else None}
        summary["timing"] = "rounds unsampled"
        summary["bytecode"] = "as found" if cold else "compiled beforehand"
        write_text_atomic(Path(json_path), json.dumps(summary, indent=2))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="ci")
    p.add_argument("--budget", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument("--json", default=None)
    p.add_argument("--no-isolation", action="store_true",
                   help="load the targets in this process (the figure without the boundary)")
    p.add_argument("--side-by-side", default=None, metavar="BASE",
                   help="time whole command lines here and in the checkout BASE, interleaved")
    p.add_argument("--rounds", type=int, default=2, help="rounds of --side-by-side (default 2)")
    p.add_argument("--cold", action="store_true",
                   help="--side-by-side: do not byte-compile the two packages first (with "
                        "PYTHONDONTWRITEBYTECODE set, every run then compiles them again)")
    p.add_argument("--sample-s", type=float, default=1.0,
                   help="--side-by-side: seconds between memory samples in the memory rounds, "
                        "which run after the timed ones and are not timed (default 1; 0: no "
                        "memory rounds, the largest process's peak resident size only)")
    p.add_argument("--only", default="", help="--side-by-side: these runs only (comma-separated "
                   f"names: {', '.join(n for n, _, _ in SIDE_BY_SIDE)})")
    args = p.parse_args(argv)
    if args.side_by_side:
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        if args.sample_s < 0:
            print("certify_budget: --sample-s must be 0 or more", file=sys.stderr)
            return 2
        return side_by_side(args.side_by_side, args.rounds, only, args.json, args.sample_s,
                            args.cold)
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
