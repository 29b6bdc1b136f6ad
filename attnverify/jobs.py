"""``certify --jobs N``: the units of one run on N checker processes, merged into one certificate.

The run is split with the shard machinery (:mod:`attnverify.shard`: units of target × property ×
dtype × device, partitioned by their static ci costs): job ``k`` is ``attnverify certify … --shard
k/N`` with its own checker, zygote and workers, writing its partial certificate to a private
temporary directory. From the command line the command's process runs job 1 itself, on its own
zygote, and each other job is a fork of it with a clone of that zygote (:func:`_forked_jobs`),
so no job imports torch again and no process waits idle; elsewhere each job is a process of its
own. The parts are merged by :mod:`attnverify.merge`
(the same :func:`attnverify.certify.combine` an unsharded run uses), so the certificate is the
serial run's apart from seconds and process ids. ``--jobs 1`` is the serial path itself (no
process is started).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from attnverify.atomic import write_text_atomic
from attnverify.errors import (
    IN_JOB_ENV,
    TERMINATING,
    Interrupted,
    UsageError,
    interrupt_for,
    interrupt_on_signals,
    interrupt_signal,
)

#: Options of a certify command line that take a value and that each job gets its own of.
_OWN_VALUE = ("--json", "--markdown", "--jobs", "--shard", "--xfails", "--seed")
#: Flags each job gets its own of.
_OWN_FLAG = ("--quiet",)
#: The environment variable that sets the default number of jobs.
JOBS_ENV = "ATTNVERIFY_JOBS"
#: Seconds the jobs of a stopped run get to write the part they finished before they are killed.
STOP_GRACE_S = 20.0


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
    share: ``--shard``, ``--database``, ``--no-isolation``), else ``$ATTNVERIFY_JOBS``, else the
    cores, and 1 wherever the run cannot be split. Forked jobs (:func:`_forked_jobs`) start at
    once, so one target's units are split too; where the jobs would be new processes (this one
    cannot fork), at most one per target (a second process for one target would cost more
    start-up than it saves)."""
    given = getattr(args, "jobs", None)
    if getattr(args, "argv", None) is None:  # not from the command line: nothing to run again
        return 1
    blocker = next((option for option, on in (
        ("--shard", getattr(args, "shard", None) is not None),
        ("--database", getattr(args, "database", None) is not None),
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
    return max(1, count if _can_fork() else min(count, len(targets)))


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


def certify_on_jobs(args, targets: list[str], ctx, xfails) -> int | None:
    """A certify run (normalizers or ``--attention``) on its jobs (:func:`job_count`): its
    certificate written and printed as a serial run's, and its exit code; ``None`` where the run
    takes one job (the caller runs it)."""
    jobs = job_count(args, targets)
    if jobs == 1:
        return None
    from attnverify import report  # dispatch: torch, imported by the command that calls this
    from attnverify.xfails import check_entries  # dispatch: with report

    try:
        data = run_jobs(args.argv, jobs, ctx, quiet=args.quiet)
    except Interrupted as exc:  # Ctrl-C or a terminating signal: what the jobs finished
        return report.finish_interrupted(args, exc.data, xfails, exc)
    if xfails is not None:
        check_entries(xfails, [f"{t['target']}::{r['property']}" for t in data["targets"]
                               for r in t["results"]])
    return report.finish_certify(args, data, xfails)


def run_jobs(argv: list[str], n: int, ctx, *, quiet: bool) -> dict:
    """Run the certify command ``argv`` as ``n`` jobs and return the merged certificate (as the
    serial run writes it: no ``merged_from``, this process's pid). Each job's progress lines go to
    standard error as it runs (its verdict lines, of a partial certificate, nowhere). A job that
    ends without its part is a usage error naming it (its own message on standard error).
    Stopped by Ctrl-C or a terminating signal, the jobs are stopped the same way, each writes
    the part it finished, and :class:`Interrupted` carries the merge of those parts (units not
    finished ``not_checked``); where none was written, the interrupt goes on as it came."""
    # dispatch: the merge (and its modules) only on a run with jobs
    from attnverify.merge import check_together, load_part, merge_parts

    with tempfile.TemporaryDirectory(prefix="attnverify-jobs-") as tmp:
        paths = [os.path.join(tmp, f"part{k}.json") for k in range(1, n + 1)]
        commands = [job_argv(argv, k, n, ctx.seed, path, quiet)
                    for k, path in enumerate(paths, start=1)]
        try:
            ended = _forked_jobs(commands, tmp, quiet) if _can_fork() else None
            if ended is None:
                ended = _spawned_jobs(commands, quiet)
            usage = [_read(os.path.join(tmp, f"usage{k}")) for k in range(1, n + 1)]
            first = next((text for text in usage if text), None)
            if first:  # the same bad input in every job: one line for all (exit 2)
                raise UsageError(first.decode("utf-8", "replace").strip())
            parts = []
            for k, (path, (code, err)) in enumerate(zip(paths, ended), start=1):
                if not os.path.exists(path):
                    why = (err or b"").decode("utf-8", "replace").strip().splitlines()
                    raise UsageError(f"--jobs: job {k} of {n} ended with exit code "
                                     f"{code} and no results"
                                     + (f" ({why[-1][:200]})" if why else ""))
                parts.append((path, load_part(path)))
            check_together(parts)
            data = merge_parts(parts)
        except KeyboardInterrupt as exc:  # during the jobs, or during the merge of their parts
            data = _stopped_parts(paths, exc)
            if data is None:
                raise
            raise Interrupted(exc, data=_as_serial(data, ctx)) from None
    return _as_serial(data, ctx)


def _as_serial(data: dict, ctx) -> dict:
    """The merged certificate as the serial run writes it: no ``merged_from``, this pid."""
    data.pop("merged_from", None)
    data.pop("missing_shards", None)
    data["checker_pid"] = os.getpid()
    data["seed_source"] = getattr(ctx, "seed_source", "fixed")
    return data


def _stopped_parts(paths: list[str], exc: KeyboardInterrupt) -> dict | None:
    """The merge of the parts the jobs of a stopped run wrote (the units of a job that wrote
    none ``not_checked`` too), marked ``interrupted``; ``None`` where no usable part was
    written."""
    # dispatch: the merge (and its modules) only on a run with jobs
    from attnverify.merge import check_together, load_part, merge_parts

    try:
        parts = [(path, load_part(path)) for path in paths if os.path.exists(path)]
        if not parts:
            return None
        check_together(parts)
        data = merge_parts(parts, stopped=signal.Signals(interrupt_signal(exc)).name)
    except UsageError:
        return None
    return data


#: This process's native threads when its command began, before any tensor operation
#: (:func:`mark_clean`); ``None``: not recorded, or not countable here.
_CLEAN_THREADS: int | None = None


def _native_threads() -> int | None:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def mark_clean() -> None:
    """Record this process's native threads now: called by a certify command when it begins in
    a process of its own (``attnverify …``, ``python -m attnverify …``: nothing ran before it),
    torch imported and no tensor operation run yet (importing torch starts a thread of its own;
    its first parallel operation starts OpenMP's, which a forked child could never use). A
    command run by another program (``cli.main([...])``) records nothing: what that program
    ran before is unknown, so its jobs are new processes."""
    global _CLEAN_THREADS
    _CLEAN_THREADS = _native_threads()


def _can_fork() -> bool:
    """Whether the jobs can be forked from this process: a POSIX system, this process alone on
    its Python thread and with no native thread beyond those it had when its command began
    (:func:`mark_clean`). A fork copies only the forking thread: a lock another one held stays
    held in the child, and OpenMP's pool, started by the parent's first parallel operation,
    hangs the child's first one."""
    return (hasattr(os, "fork") and threading.active_count() == 1
            and _CLEAN_THREADS is not None and _native_threads() == _CLEAN_THREADS)


def _spawned_jobs(commands: list[list[str]], quiet: bool) -> list[tuple[int, bytes | None]]:
    """Each job a new ``python -m attnverify`` process (where this one cannot fork):
    ``[(exit code, its standard error where quiet)]``."""
    procs = []
    env = {**os.environ, IN_JOB_ENV: "1"}
    try:
        for command in commands:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "attnverify", *command], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=None if not quiet else subprocess.PIPE,
                env=env))
        errors = [p.communicate()[1] for p in procs]
    except BaseException as exc:
        _stop([p.pid for p in procs], exc)
        raise
    return [(p.returncode, err) for p, err in zip(procs, errors)]


def _forked_jobs(commands: list[list[str]], tmp: str,
                 quiet: bool) -> list[tuple[int, bytes | None]] | None:
    """Job 1 run in this process (:func:`_own_job`, on this process's zygote) and each other job
    a fork of it, which has imported torch, Hypothesis and the checks already, with a clone of
    this process's zygote (:meth:`attnverify.remote.Zygote.clone`), which has imported torch for
    the workers: a job starts at once instead of importing both again, and no process waits idle
    for the others (an idle command held its own pages, and each forked job copied the pages
    it wrote from them). ``[(exit code, its standard error where quiet)]``, or ``None`` where
    the zygote could not be cloned (the caller spawns the jobs instead). Job 1 stopped by
    Ctrl-C or a terminating signal (it wrote the part it finished) stops the others the same
    way (:func:`_stop`) and raises the interrupt, as one that comes while this process waits."""
    from attnverify import remote  # dispatch: imports torch, which a run with jobs has already

    sys.stdout.flush()
    sys.stderr.flush()
    pids: list[int] = []
    errs = [os.path.join(tmp, f"stderr{k}") for k in range(1, len(commands) + 1)]
    usages = [os.path.join(tmp, f"usage{k}") for k in range(1, len(commands) + 1)]
    parent = os.getpid()
    # what this process holds stays shared with the jobs: a collection in a job (or in this
    # process, which runs job 1) would write into every object's header, copying all of its
    # pages; they stay frozen until every job has ended
    gc.freeze()
    try:
        for command, err, usage in zip(commands[1:], errs[1:], usages[1:]):
            try:
                zpid, zsock = remote.zygote().clone()
            except remote.WorkerFailed:
                if pids:
                    raise
                return None
            try:
                pid = os.fork()
                if pid == 0:
                    _tied_to(parent)
                    _job_main(command, zpid, zsock, err if quiet else None, usage)
            finally:
                zsock.close()
            pids.append(pid)
        own = _own_job(commands[0], errs[0] if quiet else None, usages[0])
        stopped = _stopped_by(own)
        if stopped is not None:  # job 1 wrote what it finished: the others do the same
            raise stopped
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    except BaseException as exc:
        _stop(pids, exc)
        raise
    finally:
        gc.unfreeze()
    return [(own, _read(errs[0]))] + [(code, _read(err)) for code, err in zip(codes, errs[1:])]


def _own_job(command: list[str], err: str | None, usage: str) -> int:
    """Job ``command`` in this process, as a forked job runs it (:func:`_job_main`) on this
    process's zygote: standard output on ``/dev/null`` and standard error on ``err`` (where
    given) while it runs, the job's environment, a usage error written to ``usage``; its exit
    code (70 where it broke, its traceback on its standard error)."""
    before = os.environ.get(IN_JOB_ENV)
    sys.stdout.flush()
    sys.stderr.flush()
    moved = [(sys.stdout, os.devnull, os.O_WRONLY)]
    if err is not None:
        moved.append((sys.stderr, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
    saved: list[tuple[int, int]] = []
    code = 70
    try:
        for stream, path, flags in moved:
            fd = stream.fileno()
            saved.append((fd, os.dup(fd)))
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        os.environ[IN_JOB_ENV] = "1"
        try:
            code = _job_command(command, usage)
        except Exception:  # noqa: BLE001 - reported as the job's failure, as a forked job's
            import traceback  # dispatch: only where the job itself broke

            traceback.print_exc()
    finally:
        if before is None:
            os.environ.pop(IN_JOB_ENV, None)
        else:
            os.environ[IN_JOB_ENV] = before
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
    return code


def _job_command(command: list[str], usage: str) -> int:
    """A job's command run as ``attnverify COMMAND`` would run it, except that a usage error is
    written to ``usage`` for the parent to print once (exit 2): its exit code."""
    # the command line's entry point, which ran the parent's command (jobs exist only for a run
    # from the command line: job_count); not imported here, which would close a cycle
    cli = sys.modules["attnverify.cli"]
    try:
        return cli.main(command, raise_usage=True)
    except UsageError as exc:
        write_text_atomic(Path(usage), f"{exc}\n")
        return 2


def _stopped_by(code: int) -> KeyboardInterrupt | None:
    """The interrupt that stopped a job which exited with ``code`` (128 + Ctrl-C's signal or a
    terminating one: :func:`attnverify.errors.interrupt_exit_code`), else ``None``."""
    signum = code - 128
    return interrupt_for(signum) if signum in (signal.SIGINT, *TERMINATING) else None


def _stop(pids: list[int], exc: BaseException) -> None:
    """Stop the jobs ``pids`` of a run that ``exc`` ended, and reap them. Ctrl-C or a
    terminating signal is passed on (a job stops once, writing the part it finished) and the
    jobs get :data:`STOP_GRACE_S` seconds before they are killed; any other end kills them."""
    try:
        if isinstance(exc, KeyboardInterrupt):
            _signal(pids, interrupt_signal(exc))
            deadline = time.monotonic() + STOP_GRACE_S
            pending = set(pids)
            while pending and time.monotonic() < deadline:  # a second Ctrl-C ends the wait
                for pid in list(pending):
                    try:
                        if os.waitpid(pid, os.WNOHANG)[0] == pid:
                            pending.discard(pid)
                    except ChildProcessError:
                        pending.discard(pid)
                if pending:
                    time.sleep(0.02)
    finally:
        _signal(pids, signal.SIGKILL)
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _tied_to(parent: int) -> None:
    """In a forked job: Ctrl-C and the terminating signals stop it once, as they stop the
    parent (which passes them on, then prints the one line for all: :data:`IN_JOB_ENV`), so
    that it writes the part it finished; killed with the parent if it dies first."""
    from attnverify.worker import PR_SET_PDEATHSIG, _prctl  # dispatch: imported by remote

    interrupt_on_signals()  # Ctrl-C to the terminal's group, or the parent's stop: once
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _job_main(command: list[str], zpid: int, zsock, err: str | None, usage: str) -> None:
    """The forked job: standard input and output on ``/dev/null`` (standard error on ``err``
    where given), the zygote's clone adopted, then the command run as ``attnverify COMMAND``
    would run it, except that a usage error is written to ``usage`` for the parent to print
    once (exit 2); never returns."""
    code = 70
    try:
        os.environ[IN_JOB_ENV] = "1"
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        if err is not None:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            os.close(fd)
        os.close(devnull)
        from attnverify import remote  # dispatch: imported by the parent already

        remote.zygote().adopt(zpid, zsock)
        code = _job_command(command, usage)
        remote.zygote().close()
    except KeyboardInterrupt as exc:  # stopped before its command began: nothing to keep
        code = 128 + interrupt_signal(exc)
    except BaseException:  # noqa: BLE001 - reported as the job's failure by the parent
        import traceback  # dispatch: only where the job itself broke

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
