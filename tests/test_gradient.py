"""The ``gradient`` and ``double_backward`` properties: wrong derivatives are found in every
autograd style, correct ones pass (kinks included), and classic ``autograd.Function``s reach the
Jacobian properties."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnverify.certify import certify_target, make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.checks import gradient as G
from attnverify.checks.cases import RowCase
from attnverify.registry import load_target

FILE = str(Path(__file__).parent / "fixtures" / "planted_trust.py")
CTX = make_context("ci", seed=0)
JACOBIAN_CLAIMS = ["simplex", "jacobian_spectral_half", "cor3_entrywise", "lemma3_l1_uniform",
                   "fd_gradient"]
F64 = torch.float64


def planted(attr: str):
    return load_target(f"{FILE}:{attr}")


def status(attr: str, prop: str) -> str:
    return run_property(PROPERTIES[prop], planted(attr), CTX).status


def case(rows, temperature=1.0, seed=0) -> RowCase:
    return RowCase(torch.tensor(rows, dtype=F64), temperature, "gaussian", seed)


@pytest.mark.parametrize("attr", ["halved_gradient_softmax", "wrong_jvp_softmax"])
def test_wrong_derivative_fails_gradient(attr):
    res = run_property(PROPERTIES["gradient"], planted(attr), CTX)
    assert res.status == "violated", res
    mode = "reverse" if attr.startswith("halved") else "forward"
    assert f"by {mode} mode" in res.message
    scores = res.counterexample["scores"]
    assert len(scores) == 1 and len(scores[0]) <= 3  # shrunk to one short row


def test_halved_gradient_is_caught_on_a_plain_row():
    spec = planted("halved_gradient_softmax")
    with pytest.raises(G.Violation, match="reverse mode is .* but central differences"):
        G.check_gradient(spec, case([[0.3, -1.0, 2.0]]), CTX)
    G.check_gradient(planted("classic_softmax"), case([[0.3, -1.0, 2.0]]), CTX)


@pytest.mark.slow  # whole certifications
@pytest.mark.parametrize("attr", ["classic_softmax", "once_softmax"])
def test_correct_classic_functions_are_certified_with_jacobian_claims(attr):
    res = certify_target(planted(attr), JACOBIAN_CLAIMS, CTX)
    # in this process without the proxy: side effects are not observed (tests/test_isolation.py)
    bad = {r.property: r.message for r in res.results if r.status not in ("holds",)
           and r.property != "no_side_effects"}
    assert res.verdict == "certified" and not bad, bad
    assert {r.property for r in res.results} >= {"gradient", *JACOBIAN_CLAIMS}
    # the two-way tie of the battery attains 1/(2T): the Jacobian was really formed, not zero
    ratio = {r.property: r.worst_ratio for r in res.results}["jacobian_spectral_half"]
    assert ratio > 0.99


def test_double_backward_claim():
    assert status("classic_softmax", "double_backward") == "holds"
    res = run_property(PROPERTIES["double_backward"], planted("once_softmax"), CTX)
    assert res.status == "violated" and "not differentiable" in res.message


def test_no_autograd_graph_is_not_applicable():
    res = run_property(PROPERTIES["gradient"], planted("numpy_softmax"), CTX)
    assert res.status == "not_applicable" and "gradients not checked" in res.message
    assert [u.status for _, u in res.units] == ["not_applicable", "not_applicable"]


def test_a_float32_kernel_has_its_float32_derivatives_checked():
    """Raising on float64 scores makes the float64 unit not applicable (decided over all its
    cases), not the property: the float32 unit checks the float32 backward."""
    res = run_property(PROPERTIES["gradient"], planted("float32_only_softmax"), CTX)
    units = dict(res.units)
    assert res.status == "holds", res.message
    assert units["float32"].status == "holds" and units["float32"].examples > 10
    assert units["float64"].status == "not_applicable"
    assert "float64 not checked" in units["float64"].message
    assert "on every one of the" in units["float64"].message


def test_every_builtin_gradient_holds_on_kinks():
    """Support boundaries, ReLU kinks and max ties: skipped, never a false alarm."""
    rows = [[1.0, 0.0, -3.0], [2.0, 2.0, 0.5], [0.0, 0.0, 0.0], [0.5, float("-inf"), -0.5]]
    for name in ("sparsemax", "entmax15", "relu_norm", "softpick", "sa_softmax", "stablemax"):
        G.check_gradient(load_target(name), case(rows), CTX)


def test_kink_rows_are_skipped_not_judged():
    """Sparsemax at [1, 0]: key 2 sits exactly on the support boundary (z = τ)."""
    z = torch.tensor([[1.0, 0.0]], dtype=F64)
    f = load_target("sparsemax")
    u, v = torch.tensor([[0.0, 1.0]], dtype=F64), torch.tensor([[0.0, 1.0]], dtype=F64)

    def weights(x):
        y = f(x)
        return y, y == 0

    diff = G.smooth_difference(weights, z, v, u, torch.full((1, 1), 1e-5, dtype=F64))
    assert not bool(diff.judged[0])
    smooth = G.smooth_difference(weights, z + torch.tensor([[0.0, -0.5]], dtype=F64), v, u,
                                 torch.full((1, 1), 1e-5, dtype=F64))
    assert bool(smooth.judged[0])


def test_gradient_is_universal_and_double_backward_claimed_by_smooth_builtins():
    assert PROPERTIES["gradient"].universal
    assert not PROPERTIES["double_backward"].universal
    for name in ("softmax", "softmax1", "ssmax", "sigmoid", "dagpam"):
        assert "double_backward" in load_target(name).claims
    assert "double_backward" not in load_target("sparsemax").claims
