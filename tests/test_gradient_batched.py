"""The finite-difference gradients of ``double_backward`` in one request (issue #27): the worker
op ``vjps`` (forward output, gradient and graph flag per point), the layout's adjoints taken in
the checker, the same values as a forward and a backward request per point, and a gradient
wrong only at those points still caught (tests/fixtures/planted_batched_gradient.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from attnverify import remote, wire
from attnverify.certify import make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.checks import gradient as G
from attnverify.checks.base import NormalizerError, Violation
from attnverify.checks.cases import RowCase
from attnverify.registry import load_target
from attnverify.strategies import layouts as LY
from attnverify.worker import Server

FIXTURES = Path(__file__).parent / "fixtures"
FILE = str(FIXTURES / "planted_batched_gradient.py")
TAMPERERS = str(FIXTURES / "tamperers.py")
DEV = make_context("dev", seed=0)
F64, F32 = torch.float64, torch.float32
#: (kind, rank, axis from the end, positive spelling, detail) of build_layout: each kind of view.
LAYOUTS = [
    ("contiguous", 2, -1, False, 0),
    ("transposed", 3, -1, False, 0),
    (("strided", "offset"), 2, -1, False, 1),
    ("expanded", 3, -1, False, 0),
    (("permuted", "expanded"), 4, -1, False, 2),
    (("expanded", "strided", "offset"), 4, -1, False, 2),
    ("transposed", 3, -2, True, 1),
]


@pytest.fixture(scope="module")
def workers():
    """Built-ins opened behind the process boundary, and in this process (--no-isolation)."""
    opened = {}
    local = dataclasses.replace(DEV, isolation=False)
    try:
        for name in ("softmax", "sparsemax", "entmax15"):
            opened[name, True] = remote.open_normalizer(name, {}, DEV)
            opened[name, False] = remote.open_normalizer(name, {}, local)
        yield opened
    finally:
        for spec in opened.values():
            spec.fn.channel.close()
        remote.shutdown()


def _case(spec, index: int, dtype, rows: int = 6, length: int = 7) -> tuple[RowCase, list]:
    kind, rank, from_end, positive, detail = LAYOUTS[index]
    layout = LY.build_layout(rows, length, rank=rank, from_end=from_end, positive=positive,
                             kind=kind, detail=detail)
    g = torch.Generator().manual_seed(index)
    z = (0.5 * torch.randn(rows, length, generator=g, dtype=F64)).to(dtype).to(F64)
    z[1, 3] = float("-inf")
    z[4, :2] = float("-inf")
    v = torch.randn(rows, length, generator=g, dtype=F64) * (z != float("-inf"))
    t = 0.7 if "temperature" in spec.params else None
    case = RowCase(z.to(dtype), t, "gaussian", index, layout)
    return case, [z, z + 1e-4 * v, z - 1e-4 * v, z + 1e-5 * v, z - 1e-5 * v]


def _per_point(spec, case, dtype, u, xs, monkeypatch):
    """The gradients as a forward and a backward pass per point give them (the path before
    ``vjps``, and the one of a normalizer called in this process)."""
    with monkeypatch.context() as m:
        m.setattr(G, "case_vjps_many", lambda *a, **k: None)
        return G._own_gradient(spec, case, dtype)(u)(xs)


@pytest.mark.parametrize("isolated", [True, False], ids=["worker", "no-isolation"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
def test_batched_gradients_equal_the_per_point_ones_in_every_layout(workers, monkeypatch, name,
                                                                    dtype, isolated):
    """Bit for bit, on transposed, expanded, strided, offset and permuted views (the adjoints
    of present and collect taken by autograd here), with masked keys, in one request."""
    spec = workers[name, isolated]
    channel = spec.fn.channel
    for index in range(len(LAYOUTS)):
        case, xs = _case(spec, index, dtype)
        g = torch.Generator().manual_seed(100 + index)
        u = torch.randn(case.scores.shape, generator=g, dtype=F64).to(dtype).to(F64)
        before = channel.monitor.calls
        batched = G._own_gradient(spec, case, dtype)(u)(xs)
        assert channel.monitor.calls - before == 1, "one request for every point"
        before = channel.monitor.calls
        single = _per_point(spec, case, dtype, u, xs, monkeypatch)
        assert channel.monitor.calls - before == 2 * len(xs)
        for (ga, pa), (gb, pb) in zip(batched, single):
            assert ga.dtype == gb.dtype == F64
            assert torch.equal(ga, gb), (case.layout.describe(), (ga - gb).abs().max())
            assert torch.equal(pa, pb)
        # a gradient that reached the rows through the view (softmax: every row's)
        rows = [0, 2, 3, 5] if name == "softmax" else slice(None)
        assert all(bool((ga[rows] != 0).any(-1).all() if name == "softmax" else
                        (ga != 0).any()) for ga, _ in batched)


def test_plain_callables_keep_the_per_point_path():
    """A normalizer called in this process (no worker proxy) is differentiated here."""
    spec = load_target("softmax")
    case, xs = _case(spec, 1, F64)
    u = torch.ones(case.scores.shape, dtype=F64)
    grads = G._own_gradient(spec, case, F64)(u)(xs)
    assert len(grads) == len(xs)
    # softmax: Jᵀ1 = 0 on every row (the weights sum to 1)
    assert all(float(g.abs().max()) < 1e-12 for g, _ in grads)


RAISES = """
import torch

def big_raises(scores, dim=-1):
    if bool((scores.detach() > 50).any()):
        raise ValueError("a score above 50")
    return torch.softmax(scores, dim)
"""


def test_a_point_that_raises_names_its_input(tmp_path):
    """The index of the failing call comes back with the error: the NormalizerError carries
    the rows of that point (the third), not the first."""
    source = tmp_path / "raising.py"
    source.write_text(RAISES)
    spec = remote.open_normalizer(f"{source}:big_raises", {}, DEV)
    try:
        case, xs = _case(spec, 1, F64)
        xs[2] = xs[2].clone()
        xs[2][0, 0] = 60.0
        u = torch.ones(case.scores.shape, dtype=F64)
        with pytest.raises(NormalizerError, match="a score above 50") as info:
            G._own_gradient(spec, case, F64)(u)(xs)
        assert torch.equal(info.value.input, xs[2])
    finally:
        spec.fn.channel.close()
        remote.shutdown()


def _server(target: str) -> Server:
    server = Server()
    server.load({"kind": "normalizer", "target": target, "params": {}})
    return server


def _vjps_message(n: int, shape, dtype="float64") -> dict:
    want = {"size": list(shape), "dtype": dtype, "device": "cpu"}
    return {"op": "vjps", "fn": "target",
            "calls": [{"args": [{"$tensor": i}], "kwargs": {"dim": -1}, "cotangent": n + i}
                      for i in range(n)],
            "expect": [want] * (2 * n)}


def test_worker_vjps_op_answers_forward_gradient_and_graph():
    server = _server("softmax")
    xs = [torch.randn(2, 5, dtype=F64) for _ in range(3)]
    cs = [torch.randn(2, 5, dtype=F64) for _ in range(3)]
    reply, outputs = server.handle(_vjps_message(3, (2, 5)), [x.clone() for x in xs] + cs)
    assert reply["ok"] and reply["graph"] == [True, True, True]
    assert len(outputs) == 6
    for i, (x, c) in enumerate(zip(xs, cs)):
        xx = x.clone().requires_grad_(True)
        y = torch.softmax(xx, -1)
        (g,) = torch.autograd.grad(y, xx, c)
        assert torch.equal(outputs[2 * i], y.detach())
        assert torch.equal(outputs[2 * i + 1], g)
        assert not outputs[2 * i].requires_grad and not outputs[2 * i + 1].requires_grad


def test_worker_vjps_op_refuses_a_malformed_request():
    server = _server("softmax")
    tensors = [torch.randn(2, 5, dtype=F64), torch.randn(2, 5, dtype=F64)]
    message = _vjps_message(1, (2, 5))
    with pytest.raises(wire.ProtocolError):
        server.handle({**message, "expect": message["expect"][:1]}, list(tensors))
    bad = {**message, "calls": [{**message["calls"][0], "cotangent": 7}]}
    with pytest.raises(wire.ProtocolError):
        server.handle(bad, list(tensors))
    same = {**message, "calls": [{**message["calls"][0], "cotangent": 0}]}
    with pytest.raises(wire.ProtocolError):
        server.handle(same, list(tensors))


def test_the_border_holds_in_a_vjps_request():
    """The inputs of a vjps request are read back after the answer like any other's (a target
    that writes into its argument is refused, kept for no_mutation); a forward output in a
    buffer an earlier call returned is refused at the border; a change of global state is
    reported as a side effect."""
    xs = [torch.randn(2, 5, dtype=F64) for _ in range(3)]
    cs = [torch.ones(2, 5, dtype=F64)] * 3
    for attr, match in (("clobbers_input", "wrote into its input"),
                        ("reused_buffer", "output of an earlier call")):
        spec = remote.open_normalizer(f"{TAMPERERS}:{attr}", {}, DEV)
        try:
            with pytest.raises(Violation, match=match):
                spec.fn.many_vjp(xs, cs)
            assert spec.fn.monitor.refused
        finally:
            spec.fn.channel.close()
    spec = remote.open_normalizer(f"{TAMPERERS}:grad_off", {}, DEV)
    try:
        spec.fn.many_vjp(xs, cs)
        assert any("grad" in e.what for e in spec.fn.monitor.effects), spec.fn.monitor.effects
    finally:
        spec.fn.channel.close()
        remote.shutdown()


def _double_backward_of(attr: str, ctx):
    """``double_backward``'s result on the planted fixture ``attr`` opened with ``ctx``."""
    spec = remote.open_normalizer(f"{FILE}:{attr}", {}, ctx)
    try:
        return run_property(PROPERTIES["double_backward"], spec, DEV)
    finally:
        spec.fn.channel.close()
        remote.shutdown()


@pytest.mark.slow  # whole double_backward runs on planted defects
@pytest.mark.parametrize("isolated", [True, False], ids=["worker", "no-isolation"])
def test_gradient_wrong_only_at_the_probes_fails_double_backward(isolated):
    """probe_backward_softmax: right weights everywhere, right derivatives at every input but
    those near an earlier one (the points z ± hv), where its gradient is 1% too large. The
    gradients at those points come from the worker in one request; double_backward fails."""
    ctx = dataclasses.replace(DEV, isolation=isolated)
    res = _double_backward_of("probe_backward_softmax", ctx)
    assert res.status == "violated", (res.status, res.message)


@pytest.mark.slow  # a whole double_backward run on a planted defect
def test_gradient_lost_at_the_probes_fails_double_backward():
    """probe_detached_softmax: no graph at the points z ± hv (where z has one): a violation,
    never 'not applicable'."""
    res = _double_backward_of("probe_detached_softmax", DEV)
    assert res.status == "violated", (res.status, res.message)
    assert "no autograd graph at a point near" in res.message


@pytest.mark.slow  # whole double_backward runs on planted defects
def test_planted_probes_fail_in_this_process_too():
    """The same defects on the plain callables (no worker): the per-point path catches them."""
    for attr in ("probe_backward_softmax", "probe_detached_softmax"):
        res = run_property(PROPERTIES["double_backward"], load_target(f"{FILE}:{attr}"), DEV)
        assert res.status == "violated", (attr, res.status, res.message)


OWN_REFERENCE = """
import torch

from attnverify import normalizer_spec


def own_softmax(scores, dim=-1):
    return torch.softmax(scores, dim)


def float32_softmax(scores, dim=-1, temperature=1.0):
    if scores.dtype != torch.float32:
        raise TypeError("float32 only")
    return torch.softmax(scores / temperature, dim)


target = normalizer_spec(float32_softmax, id="float32_softmax", reference=own_softmax,
                         space="simplex")
"""


def test_own_reference_gradients_in_one_request(tmp_path, monkeypatch):
    """A float32 kernel's second derivatives are compared with central differences of its own
    reference's gradient (evaluated in its worker, on z/T: it takes no temperature): every
    point in one request, bit for bit what a request pair per point gives."""
    from attnverify.checks import reference as R

    source = tmp_path / "own_reference.py"
    source.write_text(OWN_REFERENCE)
    spec = remote.open_normalizer(f"{source}:target", {}, DEV)
    try:
        ref = R.reference_spec(spec)
        assert isinstance(ref.fn, remote.OwnReference)
        case, xs = _case(spec, 2, F32)
        case = case._replace(temperature=0.7)
        u = torch.randn(case.scores.shape, generator=torch.Generator().manual_seed(5),
                        dtype=F64)
        channel = spec.fn.channel
        before = channel.monitor.calls
        batched = G._reference_maps(spec, case, ref)[1](u)(xs)
        assert channel.monitor.calls - before == 1
        with monkeypatch.context() as m:
            m.setattr(G, "reference_vjps", lambda *a, **k: None)
            before = channel.monitor.calls
            single = G._reference_maps(spec, case, ref)[1](u)(xs)
            assert channel.monitor.calls - before == 2 * len(xs)
        for (ga, pa), (gb, pb) in zip(batched, single):
            assert torch.equal(ga, gb) and torch.equal(pa, pb)
        assert bool((batched[0][0] != 0).any())
    finally:
        spec.fn.channel.close()
        remote.shutdown()
