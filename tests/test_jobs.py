"""``certify --jobs N`` (issue #27): the units on N checker processes over the shard and merge
machinery give the serial run's certificate, apart from seconds and process ids."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import daemonizing_target

from attnverify import jobs, remote
from attnverify.certify import PropertyResult, combine, progress_line
from attnverify.cli import main

RUN = ["softmax", "sparsemax", "--profile", "dev", "--max-examples", "3", "--claims", "", "--quiet"]


def _comparable(cert: dict) -> dict:
    cert = json.loads(json.dumps(cert))
    cert.pop("checker_pid")
    for t in cert["targets"]:
        t.pop("worker_pids")
        for r in t["results"]:
            r.pop("elapsed_s")
            for u in r["units"]:
                u.pop("elapsed_s")
    return cert


@pytest.mark.slow  # two whole certifications
def test_two_jobs_write_the_serial_certificate(capsys, tmp_path):
    paths = {}
    for n in (1, 2):
        paths[n] = tmp_path / f"jobs{n}.json"
        code = main(["certify", *RUN, "--jobs", str(n), "--json", str(paths[n]),
                     "--markdown", str(tmp_path / f"jobs{n}.md")])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out.count("CERTIFIED") == 2 and "Traceback" not in err
    serial, parallel = (json.loads(paths[n].read_text()) for n in (1, 2))
    assert list(serial) == list(parallel)  # the same keys in the same order
    assert "merged_from" not in parallel and "shard" not in parallel
    assert _comparable(serial) == _comparable(parallel)
    # the units ran in other processes: their workers are not the serial run's
    assert set(serial["targets"][0]["worker_pids"]).isdisjoint(
        parallel["targets"][0]["worker_pids"])


def test_each_job_runs_the_same_command_as_one_shard():
    argv = ["certify", "a", "b", "--json=x.json", "--quiet", "--jobs", "4", "--seed", "random",
            "--xfails", "f", "--profile", "ci"]
    assert jobs.job_argv(argv, 2, 3, 7, "/p/2.json", quiet=True) == [
        "certify", "a", "b", "--profile", "ci", "--shard", "2/3", "--seed", "7",
        "--json", "/p/2.json", "--jobs", "1", "--quiet"]


@pytest.mark.parametrize("argv, fragment", [
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "many"], "--jobs"),
    (["--jobs", "2", "--shard", "1/2"], "--jobs 2 with --shard"),
    (["--jobs", "2", "--no-isolation"], "--jobs 2 with --no-isolation"),
])
def test_bad_jobs_are_exit_2(capsys, argv, fragment):
    code = main(["certify", "softmax", "sparsemax", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and fragment in err and err.count("\n") == 1, err


def test_the_default_is_the_cores(monkeypatch):
    class Args:
        jobs = shard = database = attention = None
        no_isolation = False
        argv = ["certify"]

    monkeypatch.delenv(jobs.JOBS_ENV, raising=False)
    monkeypatch.setattr(jobs, "cores", lambda: 2)
    monkeypatch.setattr(jobs, "_can_fork", lambda: True)  # a command's process, no thread
    assert jobs.job_count(Args, ["softmax"]) == 2  # forked jobs split one target's units too
    assert jobs.job_count(Args, ["softmax", "sparsemax", "entmax15"]) == 2
    monkeypatch.setattr(jobs, "_can_fork", lambda: False)  # new processes: one per target
    assert jobs.job_count(Args, ["softmax"]) == 1
    assert jobs.job_count(Args, ["softmax", "sparsemax", "entmax15"]) == 2
    monkeypatch.undo()
    monkeypatch.setattr(jobs, "cores", lambda: 2)
    monkeypatch.setenv(jobs.JOBS_ENV, "1")
    assert jobs.job_count(Args, ["softmax", "sparsemax"]) == 1
    Args.database = "dir"
    monkeypatch.delenv(jobs.JOBS_ENV)
    assert jobs.job_count(Args, ["softmax", "sparsemax"]) == 1


def _run(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "attnverify", *argv], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


@pytest.mark.slow  # four certifications of one target, from the command line
def test_forked_jobs_split_one_target_into_the_serial_certificate(tmp_path):
    """From the command line the command's process runs job 1 and the other jobs are forks of
    it, each with a clone of its zygote (:func:`attnverify.jobs._forked_jobs`): one normalizer
    and one attention kernel split over two jobs give the serial certificates, and job 1's
    verdict lines (of its partial certificate) reach nothing."""
    runs = {"normalizer": ["softmax", "--profile", "dev", "--max-examples", "4"],
            "attention": ["--attention", "eager_softmax", "--profile", "dev",
                          "--max-examples", "2"]}
    for what, argv in runs.items():
        certs = {}
        for n in (1, 2):
            path = tmp_path / f"{what}{n}.json"
            done = _run("certify", *argv, "--quiet", "--jobs", str(n), "--json", str(path))
            assert done.returncode == 0, done.stderr
            assert done.stdout.count("CERTIFIED") == 1 and not done.stderr, done.stderr
            certs[n] = json.loads(path.read_text())
        assert list(certs[1]) == list(certs[2])
        assert _comparable(certs[1]) == _comparable(certs[2]), what
        assert set(certs[1]["targets"][0]["worker_pids"]).isdisjoint(
            certs[2]["targets"][0]["worker_pids"])


@pytest.mark.slow  # one certification on two jobs, from the command line
def test_the_command_runs_a_job_itself(tmp_path):
    """No process of a run with jobs waits idle for the others: the workers of one job are
    children of the command's own zygote (the command ran that job), the other job's of a clone
    of it (a child of that zygote); the run certifies as a serial one."""
    log = tmp_path / "workers.log"
    source = tmp_path / "lineage.py"
    source.write_text(f"""
import os, torch

def _parent(pid):
    with open(f"/proc/{{pid}}/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[-1].split()[1])

with open({str(log)!r}, "a") as fh:  # at load, once per worker
    fh.write(f"{{os.getpid()}} {{os.getppid()}} {{_parent(os.getppid())}}\\n")

def norm(scores, dim=-1):
    return torch.softmax(scores, dim)
""")
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnverify", "certify", f"{source}:norm", "--claims", "",
         "--profile", "dev", "--max-examples", "2", "--quiet", "--jobs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ATTNVERIFY_SANDBOX_WRITABLE": str(tmp_path)})
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    assert out.count("CERTIFIED") == 1 and not err, out + err
    lineage = [tuple(int(x) for x in line.split()) for line in log.read_text().splitlines()]
    zygotes = {zygote for _, zygote, above in lineage if above == proc.pid}
    clones = {zygote for _, zygote, above in lineage if above != proc.pid}
    assert len(zygotes) == 1, lineage  # the command's own zygote served a job's workers
    assert clones and all(above in zygotes for _, zygote, above in lineage
                          if zygote in clones), lineage  # the other job's: its clone's


#: The checker's modules (docs/ARCHITECTURE.md, the layering), Hypothesis and the property suite:
#: none of them is ever in a worker.
CHECKER_MODULES = ("hypothesis", "attnverify.checks", "attnverify.certify", "attnverify.strategies",
                   "attnverify.bounds", "attnverify.report", "attnverify.isolation",
                   "attnverify.remote", "attnverify.falsify", "attnverify.quantities",
                   "attnverify.jacobian", "attnverify.properties", "attnverify.attention.suite")


def _probe_target(tmp_path: Path) -> tuple[Path, Path]:
    """A normalizer that writes, when a worker loads it, its zygote's process id, parent and
    command line and the modules of the checker's it finds loaded: ``(source, log)``."""
    log = tmp_path / "workers.jsonl"
    source = tmp_path / "probe.py"
    source.write_text(f"""
import json, os, sys, torch

def _stat(pid):
    with open(f"/proc/{{pid}}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[-1].split()

zygote = os.getppid()
with open(f"/proc/{{zygote}}/cmdline", "rb") as fh:
    command = fh.read().decode(errors="replace").split("\\0")[:-1]
with open({str(log)!r}, "a") as fh:  # at load, once per worker
    fh.write(json.dumps({{"zygote": zygote, "parent": int(_stat(zygote)[1]),
                         "session": int(_stat(zygote)[3]), "command": command,
                         "argv": sys.argv[:2],
                         "checks": sorted(m for m in sys.modules
                                          if m.startswith({CHECKER_MODULES!r}))}}) + "\\n")

def norm(scores, dim=-1):
    return torch.softmax(scores, dim)
""")
    return source, log


def test_the_command_line_forks_its_zygote_before_the_checks(tmp_path):
    """From the command line the zygote is forked from the command once it has imported torch
    (:func:`attnverify.prestart.forked`: the workers share that import's pages), before
    Hypothesis, the checks or the target are: the workers' zygote is a child of the command
    running the command's own program, in a session of its own, and no module of the checks
    is in a worker."""
    source, log = _probe_target(tmp_path)
    argv = [sys.executable, "-m", "attnverify", "certify", f"{source}:norm", "--claims", "",
            "--profile", "dev", "--max-examples", "2", "--quiet", "--jobs", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ATTNVERIFY_SANDBOX_WRITABLE": str(tmp_path)})
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and out.count("CERTIFIED") == 1 and not err, out + err
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert seen and all(s["parent"] == proc.pid for s in seen), seen
    assert all(s["command"] == argv and s["session"] == s["zygote"] for s in seen), seen
    assert all(not s["checks"] and s["argv"] == ["-c", "zygote"] for s in seen), seen


def test_a_workers_backward_passes_import_no_sympy(tmp_path):
    """The worker takes the target's backward passes as the gradient of ``⟨out, cotangent⟩``
    (:func:`attnverify.worker._grad`), never through ``torch.autograd.grad``'s tensor-cotangent
    path, which imports ``torch.fx.experimental.symbolic_shapes`` and sympy: the zygote no
    longer preloads them, so a certification of one normalizer (``torch._dynamo`` deferred,
    which brings sympy where it is imported) takes its gradients and double backward without
    either. The target records, at every call, whether its input requires grad and what is
    loaded."""
    log = tmp_path / "calls.txt"
    source = tmp_path / "spy.py"
    source.write_text(f"""
import sys, torch

def norm(scores, dim=-1):
    with open({str(log)!r}, "a") as fh:
        fh.write(f"{{scores.requires_grad}} {{'sympy' in sys.modules}} "
                 f"{{'torch._dynamo' in sys.modules}}\\n")
    return torch.softmax(scores, dim)
""")
    argv = [sys.executable, "-m", "attnverify", "certify", f"{source}:norm", "--claims",
            "double_backward", "--profile", "dev", "--max-examples", "4", "--quiet", "--jobs", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "ATTNVERIFY_SANDBOX_WRITABLE": str(tmp_path)})
    assert done.returncode == 0 and "CERTIFIED" in done.stdout, done.stdout + done.stderr
    calls = [tuple(line.split()) for line in log.read_text().splitlines()]
    backward = [c for c in calls if c[0] == "True"]
    assert len(backward) >= 20 and ("True", "False", "False") in backward, calls[:5]
    assert ("True", "True", "False") not in backward and ("False", "True", "False") not in calls


def test_a_command_run_in_a_callers_process_spawns_its_zygote(tmp_path, monkeypatch, capsys):
    """``main`` called in another program's process (this test's) spawns the zygote instead of
    forking it (the caller's objects would be in every worker): a new interpreter, with no
    module of the checks either."""
    source, log = _probe_target(tmp_path)
    monkeypatch.setenv("ATTNVERIFY_SANDBOX_WRITABLE", str(tmp_path))
    code = main(["certify", f"{source}:norm", "--claims", "", "--profile", "dev",
                 "--max-examples", "2", "--quiet", "--jobs", "1"])
    assert code == 0, capsys.readouterr()
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert seen and all(s["parent"] == os.getpid() for s in seen), seen
    assert all(s["command"][1:2] == ["-c"] and "zygote" in s["command"] for s in seen), seen
    assert all(not s["checks"] and s["argv"] == ["-c", "zygote"] for s in seen), seen


def test_the_command_spawns_its_zygote_where_it_maps_shared_writable_memory(monkeypatch):
    """A fork would share such memory with every worker, which could then write into the
    checker through it: ``prestart.forked`` spawns the zygote instead (and forks nothing)."""
    from attnverify import prestart

    probe = ("import mmap; from attnverify import prestart; "
             "print(prestart._writable_shared_memory()); "
             "m = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED); "
             "print(prestart._writable_shared_memory())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr
    started = []
    monkeypatch.setattr(prestart, "_EARLY", [])
    monkeypatch.setattr(prestart, "_writable_shared_memory", lambda: True)
    monkeypatch.setattr(prestart, "early", lambda *a: started.append(a))
    monkeypatch.setattr(remote, "zygote", lambda: remote.Zygote())
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked"))
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    prestart.forked(True)
    assert started == [(True,)]


def test_a_usage_error_of_the_jobs_is_one_line(tmp_path):
    """Every forked job meets the same bad input (it shows only once a target is loaded): the
    command prints it once, exit 2, whatever the number of jobs and targets."""
    for targets in (["softmax"], ["softmax", "sparsemax"]):
        done = _run("certify", *targets, "--claims", "no_such_property", "--profile", "dev",
                    env={jobs.JOBS_ENV: "2"})
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "unknown property id" in done.stderr, \
            done.stderr
    done = _run("certify", str(tmp_path / "absent.py") + ":fn", env={jobs.JOBS_ENV: "2"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[-1].split()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _alive(pid)


def test_a_zygote_clone_serves_workers_of_its_own():
    """A job's zygote is a fork of the command's (``clone``): its workers are its children,
    closing it kills them and it, and the first zygote forks on as before."""
    root = remote.zygote()
    pid, sock = root.clone()
    clone = remote.Zygote()
    clone.adopt(pid, sock)
    assert clone.alive() and _parent(pid) == root.pid
    worker, channel, _sandbox = clone.fork(memory_limit=False)
    assert _parent(worker) == pid
    clone.close()
    channel.close()
    assert _wait_gone(worker) and _wait_gone(pid)
    other, channel, _sandbox = root.fork(memory_limit=False)
    assert _parent(other) == root.pid
    root.kill(other)
    channel.close()
    assert _wait_gone(other)


def _not_passed(report: Path) -> str:
    """The results of a certificate that did not pass, for an assertion's message."""
    try:
        targets = json.loads(report.read_text(encoding="utf-8"))["targets"]
    except (OSError, ValueError, KeyError):
        return f" (no certificate at {report})"
    return "".join(f"\n{r}" for t in targets for r in t["results"] if r.get("status") != "holds")


def test_nothing_of_a_run_with_jobs_outlives_it(tmp_path):
    """A target that leaves a daemon behind (double fork, new session), certified on two forked
    jobs: when the command has exited, no process it started is left (its zygote, the clones,
    the workers, the daemon: each found by a mark in its environment)."""
    target, pidfile = daemonizing_target(tmp_path)
    mark = f"attnverify-test-{os.getpid()}-{time.monotonic_ns()}"
    report = tmp_path / "certificate.json"
    done = _run("certify", target, "--claims", "", "--profile", "dev",
                "--max-examples", "2", "--quiet", "--jobs", "2", "--json", str(report),
                env={"ATTNVERIFY_SANDBOX_WRITABLE": str(tmp_path), "ATTNVERIFY_TEST_MARK": mark})
    assert done.returncode == 0, done.stdout + done.stderr + _not_passed(report)
    assert pidfile.exists()
    assert _wait_gone(int(pidfile.read_text()), 5), "the target's daemon outlived the run"
    left = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if mark.encode() in fh.read() and _alive(int(name)):
                    left.append(name)
        except (OSError, ValueError):
            continue
    assert not left, f"processes of the run outlived it: {left}"


def test_a_job_prints_only_the_units_it_ran(capsys):
    """A job's progress line says what ran in it: nothing for a property whose units all ran
    elsewhere, the dtypes and their own status for one split between jobs."""
    def unit(status, examples):
        return PropertyResult("simplex", True, status, examples=examples, elapsed_s=0.5)

    split = combine("simplex", True, [("float32", unit("holds", 7)), ("float64", None)])
    assert split.status == "not_checked"  # the partial result itself
    progress_line("t", split)
    progress_line("t", combine("simplex", True, [("float32", None), ("float64", None)]))
    progress_line("t", combine("simplex", True, [("float32", unit("violated", 3)),
                                                 ("float64", unit("holds", 4))]))
    err = capsys.readouterr().err.splitlines()
    assert err == ["  t: simplex [float32] … holds (7 examples, 0.50s)",
                   "  t: simplex … violated (7 examples, 1.00s)"]


_THREADS = "len(os.listdir('/proc/self/task'))"


def test_the_command_modules_start_no_thread_a_fork_would_lose():
    """Jobs are forked only from a process whose native threads are those it had when its
    command began (``mark_clean``): importing the command modules must run no parallel tensor
    operation (OpenMP's pool, which a forked job could never use, would hang it)."""
    code = (f"import os, torch; n = {_THREADS}; "
            "import attnverify.certify_command, attnverify.attention.command, attnverify.checks; "
            f"print(n, {_THREADS})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == after


def test_no_fork_after_a_parallel_operation():
    """After a parallel operation has started OpenMP's threads the jobs are new processes
    (forked, each would hang at its first parallel operation)."""
    code = ("import os, torch; from attnverify import jobs; jobs.mark_clean(); "
            "a = jobs._can_fork(); torch.set_num_threads(2); "
            "torch.softmax(torch.randn(2000, 2000), -1); print(a, jobs._can_fork())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_a_program_that_ran_parallel_work_first_gets_new_processes_as_jobs():
    """A program that ran a parallel tensor operation (OpenMP's threads started) and then runs
    ``certify --jobs 2`` through ``cli.main``: what ran before is unknown, so nothing is recorded
    as the command's clean state and its jobs are new processes, not forks; the run ends."""
    code = ("import sys, torch; torch.set_num_threads(2); "
            "torch.softmax(torch.randn(2000, 2000), -1); from attnverify.cli import main; "
            "from attnverify import jobs; "
            "code = main(['certify', 'softmax', '--profile', 'dev', '--max-examples', '2', "
            "'--claims', '', '--quiet', '--jobs', '2']); "
            "print('clean', jobs._CLEAN_THREADS, jobs._can_fork()); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("CERTIFIED") == 1
    assert "clean None False" in done.stdout


def _loaded_triton(pid: int) -> bool:
    """Whether ``pid`` has loaded Triton's library: ``torch._dynamo`` imports Triton."""
    with open(f"/proc/{pid}/maps", encoding="utf-8") as fh:
        return "libtriton" in fh.read()


def test_a_deferring_zygote_imports_torch_dynamo_before_its_second_worker_only(monkeypatch):
    """``falsify``'s zygote (``prestart.spawn(defer=True)``) answers and forks its first worker
    before it imports ``torch._dynamo``, and imports it before it forks a second worker (and a
    clone, which then has it too); the default zygote imports it before it answers."""
    pytest.importorskip("triton", reason="the import is seen by the Triton library it loads")
    from attnverify import prestart

    plain = remote.Zygote()
    monkeypatch.setattr(prestart, "take", lambda: prestart.spawn())
    plain.start()
    deferring = remote.Zygote()
    monkeypatch.setattr(prestart, "take", lambda: prestart.spawn(defer=True))
    deferring.start()
    try:
        assert _loaded_triton(plain.pid) and not _loaded_triton(deferring.pid)
        first, channel1, _ = deferring.fork(memory_limit=False)
        assert not _loaded_triton(deferring.pid)
        second, channel2, _ = deferring.fork(memory_limit=False)
        assert _loaded_triton(deferring.pid)
        pid, sock = deferring.clone()
        assert _loaded_triton(pid)
        sock.close()
        for worker, channel in ((first, channel1), (second, channel2)):
            deferring.kill(worker)
            channel.close()
    finally:
        deferring.close()
        plain.close()


def test_a_clone_of_a_deferring_zygote_defers_torch_dynamo_to_its_own_second_worker(monkeypatch):
    """``certify`` of one normalizer on jobs: the deferring zygote's clone, forked before any
    second worker, starts without ``torch._dynamo`` and forks its first worker so, then imports
    it before its second worker; the zygote itself never imports it for its clones."""
    pytest.importorskip("triton", reason="the import is seen by the Triton library it loads")
    from attnverify import prestart

    deferring = remote.Zygote()
    monkeypatch.setattr(prestart, "take", lambda: prestart.spawn(defer=True))
    deferring.start()
    clone = remote.Zygote()
    try:
        pid, sock = deferring.clone()
        clone.adopt(pid, sock)
        assert not _loaded_triton(pid) and not _loaded_triton(deferring.pid)
        first, channel1, _ = clone.fork(memory_limit=False)
        assert not _loaded_triton(pid) and not _loaded_triton(first)
        second, channel2, _ = clone.fork(memory_limit=False)
        assert _loaded_triton(pid) and not _loaded_triton(deferring.pid)
        for worker, channel in ((first, channel1), (second, channel2)):
            clone.kill(worker)
            channel.close()
    finally:
        clone.close()
        deferring.close()


@pytest.mark.parametrize(("argv", "defers"), [
    (["certify", "softmax"], True),
    (["certify", "softmax", "sparsemax"], False),
    (["certify"], False),  # the built-ins
    (["certify", "--attention", "sdpa"], False),  # forward mode through decompositions
])
def test_certify_defers_torch_dynamo_for_one_normalizer(monkeypatch, argv, defers):
    from attnverify import certify_command, commands
    from attnverify.attention import command as attention_command

    seen = []
    monkeypatch.setattr(commands, "_early_zygote",
                        lambda args, defer=False: seen.append(defer))
    monkeypatch.setattr(certify_command, "run_certify", lambda args: 0)
    monkeypatch.setattr(attention_command, "run_certify", lambda args: 0)
    assert main(argv) == 0
    assert seen == [defers]


@pytest.mark.parametrize(("inequality", "workers", "defers"), [
    ("max_weight <= exp(2*a/T)/L", 1, True),
    ("jacobian_spectral <= 1/(2*T)", 1, False),  # its forward mode may import torch._dynamo
    ("Jacobian_Entry <= 1/(4*T)", 1, False),
    ("max_weight <= 1", 3, None),  # each of the N workers starts a zygote of its own
])
def test_falsify_defers_torch_dynamo_for_a_bound_without_a_jacobian(monkeypatch, inequality,
                                                                   workers, defers):
    from attnverify import commands, falsify

    seen = []
    monkeypatch.setattr(commands, "_early_zygote",
                        lambda args, defer=False: seen.append(defer))
    monkeypatch.setattr(falsify, "run_falsify_command", lambda args, isolated: 0)
    assert main(["falsify", "softmax", inequality, "--workers", str(workers)]) == 0
    assert seen == ([] if defers is None else [defers])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals, /proc")
@pytest.mark.parametrize("jobs, sig, code", [("1", "SIGTERM", 143), ("2", "SIGINT", 130),
                                             ("2", "SIGTERM", 143)])
def test_a_stopped_run_writes_the_certificate_of_what_it_finished(tmp_path, jobs, sig, code):
    """Ctrl-C, or SIGTERM (a CI job cancelled or past its limit), part-way through a run, serial
    or on jobs: the certificate is written with every property that finished as it finished
    (the console reported it), each other one ``not_checked`` saying why, the incomplete
    targets ``not_checked``, ``interrupted`` naming the signal; exit 128 + the signal, one
    line, no traceback."""
    import signal

    from helpers import PYTHON_WITH_CTRL_C

    out = tmp_path / "cert.json"
    proc = subprocess.Popen(
        PYTHON_WITH_CTRL_C + ["-m", "attnverify", "certify", "softmax", "sparsemax", "ssmax",
                              "--profile", "ci", "--jobs", jobs, "--json", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    reported = {}
    try:
        while len(reported) < 6:  # six properties reported finished, far from the end
            line = proc.stderr.readline()
            assert line, f"the run ended first: exit {proc.wait()}"
            if " … " in line and "[" not in line:  # a property's whole result (no shard label)
                name, rest = line.strip().split(" … ")
                reported[name] = rest.split(" ")[0]
        proc.send_signal(getattr(signal, sig))
        err = proc.stderr.read()
        assert proc.wait(60) == code, err
    finally:
        proc.kill()
        proc.wait()
    assert "Traceback" not in err
    last = err.rstrip().splitlines()[-1]
    word = "interrupted" if sig == "SIGINT" else f"terminated ({sig})"
    assert last.startswith(f"attnverify: {word}: ") and str(out) in last, err
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["interrupted"] == sig
    status = {f"{t['target']}: {r['property']}": r["status"]
              for t in data["targets"] for r in t["results"]}
    assert {name: status[name] for name in reported} == reported
    unfinished = [r for t in data["targets"] for r in t["results"] if r["status"] == "not_checked"]
    assert unfinished, "the run ended before the signal"
    # (on jobs, a property's units may be split: those that finished keep their results)
    assert all(r["message"].endswith(f"did not finish: the run was {word}") and
               any(u["status"] == "not_checked" for u in r["units"]) for r in unfinished)
    assert data["targets"][-1]["verdict"] == "not_checked"  # ssmax: never finished
    assert f"{len(status) - len(unfinished)} of {len(status)} properties finished" in last


def _stopped_at(monkeypatch, module, name: str) -> None:
    """``module.name`` raises what the handler raises on SIGTERM, wherever it is called."""
    import signal

    from attnverify.errors import Terminated

    def stopped(*_args, **_kwargs):
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(module, name, stopped)


def _certify_serially(target: str, extra: list, out: Path, capsys) -> tuple[int, str]:
    """``certify TARGET --profile dev EXTRA --jobs 1 --quiet --json OUT``: its exit code and
    standard error."""
    code = main(["certify", target, "--profile", "dev", *extra, "--jobs", "1", "--quiet",
                 "--json", str(out)])
    return code, capsys.readouterr().err


def test_a_failure_in_hand_when_the_run_is_stopped_is_kept(tmp_path, monkeypatch, capsys):
    """The signal comes while a failure found is being shrunk: the property is reported
    violated on the case as found (the message says it was not shrunk), not lost as
    ``not_checked``; the properties after it are ``not_checked``; exit 143."""
    from attnverify import certify

    _stopped_at(monkeypatch, certify, "_exact_and_minimal")
    target = f"{Path(__file__).parent / 'fixtures' / 'planted.py'}:wrong_threshold_sparsemax"
    out = tmp_path / "cert.json"
    code, err = _certify_serially(target, ["--max-examples", "20"], out, capsys)
    assert code == 143, err
    assert "attnverify: terminated (SIGTERM): 1 of " in err.splitlines()[-1]
    target = json.loads(out.read_text(encoding="utf-8"))["targets"][0]
    results = target["results"]
    # the first property's first unit fails (the defect raises on a strided view): kept, its
    # second unit not run, the target failed
    kept = results[0]
    assert kept["status"] == "error" and target["verdict"] == "failed"
    assert [u["status"] for u in kept["units"]] == ["error", "not_checked"]
    assert kept["message"].endswith("(as found: the run was terminated (SIGTERM) before it was "
                                    "shrunk)"), kept["message"]
    assert kept["counterexample"]["repro"].startswith("attnverify repro")
    assert all(r["message"].endswith("did not finish: the run was terminated (SIGTERM)")
               for r in results[results.index(kept) + 1:])


def test_a_hang_in_hand_when_the_run_is_stopped_is_kept(tmp_path, monkeypatch, capsys):
    """The signal comes while a case that ran past the time limit is being shrunk: the
    property is reported on the case as found (the message says it was not shrunk), not lost
    as ``not_checked``; exit 143."""
    from attnverify import certify

    _stopped_at(monkeypatch, certify, "shrink_hang")
    monkeypatch.setenv("HOSTILE_MARKER", str(tmp_path / "hung-once"))  # one hang
    monkeypatch.setenv("ATTNVERIFY_SANDBOX_WRITABLE", str(tmp_path))  # where the marker goes
    target = f"{Path(__file__).parent / 'fixtures' / 'hostile.py'}:hangs"
    out = tmp_path / "cert.json"
    code, err = _certify_serially(target, ["--timeout", "2"], out, capsys)
    assert code == 143, err
    results = json.loads(out.read_text(encoding="utf-8"))["targets"][0]["results"]
    kept = next(r for r in results if r["status"] != "holds")
    assert kept["status"] == "error", kept
    assert "exceeded the per-example time limit of 2 s" in kept["message"], kept["message"]
    assert kept["message"].endswith("(as found: the run was terminated (SIGTERM) before it was "
                                    "shrunk)"), kept["message"]
    assert kept["counterexample"]["repro"].startswith("attnverify repro")
    assert all(r["status"] == "not_checked" for r in results[results.index(kept) + 1:])


@pytest.mark.parametrize("swallowed", [False, True], ids=["turned-into-an-error", "swallowed"])
def test_a_stop_that_a_library_turns_into_an_error_or_swallows_still_stops_the_run(
        tmp_path, monkeypatch, capsys, swallowed):
    """Ctrl-C lands inside a library's ``except BaseException``. Hypothesis, interrupted before
    its engine began, fails its own assertion in that handler: the property read as an
    internal error of the run and the run went on to its end, exit 1 where 130 was due (seen in
    CI on ``certify … --jobs 2``). A library that swallows the interrupt let the run finish as
    if no signal had come. Both now stop the run: exit 130, the certificate ``interrupted``,
    no property in ``error``, those not finished ``not_checked``."""
    import signal

    from hypothesis.internal.conjecture import engine

    made = []
    original = engine.ConjectureRunner.__init__

    def interrupted_here(self, *args, **kwargs):
        made.append(True)
        if len(made) == 3:  # the third search of the run: Ctrl-C comes inside Hypothesis
            try:
                signal.raise_signal(signal.SIGINT)
                for _ in range(1000):  # the handler runs in here
                    pass
            except KeyboardInterrupt:
                if not swallowed:
                    raise
        original(self, *args, **kwargs)

    monkeypatch.setattr(engine.ConjectureRunner, "__init__", interrupted_here)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a command
    try:
        out = tmp_path / "cert.json"
        code, err = _certify_serially("softmax", [], out, capsys)
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(made) >= 3, "the run ended before the signal"
    assert code == 130, err
    assert err.splitlines()[-1].startswith("attnverify: interrupted: "), err
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["interrupted"] == "SIGINT"
    status = [r["status"] for t in data["targets"] for r in t["results"]]
    assert "error" not in status and "not_checked" in status, status
    assert status[0] == "holds", status  # what finished before the signal is kept


def test_a_run_stopped_while_it_merges_its_jobs_parts_writes_the_certificate(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    """The signal comes after every job wrote its part, while the parts are merged: the
    certificate is still written (every property as it finished), marked interrupted; exit
    143. It was lost."""
    import signal

    from attnverify import merge
    from attnverify.errors import Terminated

    real = merge.merge_parts
    calls = []

    def stopped_once(parts, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise Terminated(signal.SIGTERM)  # what the handler raises on SIGTERM
        return real(parts, **kwargs)

    monkeypatch.setattr(merge, "merge_parts", stopped_once)
    out = tmp_path / "cert.json"
    code = main(["certify", "softmax", "--profile", "dev", "--max-examples", "5", "--jobs", "2",
                 "--quiet", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 143, err
    assert len(calls) == 2 and calls[1] == {"stopped": "SIGTERM"}
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["interrupted"] == "SIGTERM"
    assert {r["status"] for r in data["targets"][0]["results"]} == {"holds"}


def _with_closed(stream: str, *argv) -> subprocess.CompletedProcess:
    """``python -m attnverify ARGV`` with standard output (``stream`` 1) or error (2) closed,
    as ``attnverify … >&-`` runs it."""
    line = " ".join(["exec", shlex.quote(sys.executable), "-m", "attnverify",
                     *map(shlex.quote, argv), f"{stream}>&-"])
    return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=600)


def test_a_closed_standard_stream_is_output_discarded():
    """``attnverify … >&-`` (or ``2>&-``): Python leaves that stream ``None``, and every command
    ended in a traceback at its first print. It runs as with that output discarded."""
    done = _with_closed("1", "list")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    done = _with_closed("2", "certify", "no_such_target")
    assert done.returncode == 2 and done.stdout == "", done.stdout


@pytest.mark.slow  # two certifications on two jobs, from the command line
def test_a_run_with_jobs_and_a_closed_standard_stream_writes_its_certificate(tmp_path):
    """A closed standard output or error does not stop the job the command runs itself (its
    output moved aside while it runs, then put back): the certificate is written, exit 0."""
    for stream in ("1", "2"):
        path = tmp_path / f"closed{stream}.json"
        done = _with_closed(stream, "certify", "softmax", "--claims", "", "--profile", "dev",
                            "--max-examples", "2", "--jobs", "2", "--json", str(path))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        assert json.loads(path.read_text())["targets"][0]["verdict"] == "certified"
