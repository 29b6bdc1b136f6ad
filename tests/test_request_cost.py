"""The cheaper request path keeps every check of the boundary (issue #27).

Each mechanism that makes one request cheaper has a test here that fails without it, and the
checks it must not weaken are tried on the cheap path itself: a call with nothing to
differentiate skips the autograd node (``remote._autograd_involved``) yet still refuses a lying
output, a mutated input and an aliased output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.autograd import forward_ad

from attnverify import remote, wire, worker
from attnverify.runconfig import make_context

FIXTURES = Path(__file__).parent / "fixtures"
TAMPERERS = str(FIXTURES / "tamperers.py")
DEV = make_context("dev")


@pytest.fixture(autouse=True)
def _shutdown():
    yield
    remote.shutdown()


class _Counted:
    """``remote._Call.apply`` counted (the autograd node a request goes through)."""

    def __init__(self, monkeypatch) -> None:
        self.n = 0
        real = remote._Call.apply

        def apply(*args):
            self.n += 1
            return real(*args)

        monkeypatch.setattr(remote._Call, "apply", apply)


def test_a_call_with_nothing_to_differentiate_skips_the_autograd_node(monkeypatch):
    spec = remote.open_normalizer("softmax", {}, DEV)
    counted = _Counted(monkeypatch)
    z = torch.randn(2, 5, dtype=torch.float64)
    want = torch.softmax(z, -1)
    assert torch.equal(spec(z), want)
    with torch.no_grad():
        assert torch.equal(spec(z.clone().requires_grad_()), want)
    assert counted.n == 0


def test_every_derivative_still_goes_through_the_autograd_node(monkeypatch):
    spec = remote.open_normalizer("softmax", {}, DEV)
    counted = _Counted(monkeypatch)
    z = torch.randn(2, 5, dtype=torch.float64)
    v = torch.randn(2, 5, dtype=torch.float64)
    y = torch.softmax(z, -1)
    jvp = y * (v - (y * v).sum(-1, keepdim=True))

    zg = z.clone().requires_grad_()
    (g,) = torch.autograd.grad(spec(zg).mul(v).sum(), zg)  # reverse mode
    assert torch.allclose(g, jvp)  # the softmax Jacobian is symmetric
    assert counted.n == 1

    _, t = torch.func.jvp(lambda x: spec(x), (z,), (v,))  # a torch.func transform
    assert torch.allclose(t, jvp)
    assert counted.n > 1
    seen = counted.n

    with forward_ad.dual_level():  # forward mode without torch.func: a dual tensor
        out = spec(forward_ad.make_dual(z, v))
        assert torch.allclose(forward_ad.unpack_dual(out).tangent, jvp)
    assert counted.n > seen
    seen = counted.n

    g = torch.func.grad(lambda x: spec(x).mul(v).sum())(z)
    assert torch.allclose(g, jvp)
    assert counted.n > seen


@pytest.mark.parametrize("name, fragment", [
    ("lying_subclass", "subclass of torch.Tensor"),
    ("in_place", "unchanged"),
    ("returns_input_view", "storage"),
])
def test_the_cheap_path_still_refuses(monkeypatch, name, fragment):
    spec = remote.open_normalizer(f"{TAMPERERS}:{name}", {}, DEV)
    counted = _Counted(monkeypatch)
    z = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(remote.Refused) as refused:
        spec(z)
    assert fragment in str(refused.value)
    assert counted.n == 0


def test_the_cheap_path_still_refuses_a_reused_output_buffer(monkeypatch):
    spec = remote.open_normalizer(f"{TAMPERERS}:reused_buffer", {}, DEV)
    counted = _Counted(monkeypatch)
    z = torch.randn(3, 4, dtype=torch.float64)
    spec(z)
    with pytest.raises(remote.Refused, match="earlier call"):
        spec(z)
    assert counted.n == 0


# --------------------------------------------------------------------------------------------
# The state guard's cheaper getters read the same state, at every call


def test_the_default_device_getter_agrees_with_torch():
    get = worker._default_device_getter()
    assert get() == str(torch.get_default_device()) == "cpu"
    try:
        torch.set_default_device("meta")
        assert get() == str(torch.get_default_device()) == "meta"
        torch.set_default_device(None)
        assert get() == "cpu"
        with torch.device("meta"):  # a device context alone, no global default
            assert get() == str(torch.get_default_device()) == "meta"
        assert get() == "cpu"
    finally:
        torch.set_default_device(None)


def test_a_default_device_set_by_the_target_is_found_at_each_call(tmp_path):
    source = tmp_path / "sets_device.py"
    source.write_text(
        "import torch\n"
        "def sets_device(scores, dim=-1):\n"
        "    out = torch.softmax(scores, dim)\n"
        "    torch.set_default_device('meta')\n"
        "    return out\n"
        "def enters_device(scores, dim=-1):\n"
        "    out = torch.softmax(scores, dim)\n"
        "    torch.device('meta').__enter__()  # never left\n"
        "    return out\n"
    )
    for name in ("sets_device", "enters_device"):
        spec = remote.open_normalizer(f"{source}:{name}", {}, DEV)
        effects = spec.fn.monitor.effects
        z = torch.randn(2, 3, dtype=torch.float64)
        for call in (1, 2):
            assert torch.equal(spec(z), torch.softmax(z, -1))
            found = [e.what for e in effects if "default device changed" in e.what]
            assert len(found) == call, (name, [e.what for e in effects])
        assert "from cpu to meta" in found[0]
        remote.shutdown()


def test_the_guard_reads_every_flag_at_every_call(monkeypatch):
    """No flag is skipped between calls: each getter runs in every snapshot and check."""
    guard = worker.StateGuard()
    counts = [0] * len(guard.flags)

    def counted(i, get):
        def read():
            counts[i] += 1
            return get()
        return read

    guard.flags = [(name, counted(i, get), put) for i, (name, get, put) in
                   enumerate(guard.flags)]
    for _ in range(3):
        assert guard.check(guard.snapshot()) == []
    assert counts == [6] * len(counts)


def test_a_draw_from_the_random_generator_is_found_at_that_call():
    guard = worker.StateGuard()
    before = guard.snapshot()
    assert guard.check(before) == []
    state = torch.get_rng_state()
    torch.rand(1)  # drawn from: the state moved on
    found = guard.check(before)
    assert len(found) == 1 and "random generator" in found[0]
    assert torch.equal(torch.get_rng_state(), state)  # undone
    assert guard.check(guard.snapshot()) == []


# --------------------------------------------------------------------------------------------
# Messages: one decoder and one encoder; inputs written from the checker's own copy


def test_messages_build_no_json_codec_per_message(monkeypatch):
    import json

    built = []

    class Decoder(json.JSONDecoder):
        def __init__(self, *a, **kw):
            built.append("decoder")
            super().__init__(*a, **kw)

    class Encoder(json.JSONEncoder):
        def __init__(self, *a, **kw):
            built.append("encoder")
            super().__init__(*a, **kw)

    monkeypatch.setattr(json, "JSONDecoder", Decoder)
    monkeypatch.setattr(json, "JSONEncoder", Encoder)
    message = {"op": "call", "id": 3, "args": [{"$tensor": 0}], "kwargs": {"dim": -1}}
    for _ in range(3):
        assert wire.parse(wire.dump(message)) == message
    assert built == []
    # as strict as before: duplicate keys (nested too), non-finite numbers, a byte-order mark
    for bad in (b'{"a":1,"a":2}', b'{"a":{"b":1,"b":1}}', b'{"a":NaN}', b'{"a":-Infinity}',
                b'\xef\xbb\xbf{"a":1}', b'[1]', b'{'):
        with pytest.raises(wire.ProtocolError):
            wire.parse(bad)
    with pytest.raises(ValueError):
        wire.dump({"a": float("nan")})


def test_cpu_inputs_are_written_from_the_checkers_own_copy(monkeypatch):
    spans = []
    real = wire.write_tensor

    def spy(arena, layout, t, device=None, span=None):
        spans.append(span)
        return real(arena, layout, t, device, span=span)

    monkeypatch.setattr(wire, "write_tensor", spy)
    spec = remote.open_normalizer("softmax", {}, DEV)
    view = torch.arange(60, dtype=torch.float64).reshape(4, 15)[1:, ::2].t()
    assert torch.equal(spec(view, dim=0), torch.softmax(view, 0))
    (span,) = spans
    assert span == remote._raw(view).numpy().tobytes()  # the span from the storage's start
