"""The process boundary (issue #16): the checker and the target in separate processes.

A target that tampers with its evaluation (patches the checker's modules, returns a lying tensor,
caches answers, aliases storage, changes global state, patches torch, forges answers on the
channel) fails; honest targets that import attnverify or check themselves are certified; the
worker is a process of its own with nothing open but its channel; the checker never imports the
target; what crosses is parsed strictly; ``--seed random`` is recorded wherever the seed is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import daemonizing_target

from attnverify import remote, wire
from attnverify.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
TAMPERERS = str(FIXTURES / "tamperers.py")
FAST = ["--profile", "dev", "--max-examples", "4", "--quiet"]


def certify(capsys, tmp_path, target, *extra):
    path = tmp_path / "cert.json"
    code = main(["certify", target, *FAST, "--json", str(path), *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, json.loads(path.read_text())


def failed(data) -> dict:
    (target,) = data["targets"]
    return {r["property"]: r for r in target["results"] if r["status"] in ("violated", "error")}


# --------------------------------------------------------------------------------------------
# Tamperers fail, each for what it did; honest targets are certified


@pytest.mark.parametrize("name, prop, fragment", [
    # uniform weights after replacing every comparison of the loaded attnverify modules
    ("patches_checker", "matches_reference", "weights differ from the reference"),
    # uniform weights as a tensor subclass whose differences are zero
    ("lying_subclass", "shape", "only a plain torch.Tensor is accepted"),
    # the answer remembered for the first input of each shape
    ("cached_by_shape", "deterministic", "an answer remembered from an earlier call"),
    # the answer remembered for an input at the same address
    ("cached_by_address", "deterministic", "the weights depend on what was called before"),
    # softmax written into the input, returned: the checker reads the input back from the arena
    ("in_place", "shape", "the target wrote into its input"),
    ("returns_input_view", "shape", "the target wrote into its input"),
    # right weights, then its argument zeroed (read back by the checker, not reported)
    ("clobbers_input", "shape", "the target wrote into its input"),
    # a graph on some inputs, none on others: differentiability is judged over every case
    ("detached_long_rows", "gradient", "no autograd graph on this input, though it carries one"),
    ("detached_sometimes", "gradient", "the gradient by reverse mode is"),
    # one output buffer per shape, reused
    ("reused_buffer", "deterministic", "shares its storage with the output of an earlier call"),
    ("grad_off", "no_side_effects", "grad mode changed from True to False"),
    ("default_dtype", "no_side_effects", "default dtype changed"),
    ("patches_torch", "no_side_effects", "torch.autograd.grad was replaced"),
    ("threads", "no_side_effects", "thread count changed"),
    ("patches_softmax", "no_side_effects", "torch.softmax was replaced"),
    # right weights; a thread zeroes the argument after the call returned
    ("writes_input_later", "no_side_effects", "wrote into its input after the call returned"),
    ("shadows_tensor_method", "no_side_effects", "torch.Tensor.sub was replaced"),
    ("reseeds", "no_side_effects", "the global random generator's state"),
    ("flushes_denormals", "no_side_effects", "flush-to-zero of denormals changed"),
    ("switches_backend", "no_side_effects", "torch.backends.mkldnn.enabled changed"),
    ("forges_answers", "shape", "broke the worker protocol"),
])
@pytest.mark.slow  # a whole certification per tamperer
def test_tamperer_fails(capsys, tmp_path, name, prop, fragment):
    code, data = certify(capsys, tmp_path, f"{TAMPERERS}:{name}", "--reference", "softmax",
                         "--claims", "simplex")
    assert code == 1
    (target,) = data["targets"]
    assert target["verdict"] == "failed"
    bad = failed(data)
    assert prop in bad, sorted(bad)
    assert fragment in bad[prop]["message"], bad[prop]["message"]


def test_no_graph_anywhere_is_not_applicable(capsys, tmp_path):
    """A normalizer computed outside autograd is not differentiable: gradient does not apply
    (judged over every case, not on one probe input a target could recognise)."""
    code, data = certify(capsys, tmp_path, f"{TAMPERERS}:never_differentiable", "--reference",
                         "softmax", "--claims", "simplex")
    assert code == 0
    (target,) = data["targets"]
    grad = next(r for r in target["results"] if r["property"] == "gradient")
    assert grad["status"] == "not_applicable" and "no autograd graph on any" in grad["message"]


@pytest.mark.slow  # a whole certification in process
def test_mutation_is_read_back_without_isolation(capsys, tmp_path):
    code, data = certify(capsys, tmp_path, f"{TAMPERERS}:clobbers_input", "--reference",
                         "softmax", "--claims", "simplex", "--no-isolation")
    assert code == 1
    assert "the target wrote into its input" in failed(data)["shape"]["message"]


@pytest.mark.parametrize("name", ["imports_attnverify", "self_checking"])
def test_honest_targets_are_certified(capsys, tmp_path, name):
    code, data = certify(capsys, tmp_path, f"{TAMPERERS}:{name}", "--reference", "softmax",
                         "--claims", "simplex,shift_invariant")
    assert code == 0, failed(data)
    (target,) = data["targets"]
    assert target["verdict"] == "certified"
    assert {r["property"] for r in target["results"]} >= {"no_side_effects", "deterministic",
                                                           "matches_reference"}


def test_patching_the_checker_leaves_the_checker_alone(capsys, tmp_path):
    """The patches land in the worker's modules; the checker's stay as they were."""
    from attnverify.checks import base

    before = base.close_mask
    certify(capsys, tmp_path, f"{TAMPERERS}:patches_checker", "--reference", "softmax",
            "--claims", "simplex")
    assert base.close_mask is before
    assert torch.equal is torch.__dict__["equal"] and torch.equal(torch.zeros(1), torch.zeros(1))
    assert not torch.equal(torch.zeros(1), torch.ones(1))


# --------------------------------------------------------------------------------------------
# The worker process


def _process_report(capsys, tmp_path) -> tuple[dict, dict]:
    code, data = certify(capsys, tmp_path, f"{TAMPERERS}:reports_process", "--claims", "")
    message = failed(data)["shape"]["message"]
    report = json.loads(message[message.index("{"):])
    return report, data


def test_worker_is_a_process_of_its_own(capsys, tmp_path):
    report, data = _process_report(capsys, tmp_path)
    assert data["isolation_mode"] == "process" and data["isolation"] is True
    assert data["checker_pid"] == os.getpid()
    (target,) = data["targets"]
    assert report["pid"] != os.getpid() and report["pid"] in target["worker_pids"]
    assert report["sid"] == report["pid"], "the worker leads a session of its own"
    fds = {int(k): v for k, v in report["fds"].items()}
    assert {fd: fds[fd] for fd in (0, 1, 2)} == {0: "/dev/null", 1: "/dev/null", 2: "/dev/null"}
    others = {fd: v for fd, v in fds.items() if fd > 2}
    # the channel; listing /proc/self/fd itself holds one more descriptor while it runs
    assert sum(v.startswith("socket:") for v in others.values()) == 1, fds
    assert len(others) <= 2 and all(v.startswith(("socket:", "/proc/")) for v in others.values())


sys.path.insert(0, str(FIXTURES))
from tamperers import CHECKER  # noqa: E402 - the fixture's own list, reported from the worker

sys.path.remove(str(FIXTURES))


def test_no_checker_module_in_the_worker(capsys, tmp_path):
    report, _ = _process_report(capsys, tmp_path)
    assert report["modules"] == [], report["modules"]
    assert "attnverify.checks" in CHECKER and "hypothesis" in CHECKER


def test_worker_imports_no_checker_module():
    """What the worker module and the loaders import, in a fresh interpreter."""
    code = ("import sys, attnverify.worker, attnverify.registry, attnverify.attention.loader;"
            "import attnverify.normalizers;"
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert not [m for m in out if m.startswith(CHECKER)]


def test_checker_never_imports_the_target(tmp_path):
    from attnverify.certify import make_context
    from attnverify.isolation import certify_all

    source = tmp_path / "secret_norm.py"
    source.write_text("import torch\nIMPORTED = True\n"
                      "def norm(scores, dim=-1):\n    return torch.softmax(scores, dim)\n")
    results = certify_all([f"{source}:norm"], {}, [], make_context("dev", max_examples=2))
    assert results[0].verdict == "certified"
    assert not [name for name, m in sys.modules.items()
                if "secret_norm" in name or getattr(m, "__file__", None) == str(source)]


def test_layout_crosses_the_boundary():
    """The target sees the view the checker made: sizes, strides, storage offset."""
    from attnverify.runconfig import make_context

    spec = remote.open_normalizer(f"{TAMPERERS}:reports_layout", {}, make_context("dev"))
    base = torch.arange(60, dtype=torch.float64).reshape(4, 15)
    view = base[1:, ::2].t()  # transposed, strided, with an offset
    with pytest.raises(remote.TargetRaised) as raised:
        spec(view, dim=0)
    seen = json.loads(str(raised.value))
    assert seen == {"shape": list(view.shape), "stride": list(view.stride()),
                    "offset": view.storage_offset(), "dim": 0,
                    "storage": (view.storage_offset() + (view.shape[0] - 1) * view.stride(0)
                                + (view.shape[1] - 1) * view.stride(1) + 1) * 8}
    remote.shutdown()


def test_nothing_outlives_the_run(capsys, tmp_path, monkeypatch):
    """A target that leaves a daemon behind (double fork, new session): the daemon is killed
    before certify writes its certificate."""
    monkeypatch.setenv("ATTNVERIFY_SANDBOX_WRITABLE", str(tmp_path))  # its pid file
    target, pidfile = daemonizing_target(tmp_path)
    code, data = certify(capsys, tmp_path, target, "--claims", "")
    pid = int(pidfile.read_text())
    assert not _alive(pid), "a process the target started outlived the run"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # a whole certification in process
def test_no_isolation_is_recorded(capsys, tmp_path):
    code, data = certify(capsys, tmp_path, "softmax", "--claims", "", "--no-isolation")
    assert code == 0
    assert data["isolation_mode"] == "in-process" and data["isolation"] is False
    assert data["targets"][0]["worker_pids"] == []


# --------------------------------------------------------------------------------------------
# --seed random


def test_random_seed_is_drawn_and_recorded(capsys, tmp_path):
    seeds = set()
    for i in range(2):
        path = tmp_path / f"cert{i}.json"
        assert main(["certify", "softmax", *FAST, "--claims", "", "--seed", "random",
                     "--json", str(path)]) == 0
        data = json.loads(path.read_text())
        assert data["seed_source"] == "random"
        seeds.add(data["seed"])
    capsys.readouterr()
    assert len(seeds) == 2 and all(0 <= s < 2**64 for s in seeds)


def test_random_seed_is_in_every_repro_line(capsys, tmp_path):
    code, data = certify(capsys, tmp_path, str(FIXTURES / "planted.py") + ":nan_on_mask_softmax",
                         "--seed", "random")
    assert code == 1 and data["seed_source"] == "random"
    lines = [r["counterexample"]["repro"] for r in data["targets"][0]["results"]
             if r.get("counterexample")]
    assert lines and all(f"--seed {data['seed']}" in line for line in lines)
    import shlex

    argv = shlex.split(lines[0])
    assert argv[:2] == ["attnverify", "repro"]
    assert main(argv[1:]) == 1  # the repro, with the seed, still fails
    capsys.readouterr()


# --------------------------------------------------------------------------------------------
# The protocol, strictly


def test_messages_are_parsed_strictly():
    assert wire.parse(b'{"id": 1, "ok": true}') == {"id": 1, "ok": True}
    for bad in (b'{"a": NaN}', b'{"a": Infinity}', b'{"a": 1, "a": 2}', b"[1]", b"\xff",
                b'"text"', b"{"):
        with pytest.raises(wire.ProtocolError):
            wire.parse(bad)


def test_slots_stay_inside_the_arena():
    good = {"offset": 0, "elements": 6, "dtype": "float64", "size": [2, 3], "stride": [3, 1],
            "storage_offset": 0, "device": "cpu"}
    assert wire.Slot.from_json(good, 48).reach == 6
    for change in ({"offset": 64}, {"elements": 5}, {"dtype": "object"}, {"size": [2, -3]},
                   {"stride": [3]}, {"storage_offset": 1}, {"offset": 3}, {"size": [2, 3.0]}):
        with pytest.raises(wire.ProtocolError):
            wire.Slot.from_json({**good, **change}, 48)
    with pytest.raises(wire.ProtocolError):
        wire.Slot.from_json({**good, "extra": 1}, 48)


def test_oversized_frames_are_refused():
    import socket
    import struct

    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", wire.MAX_FRAME + 1))
    with pytest.raises(wire.ProtocolError):
        wire.receive(b)
    a.close(), b.close()


def test_arena_round_trip_keeps_the_layout():
    arena = wire.Arena.create(1 << 16)
    layout = wire.Layout()
    base = torch.arange(40, dtype=torch.float32).reshape(5, 8)
    for t in (base.t(), base[1:, ::3], base[2:3].expand(4, 8), base[:, 5]):
        slot = wire.write_tensor(arena, layout, t)
        back = wire.read_tensor(arena, slot)
        assert back.stride() == t.stride() and back.storage_offset() == t.storage_offset()
        assert torch.equal(back, t) and back.data_ptr() != t.data_ptr()
    arena.close()


def test_time_limit_covers_a_hang(capsys, tmp_path):
    start = time.monotonic()
    code, data = certify(capsys, tmp_path, str(FIXTURES / "hostile.py") + ":hangs",
                         "--claims", "", "--timeout", "2")
    assert code == 1
    assert any("time limit of 2 s" in r["message"] for r in failed(data).values())
    assert time.monotonic() - start < 120


# --------------------------------------------------------------------------------------------
# What the worker says of its target is data


FORGED = str(FIXTURES / "forged_description.py")


@pytest.mark.parametrize("mode, fragment", [
    ("builtin_reference", "malformed reference"),
    ("formula_reference", "malformed reference"),
    ("own_params", "malformed reference"),
    ("signature", "malformed signature"),
    ("kernel_formula", "malformed kernel"),
])
def test_a_forged_description_fails_the_target(capsys, tmp_path, monkeypatch, mode, fragment):
    """A description the target's process forged fails that target (no traceback, no verdict
    of certified), and nothing it names is imported in the checker."""
    marker = tmp_path / "marker"
    marker.mkdir()
    monkeypatch.setenv("FORGE_MODE", mode)
    monkeypatch.setenv("FORGE_MARKER", str(marker))
    code, data = certify(capsys, tmp_path, f"{FORGED}:uniform")
    assert code == 1
    (target,) = data["targets"]
    assert target["verdict"] == "failed"
    (load,) = target["results"]
    assert load["property"] == "load" and fragment in load["message"], load["message"]
    assert list(marker.iterdir()) == [], "the checker imported the target's file"
    # the worker it failed in is on record (not "no worker process was started")
    assert target["sandbox"] and target["sandbox"] == data["sandbox"]


def test_the_target_string_is_the_checkers(capsys, tmp_path, monkeypatch):
    """A worker that says its target is the built-in softmax (with softmax's reference) is
    still checked, reported and reproduced as the file that was asked for."""
    monkeypatch.setenv("FORGE_MODE", "target")
    code, data = certify(capsys, tmp_path, f"{FORGED}:uniform")
    assert code == 1
    (target,) = data["targets"]
    assert target["target"] == f"{FORGED}:uniform"
    ref = failed(data)["matches_reference"]
    assert f"attnverify repro {FORGED}:uniform " in ref["counterexample"]["repro"]


def test_a_non_finite_parameter_default_crosses_as_a_number(capsys, tmp_path):
    """cap=inf crosses the boundary as JSON ("inf") and reaches the reference the user gave
    (evaluated in the checker) as the number, not as text."""
    users = FIXTURES / "user_normalizers.py"
    code, data = certify(capsys, tmp_path, f"{users}:capped_softmax", "--reference",
                         f"{users}:capped_reference")
    assert code == 0, failed(data)
    (target,) = data["targets"]
    assert target["params"] == {"cap": "inf"}  # the JSON encoding of every certificate


@pytest.mark.parametrize("target, mode", [("spoofs_the_report", ""), ("uniform", "newlines")])
def test_nothing_the_worker_sends_can_forge_a_line_of_the_report(capsys, tmp_path,
                                                                 monkeypatch, target, mode):
    monkeypatch.setenv("FORGE_MODE", mode)
    path = tmp_path / "cert.json"
    code = main(["certify", f"{FORGED}:{target}", *FAST[:-1], "--json", str(path)])
    out, err = capsys.readouterr()
    verdict = "FAILED" if code == 1 else "CERTIFIED"  # uniform weights do meet simplex
    verdicts = [line for line in out.splitlines() if "verdict:" in line]
    assert verdicts == [f"verdict: {FORGED}:{target}: {verdict}"], verdicts
    assert "\x1b" not in out + err + path.read_text()


@pytest.mark.slow  # a certification and its repro
def test_a_side_effect_on_a_view_reproduces(capsys, tmp_path):
    """A side effect seen on a large input given as a view is reported on the case of rows that
    call was made on, in its layout, and the repro line re-checks it (exit 1), not a traceback."""
    import shlex

    code, data = certify(capsys, tmp_path, f"{TAMPERERS}:threads_on_large_inputs",
                         "--reference", "softmax", "--claims", "simplex")
    assert code == 1
    effect = failed(data)["no_side_effects"]
    assert "thread count changed" in effect["message"]
    ce = effect["counterexample"]
    assert len(ce["shape"]) == 2
    argv = shlex.split(ce["repro"])
    assert argv[:2] == ["attnverify", "repro"]
    # the line as a shell runs it, through this interpreter (its bin folder need not be on PATH)
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "thread count changed" in done.stdout


def test_a_repro_case_whose_layout_does_not_fit_its_scores_is_exit_2(capsys):
    case = ('{"case":"RowCase","scores":[[[0.0]]],"dtype":"float32","shape":[1,1,1],'
            '"temperature":null,"kind":"gaussian","seed":0,"layout":{"sizes":[1,1],'
            '"strides":[1,1],"storage_offset":0,"dim":-1,"order":[0,1],"step":[1,1],'
            '"expand":[],"kinds":["contiguous"],"text":"x"},"params":{}}')
    code = main(["repro", "softmax", "--property", "shape", "--case", case])
    out, err = capsys.readouterr()
    assert code == 2 and "rows [R, L]" in err and "Traceback" not in out + err


def test_arena_pages_go_back_in_both_mappings():
    """Dropped pages free the memory of every mapping (the worker keeps a replaced arena mapped)
    and read as zeros after."""
    arena = wire.Arena.create(1 << 23)
    other = wire.Arena.attach(os.dup(arena.fd), arena.size)
    arena.buffer[: 1 << 20] = b"\x07" * (1 << 20)
    assert other.buffer[12345] == b"\x07"
    arena.drop_pages()
    assert other.buffer[12345] == b"\x00" and arena.buffer[(1 << 20) - 1] == b"\x00"
    other.close(), arena.close()


def _shmem_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    pytest.skip("no RssShmem in /proc")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_one_large_request_does_not_keep_its_memory(monkeypatch):
    """After a large request, small ones wrap the arena: it is replaced by a small one and the
    large one's pages go back, in the checker and in the worker."""
    from attnverify.runconfig import make_context

    monkeypatch.setattr(remote, "KEEP_ARENA", wire.MIN_ARENA)
    spec = remote.open_normalizer("softmax", {}, make_context("dev"))
    channel = spec.fn.channel
    try:
        spec(torch.randn(512, 4096, dtype=torch.float64))  # 16 MiB in, 16 MiB out
        big = channel.arena.size
        assert big >= 1 << 25 and _shmem_kib(channel.pid) * 1024 >= 1 << 24
        small = torch.randn(64, 256, dtype=torch.float64)
        for _ in range(2 * big // (2 * small.numel() * 8)):
            spec(small)
            if channel.arena.size < big:
                break
        assert channel.arena.size <= 4 * wire.MIN_ARENA
        assert _shmem_kib(channel.pid) * 1024 < 2 * channel.arena.size
    finally:
        remote.shutdown()


def test_a_worker_that_ended_between_requests_is_reported_as_ended_not_as_a_protocol_break():
    """The end of the channel found before a request (the worker died after its last answer) is
    the worker's end, said with its exit status, not a message nobody asked for."""
    import select
    import signal

    from attnverify.runconfig import make_context

    spec = remote.open_normalizer("softmax", {}, make_context("dev"))
    channel = spec.fn.channel
    try:
        spec(torch.randn(2, 5))
        os.kill(channel.pid, signal.SIGKILL)
        assert select.select([channel.sock], [], [], 30)[0]  # its end of the channel closed
        with pytest.raises(remote.WorkerFailed) as failed_:
            spec(torch.randn(2, 5))
        assert "crashed the worker process (SIGKILL" in str(failed_.value)
        assert "protocol" not in str(failed_.value)
    finally:
        remote.shutdown()
