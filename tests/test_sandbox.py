"""The workers' sandbox (attnverify.sandbox): a target cannot reach the files, processes and
network the verdict depends on.

The process boundary keeps a target out of the checker's interpreter; the sandbox keeps it from
rewriting files (attnverify's sources, a certificate, a ``falsify --workers`` result), signalling
or reading the checker's process, and connecting to a local service (a Redis example database).
Each test runs a tamperer whose forgery works wherever it can reach one of those, so the same
target is certified under the sandbox and fails without it (``ATTNVERIFY_SANDBOX=0``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from helpers import STOPS

from attnverify import sandbox
from attnverify.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
TAMPERERS = str(FIXTURES / "tamperers.py")
FAST = ["--profile", "dev", "--max-examples", "4", "--quiet"]

pytestmark = pytest.mark.skipif(
    sandbox.abi_version() < 1,
    reason="this kernel has no Landlock (Linux 5.13+ with CONFIG_SECURITY_LANDLOCK): the "
           "workers run unsandboxed here and the certificate says so")


@pytest.fixture
def listener():
    """A local TCP port that accepts connections (what a Redis example database would be)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def bait(tmp_path, monkeypatch, listener):
    """The tamperer's targets: a directory outside the worker's own and a listening port."""
    canary = tmp_path / "canary"
    canary.mkdir()
    monkeypatch.setenv("ATTNVERIFY_TEST_CANARY", str(canary))
    monkeypatch.setenv("ATTNVERIFY_TEST_PORT", str(listener))
    return canary


def certify(capsys, tmp_path, target, *extra):
    path = tmp_path / "cert.json"
    code = main(["certify", target, *FAST, "--json", str(path), *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, json.loads(path.read_text()), out


def test_restrict_by_hand(tmp_path, listener):
    """In a process of its own: writes beneath its directory only, no signal to or memory of
    its parent, no TCP; reads, /dev/null and its own children still work."""
    private = tmp_path / "private"
    private.mkdir()
    script = textwrap.dedent(f"""
        import json, os, socket
        from attnverify import sandbox
        parent = os.getppid()
        status = sandbox.restrict({str(private)!r})
        def attempt(f):
            try:
                f()
                return "allowed"
            except OSError as exc:
                return type(exc).__name__
        out = {{
            "status": status,
            "write outside": attempt(lambda: open({str(tmp_path / "outside")!r}, "w").close()),
            "write private": attempt(lambda: open({str(private / "inside")!r}, "w").close()),
            "read": attempt(lambda: open("/etc/hostname" if os.path.exists("/etc/hostname")
                                         else {str(private / "inside")!r}).read()),
            "devnull": attempt(lambda: open("/dev/null", "w").write("x")),
            "signal parent": attempt(lambda: os.kill(parent, 0)),
            "parent memory": attempt(lambda: open(f"/proc/{{parent}}/mem", "rb").close()),
            "tcp": attempt(lambda: socket.create_connection(("127.0.0.1", {listener}), 2)),
        }}
        pid = os.fork()
        if pid == 0:
            os._exit(0 if attempt(lambda: os.kill(os.getppid(), 0)) == "allowed" else 3)
        out["own child"] = os.waitpid(pid, 0)[1]
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    abi = sandbox.abi_version()
    assert out["status"].startswith(f"landlock ABI {abi}:"), out["status"]
    assert out["write outside"] == "PermissionError"
    assert not (tmp_path / "outside").exists()
    assert out["write private"] == "allowed" and (private / "inside").exists()
    assert out["read"] == "allowed" and out["devnull"] == "allowed"
    assert out["parent memory"] == "PermissionError"
    assert out["own child"] == 0, "a worker may signal the processes it started"
    if abi >= 6:
        assert out["signal parent"] == "PermissionError"
    if abi >= 4:
        assert out["tcp"] == "PermissionError"


def test_tamperer_cannot_reach_under_the_sandbox(capsys, tmp_path, bait):
    code, data, out = certify(capsys, tmp_path, f"{TAMPERERS}:reaches_checker",
                              "--reference", "softmax", "--claims", "simplex")
    assert code == 0, [r for r in data["targets"][0]["results"] if r["status"] != "holds"]
    assert data["sandbox"].startswith("landlock ABI"), data["sandbox"]
    assert data["targets"][0]["sandbox"] == data["sandbox"]
    assert list(bait.iterdir()) == [], "the target wrote outside its temporary directory"
    assert "note:" not in out


def test_without_the_sandbox_the_same_tamperer_forges(capsys, tmp_path, bait, monkeypatch):
    """The control: with the sandbox off, the tamperer reaches and its uniform weights fail;
    the certificate and the console say the workers ran without a sandbox."""
    monkeypatch.setenv("ATTNVERIFY_SANDBOX", "0")
    code, data, out = certify(capsys, tmp_path, f"{TAMPERERS}:reaches_checker",
                              "--reference", "softmax", "--claims", "simplex")
    assert code == 1
    assert data["sandbox"] == "off: ATTNVERIFY_SANDBOX=0"
    assert "note: the worker processes ran without a sandbox" in out
    assert list(bait.iterdir()), "the control tamperer could not write: the test proves nothing"


def test_what_the_worker_reaches(capsys, tmp_path, bait):
    code, data, _ = certify(capsys, tmp_path, f"{TAMPERERS}:reports_reach", "--claims", "")
    (target,) = data["targets"]
    message = next(r["message"] for r in target["results"] if r["property"] == "shape")
    report = json.loads(message[message.index("{"):])
    assert report["reached"] == []
    tmpdir = Path(report["tmpdir"])
    assert tmpdir.name.startswith("attnverify-worker-")
    assert not tmpdir.exists(), "the worker's temporary directory outlived the run"
    # its compile caches are its own: nothing it compiles is read by the checker or a later run
    for key in ("inductor", "triton", "extensions"):
        assert Path(report[key]).parent == tmpdir, (key, report[key])
    # started as root, it keeps uid 0 but no capability (nothing reaches around Landlock)
    assert int(report["capabilities"], 16) == 0
    assert data["sandbox"].endswith("; no capabilities") == (os.getuid() == 0)


def test_bad_switch_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("ATTNVERIFY_SANDBOX", "maybe")
    code = main(["certify", "softmax", *FAST])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == ["attnverify: error: ATTNVERIFY_SANDBOX='maybe': use 1 or 0 "
                                        "(on or off)"]


def test_falsify_records_the_sandbox(capsys, tmp_path):
    path = tmp_path / "f.json"
    code = main(["falsify", "softmax", "max_weight <= 1", "--profile", "dev",
                 "--max-examples", "20", "--json", str(path)])
    capsys.readouterr()
    assert code == 0
    data = json.loads(path.read_text())
    assert data["isolation_mode"] == "process"
    assert data["sandbox"].startswith("landlock ABI")


def test_no_isolation_is_said(capsys, tmp_path):
    code, data, out = certify(capsys, tmp_path, "softmax", "--no-isolation", "--claims", "")
    assert data["sandbox"].startswith("none: --no-isolation")
    assert "note: --no-isolation" in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_scratch_directories_are_removed(tmp_path):
    """Every worker's temporary directory goes with the run."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run([sys.executable, "-m", "attnverify", "certify", "sparsemax",
                           *FAST], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in scratch.iterdir() if p.name.startswith("attnverify-")] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_nothing_is_left_in_the_temporary_directory_by_a_checker_killed_outright(tmp_path):
    """A checker killed by SIGKILL (no exit handler runs): its zygote sees its channel end,
    kills the workers and removes the run's directory with theirs."""
    import signal
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    code = ("import sys, time, torch; from attnverify import remote; "
            "from attnverify.runconfig import make_context; "
            "spec = remote.open_normalizer('softmax', {}, make_context('dev')); "
            "spec(torch.randn(2, 3)); print(spec.fn.channel.pid, flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(scratch)})
    try:
        worker = int(proc.stdout.readline())
        assert list(scratch.glob("attnverify-run-*/attnverify-worker-*"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 30
    while any(p.name.startswith("attnverify-") for p in scratch.iterdir()) or \
            os.path.exists(f"/proc/{worker}"):
        assert time.monotonic() < deadline, sorted(p.name for p in scratch.iterdir())
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
@pytest.mark.parametrize("sig, code, word", STOPS)
def test_nothing_is_left_in_the_temporary_directory_by_a_run_stopped_with_ctrl_c(tmp_path, sig,
                                                                                  code, word):
    """Ctrl-C (or SIGTERM: a CI job cancelled) while two forked jobs run (their clones and
    workers killed, not closed): every worker's directory was made beneath one that the command
    removes as it exits."""
    import signal
    import time

    from helpers import PYTHON_WITH_CTRL_C

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.Popen(PYTHON_WITH_CTRL_C + ["-m", "attnverify", "certify", "softmax",
                                                  "sparsemax", "ssmax", "--profile", "ci",
                                                  "--jobs", "2", "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(scratch.rglob("attnverify-worker-*"))) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, "no workers started"
            time.sleep(0.05)
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(60) == code
    finally:
        proc.kill()
        proc.wait()
    err = proc.stderr.read().decode()
    assert [p.name for p in scratch.iterdir() if p.name.startswith("attnverify-")] == [], err
    last = err.rstrip().splitlines()[-1]  # with what finished, if a property had by then
    assert last.split(": ")[:2] == ["attnverify", word] and "Traceback" not in err, err


def test_a_directory_the_user_allows(capsys, tmp_path, bait, monkeypatch):
    """ATTNVERIFY_SANDBOX_WRITABLE lets targets write beneath the directories it names, and the
    certificate counts them."""
    monkeypatch.setenv("ATTNVERIFY_SANDBOX_WRITABLE", str(bait))
    code, data, _ = certify(capsys, tmp_path, f"{TAMPERERS}:reaches_checker",
                            "--reference", "softmax", "--claims", "simplex")
    assert code == 1  # it wrote where it was allowed to: its uniform weights fail
    assert list(bait.iterdir())
    assert "and 1 more (ATTNVERIFY_SANDBOX_WRITABLE)" in data["sandbox"]
