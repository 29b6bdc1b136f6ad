"""Tests of :mod:`attnverify.quantities`: hand-computed cases, laziness, and dense references."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import F64, TOL
from hypothesis import given, settings
from hypothesis import strategies as st

from attnverify import jacobian, quantities
from attnverify.errors import UsageError
from attnverify.quantities import QUANTITIES, evaluate_quantities
from attnverify.registry import normalizer_spec

INTERFACE_NAMES = (
    "L",
    "T",
    "a",
    "max_weight",
    "min_weight",
    "sum_weight",
    "jacobian_spectral",
    "jacobian_entry",
    "jacobian_frobenius",
    "jacobian_l1_total",
)


def softmax_t(scores, dim=-1, temperature=1.0):
    """Reference softmax with temperature (the built-ins are tested elsewhere)."""
    return torch.softmax(scores / temperature, dim)


def plain_softmax(scores, dim=-1):
    return torch.softmax(scores, dim)


def dagpam_like(scores, dim=-1, lam=0.5):
    return (1 + lam) * torch.softmax(scores, dim) - lam * torch.softmax(-scores, dim)


SOFTMAX = normalizer_spec(softmax_t, id="softmax_t")


def approx(x: float) -> pytest.approx:
    return pytest.approx(x, rel=TOL.rtol, abs=TOL.atol)


def test_interface_quantities_exist_with_descriptions():
    assert set(INTERFACE_NAMES) <= set(QUANTITIES)
    for name, q in QUANTITIES.items():
        assert name.isidentifier() and q.name == name
        assert q.description and "\n" not in q.description
    assert quantities.describe()[0] == ("L", QUANTITIES["L"].description)


def test_two_way_tie_hand_case():
    # softmax at T = 2 of (0, 0): α = (½, ½), J = (1/2)[[¼, −¼], [−¼, ¼]]:
    # ‖J‖₂ = 1/(2T) = ¼, max|J| = 1/(4T) = ⅛, ‖J‖_F = √(4/64) = ¼, Σ|J| = 4/8 = ½.
    got = evaluate_quantities(QUANTITIES, SOFTMAX, torch.zeros(2), temperature=2.0)
    want = {
        "L": 2,
        "L_padded": 2,
        "n_unmasked": 2,
        "T": 2.0,
        "a": 0.0,
        "logit_gap": 0.0,
        "max_weight": 0.5,
        "min_weight": 0.5,
        "sum_weight": 1.0,
        "sum_sq_weight": 0.5,
        "entropy": math.log(2),
        "n_support": 2,
        "lambda": 0.0,
        "jacobian_spectral": 0.25,
        "jacobian_entry": 0.125,
        "jacobian_frobenius": 0.25,
        "jacobian_l1_total": 0.5,
    }
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name] == approx(value), name


def test_masked_keys_are_left_out_of_the_jacobian():
    # (0, −∞, 0) at T = 1: the same as the two-way tie on the two unmasked keys.
    row = torch.tensor([0.0, -math.inf, 0.0])
    names = [
        "L",
        "L_padded",
        "n_unmasked",
        "a",
        "min_weight",
        "n_support",
        "jacobian_spectral",
        "jacobian_frobenius",
    ]
    got = evaluate_quantities(names, SOFTMAX, row)
    assert got == {
        "L": 2,  # the keys the normalizer attends to
        "L_padded": 3,
        "n_unmasked": 2,
        "a": 0.0,
        "min_weight": 0.5,
        "n_support": 2,
        "jacobian_spectral": approx(0.5),
        "jacobian_frobenius": approx(0.5),
    }


def test_temperature_defaults_and_normalizers_without_one():
    row = torch.tensor([1.0, -3.0, 0.5])
    assert evaluate_quantities(["T"], SOFTMAX, row) == {"T": 1.0}
    assert evaluate_quantities(["T"], SOFTMAX.with_params(temperature=0.3), row) == {"T": 0.3}
    plain = normalizer_spec(plain_softmax)
    assert evaluate_quantities(["T", "a", "logit_gap"], plain, row, temperature=5.0) == {
        "T": 1.0,
        "a": 3.0,
        "logit_gap": 0.5,
    }


def test_lambda_reads_the_normalizer_parameter():
    spec = normalizer_spec(dagpam_like, space="affine")
    row = torch.tensor([1.0, 0.0])
    assert evaluate_quantities(["lambda"], spec, row) == {"lambda": 0.5}
    assert evaluate_quantities(["lambda"], spec, row, params={"lam": 2.0}) == {"lambda": 2.0}
    got = evaluate_quantities(["min_weight", "sum_weight"], spec, torch.tensor([4.0, -4.0]))
    assert got["min_weight"] < 0 and got["sum_weight"] == approx(1.0)


def test_only_the_named_quantities_are_computed(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a Jacobian was computed for a cheap quantity")

    monkeypatch.setattr(jacobian, "spectral_norm", refuse)
    monkeypatch.setattr(jacobian, "entrywise_norms", refuse)
    got = evaluate_quantities(["L", "max_weight", "L"], SOFTMAX, torch.zeros(4))
    assert got == {"L": 4, "max_weight": 0.25}


def test_entrywise_quantities_share_one_pass(monkeypatch):
    calls = []
    real = jacobian.entrywise_norms

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jacobian, "entrywise_norms", counting)
    names = ["jacobian_entry", "jacobian_frobenius", "jacobian_l1_total"]
    evaluate_quantities(names, SOFTMAX, torch.randn(6, dtype=F64))
    assert len(calls) == 1


def test_unknown_quantity_is_a_usage_error():
    with pytest.raises(UsageError,
                       match="unknown quantity .bogus. \\(known: L, L_padded, n_unmasked"):
        evaluate_quantities(["L", "bogus"], SOFTMAX, torch.zeros(2))


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 16),
    scale=st.floats(0.1, 5.0),
    temperature=st.sampled_from([0.2, 1.0, 3.0]),
)
def test_jacobian_quantities_match_the_dense_softmax_jacobian(seed, length, scale, temperature):
    row = scale * torch.randn(length, generator=torch.Generator().manual_seed(seed), dtype=F64)
    alpha = torch.softmax(row / temperature, -1)
    J = (torch.diag(alpha) - torch.outer(alpha, alpha)) / temperature
    names = ["jacobian_spectral", "jacobian_entry", "jacobian_frobenius", "jacobian_l1_total"]
    got = evaluate_quantities(names + ["a", "entropy"], SOFTMAX, row, temperature=temperature)
    assert got["jacobian_spectral"] == approx(float(torch.linalg.matrix_norm(J, 2)))
    assert got["jacobian_entry"] == approx(float(J.abs().max()))
    assert got["jacobian_frobenius"] == approx(float(torch.linalg.matrix_norm(J)))
    assert got["jacobian_l1_total"] == approx(float(J.abs().sum()))
    assert got["a"] == float(row.abs().max())
    assert got["entropy"] == approx(float(-(alpha * alpha.log()).sum()))


def test_builtin_softmax_if_available():
    normalizers = pytest.importorskip("attnverify.normalizers")
    spec = normalizers.BUILTINS["softmax"]
    got = evaluate_quantities(["jacobian_spectral", "T"], spec, torch.zeros(2), temperature=0.5)
    assert got == {"jacobian_spectral": approx(1.0), "T": 0.5}


def _spy_methods(monkeypatch):
    """``(methods, spectral_norm)``: the ``method`` of every ``jacobian.spectral_norm`` call from
    now on, and the function itself."""
    methods = []
    real = jacobian.spectral_norm

    def spy(f, z, **kwargs):
        methods.append(kwargs.get("method"))
        return real(f, z, **kwargs)

    monkeypatch.setattr(jacobian, "spectral_norm", spy)
    return methods, real


@pytest.mark.parametrize("length", [17, 100, 128])
def test_rows_up_to_128_keys_take_the_spectral_norm_from_the_dense_jacobian(monkeypatch, length):
    """One batch of products and an SVD (two requests behind the process boundary) instead of
    Lanczos's two products a step; the value is the hand-formed Jacobian's norm, and Lanczos's
    to its tolerance."""
    methods, real = _spy_methods(monkeypatch)
    row = 3.0 * torch.randn(length, generator=torch.Generator().manual_seed(length), dtype=F64)
    alpha = torch.softmax(row, -1)
    J = torch.diag(alpha) - torch.outer(alpha, alpha)
    exact = float(torch.linalg.matrix_norm(J, 2))
    got = evaluate_quantities(["jacobian_spectral"], SOFTMAX, row)["jacobian_spectral"]
    assert methods == ["dense"] and got == approx(exact)
    padded = torch.cat([row, torch.full((length,), -math.inf, dtype=F64)])
    assert evaluate_quantities(["jacobian_spectral"], SOFTMAX, padded) == {
        "jacobian_spectral": approx(exact)}
    assert methods == ["dense", "dense"]
    lanczos = real(lambda z: torch.softmax(z, -1), row, method="lanczos")
    assert float(lanczos.value) == pytest.approx(got, rel=1e-7)


@pytest.mark.parametrize("length, method", [(129, "dense_lanczos"), (256, "dense_lanczos"),
                                            (257, "lanczos")])
def test_rows_up_to_256_keys_run_lanczos_on_the_dense_jacobian(monkeypatch, length, method):
    """Over 128 keys and up to 256: the dense Jacobian (one batch of products, one request
    behind the process boundary) and Lanczos on it in this process; longer rows run Lanczos
    on products. The value is the hand-formed Jacobian's norm, masked keys left out."""
    methods, real = _spy_methods(monkeypatch)
    row = 3.0 * torch.randn(length, generator=torch.Generator().manual_seed(length), dtype=F64)
    alpha = torch.softmax(row, -1)
    exact = float(torch.linalg.matrix_norm(torch.diag(alpha) - torch.outer(alpha, alpha), 2))
    got = evaluate_quantities(["jacobian_spectral"], SOFTMAX, row)["jacobian_spectral"]
    assert methods == [method] and got == pytest.approx(exact, rel=1e-7)
    padded = torch.cat([row, torch.full((3,), -math.inf, dtype=F64)])
    got = evaluate_quantities(["jacobian_spectral"], SOFTMAX, padded)["jacobian_spectral"]
    assert methods == [method, method] and got == pytest.approx(exact, rel=1e-7)
