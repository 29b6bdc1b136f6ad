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

from attnverify import remote
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
