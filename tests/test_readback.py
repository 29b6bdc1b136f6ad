"""The read-back of a request's inputs without copies (issue #27, ``certify --attention``): the
arena compared in place, a tensor given twice written once, the lifting's identity built once
and never sent (the worker builds its own, read-only), and a wrapped arena keeping the pages it
writes over next. Each still refuses a target that writes into what it was given."""

from __future__ import annotations

import json

import pytest
import torch

from attnverify import remote, wire
from attnverify.attention import lift
from attnverify.attention.spec import attention_spec
from attnverify.cli import main
from attnverify.runconfig import make_context


class _NoSlicing:
    """An arena buffer that refuses to be sliced (a slice is a copy of its bytes)."""

    def __init__(self, buffer):
        self.buffer = buffer

    def __getitem__(self, key):
        raise AssertionError("the arena's bytes were copied to be compared")


def test_arena_compares_in_place_and_rejects_any_difference():
    arena = wire.Arena.create(1 << 20)
    data = torch.arange(1000, dtype=torch.float64)
    slot = wire.write_tensor(arena, wire.Layout(64), data)
    want = data.view(torch.uint8).clone()
    arena.buffer = _NoSlicing(arena.buffer)  # a comparison that copies fails here
    assert remote._same_bytes(arena, slot, want)
    assert remote._same_bytes(arena, slot, want.numpy().tobytes())
    arena.buffer = arena.buffer.buffer
    arena.buffer[slot.offset + 8 * 999 + 7] = b"\x01"  # the last byte of the last element
    assert not remote._same_bytes(arena, slot, want)
    assert not remote._same_bytes(arena, slot, want[:-1])  # a short expectation never matches
    assert not arena.same_bytes(arena.size - 4, want[:8])  # nor one reaching past the arena
    arena.close()


def test_drop_pages_from_an_offset_keeps_what_is_before_it():
    arena = wire.Arena.create(1 << 22)
    arena.buffer[0:3] = b"abc"
    arena.buffer[(1 << 21) + 5:(1 << 21) + 8] = b"xyz"
    arena.drop_pages(100)  # rounded up to a page: the first page stays
    assert arena.buffer[0:3] == b"abc"
    assert arena.buffer[(1 << 21) + 5:(1 << 21) + 8] == b"\x00\x00\x00"
    arena.close()


def test_expected_bytes_are_a_copy_except_for_a_constant():
    t = torch.randn(4, 5)
    copied = remote._expected_bytes(t)  # on the CPU: the span's bytes, a copy of them
    assert copied == t.numpy().tobytes()
    t.add_(1)
    assert copied != t.numpy().tobytes()
    view = torch.arange(60.0).reshape(4, 15)[1:, ::2].t()  # the span from the storage's start
    assert remote._expected_bytes(view) == remote._raw(view).numpy().tobytes()
    c = wire.constant(torch.randn(4, 5))
    assert remote._expected_bytes(c).data_ptr() == c.data_ptr()
    other = c.detach()  # another object over the same storage (as torch.func hands over)
    assert other is not c and wire.is_constant(other)
    assert remote._first_positions([t, c, other, t, c.T]) == [0, 1, 1, 0, 4]
    assert not wire.is_constant(c.clone())
    c.add_(1)  # a constant written into is an internal error, never a wrong comparison
    with pytest.raises(RuntimeError, match="marked constant was written into"):
        remote._expected_bytes(c)


def _count_writes(monkeypatch) -> list:
    """The shapes of the tensors written into the arena from now on, in order."""
    writes = []
    real = wire.write_tensor

    def counting(arena, layout, t, device=None, **kw):
        writes.append(tuple(t.shape))
        return real(arena, layout, t, device, **kw)

    monkeypatch.setattr(wire, "write_tensor", counting)
    return writes


def test_a_tensor_given_twice_is_written_once(monkeypatch):
    writes = _count_writes(monkeypatch)
    spec = remote.open_attention("sdpa", {}, make_context("dev"))
    try:
        q = torch.randn(1, 1, 3, 5, dtype=torch.float64)
        eye = torch.eye(5, dtype=torch.float64)[None, None]
        out = spec(q, eye, eye, scale=1.0)
        assert writes == [(1, 1, 3, 5), (1, 1, 5, 5)]
        assert torch.allclose(out, torch.softmax(q, -1))
        writes.clear()
        spec(q, eye, eye.clone(), scale=1.0)  # equal values, two tensors: written twice
        assert writes == [(1, 1, 3, 5), (1, 1, 5, 5), (1, 1, 5, 5)]
    finally:
        remote.shutdown()


def test_the_lifting_builds_its_identity_once_and_only_for_a_copying_kernel():
    calls = []

    def kernel(q, k, v, attn_mask=None, is_causal=False, scale=None):
        calls.append(k)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                                scale=scale)

    local = lift.Lifted(attention_spec(kernel, id="local"))
    scores = torch.randn(3, 6, dtype=torch.float64)
    local(scores), local(scores)
    assert calls[0] is not calls[1]  # in this process: a fresh identity per call
    assert not wire.is_constant(calls[0])
    kernel.copies_inputs = True  # as a proxy to a worker says
    copying = lift.Lifted(attention_spec(kernel, id="copying"))
    out = copying(scores)
    copying(scores)
    assert calls[2] is calls[3] and wire.is_constant(calls[2])
    assert torch.allclose(out, torch.softmax(scores, -1))


WRITES_KEYS = '''import torch


def attn(query, key, value, attn_mask=None, is_causal=False, scale=None):
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value,
                                                           attn_mask=attn_mask, scale=scale)
    key.mul_(2)  # right output, then its keys (the lifting's shared identity) written into
    return out
'''


@pytest.mark.slow  # a whole certification (dev profile, few examples) per isolation mode
@pytest.mark.parametrize("isolation", [[], ["--no-isolation"]])
def test_a_kernel_writing_into_the_shared_identity_is_refused(tmp_path, capsys, isolation):
    """The lifting gives K and V as one identity, which the worker builds read-only: a kernel
    that writes into its keys ends its worker, and the request made again with the identity in
    the arena catches the write by the bytes read back, as before."""
    path = tmp_path / "writes_keys.py"
    path.write_text(WRITES_KEYS)
    cert = tmp_path / "cert.json"
    code = main(["certify", "--attention", f"{path}:attn", "--profile", "dev",
                 "--max-examples", "3", "--quiet", "--claims", "simplex", "--json", str(cert),
                 *isolation])
    capsys.readouterr()
    assert code == 1
    (target,) = json.loads(cert.read_text())["targets"]
    shape = next(r for r in target["results"] if r["property"] == "shape")
    assert shape["status"] == "violated" and "wrote into its input" in shape["message"]


def test_a_recipe_is_checked_field_by_field():
    good = {"recipe": "eye", "n": 3, "dtype": "float64", "size": [1, 1, 3, 3], "device": "cpu"}
    assert wire.slot_from_json(good, 0) == wire.Recipe("eye", 3, "float64", (1, 1, 3, 3))
    for bad in ({**good, "recipe": "ones"}, {**good, "n": -1}, {**good, "n": wire.MAX_EYE + 1},
                {**good, "n": True}, {**good, "dtype": "int64"}, {**good, "size": [2, 1, 3, 3]},
                {**good, "size": [1, 1, 3, 4]}, {**good, "size": [3]}, {**good, "extra": 1},
                {k: v for k, v in good.items() if k != "device"}):
        with pytest.raises(wire.ProtocolError):
            wire.slot_from_json(bad, 0)


def test_eye_pages_is_the_identity_and_read_only_when_asked(tmp_path):
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for n in (0, 1, 7, 1025):
            eye = wire.eye_pages(n, dtype, readonly=True)
            assert eye.dtype == dtype and torch.equal(eye, torch.eye(n, dtype=dtype))
    writable = wire.eye_pages(4, torch.float64, readonly=False)
    writable[0, 1] = 2.0
    script = tmp_path / "write.py"
    script.write_text("import torch\nfrom attnverify import wire\n"
                      "eye = wire.eye_pages(600, torch.float64, readonly=True)\n"
                      "eye[300, 7] = 1.0\nprint('written')\n")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -11 and "written" not in done.stdout  # SIGSEGV: no silent write


def test_the_lifting_sends_no_byte_of_its_identity(monkeypatch):
    """K = V = I crosses as a recipe: the arena holds the queries and the output only, and the
    weights are the kernel's, bit for bit."""
    writes = _count_writes(monkeypatch)
    spec = remote.open_attention("sdpa", {}, make_context("dev"))
    try:
        scores = torch.randn(3, 300, dtype=torch.float64)
        scores[1, 7] = float("-inf")
        out = lift.lift(spec).fn(scores)
        assert (1, 1, 300, 300) not in writes and (1, 1, 3, 300) in writes
        eye = torch.eye(300, dtype=torch.float64)[None, None]
        q = scores.masked_fill(scores == float("-inf"), 0.0)[None, None]
        mask = (scores != float("-inf"))[None, None]
        own = torch.nn.functional.scaled_dot_product_attention(q, eye, eye, attn_mask=mask,
                                                               scale=1.0)
        assert torch.equal(out, own.reshape(3, 300))
    finally:
        remote.shutdown()


def test_a_write_into_the_built_identity_is_refused_as_a_write(tmp_path):
    """The worker's identity is read-only, so the write ends the worker; the request is made
    again with the identity in the arena, where the write is read back: refused as a write into
    the input, not a crash, and the target is not failed in full."""
    path = tmp_path / "writes_keys.py"
    path.write_text(WRITES_KEYS)
    spec = remote.open_attention(f"{path}:attn", {}, make_context("dev"))
    try:
        norm = lift.lift(spec)
        for _ in range(4):  # more than the strikes that fail a target in full
            with pytest.raises(remote.Refused, match="wrote into its input"):
                norm.fn(torch.randn(2, 5, dtype=torch.float64))
    finally:
        remote.shutdown()


def test_reuse_of_a_built_constant_is_refused_before_it_is_sent():
    eye = lift._identity(4, torch.float64)
    assert wire.recipe_of(eye) == wire.Recipe("eye", 4, "float64", (1, 1, 4, 4))
    assert wire.recipe_of(eye[..., :2]) is None  # a part of it crosses as bytes
    with pytest.raises(ValueError, match="reuse of a constant"):
        remote._no_reuse_of([wire.recipe_of(eye), None],
                            {"calls": [{"args": []}, {"args": [], "reuse": 0}]})


EAGER = '''import torch


def attn(query, key, value, attn_mask=None, is_causal=False, scale=None):
    scores = query @ key.transpose(-2, -1) * (1.0 if scale is None else scale)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, -1) @ value
'''


def test_forward_mode_sends_no_tangent_of_zeros(tmp_path, monkeypatch):
    """``torch.func.jvp`` of the lifted kernel: the zero tangents torch.func gives K and V are
    not sent; J·v equals the kernel's own in one process, bit for bit."""
    from attnverify.attention.loader import load_attention

    path = tmp_path / "eager.py"
    path.write_text(EAGER)
    sent = []
    real = remote.Channel.request

    def recording(self, message, tensors, outputs):
        if message["op"] == "jvp":
            sent.append((message["wrt"], [tuple(t.shape) for t in tensors]))
        return real(self, message, tensors, outputs)

    monkeypatch.setattr(remote.Channel, "request", recording)
    spec = remote.open_attention(f"{path}:attn", {}, make_context("dev"))
    try:
        z = torch.randn(2, 6, dtype=torch.float64)
        z[0, 2] = float("-inf")
        v = torch.randn(2, 6, dtype=torch.float64)
        primal, jv = torch.func.jvp(lift.lift(spec).fn, (z,), (v,))
        own = lift.lift(load_attention(f"{path}:attn")).fn
        primal_here, jv_here = torch.func.jvp(own, (z,), (v,))
    finally:
        remote.shutdown()
    assert sent == [([0], [(1, 1, 2, 6), (1, 1, 6, 6), (1, 1, 6, 6), (1, 1, 2, 6),
                           (1, 1, 2, 6)])]
    assert torch.equal(jv, jv_here) and torch.equal(primal, primal_here)


def test_the_liftings_identities_get_no_tangent_in_this_process(tmp_path, monkeypatch):
    """The lifting's ``K = V = I`` (constants) are not inputs of the remote call's autograd
    node, so forward mode makes no tangent of zeros for them here (two ``L×L`` tensors per
    call: 268 MB at L = 4097 in float64); only the scores' tangent reaches the node."""
    path = tmp_path / "eager.py"
    path.write_text(EAGER)
    seen = []
    real = remote._Call.jvp

    def recording(ctx, site, *tangents):
        seen.append([None if t is None else tuple(t.shape) for t in tangents])
        return real(ctx, site, *tangents)

    monkeypatch.setattr(remote._Call, "jvp", staticmethod(recording))
    spec = remote.open_attention(f"{path}:attn", {}, make_context("dev"))
    try:
        z, v = torch.randn(3, 7, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
        _, jv = torch.func.jvp(lift.lift(spec).fn, (z,), (v,))
        _, jv_here = torch.func.jvp(lambda x: torch.softmax(x, -1), (z,), (v,))
    finally:
        remote.shutdown()
    assert seen == [[(1, 1, 3, 7)]]
    torch.testing.assert_close(jv, jv_here)


RAISES = '''def attn(query, key, value, attn_mask=None, is_causal=False, scale=None):
    raise ValueError("no")
'''


def test_a_raising_target_leaves_no_cycle_holding_the_request(tmp_path):
    """A call the target answers with an error frees its inputs when the error is handled, not
    at the next cyclic collection (a cycle through the raising frame held the request's tensors:
    hundreds of MB at L = 4097 in forward mode)."""
    import gc
    import weakref

    path = tmp_path / "raises.py"
    path.write_text(RAISES)
    spec = remote.open_attention(f"{path}:attn", {}, make_context("dev"))
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        scores = torch.randn(1, 1, 3, 7, dtype=torch.float64)
        ref = weakref.ref(scores)
        try:
            spec(scores, scores, scores)
        except remote.TargetRaised as exc:
            assert "no" in str(exc)
        else:
            raise AssertionError("the target's error was not raised")
        del scores
        assert ref() is None
    finally:
        if enabled:
            gc.enable()
        remote.shutdown()


def test_a_tensor_given_to_several_calls_of_one_request_is_not_shared():
    """Across the calls of one ``calls`` request nothing is written once for two: a call whose
    values go into an earlier call's storage (``reuse``) would change the other's input."""
    spec = remote.open_normalizer("softmax", {}, make_context("dev"))
    try:
        a = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)
        b = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
        out = spec.fn.many([a, b, a], reuse={1: 0})
    finally:
        remote.shutdown()
    assert torch.equal(out[0], torch.softmax(a, -1)) and torch.equal(out[2], out[0])
    assert torch.equal(out[1], torch.softmax(b, -1))


def test_lifted_calls_go_in_one_request_with_reuse_at_the_queries():
    """A check's several inputs reach a lifted kernel behind the boundary in one request (the
    identity crosses as a recipe, so calls need not share it); ``reuse`` gives a call the
    queries' storage of an earlier call, as for a normalizer."""
    from attnverify.checks.base import call_many

    spec = remote.open_attention("sdpa", {}, make_context("dev"))
    try:
        norm = lift.lift(spec)
        xs = [torch.randn(2, 7, dtype=torch.float64), torch.randn(3, 300),
              torch.randn(2, 7, dtype=torch.float64)]
        xs[1][0, 3] = float("-inf")
        before = spec.fn.channel.monitor.calls
        outs = call_many(norm, xs, reuse={2: 0})
        assert spec.fn.channel.monitor.calls - before == 1
        for x, out in zip(xs, outs):
            assert out.dtype == x.dtype and torch.allclose(out, torch.softmax(x, -1))
        message = {"calls": [{"args": [{"$tensor": 0}]}, {"args": [{"$tensor": 4}]},
                             {"args": [{"$tensor": 7}], "reuse": 0}]}
        # the reused slot must hold the values of the reusing call's queries (tensor 7)
        assert remote.Channel._expected(list("abcdefgh"), message) == list("hbcdefgh")
    finally:
        remote.shutdown()


def test_long_rows_are_lifted_with_the_scores_in_the_keys():
    """Rows of at least ``TRANSPOSED_FROM`` scores, fewer rows than keys: ``Q = I``, ``K = Sᵀ``
    (``d`` = rows, no dense ``L × L`` key); shorter rows keep ``Q = S``, ``K = V = I``. The
    weights and their gradient are the normalizer's either way."""
    shapes = []

    def kernel(q, k, v, attn_mask=None, is_causal=False, scale=None):
        shapes.append((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                                scale=scale)

    norm = lift.lift(attention_spec(kernel, id="recording"))
    n = lift.TRANSPOSED_FROM
    long = torch.randn(3, n + 5, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        long[1, 7] = float("-inf")
    short = torch.randn(5, 6, dtype=torch.float64)
    square = torch.randn(n, n, dtype=torch.float64)
    out = norm.fn(long)
    assert torch.allclose(norm.fn(short), torch.softmax(short, -1))
    assert torch.allclose(norm.fn(square), torch.softmax(square, -1))
    assert shapes == [((1, 1, 3, 3), (1, 1, n + 5, 3), (1, 1, n + 5, n + 5)),
                      ((1, 1, 5, 6), (1, 1, 6, 6), (1, 1, 6, 6)),
                      ((1, 1, n, n), (1, 1, n, n), (1, 1, n, n))]
    want = torch.softmax(long, -1)
    assert torch.allclose(out, want) and out[1, 7] == 0
    u = torch.randn_like(want)
    got, = torch.autograd.grad(out, long, u)
    expected, = torch.autograd.grad(want, long, u)
    assert torch.allclose(got, expected)


CACHES_BY_KEY = '''import torch

_SEEN = {}


def attn(query, key, value, attn_mask=None, is_causal=False, scale=None):
    at = key.data_ptr()  # an answer remembered by the address of the keys
    if at not in _SEEN:
        _SEEN[at] = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, scale=scale)
    return _SEEN[at].clone()
'''


def test_lifted_calls_reuse_the_keys_where_they_carry_the_scores(tmp_path):
    """Where the lifting puts the scores in the keys (``Q`` is a built constant, which no call
    may be given again), ``reuse`` gives a later call the keys' storage of an earlier one: a
    kernel that remembers its answer by the keys' address answers the new scores with the old
    weights, and is seen to."""
    from attnverify.checks.base import call_many

    path = tmp_path / "caches_by_key.py"
    path.write_text(CACHES_BY_KEY)
    n = lift.TRANSPOSED_FROM + 3
    for target, fooled in (("sdpa", False), (f"{path}:attn", True)):
        spec = remote.open_attention(target, {}, make_context("dev"))
        try:
            xs = [torch.randn(2, n, dtype=torch.float64) for _ in range(2)]
            before = spec.fn.channel.monitor.calls
            outs = call_many(lift.lift(spec), xs, reuse={1: 0})
            assert spec.fn.channel.monitor.calls - before == 1
            assert torch.allclose(outs[0], torch.softmax(xs[0], -1))
            assert torch.allclose(outs[1], torch.softmax(xs[1], -1)) is not fooled
        finally:
            remote.shutdown()
    message = {"calls": [{"args": [{"$tensor": i} for i in range(3)]},
                         {"args": [{"$tensor": i} for i in range(3, 6)], "reuse": 1, "arg": 1}]}
    assert remote.Channel._expected(list("abcdef"), message) == list("aecdef")


def test_the_worker_refuses_reuse_of_an_argument_a_call_is_not_given():
    from attnverify.worker import Server

    server = Server()
    server.load({"kind": "normalizer", "target": "softmax", "params": {}})
    xs = [torch.randn(2, 5, dtype=torch.float64) for _ in range(2)]
    want = {"size": [2, 5], "dtype": "float64", "device": "cpu"}
    first = {"args": [{"$tensor": 0}], "kwargs": {"dim": -1}}
    for arg in (1, -1, "0", None):
        second = {"args": [{"$tensor": 1}], "kwargs": {"dim": -1}, "reuse": 0, "arg": arg}
        with pytest.raises(wire.ProtocolError):
            server.handle({"op": "calls", "fn": "target", "calls": [first, second],
                           "expect": [want, want]}, [x.clone() for x in xs])
    reply, outs = server.handle({"op": "calls", "fn": "target", "expect": [want, want],
                                 "calls": [first, {**first, "args": [{"$tensor": 1}],
                                                   "reuse": 0, "arg": 0}]},
                                [x.clone() for x in xs])
    assert reply["ok"] and torch.equal(outs[1], torch.softmax(xs[1], -1))


@pytest.mark.parametrize("length", [7, lift.TRANSPOSED_FROM + 3])
def test_reuse_in_the_checkers_process_is_no_write_into_the_input(length):
    """Under ``--no-isolation`` the inputs are compared after the request with what each slot
    must hold: a reused slot holds the reusing call's values, found by the argument it takes
    (of three a call: ``certify --attention sdpa --no-isolation`` once failed ``deterministic``
    as a write into its input)."""
    import dataclasses

    from attnverify.checks.base import call_many

    ctx = dataclasses.replace(make_context("dev"), isolation=False)
    spec = remote.open_attention("sdpa", {}, ctx)
    try:
        xs = [torch.randn(2, length, dtype=torch.float64) for _ in range(2)]
        outs = call_many(lift.lift(spec), xs, reuse={1: 0})
        for x, out in zip(xs, outs):
            assert torch.allclose(out, torch.softmax(x, -1))
    finally:
        remote.shutdown()


def test_identities_are_kept_by_the_pages_they_hold():
    """An identity of 4096 rows holds a page a row in any dtype (16 MiB); the kept ones stay
    within the budget, the last one used always kept, a use making an identity the newest."""
    page = __import__("mmap").PAGESIZE
    assert wire.eye_resident(4096, 8) == wire.eye_resident(4096, 4) == 4096 * page
    assert wire.eye_resident(4, 8) == page and wire.eye_resident(0, 8) == 0
    kept = wire.Identities(3 * page)
    kept.put("a", "A", page)
    kept.put("b", "B", page)
    assert kept.get("a") == "A"  # now the newest: "b" goes first
    kept.put("c", "C", 2 * page)
    assert kept.get("b") is None and kept.get("a") == "A" and kept.get("c") == "C"
    kept.put("big", "BIG", 10 * page)  # alone past the budget: kept, everything else dropped
    assert kept.values() == ["BIG"] and kept.held == 10 * page
    eye = lift._identity(4096, torch.float32)
    assert lift._identity(4096, torch.float32) is eye
    lift._identity(4097, torch.float64)
    lift._identity(4098, torch.float32)  # a third of 16 MiB: the oldest goes
    assert lift._IDENTITIES.held <= wire.KEEP_EYES
    assert lift._IDENTITIES.get((4096, torch.float32)) is None
