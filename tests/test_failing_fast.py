"""A failing target is judged as fast as a passing one (issue #27, item 6).

A target that writes bytes of its own onto its channel breaks the protocol at once (the checker
bounds an answer's length and rejects a byte no answer holds as soon as it arrives, instead of
waiting for the rest of a frame the target announced), and a target whose worker fails on every
call (protocol, crash, hang) is failed in full after its first few failures: the run starts a
few workers, not one per property unit. Timing is asserted through what is counted (workers
started, messages), never through a clock."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest

from attnverify import remote, wire
from attnverify.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
CHANNEL = str(FIXTURES / "channel_hostile.py")
FAST = ["--profile", "dev", "--max-examples", "2", "--claims", "", "--quiet"]


def certificate(capsys, tmp_path, *targets, extra=()):
    path = tmp_path / "cert.json"
    code = main(["certify", *targets, *FAST, "--json", str(path), *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    data = json.loads(path.read_text())
    return code, {t["target"]: t for t in data["targets"]}


# --------------------------------------------------------------------------------------------
# Frames: a forged frame is a protocol error when its first wrong byte arrives


def _answer_after(garbage: bytes):
    a, b = socket.socketpair()
    body = wire.dump({"id": 1, "ok": True})
    a.sendall(garbage + struct.pack(">I", len(body)) + body)
    return a, b


def test_bytes_before_an_answer_are_a_protocol_error_not_a_wait():
    """Three bytes before a real answer read as a header announcing 4 KiB: the zero bytes that
    follow can be in no answer, so the frame fails at once (before, the checker waited for the
    4 KiB until the per-example limit)."""
    a, b = _answer_after(b"\x00\x00\x10")
    with a, b, pytest.raises(wire.ProtocolError, match="bytes that no message holds"):
        remote._receive(b, time.monotonic() + 5)


def test_an_answer_longer_than_any_answer_is_refused_at_its_header():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", wire.MAX_ANSWER + 1))
        with pytest.raises(wire.ProtocolError, match="limit"):
            remote._receive(b, time.monotonic() + 5)


def test_a_whole_answer_still_crosses():
    a, b = _answer_after(b"")
    with a, b:
        assert remote._receive(b, time.monotonic() + 60) == {"id": 1, "ok": True}
        text = {"id": 2, "ok": False, "message": "é\n\x00\u202e"}  # escaped by dump
        wire.send(a, text)
        assert remote._receive(b, time.monotonic() + 60) == text


# --------------------------------------------------------------------------------------------
# Whole runs: a target that fails on every call costs its first few failures


@pytest.mark.parametrize("name, first", [
    ("scribbles", "broke the worker protocol: the worker sent a frame holding bytes"),
    ("announces_a_huge_frame", "broke the worker protocol: the worker sent a frame of 8388608"),
    ("crashes", "exited the worker process (exit code 3)"),
])
@pytest.mark.slow  # a whole run against a target that fails every call
def test_a_target_failing_every_call_is_failed_in_full_after_a_few_workers(
        capsys, tmp_path, name, first):
    target = f"{CHANNEL}:{name}"
    code, targets = certificate(capsys, tmp_path, target, "softmax", extra=["--timeout", "20"])
    assert code == 1
    assert targets["softmax"]["verdict"] == "certified"
    bad = targets[target]
    results = bad["results"]
    assert bad["verdict"] == "failed" and len(results) > remote.STRIKES
    assert all(r["status"] == "error" for r in results), results
    assert first in results[0]["message"]
    # one worker per failure until the target is failed in full, none after
    assert len(bad["worker_pids"]) == remote.STRIKES
    rest = [r for r in results if "failed in full" in r["message"]]
    assert rest and rest[-1] is results[-1]
    assert f"failed {remote.STRIKES} times in a row" in rest[-1]["message"]
    assert all(r["counterexample"] is None and r["examples"] == 0 for r in rest)


def test_a_target_hanging_on_every_call_costs_two_time_limits(capsys, tmp_path):
    target = f"{CHANNEL}:hangs"
    code, targets = certificate(capsys, tmp_path, target, extra=["--timeout", "3"])
    assert code == 1
    results = targets[target]["results"]
    assert all(r["status"] == "error" for r in results)
    assert "exceeded the per-example time limit of 3 s" in results[0]["message"]
    # the two time-outs in a row, and the hanging candidates of the shrink of the first hang,
    # which a budget of its own bounds (attnverify.certify.shrink_hang)
    from attnverify.certify import HANG_SHRINK_LIMITS

    pids = len(targets[target]["worker_pids"])
    assert remote.TIMEOUT_STRIKES < pids <= remote.TIMEOUT_STRIKES + HANG_SHRINK_LIMITS, pids
    assert "failed 2 times in a row" in results[-1]["message"]


def test_a_target_that_fails_only_on_some_cases_is_not_failed_in_full(capsys, tmp_path):
    """Failures with a well-formed answer between them (a float32 unit between two float64
    units that crash) never add up: every property runs on workers of its own."""
    target = f"{CHANNEL}:crashes_on_float64"
    code, targets = certificate(capsys, tmp_path, target)
    results = targets[target]["results"]
    assert code == 1
    assert not any("failed in full" in r["message"] for r in results), results
    assert sum("exit code 4" in r["message"] for r in results) > remote.STRIKES
    assert len(targets[target]["worker_pids"]) > remote.STRIKES
