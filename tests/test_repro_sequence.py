"""Defects that need more than one call (issue #25): a failure that a fresh worker does not
reproduce from its case alone is reported with the earlier calls it needs, shrunk to the fewest,
and its repro line replays them in order in one fresh worker and fails the same way (exit 1).
Each planted defect (tests/fixtures/planted_sequence.py) on the ci profile at the default seed;
a target that keeps a legitimate cache is certified."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from attnverify import cli, remote
from attnverify.certify import certify_target, make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.remote import History

FILE = str(Path(__file__).parent / "fixtures" / "planted_sequence.py")
CI = make_context("ci", seed=0)


@pytest.fixture(autouse=True)
def _workers_closed():
    yield
    remote.shutdown()


def run_line(capsys, line: str) -> tuple[int, str]:
    argv = shlex.split(line)
    assert argv[:2] == ["attnverify", "repro"], line
    capsys.readouterr()
    code = cli.main(argv[1:])
    return code, capsys.readouterr().out


def without_sequence(line: str) -> str:
    argv = shlex.split(line)
    i = argv.index("--case")
    text = argv[i + 1]
    data = json.loads(text if text.startswith("{") else Path(text).read_text())
    data.pop("sequence")
    argv[i + 1] = json.dumps(data)
    return shlex.join(argv)


@pytest.mark.parametrize("attr, prop_id, needle, most", [
    # the second call of a shape gets the first call's buffer back: one earlier call
    ("workspace_softmax", "shape", "shares its storage with the output of an earlier call", 1),
    # right for 40 calls, then drifting: 40 calls of the cheapest case, no more
    ("autotuned_softmax", "simplex", "row sum", 40),
    # the log-sum-exp of the first input of a shape reused for the next: one earlier call
    ("shape_cache_softmax", "simplex", "row sum", 1),
])
@pytest.mark.slow  # searches with fresh workers, then repro runs
def test_a_defect_across_calls_is_reported_with_its_sequence_and_reproduces(
        attr, prop_id, needle, most, capsys):
    spec = remote.open_normalizer(f"{FILE}:{attr}", {}, CI)
    res = run_property(PROPERTIES[prop_id], spec, CI)
    assert res.status == "violated", res.message
    assert needle in res.message
    ce = res.counterexample
    assert ce.get("reproduces", True) is True
    steps = ce["sequence"]
    assert 1 <= len(steps) <= most, [(s["property"], s["case"]["shape"]) for s in steps]
    assert ce["shape"][0] * ce["shape"][1] <= 2  # the case itself shrunk as ever
    code, out = run_line(capsys, ce["repro"])
    assert code == 1, out
    assert f"replaying {len(steps)} earlier call" in out and needle in out
    # the case alone, in a fresh worker, holds: the sequence is what it needs
    code, out = run_line(capsys, without_sequence(ce["repro"]))
    assert code == 0 and "holds" in out, out


def test_a_defect_of_one_case_carries_no_sequence():
    """A stale answer caught inside one check (deterministic's calls A, B, A, B) fails again
    alone in a fresh worker: no sequence."""
    spec = remote.open_normalizer(f"{FILE}:workspace_softmax", {}, CI)
    res = run_property(PROPERTIES["deterministic"], spec, CI)
    assert res.status == "violated"
    assert "sequence" not in res.counterexample


def test_a_legitimate_cache_is_certified():
    spec = remote.open_normalizer(f"{FILE}:constant_cache_softmax", {}, CI)
    res = certify_target(spec, ["simplex"], make_context("dev", seed=0))
    bad = {r.property: r.message for r in res.results if r.status != "holds"}
    assert res.verdict == "certified" and not bad, bad


@pytest.mark.parametrize("sequence, needle", [
    ({"a": 1}, "must be a list"),
    ([{"property": "simplex"}], "must be an object with a \"case\""),
    ([{"property": "nope", "case": {}}], "unknown property 'nope'"),
    ([{"property": "simplex", "how": "twice", "case": {}}], "\"how\" must be one of"),
])
def test_a_bad_sequence_is_a_usage_error(sequence, needle, capsys):
    case = {"case": "RowCase", "scores": [[0.0, 1.0]], "dtype": "float64", "shape": [1, 2],
            "temperature": None, "kind": "gaussian", "seed": 0, "sequence": sequence}
    code = cli.main(["repro", "softmax", "--property", "simplex", "--case", json.dumps(case)])
    assert code == 2
    assert needle in capsys.readouterr().err


def test_the_history_keeps_the_latest_examples_within_its_bounds(monkeypatch):
    from attnverify import heartbeat

    monkeypatch.setattr("attnverify.remote.HISTORY_ENTRIES", 3)
    h = History()
    for i in range(5):
        heartbeat.example_started(f"case {i}", ("simplex", "check"))
        h.note()
        h.note()  # a second request of the same example
        heartbeat.example_finished()
    assert [(c, n) for _, c, n in h.snapshot()] == [("case 2", 2), ("case 3", 2), ("case 4", 2)]
    assert h.dropped == 2
    h.note()  # outside any example: kept, not replayable
    assert h.snapshot()[-1][0] is None


# --------------------------------------------------------------------------------------------
# The fresh worker made ready ahead (remote.Channel.prepare)


def test_a_restart_takes_the_worker_made_ready_ahead():
    """A spare is forked and given the load while the current worker still serves; a restart
    kills the old worker and takes the spare (recorded among the target's workers only then,
    with nothing of the calls before); the next spare's thread waits for the old worker's exit
    first; closing the channel kills the spare that was never taken."""
    import torch

    spec = remote.open_normalizer(f"{FILE}:constant_cache_softmax", {}, CI)
    channel = remote.channel_of(spec)
    old = channel.pid
    channel.prepare()
    ready = channel.spare
    ready.thread.join()
    assert ready.error is None and ready.pid not in (0, old)
    assert ready.pid not in channel.monitor.pids  # not one of the target's workers yet
    spec.fn(torch.zeros(2, 3))  # the current worker still answers
    assert channel.pid == old and channel.monitor.history.snapshot()
    channel.restart()
    assert channel.pid == ready.pid and channel.monitor.pids[-1] == ready.pid
    assert channel.monitor.history.snapshot() == [] and channel.spare is None
    assert channel.unreaped == [old]
    channel.prepare()
    following = channel.spare
    following.thread.join()
    assert following.error is None and following.pid not in (old, ready.pid)
    assert following.reap == (old,) and channel.unreaped == []
    assert remote.zygote().status(old, wait=0) is not None  # reaped on the spare's thread
    out = spec.fn(torch.zeros(2, 3))
    assert torch.allclose(out, torch.full((2, 3), 1 / 3))
    spare = following.pid
    channel.close()
    assert channel.spare is None
    assert remote.zygote().status(spare, wait=5) is not None  # killed, never taken
    assert spare not in channel.monitor.pids


def test_a_spare_that_could_not_be_made_leaves_the_restart_as_it_was(monkeypatch):
    """Where the spare's fork fails, the restart forks and loads a worker itself, as it did
    before there were spares."""
    from attnverify.errors import WorkerFailed

    spec = remote.open_normalizer(f"{FILE}:constant_cache_softmax", {}, CI)
    channel = remote.channel_of(spec)
    old = channel.pid
    fork = remote.Zygote.fork
    calls = []

    def fails_once(self, memory_limit):
        calls.append(memory_limit)
        if len(calls) == 1:
            raise WorkerFailed("no fork this time")
        return fork(self, memory_limit)

    monkeypatch.setattr(remote.Zygote, "fork", fails_once)
    channel.prepare()
    channel.spare.thread.join()
    assert isinstance(channel.spare.error, WorkerFailed)
    channel.restart()
    assert len(calls) >= 2 and channel.pid not in (0, old)
    assert channel.monitor.pids[-1] == channel.pid
    assert channel.open() == channel.description


def test_a_spare_taken_after_its_load_limit_is_not_a_hang():
    """The spare's load answered in time but is read after its time limit has passed (a shrink
    longer than --timeout): it is taken, not reported as a target that hung while loading; the
    limit holds for a load that has not answered (the answer read then, not a wait begun)."""
    import time

    import torch

    spec = remote.open_normalizer(f"{FILE}:constant_cache_softmax", {}, CI)
    channel = remote.channel_of(spec)
    channel.timeout_s = 0.5
    channel.prepare()
    channel.spare.thread.join()
    time.sleep(1.5)  # the load answered long ago; its limit passed before it is read
    ready = channel.spare.pid
    channel.restart()
    assert channel.pid == ready
    channel.timeout_s = 30.0
    out = spec.fn(torch.zeros(2, 3))
    assert torch.allclose(out, torch.full((2, 3), 1 / 3))
    channel.close()
