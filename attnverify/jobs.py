"""``certify --jobs N``: the units of one run on N checker processes, merged into one certificate.

The run is split with the shard machinery (:mod:`attnverify.shard`: units of target × property ×
dtype × device, partitioned by their static ci costs): job ``k`` is ``attnverify certify … --shard
k/N`` in a process of its own (its own checker, zygote and workers), writing its partial
certificate to a private temporary directory. The parts are merged by :mod:`attnverify.merge`
(the same :func:`attnverify.certify.combine` an unsharded run uses), so the certificate is the
serial run's apart from seconds and process ids. ``--jobs 1`` is the serial path itself (no
process is started).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from attnverify.errors import UsageError

#: Options of a certify command line that take a value and that each job gets its own of.
_OWN_VALUE = ("--json", "--markdown", "--jobs", "--shard", "--xfails", "--seed")
#: Flags each job gets its own of.
_OWN_FLAG = ("--quiet",)
#: The environment variable that sets the default number of jobs.
JOBS_ENV = "ATTNVERIFY_JOBS"


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_jobs(text) -> int:
    """``--jobs N`` (1 to 256) or ``$ATTNVERIFY_JOBS``; exit 2 on anything else."""
    value = str(text).strip()
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 256:
        raise UsageError(f"--jobs expects an integer from 1 to 256, got {str(text)[:40]!r}")
    return int(value)


def job_count(args, targets: list[str]) -> int:
    """How many jobs a certify run takes: ``--jobs N`` as given (exit 2 with an option no job can
    share: ``--shard``, ``--database``, ``--attention``), else ``$ATTNVERIFY_JOBS``, else the
    cores, at most one per target (one target runs serially: a second process would cost more
    start-up than it saves), and 1 wherever the run cannot be split."""
    given = getattr(args, "jobs", None)
    if getattr(args, "argv", None) is None:  # not from the command line: nothing to run again
        return 1
    blocker = next((option for option, on in (
        ("--shard", getattr(args, "shard", None) is not None),
        ("--database", getattr(args, "database", None) is not None),
        ("--attention", getattr(args, "attention", None) is not None),
        ("--no-isolation", bool(getattr(args, "no_isolation", False))),
    ) if on), None)
    if given is not None:
        if given > 1 and blocker:
            raise UsageError(f"--jobs {given} with {blocker}: run it with --jobs 1")
        return given
    if blocker:
        return 1
    default = os.environ.get(JOBS_ENV)
    count = check_jobs(default) if default else cores()
    return max(1, min(count, len(targets)))


def job_argv(argv: list[str], k: int, n: int, seed: int, part: str, quiet: bool) -> list[str]:
    """The command line of job ``k`` of ``n``: the run's own, less the options each job has its
    own of (outputs, quiet, xfails, jobs, seed), plus ``--shard k/N``, the run's seed (drawn once
    for ``--seed random``), its part's path and ``--quiet`` where the run is quiet."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in _OWN_VALUE:
            skip = "=" not in token
            continue
        if token in _OWN_FLAG:
            continue
        out.append(token)
    return [*out, "--shard", f"{k}/{n}", "--seed", str(seed), "--json", part, "--jobs", "1",
            *(["--quiet"] if quiet else [])]


def run_jobs(argv: list[str], n: int, ctx, *, quiet: bool) -> dict:
    """Run the certify command ``argv`` as ``n`` jobs and return the merged certificate (as the
    serial run writes it: no ``merged_from``, this process's pid). Each job's progress lines go to
    standard error as it runs (its verdict lines, of a partial certificate, nowhere). A job that
    ends without its part is a usage error naming it (its own message on standard error)."""
    # dispatch: the merge (and its modules) only on a run with jobs
    from attnverify.merge import check_together, load_part, merge_parts


    with tempfile.TemporaryDirectory(prefix="attnverify-jobs-") as tmp:
        paths = [os.path.join(tmp, f"part{k}.json") for k in range(1, n + 1)]
        procs = []
        try:
            for k, path in enumerate(paths, start=1):
                command = [sys.executable, "-m", "attnverify",
                           *job_argv(argv, k, n, ctx.seed, path, quiet)]
                procs.append(subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=None if not quiet else subprocess.PIPE))
            errors = [p.communicate()[1] for p in procs]
        except BaseException:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            raise
        parts = []
        for k, (proc, path, err) in enumerate(zip(procs, paths, errors), start=1):
            if not os.path.exists(path):
                why = (err or b"").decode("utf-8", "replace").strip().splitlines()
                raise UsageError(f"--jobs: job {k} of {n} ended with exit code "
                                 f"{proc.returncode} and no results"
                                 + (f" ({why[-1][:200]})" if why else ""))
            parts.append((path, load_part(path)))
        check_together(parts)
        data = merge_parts(parts)
    data.pop("merged_from", None)
    data.pop("missing_shards", None)
    data["checker_pid"] = os.getpid()
    data["seed_source"] = getattr(ctx, "seed_source", "fixed")
    return data
