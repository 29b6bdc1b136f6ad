"""``falsify --database`` and ``--workers`` (issue #19): example databases shared between runs,
processes and machines.

The bound used throughout is NARROW of ``tests/test_falsify_search.py``: softmax's
``max_weight·L <= 1.0606·exp(a/T) + (L − 3)²`` is false only at L = 3 near a/T = ln(2)/2, where no
battery point lies, so a search needs its battery, strata and polish (hundreds of evaluations) to
find it, and a run that replays it from the database needs exactly one. Redis tests start a real
``redis-server`` on a free loopback port (skipped, with the reason, where it is not installed).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import PYTHON_WITH_CTRL_C, STOPS
from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase

import attnverify
from attnverify import campaign
from attnverify import falsify_search as FS
from attnverify.cli import main
from attnverify.exampledb import ResilientDatabase, database_key, describe, open_database
from attnverify.expr import parse_inequality
from attnverify.falsify import falsify, make_search
from attnverify.falsify_search import F64, FalsifyCase
from attnverify.registry import load_target
from attnverify.runconfig import make_context

NARROW = "max_weight*L <= 1.0606*exp(a/T) + (L - 3)**2"
#: Small enough for a test: the dev profile (500 evaluations), rows of at most 16 keys.
SMALL = ["--profile", "dev", "--max-length", "16"]
#: A true bound (Lemma 1): a search spends its whole budget and finds no witness.
TRUE = "max_weight <= exp(2*a/T)/L"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def cli(*argv: str, cwd: Path, timeout: float = 120, env: dict | None = None):
    """``attnverify ARGV`` as a process of its own (Hypothesis's files kept out of ``~``)."""
    full = dict(os.environ, XDG_CACHE_HOME=str(cwd / ".cache-home"), **(env or {}))
    full.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    return subprocess.run([sys.executable, "-m", "attnverify", *argv], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def tree(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Keys and entries, by hand


def test_database_key_is_the_documented_digest_of_kind_parts_and_version(monkeypatch):
    monkeypatch.setattr(attnverify, "__version__", "9.9.9")
    text = "attnverify-example-db-1\x009.9.9\x00witness\x00softmax\x00max_weight <= 1\x00"
    digest = hashlib.sha256(text.encode()).hexdigest()[:40]
    assert database_key("witness", "softmax", "max_weight <= 1", "") == \
        f"attnverify/witness/{digest}".encode()
    key = database_key("witness", "softmax", "max_weight <= 1", "")
    assert database_key("near", "softmax", "max_weight <= 1", "") != key
    assert database_key("witness", "sparsemax", "max_weight <= 1", "") != key
    assert database_key("witness", "softmax", "max_weight <= 1", "temperature=2") != key
    monkeypatch.setattr(attnverify, "__version__", "9.9.10")
    assert database_key("witness", "softmax", "max_weight <= 1", "") != key


def test_keys_name_the_target_the_normalized_bound_and_the_parameters():
    a = parse_inequality("max_weight<=1").normalized
    b = parse_inequality("max_weight <= 1").normalized
    assert a == b  # spacing is not part of a bound
    assert campaign.keys("softmax", a, {}) == campaign.keys("softmax", b, {})
    assert campaign.keys("softmax", a, {"temperature": 2.0}) != campaign.keys("softmax", a, {})
    assert campaign.bound_parts("t", "x", {"b": 1, "a": 2, "c": None}) == ("t", "x", "a=2,b=1")


def test_an_entry_round_trips_exactly_and_hostile_entries_are_skipped():
    spec = load_target("softmax")
    search = make_search(spec, parse_inequality("max_weight <= 1"),
                         make_context("dev", max_length=8))
    row = torch.tensor([0.1, -1 / 3, -math.inf, 1e-300], dtype=F64)
    ev = FS.evaluate(spec, search.ineq, FalsifyCase(row, 0.7, "strata:levels", 12), {})
    case, margin = campaign.decode(campaign.encode(ev), search)
    assert torch.equal(case.scores, row) and case.temperature == 0.7  # bit for bit
    assert (case.kind, case.seed) == ("strata:levels", 12) and margin == ev.margin

    def entry(**change):
        base = json.loads(campaign.encode(ev))
        base.update(change)
        return json.dumps(base).encode()

    hostile = [b"", b"\xff\xfe", b"[]", b"{}", entry(format=2), entry(scores="0x1p0"),
               entry(scores=[]), entry(scores=["0x1p0"] * 9),  # longer than --max-length 8
               entry(scores=["nan", "0x1p0"]), entry(scores=["inf"]), entry(scores=["-inf"]),
               entry(temperature=None), entry(temperature="-0x1p0"), entry(temperature="inf"),
               entry(seed=-1), entry(seed=2**64), entry(seed=1.5), entry(kind=7),
               entry(scores=[[1]]), b'{"format": 1, "scores": ' + b"[" * 5000 + b"]" * 5000]
    for value in hostile:
        assert campaign.decode(value, search) is None, value[:80]
    # a target that takes no temperature, or a run that fixes it, skips other temperatures
    plain = make_search(load_target("sparsemax"), search.ineq, make_context("dev"))
    plain.takes_temperature = False
    assert campaign.decode(campaign.encode(ev), plain) is None
    fixed = make_search(spec, search.ineq, make_context("dev"))
    fixed.fixed_temperature = 2.0
    assert campaign.decode(campaign.encode(ev), fixed) is None


def test_a_lost_backend_leaves_the_run_on_memory_with_the_reason():
    class Dying(ExampleDatabase):  # a database whose server went away
        def __init__(self):
            super().__init__()
            self.calls = 0

        def fetch(self, key):
            raise ConnectionError("Connection refused")

        def save(self, key, value):
            self.calls += 1
            raise TimeoutError("Timeout reading from socket")

        def delete(self, key, value):
            raise AssertionError("never called once lost")

        def move(self, src, dest, value):
            raise AssertionError("never called once lost")

    backend = Dying()
    db = ResilientDatabase(backend, "redis://h:1/0", "redis")
    db.save(b"k", b"v")
    assert db.lost == "save failed: TimeoutError: Timeout reading from socket"
    assert db.backend is None and backend.calls == 1
    db.save(b"k", b"w")  # in memory only: the backend is not asked again
    db.delete(b"k", b"v")
    assert list(db.fetch(b"k")) == [b"w"] and backend.calls == 1


def test_describe_hides_a_password():
    assert describe("redis://:s3cret@host:6379/2") == "redis://:***@host:6379/2"
    assert describe("redis://user:s3cret@host/0") == "redis://user:***@host/0"
    assert describe("redis://host:6379/0") == "redis://host:6379/0"
    assert describe("some/dir") == "some/dir"


# --------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written


def _bad_databases(tmp: Path) -> list[tuple[str, str]]:
    (tmp / "a_file").write_text("x")
    cases = [
        (str(tmp / "a_file"), "is not a directory"),
        (str(tmp / "a_file" / "db"), "a_file is not a directory"),
        ("/proc/attnverify-db", "/proc is not writable"),  # no one creates files in /proc
        ("/proc/attnverify/db", "/proc is not writable"),
        (f"redis://127.0.0.1:{free_port()}/0", "Connection refused"),
        ("redis://127.0.0.1:99999/0", "Port out of range"),
        ("redis://127.0.0.1:abc/0", "bad Redis URL"),
        ("redis://127.0.0.1:0/0", "port 0"),
        ("redis://127.0.0.1:6379/x", "the Redis database must be a number, got 'x'"),
        ("redis://127.0.0.1:6379/-1", "must be a number"),
        ("redis://127.0.0.1:6379/99999999999", "must be a number"),
        ("redis:///0", "no host"),
        ("redis://127.0.0.1:6379/0?x=1", "unexpected '?'"),
        ("http://127.0.0.1/db", "unsupported URL scheme 'http'"),
        ("", "expects a directory or redis://HOST:PORT/DB"),
    ]
    if os.geteuid() != 0:  # root writes through permission bits (the /proc cases cover root)
        ro = tmp / "read_only"
        ro.mkdir()
        ro.chmod(0o500)
        cases.append((str(ro), "is not writable"))
        cases.append((str(ro / "db"), "read_only is not writable"))
    return cases


def test_a_bad_database_is_one_line_exit_2_and_nothing_is_written(tmp_path):
    for text, fragment in _bad_databases(tmp_path):
        before = tree(tmp_path)
        out_json = tmp_path / "out.json"
        code, out, err = run("falsify", "softmax", NARROW, "--database", text, *SMALL,
                             "--no-isolation", "--json", str(out_json))
        assert code == 2 and out == "", (text, out, err)
        assert err.startswith("attnverify: error: --database") and err.count("\n") == 1, err
        assert fragment in err and "Traceback" not in err, (text, err)
        assert tree(tmp_path) == before, text
        assert not out_json.exists()


@pytest.mark.parametrize("value, fragment", [
    ("0", "must be between 1 and 64, got 0"), ("65", "must be between 1 and 64, got 65"),
    ("two", "expects a whole number from 1 to 64, got 'two'"), ("-1", "expects a whole number"),
    ("1.5", "expects a whole number"), ("١", "expects a whole number"),
])
def test_bad_workers_are_one_line_exit_2(value, fragment, tmp_path):
    code, out, err = run("falsify", "softmax", NARROW, "--workers", value, "--json",
                         str(tmp_path / "x.json"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--workers" in err and fragment in err, err
    assert not (tmp_path / "x.json").exists()


def test_campaign_check_workers_by_hand():
    assert campaign.check_workers("1") == 1 and campaign.check_workers(64) == 64
    assert campaign.worker_seed(5, 2) == 7 and campaign.worker_seed(2**64 - 1, 1) == 0


# --------------------------------------------------------------------------------------------
# A directory shared by two processes


def test_a_witness_found_by_one_process_is_replayed_by_the_next_without_search(tmp_path):
    db = tmp_path / "db"
    code, out, _ = run("falsify", "softmax", NARROW, *SMALL, "--no-isolation", "--database",
                       str(db), "--json", str(tmp_path / "first.json"))
    first = json.loads((tmp_path / "first.json").read_text())
    assert code == 1 and first["falsified"]
    # the search: battery, strata and polish, no stored case to replay
    assert first["search"]["phases"] == {"replay": 0, "battery": 200, "strata": 150,
                                         "polish": 14}
    assert first["examples"] == 364 and first["search"]["first_witness"]["phase"] == "polish"
    assert first["database"] == {"location": str(db), "kind": "directory", "temporary": False,
                                 "replayed": 0, "witness_replayed": False, "saved": 1,
                                 "unreadable": 0, "lost": None}

    # a second process replays it first: 1 evaluation
    work = tmp_path / "work"
    work.mkdir()
    proc = cli("falsify", "softmax", NARROW, *SMALL, "--no-isolation", "--database", str(db),
               "--json", "second.json", cwd=work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    second = json.loads((work / "second.json").read_text())
    assert second["examples"] == 1 and second["search"]["phases"] == {"replay": 1}
    assert second["search"]["first_witness"]["phase"] == "replay"
    assert second["search"]["first_witness"]["evaluation"] == 1
    assert second["witness"]["scores"] == first["witness"]["scores"]
    assert second["database"]["witness_replayed"] and second["database"]["saved"] == 0
    assert "the witness was replayed from the database (no search needed)" in proc.stdout
    assert "first met by the replay at evaluation 1" in proc.stdout
    # the command line leaves no .hypothesis/ (nor anything else) in its working directory
    assert {p.name for p in work.iterdir()} - {".cache-home"} == {"second.json"}


def test_a_search_without_witness_keeps_its_best_cases_and_the_next_run_starts_there(tmp_path):
    db = tmp_path / "db"
    argv = ["falsify", "softmax", TRUE, *SMALL, "--no-isolation", "--database", str(db)]
    code, out, _ = run(*argv, "--json", str(tmp_path / "a.json"))
    a = json.loads((tmp_path / "a.json").read_text())
    assert code == 0 and a["database"]["saved"] == campaign.SAVE_NEAR
    assert "database: " in out and "saved 4 entries" in out
    code, _, _ = run(*argv, "--json", str(tmp_path / "b.json"))
    b = json.loads((tmp_path / "b.json").read_text())
    assert code == 0 and b["search"]["phases"]["replay"] == campaign.SAVE_NEAR
    assert b["database"]["replayed"] == campaign.SAVE_NEAR and b["examples"] == 500
    assert b["worst_ratio"] >= a["worst_ratio"]  # the replayed cases are still there
    # the strata's Hypothesis runs keep their corpus in the same directory (Phase.reuse)
    assert len(list(db.iterdir())) > 2


def test_the_near_cases_are_trimmed_to_the_best(tmp_path):
    spec = load_target("softmax")
    shared = campaign.Shared(open_database(str(tmp_path / "db")))
    _, near = campaign.keys("softmax", parse_inequality(TRUE).normalized, {})
    # ten stored near cases with ratios 0.05 … 0.95 (below anything the search meets but two)
    for i in range(10):
        row = torch.tensor([0.0, -float(i + 1)], dtype=F64)
        ratio = 0.05 + 0.1 * i
        fake = FS.Evaluation(FalsifyCase(row, 1.0, "fake", i), {}, ratio, 1.0, ratio, False)
        shared.database.save(near, campaign.encode(fake))
    with campaign.sharing(shared):
        res = falsify(spec, TRUE, make_context("dev", max_length=16, max_examples=60),
                      label="softmax")
    assert not res.falsified and res.search.by_phase["replay"] == campaign.MAX_NEAR
    kept = sorted((json.loads(v)["ratio"] for v in shared.database.fetch(near)), reverse=True)
    assert len(kept) == campaign.MAX_NEAR
    new = sorted({ev.ratio for ev in [res.search.strata[0].best, res.worst] if ev}, reverse=True)
    assert res.worst.ratio in kept and kept == sorted(kept, reverse=True)
    assert min(kept) >= 0.05 + 0.1 * 2 - 1e-12  # the three lowest stored cases went
    assert new


def test_a_stop_request_ends_the_search_before_the_next_evaluation():
    spec = load_target("softmax")
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 30

    shared = campaign.Shared(ResilientDatabase(InMemoryExampleDatabase(), "memory", "directory"),
                             stop=stop)
    with campaign.sharing(shared):
        res = falsify(spec, TRUE, make_context("dev", max_length=16))
    assert not res.falsified and res.examples == 30 and res.search.stopped == "stopped"
    assert shared.saved > 0  # a stopped search keeps what it found


# --------------------------------------------------------------------------------------------
# Workers


def test_the_first_worker_with_a_witness_stops_the_others(tmp_path):
    # two stand-in workers speaking the protocol: one reports a witness at once, the other
    # searches until its stdin closes (what run_workers does to stop it), then reports
    finder = ("import json,sys; json.dump({'json': {'falsified': True, 'examples': 3, "
              "'elapsed_s': 0.1, 'worst_ratio': 2.0, 'search': {'stopped': 'witness'}}, "
              "'summary': 'FALSIFIED'}, open(sys.argv[1], 'w'))")
    searcher = ("import json,os,sys,time; t=time.monotonic(); [0 for _ in iter(lambda: "
                "os.read(0, 1), b'')]; json.dump({'json': {'falsified': False, 'examples': 9, "
                "'elapsed_s': time.monotonic()-t, 'worst_ratio': 0.5, 'search': {'stopped': "
                "'stopped'}}, 'summary': 'not falsified'}, open(sys.argv[1], 'w'))")
    workers = []
    for i, code in enumerate([searcher, finder]):
        path = tmp_path / f"w{i}.json"
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE)
        workers.append(campaign._Worker(i, i, proc, path))
    start = time.monotonic()
    campaign._wait(workers)
    assert time.monotonic() - start < campaign.STOP_GRACE_S
    data, text, code = campaign._merge(workers, None)
    assert code == 1 and data["workers"]["found_by"] == 1
    runs = data["workers"]["runs"]
    assert [r["stopped"] for r in runs] == ["stopped", "witness"]
    assert data["workers"]["evaluations"] == 12
    assert "worker 1 (seed 1) found the witness" in text


def _processes_with(marker: str) -> list[int]:
    """The live processes whose environment holds ``marker`` (workers, zygotes and targets
    inherit it from the run that a test started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig, code, word", STOPS)
def test_ctrl_c_stops_every_worker_and_leaves_no_process(tmp_path, sig, code, word):
    """Ctrl-C, or SIGTERM (a CI job cancelled or past its limit), stops the workers, which
    save what they found, and leaves no process behind."""
    marker = f"ATTNVERIFY_TEST_RUN={tmp_path.name}-{os.getpid()}"
    name, value = marker.split("=")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / ".cache-home"), **{name: value})
    # a true bound and a large budget: the workers (targets behind the process boundary) are
    # still searching when Ctrl-C comes
    proc = subprocess.Popen(
        PYTHON_WITH_CTRL_C + ["-m", "attnverify", "falsify", "softmax", TRUE, "--profile",
                              "thorough", "--max-length", "16", "--workers", "2",
                              "--database", str(tmp_path / "db")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_processes_with(marker)) < 5:
            time.sleep(0.1)  # the parent, its two workers and their zygotes: searching
        assert len(_processes_with(marker)) >= 5, "the workers did not start"
        proc.send_signal(getattr(signal, sig))  # SIGINT: what a terminal's Ctrl-C sends
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "attnverify: stopped 2 workers; what they found is kept in the database" in err
    assert err.rstrip().endswith(f"attnverify: {word}") and "Traceback" not in err
    deadline = time.monotonic() + 10  # a zygote exits once its worker's socket closes
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(marker)


# --------------------------------------------------------------------------------------------
# Redis


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server on a free loopback port, in a temporary directory, stopped at the
    end: ``(url, process)``."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server not installed: apt-get install redis-server (Debian's "
                    "package) to run the Redis database tests")
    pytest.importorskip("redis", reason="the redis package is not installed: "
                        "pip install 'attnverify[fuzz]'")
    import redis

    port = free_port()
    home = tmp_path / "redis"
    home.mkdir()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--dir",
                             str(home), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("redis-server did not start")
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        client.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_a_redis_database_number_the_server_refuses_is_exit_2(redis_server, tmp_path):
    url, _ = redis_server
    code, out, err = run("falsify", "softmax", NARROW, "--database", url[:-1] + "99",
                         "--no-isolation", "--json", str(tmp_path / "x.json"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "cannot use the Redis database" in err and "DB index is out of range" in err
    assert not (tmp_path / "x.json").exists()


def test_two_workers_share_redis_and_a_third_run_replays_without_search(redis_server,
                                                                         tmp_path):
    url, _ = redis_server
    proc = cli("falsify", "softmax", NARROW, *SMALL, "--workers", "2", "--no-isolation",
               "--database", url, "--json", "workers.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "workers.json").read_text())
    workers = data["workers"]
    assert workers["count"] == 2 and workers["found_by"] in (0, 1)
    assert [r["seed"] for r in workers["runs"]] == [0, 1]
    found = workers["runs"][workers["found_by"]]
    assert found["falsified"] and data["seed"] == found["seed"]
    assert data["database"]["kind"] == "redis" and data["database"]["location"] == url
    assert data["database"]["lost"] is None and data["examples"] == 364
    assert f"worker {workers['found_by']} (seed {found['seed']}) found the witness" \
        in proc.stdout
    import redis

    client = redis.Redis.from_url(url)
    witness_key, _ = campaign.keys("softmax", parse_inequality(NARROW).normalized, {})
    stored = client.smembers(b"attnverify:" + witness_key)
    client.close()
    assert len(stored) >= 1
    # a third run replays the witness: one evaluation, no battery, strata or polish
    code, out, _ = run("falsify", "softmax", NARROW, *SMALL, "--no-isolation", "--database",
                       url, "--json", str(tmp_path / "third.json"))
    third = json.loads((tmp_path / "third.json").read_text())
    assert code == 1 and third["examples"] == 1 and third["search"]["phases"] == {"replay": 1}
    assert third["witness"]["scores"] == data["witness"]["scores"]
    assert third["database"]["witness_replayed"] and "replayed from the database" in out


@pytest.mark.parametrize("text, verdict", [(NARROW, 1), (TRUE, 0)])
def test_redis_killed_mid_campaign_the_run_finishes_with_the_search_verdict(
        redis_server, tmp_path, monkeypatch, text, verdict):
    url, server = redis_server
    real = FS.evaluate
    count = {"n": 0}

    def evaluate(*args, **kwargs):
        count["n"] += 1
        if count["n"] == 50:  # in the battery: the strata will find the server gone
            server.kill()
            server.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(FS, "evaluate", evaluate)
    code, out, err = run("falsify", "softmax", text, *SMALL, "--no-isolation", "--database",
                         url, "--json", str(tmp_path / "lost.json"))
    assert count["n"] > 50 and "Traceback" not in out + err
    lost = json.loads((tmp_path / "lost.json").read_text())
    assert lost["database"]["lost"] and "ConnectionError" in lost["database"]["lost"]
    assert "the database was lost during the run" in out
    monkeypatch.setattr(FS, "evaluate", real)
    code_plain, _, _ = run("falsify", "softmax", text, *SMALL, "--no-isolation", "--json",
                           str(tmp_path / "plain.json"))
    plain = json.loads((tmp_path / "plain.json").read_text())
    # the verdict, the evaluations and the witness are the search's, as without a database
    assert code == code_plain == verdict
    assert lost["falsified"] == plain["falsified"] and lost["examples"] == plain["examples"]
    assert lost["witness"] == plain["witness"]
