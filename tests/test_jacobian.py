"""Tests of :mod:`attnverify.jacobian` against hand-computed Jacobians and dense autograd ones."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import F64, TOL, close
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from attnverify import jacobian
from attnverify.tolerances import tol_for

FAST = settings(max_examples=25, deadline=None)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# Reference normalizers: each maps rows along the last dim.


def softmax(z):
    return torch.softmax(z, -1)


def stablemax(z):
    """s(x)/Σs(x), s(x) = x + 1 (x ≥ 0), 1/(1 − x) (x < 0): a non-symmetric Jacobian."""
    s = torch.where(z >= 0, z.clamp_min(0) + 1, 1 / (1 - z.clamp_max(0)))
    return s / s.sum(-1, keepdim=True)


def sa_softmax(z):
    """Self-Adjust Softmax: rescaled logits times softmax; not normalised, non-symmetric J."""
    lo = z.amin(-1, keepdim=True).clamp_max(0)
    hi = z.amax(-1, keepdim=True).clamp_min(0)
    span = (hi - lo).clamp_min(torch.finfo(z.dtype).tiny)
    return (z - lo) / span * torch.softmax(z, -1)


class _SoftmaxNoJvp(torch.autograd.Function):
    """Softmax as an old-style custom Function: no forward-mode AD, no torch.func support."""

    @staticmethod
    def forward(ctx, z):
        y = torch.softmax(z, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * (g - (g * y).sum(-1, keepdim=True))


def softmax_no_jvp(z):
    return _SoftmaxNoJvp.apply(z)


class _StablemaxOnce(torch.autograd.Function):
    """Stablemax (non-symmetric J) as a classic Function whose backward cannot be differentiated:
    neither forward mode nor the double-backward trick can form J·v."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return stablemax(z)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        with torch.enable_grad():
            zz = z.detach().requires_grad_(True)
            (out,) = torch.autograd.grad(stablemax(zz), zz, g)
        return out


def stablemax_once(z):
    return _StablemaxOnce.apply(z)


MAPS = {
    "softmax": softmax,
    "stablemax": stablemax,
    "sa_softmax": sa_softmax,
    "softmax_no_jvp": softmax_no_jvp,
    "stablemax_once": stablemax_once,
}


def reference_jacobians(f, z):
    """Dense ``[..., L, L]`` Jacobians, one ``torch.autograd.functional.jacobian`` per row."""
    rows = z.reshape(-1, z.shape[-1])
    J = torch.stack([torch.autograd.functional.jacobian(f, r) for r in rows])
    return J.reshape(z.shape + (z.shape[-1],))


# --------------------------------------------------------------------------------------------
# Hand-computed cases


def test_two_way_tie_spectral_norm_is_one_over_two_t():
    # softmax(l/T) at l = (0, 0): J = (1/T)[[¼, −¼], [−¼, ¼]], ‖J‖₂ = 1/(2T).
    for temperature in (0.1, 1.0, 3.0):
        f = lambda z, t=temperature: torch.softmax(z / t, -1)  # noqa: E731
        result = jacobian.spectral_norm(f, torch.zeros(2, dtype=F64))
        close(result.value, 1 / (2 * temperature), f"T={temperature}")
        assert bool(result.converged)
        J = jacobian.dense_jacobian(f, torch.zeros(2, dtype=F64))
        close(J, torch.tensor([[1, -1], [-1, 1]], dtype=F64) / (4 * temperature), "dense J")


def test_masked_two_way_tie_entrywise_norms():
    # (0, 0, −∞, −∞): α = (½, ½, 0, 0), J = [[¼, −¼], [−¼, ¼]] ⊕ 0:
    # max|J| = ¼, ‖J‖_F = √(4/16) = ½, Σ|J| = 1, ‖J‖₂ = ½.
    row = torch.tensor([0.0, 0.0, -math.inf, -math.inf], dtype=F64)
    norms = jacobian.entrywise_norms(softmax, row)
    close(norms.max_abs, 0.25, "max |J|")
    close(norms.frobenius, 0.5, "‖J‖_F")
    close(norms.l1_total, 1.0, "Σ|J|")
    close(jacobian.spectral_norm(softmax, row).value, 0.5, "‖J‖₂")


def test_uniform_row_softmax_norms():
    # uniform α = 1/L: J = (I − 11ᵀ/L)/L, a projection over L: ‖J‖₂ = 1/L,
    # ‖J‖_F = √(L−1)/L, Σ|J| = 2(1 − 1/L).
    length = 5
    z = torch.zeros(length, dtype=F64)
    close(jacobian.spectral_norm(softmax, z).value, 1 / length, "‖J‖₂")
    norms = jacobian.entrywise_norms(softmax, z)
    close(norms.frobenius, math.sqrt(length - 1) / length, "‖J‖_F")
    close(norms.l1_total, 2 * (1 - 1 / length), "Σ|J|")
    close(norms.max_abs, (1 / length) * (1 - 1 / length), "max |J| (diagonal)")


def test_zero_jacobian_gives_zero_and_converges():
    # softmax of a single key is constantly 1: J = 0.
    result = jacobian.spectral_norm(softmax, torch.tensor([[3.0], [-1.0]], dtype=F64))
    close(result.value, [0.0, 0.0], "‖0‖₂")
    assert bool(result.converged.all())


def test_linear_map_spectral_norm_and_fd_estimate():
    # f(z) = A z with A = [[3, 0], [4, 0]]: ‖A‖₂ = 5 (non-symmetric);
    # fd: ‖A((l + εv)/T) − A(l/T)‖/ε = ‖Av‖/T, v = e1, T = 2: 5/2.
    A = torch.tensor([[3.0, 0.0], [4.0, 0.0]], dtype=F64)
    f = lambda z: z @ A.T  # noqa: E731
    z = torch.tensor([0.3, -1.0], dtype=F64)
    for method in ("lanczos", "power", "dense", "auto"):
        close(jacobian.spectral_norm(f, z, method=method).value, 5.0, method)
    close(jacobian.dense_jacobian(f, z), A, "dense J of a linear map")
    v = torch.tensor([1.0, 0.0], dtype=F64)
    close(jacobian.fd_estimate(f, z, v, eps=1e-3, temperature=2.0), 2.5, "fd estimate")


# --------------------------------------------------------------------------------------------
# Against dense autograd Jacobians


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 20),
    rows=st.integers(1, 3),
    scale=st.floats(0.1, 6.0),
    name=st.sampled_from(sorted(MAPS)),
    block=st.sampled_from([None, 1, 3]),
)
def test_blocks_match_dense_autograd(seed, length, rows, scale, name, block):
    f = MAPS[name]
    z = scale * torch.randn(rows, 2, length, generator=gen(seed), dtype=F64)
    J = reference_jacobians(f, z)
    close(jacobian.dense_jacobian(f, z, block=block), J, f"{name}, seed={seed}")
    norms = jacobian.entrywise_norms(f, z, block=block)
    close(norms.max_abs, J.abs().amax(dim=(-2, -1)), f"max |J|, {name}")
    close(norms.frobenius, torch.linalg.matrix_norm(J), f"‖J‖_F, {name}")
    close(norms.l1_total, J.abs().sum(dim=(-2, -1)), f"Σ|J|, {name}")
    close(jacobian.frobenius(f, z, block=block), norms.frobenius, "frobenius()")


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 40),
    scale=st.floats(0.1, 6.0),
    name=st.sampled_from(sorted(MAPS)),
)
def test_lanczos_matches_dense_svd(seed, length, scale, name):
    f = MAPS[name]
    z = scale * torch.randn(4, length, generator=gen(seed), dtype=F64)
    want = torch.linalg.matrix_norm(reference_jacobians(f, z), 2)
    dense = jacobian.spectral_norm(f, z, method="dense")
    assert dense.method == "dense" and bool(dense.converged.all())
    close(dense.value, want, f"{name}: the dense method, seed={seed}")
    result = jacobian.spectral_norm(f, z, seed=seed)
    assert result.value.shape == (4,)
    assert bool(result.converged.all()), f"{name}: residual {result.residual.tolist()}"
    # value ≤ ‖J‖₂ (a compression), and the certificate brackets the true norm
    assert bool((result.value <= want * (1 + TOL.rtol) + TOL.atol).all())
    assert bool((want - result.value <= result.residual + TOL.atol).all())
    close(result.value, want, f"{name}, seed={seed}")


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 12),
    scale=st.floats(0.5, 4.0),
    name=st.sampled_from(sorted(MAPS)),
)
def test_power_iteration_is_a_certified_lower_estimate(seed, length, scale, name):
    # Power iteration can stall on a cluster of top singular values; it must then say so
    # (converged False) and still never exceed the norm.
    f = MAPS[name]
    z = scale * torch.randn(2, length, generator=gen(seed), dtype=F64)
    want = torch.linalg.matrix_norm(reference_jacobians(f, z), 2)
    result = jacobian.spectral_norm(f, z, method="power", iters=200, seed=seed)
    assert bool((result.value <= want * (1 + TOL.rtol) + TOL.atol).all())
    done = result.converged
    close(result.value[done], want[done], f"converged rows, {name}, seed={seed}")


def test_lanczos_on_a_near_uniform_row_with_clustered_singular_values():
    # softmax at logits 1e-3·z: L − 1 eigenvalues within ~1e-3/L of 1/L.
    z = 1e-3 * torch.randn(3, 30, generator=gen(3), dtype=F64)
    want = torch.linalg.matrix_norm(reference_jacobians(softmax, z), 2)
    result = jacobian.spectral_norm(softmax, z)
    assert bool(result.converged.all())
    close(result.value, want, "clustered spectrum")


def test_custom_function_without_jvp_falls_back_to_double_backward():
    z = torch.randn(3, 12, generator=gen(0), dtype=F64)
    result = jacobian.spectral_norm(softmax_no_jvp, z)
    assert result.mode == "double_backward"
    close(result.value, jacobian.spectral_norm(softmax, z).value, "fallback vs forward mode")
    lin = jacobian.linearize(softmax_no_jvp, z)
    lin.jvp(torch.ones_like(z))
    assert lin.forward_error is not None


def test_once_differentiable_function_falls_back_to_explicit_vjps():
    """No forward mode, no double backward: J from L VJPs, J·v and Jᵀu as matrix products."""
    z = torch.randn(2, 9, generator=gen(3), dtype=F64)
    lin = jacobian.linearize(stablemax_once, z)
    v = torch.randn(2, 9, generator=gen(4), dtype=F64)
    J = reference_jacobians(stablemax, z)
    close(lin.jvp(v), (J @ v.unsqueeze(-1)).squeeze(-1), "J·v from VJPs")
    assert lin.mode == "reverse_rows"
    close(lin.vjp(v), (J.transpose(-2, -1) @ v.unsqueeze(-1)).squeeze(-1), "Jᵀu from VJPs")
    result = jacobian.spectral_norm(stablemax_once, z)
    assert result.mode == "reverse_rows"
    close(result.value, torch.linalg.matrix_norm(J, 2), "spectral norm from VJPs")


def test_a_normalizer_that_raises_is_not_hidden_by_the_fallbacks():
    def broken(z):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        jacobian.spectral_norm(broken, torch.zeros(1, 3, dtype=F64))


def test_float32_rows_use_the_float32_tolerance():
    z = torch.randn(2, 30, generator=gen(1))
    result = jacobian.spectral_norm(softmax, z)
    assert result.value.dtype == torch.float32
    want = torch.linalg.matrix_norm(reference_jacobians(softmax, z.double()), 2)
    close(result.value, want, "float32 spectral norm", tol=tol_for(torch.float32))


def test_two_way_tie_attains_half_over_t_by_every_method():
    # softmax at a two-way tie (and −∞-like rest): J = (diag α − ααᵀ)/T has ‖J‖₂ = 1/(2T)
    t = 0.5
    f = lambda z: torch.softmax(z / t, dim=-1)  # noqa: E731
    z = torch.tensor([[1.0, 1.0, -60.0, -60.0]], dtype=F64)
    for method in ("lanczos", "dense", "auto"):
        close(jacobian.spectral_norm(f, z, method=method).value, [1 / (2 * t)], method)


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="method='svd'"):
        jacobian.spectral_norm(softmax, torch.zeros(3), method="svd")


def softmax_top_eigenvalue(alpha: np.ndarray) -> float:
    """λ_max of diag(α) − ααᵀ from the secular equation 1 = Σ α_i²/(α_i − λ) on (α₍₂₎, α₍₁₎)."""
    top2 = np.sort(alpha)[-2:]
    secular = lambda lam: 1.0 - np.sum(alpha**2 / (alpha - lam))  # noqa: E731
    width = top2[1] - top2[0]
    return brentq(secular, top2[0] + 1e-9 * width, top2[1] - 1e-9 * width, xtol=1e-300)


def test_spectral_norm_at_length_65536_matches_the_secular_equation():
    z = torch.randn(1, 65536, generator=gen(2), dtype=F64)
    result = jacobian.spectral_norm(softmax, z)
    want = softmax_top_eigenvalue(torch.softmax(z[0], -1).numpy())
    assert bool(result.converged)
    close(result.value[0], want, "‖J‖₂ at L = 65536")


# --------------------------------------------------------------------------------------------
# The finite-difference estimator


def test_unit_directions_are_unit_and_seeded():
    v = jacobian.unit_directions((3, 7), seed=4)
    close(torch.linalg.vector_norm(v, dim=-1), torch.ones(3), "unit rows")
    assert torch.equal(v, jacobian.unit_directions((3, 7), seed=4))


def test_fd_estimate_tends_to_the_directional_derivative():
    # δ → ‖J v‖/T as ε → 0 for f(l/T).
    z = torch.randn(2, 9, generator=gen(5), dtype=F64)
    v = jacobian.unit_directions((2, 9), seed=6)
    J = reference_jacobians(softmax, z / 0.5) / 0.5
    want = torch.linalg.vector_norm((J @ v.unsqueeze(-1)).squeeze(-1), dim=-1)
    close(
        jacobian.fd_estimate(softmax, z, v, eps=1e-7, temperature=0.5),
        want,
        "fd estimate at small ε",
        tol=tol_for(torch.float32),
    )


def test_direct_products_behind_the_boundary_agree_with_torch_func():
    """A normalizer behind the process boundary offers direct products (one request each): the
    spectral norm and the products agree with torch.func's on the same rows, masked keys too."""
    from attnverify import remote
    from attnverify.quantities import Case
    from attnverify.runconfig import make_context

    ctx = make_context("dev")
    spec = remote.open_normalizer("entmax15", {}, ctx)
    try:
        gen = torch.Generator().manual_seed(3)
        for row in (torch.randn(40, generator=gen, dtype=torch.float64),
                    torch.cat([torch.randn(20, generator=gen, dtype=torch.float64),
                               torch.full((5,), float("-inf"), dtype=torch.float64)])):
            case = Case(spec, row, 0.7)
            f, z = case.free_map
            lin = jacobian.linearize(f, z)
            assert lin.mode == "direct"
            v = torch.randn(z.shape, generator=gen, dtype=torch.float64)
            want_jv = torch.func.jvp(f.__call__, (z,), (v,))[1]
            want_vj = torch.func.vjp(f.__call__, z)[1](v)[0]
            torch.testing.assert_close(lin.jvp(v), want_jv)
            torch.testing.assert_close(lin.vjp(v), want_vj)
            direct = jacobian.spectral_norm(f, z).value
            plain = jacobian.spectral_norm(f.__call__, z).value
            torch.testing.assert_close(direct, plain, rtol=1e-6, atol=1e-9)
    finally:
        remote.channel_of(spec).close()
        remote.shutdown()


# --------------------------------------------------------------------------------------------
# Dense-then-Lanczos, and dense Jacobians behind the process boundary


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 40),
    scale=st.floats(0.001, 6.0),
    name=st.sampled_from(sorted(MAPS)),
)
def test_dense_lanczos_matches_dense_svd(seed, length, scale, name):
    """Lanczos on the dense Jacobian: a compression of J by orthonormal bases (a lower bound)
    whose residual brackets a singular value, as with products; on every map, the ones without
    forward mode (double backward, reverse rows) too."""
    f = MAPS[name]
    z = scale * torch.randn(3, length, generator=gen(seed), dtype=F64)
    J = reference_jacobians(f, z)
    sigmas = torch.linalg.svdvals(J)
    want = sigmas[:, 0]
    result = jacobian.spectral_norm(f, z, method="dense_lanczos", seed=seed)
    assert result.method == "dense_lanczos" and result.value.shape == (3,)
    assert bool(result.converged.all()), f"residual {result.residual.tolist()}"
    assert bool((result.value <= want * (1 + TOL.rtol) + TOL.atol).all())
    gap = (sigmas - result.value.unsqueeze(-1)).abs().amin(-1)
    assert bool((gap <= result.residual + TOL.atol).all())
    close(result.value, want, f"{name}, seed={seed}")


def test_dense_lanczos_equals_the_svd_on_a_hand_built_matrix():
    # f(z) = A z: J = A, not symmetric, with a known top singular value: A = U diag(s) Vᵀ
    length = 200
    g = gen(11)
    U = torch.linalg.qr(torch.randn(length, length, generator=g, dtype=F64)).Q
    V = torch.linalg.qr(torch.randn(length, length, generator=g, dtype=F64)).Q
    s = torch.linspace(0.0, 1.0, length, dtype=F64)
    s[-1], s[-2] = 2.5, 2.4999  # a close pair at the top
    A = U @ torch.diag(s) @ V.T
    f = lambda z: z @ A.T  # noqa: E731
    result = jacobian.spectral_norm(f, torch.zeros(length, dtype=F64), method="dense_lanczos")
    assert result.method == "dense_lanczos" and result.mode == "dense"
    assert bool(result.converged)
    close(result.value, 2.5, "top singular value of A")
    close(result.value, torch.linalg.matrix_norm(A, 2), "against the SVD")


def test_lanczos_on_a_hand_computed_jacobian_and_far_below_unit_scale():
    """softmax of two equal logits: J = [[1/4, -1/4], [-1/4, 1/4]], ‖J‖₂ = 1/2 exactly, for any
    temperature's 1/T; scaled by 1e-170 the norm is 5e-171: Lanczos on JᵀJ forms neither JᵀJv
    (1e-340 underflows to zero in float64) nor its scale squared."""
    for scale in (1.0, 1e-170, 1e150):
        f = lambda z, s=scale: s * torch.softmax(z, -1)  # noqa: E731
        result = jacobian.spectral_norm(f, torch.zeros(1, 2, dtype=F64), method="lanczos")
        assert bool(result.converged.all())
        assert abs(float(result.value[0]) / (0.5 * scale) - 1) < 1e-12, scale
    # a 300-key row with a known top singular value 2.5 and a close second 2.4999, times 1e-170
    length = 300
    g = gen(12)
    U = torch.linalg.qr(torch.randn(length, length, generator=g, dtype=F64)).Q
    V = torch.linalg.qr(torch.randn(length, length, generator=g, dtype=F64)).Q
    s = torch.linspace(0.0, 1.0, length, dtype=F64)
    s[-1], s[-2] = 2.5, 2.4999
    A = U @ torch.diag(s) @ V.T
    for scale in (1.0, 1e-170):
        result = jacobian.spectral_norm(lambda z, c=scale: c * (z @ A.T),
                                        torch.zeros(1, length, dtype=F64), method="lanczos")
        assert bool(result.converged.all())
        assert abs(float(result.value[0]) / (2.5 * scale) - 1) < 1e-9, scale
        gap = (s * scale - result.value[0]).abs().amin()
        assert float(gap) <= float(result.residual[0]) * (1 + 1e-9), scale  # it brackets one


def test_a_proxy_lanczos_step_is_one_request_and_its_products_are_torch_funcs():
    """Behind the process boundary a Lanczos step is one request (``normal``: J·v and Jᵀu, u the
    unit direction of J·v over the kept outputs), where separate products made two; on a
    masked row the masked keys' outputs are left out of u."""
    from attnverify import remote
    from attnverify.normalizers import BUILTINS
    from attnverify.quantities import Case
    from attnverify.runconfig import make_context

    spec = remote.open_normalizer("entmax15", {}, make_context("dev"))
    here = BUILTINS["entmax15"]
    try:
        calls = _counting(spec)
        g = gen(7)
        for row in (torch.randn(300, generator=g, dtype=F64),
                    torch.cat([torch.randn(290, generator=g, dtype=F64),
                               torch.full((10,), -math.inf, dtype=F64)])):
            f, z = Case(spec, row, 0.7).free_map
            f_here, _ = Case(here, row, 0.7).free_map
            lin = jacobian.linearize(f, z.unsqueeze(0))
            v = torch.randn(1, z.shape[-1], generator=g, dtype=F64)
            before = calls()
            jv, jtu = lin.normal(v)
            assert calls() - before == 1 and lin.mode == "direct"
            want_jv = torch.func.jvp(f_here, (z.unsqueeze(0),), (v,))[1]
            u = want_jv / torch.linalg.vector_norm(want_jv)
            close(jv, want_jv, "J·v")
            close(jtu, torch.func.vjp(f_here, z.unsqueeze(0))[1](u)[0], "Jᵀu")
            before = calls()
            result = jacobian.spectral_norm(f, z, method="lanczos")
            assert calls() - before == result.steps
            J = reference_jacobians(f_here, z)
            close(result.value, torch.linalg.matrix_norm(J, 2), "Lanczos through the proxy")
    finally:
        remote.channel_of(spec).close()
        remote.shutdown()


@pytest.mark.parametrize("name", ["wrong_jvp_softmax", "once_with_jvp"])
def test_a_proxy_lanczos_step_takes_the_backward_where_it_is_differentiable(name):
    """A Lanczos step (``normal``) makes J·v by reverse over reverse where the target's backward
    is differentiable, so both of its products come from the backward: on a softmax whose own
    forward mode forgets T, the step's J·v is the backward's (right) one, while the ``jvp``
    request, which the ``gradient`` property checks, still gives the target's forward mode.
    Where the backward is once-differentiable, the step falls back to forward mode, in the
    same one request, and later steps go there directly."""
    from pathlib import Path

    from attnverify import remote
    from attnverify.quantities import Case
    from attnverify.runconfig import make_context

    fixtures = Path(__file__).parent / "fixtures"
    module = "planted_trust.py" if name == "wrong_jvp_softmax" else "user_normalizers.py"
    spec = remote.open_normalizer(f"{fixtures / module}:{name}", {}, make_context("dev"))
    try:
        calls = _counting(spec)
        g = gen(11)
        row = torch.randn(12, generator=g, dtype=F64)
        f, z = Case(spec, row, 0.5).free_map
        z = z.unsqueeze(0)
        lin = jacobian.linearize(f, z)
        v = torch.randn(1, z.shape[-1], generator=g, dtype=F64)
        truth = torch.func.jvp(lambda x: torch.softmax(x / 0.5, -1), (z,), (v,))[1]
        u = truth / torch.linalg.vector_norm(truth)
        for _ in range(2):  # the second step knows which way works
            before = calls()
            jv, jtu = lin.normal(v)
            assert calls() - before == 1 and lin.mode == "direct"
            close(jv, truth, "J·v of a Lanczos step")
            close(jtu, torch.func.vjp(lambda x: torch.softmax(x / 0.5, -1), z)[1](u)[0], "Jᵀu")
        forward_mode = lin.jvp(v)
        if name == "wrong_jvp_softmax":
            close(forward_mode, truth * 0.5, "the target's own forward mode")
        else:
            close(forward_mode, truth, "the target's own forward mode")
    finally:
        remote.channel_of(spec).close()
        remote.shutdown()


def _counting(spec):
    monitor = spec.fn.channel.monitor
    return lambda: monitor.calls


def test_a_proxy_dense_jacobian_is_one_request_per_block_and_the_in_process_one():
    """Behind the process boundary a block of columns of J is one request (the direct
    products), where torch.func through the proxy makes two; the Jacobian is the one formed in
    this process, masked keys left out."""
    from attnverify import remote
    from attnverify.normalizers import BUILTINS
    from attnverify.quantities import Case
    from attnverify.runconfig import make_context

    spec = remote.open_normalizer("entmax15", {}, make_context("dev"))
    here = BUILTINS["entmax15"]
    try:
        calls = _counting(spec)
        g = gen(5)
        row = torch.cat([torch.randn(30, generator=g, dtype=F64),
                         torch.full((4,), -math.inf, dtype=F64)])
        for block, requests in ((None, 1), (7, 5)):
            f, z = Case(spec, row, 0.7).free_map
            f_here, _ = Case(here, row, 0.7).free_map
            before = calls()
            J = jacobian.dense_jacobian(f, z, block=block)
            assert calls() - before == requests, block
            close(J, reference_jacobians(f_here, z), f"block={block}")
            before = calls()
            norms = jacobian.entrywise_norms(f, z, block=block)
            assert calls() - before == requests
            close(norms.max_abs, J.abs().max(), "max |J|")
            before = calls()
            result = jacobian.spectral_norm(f, z, method="dense_lanczos")
            assert calls() - before == 1 and result.mode == "dense"  # one block: all columns
            close(result.value, torch.linalg.matrix_norm(J, 2), "dense Lanczos")
    finally:
        remote.channel_of(spec).close()
        remote.shutdown()


def test_a_proxy_without_forward_mode_still_gets_its_norms():
    """A target without forward mode (a classic autograd.Function with a once-differentiable
    backward): the direct products fail, torch.func fails, and the norms come from reverse
    mode as before, by every method."""
    from pathlib import Path

    from attnverify import remote
    from attnverify.quantities import Case
    from attnverify.runconfig import make_context

    target = str(Path(__file__).parent / "fixtures" / "planted_trust.py") + ":once_softmax"
    spec = remote.open_normalizer(target, {}, make_context("dev"))
    try:
        row = torch.randn(20, generator=gen(2), dtype=F64)
        f, z = Case(spec, row, 0.5).free_map
        J = reference_jacobians(lambda x: torch.softmax(x / 0.5, -1), z)
        close(jacobian.dense_jacobian(f, z), J, "dense J from VJPs")
        want = torch.linalg.matrix_norm(J, 2)
        for method in ("dense", "dense_lanczos", "lanczos"):
            result = jacobian.spectral_norm(f, z, method=method)
            close(result.value, want, method)
            assert bool(result.converged), method
    finally:
        remote.channel_of(spec).close()
        remote.shutdown()


@pytest.mark.parametrize("length", [129, 256, 1000])
def test_dense_lanczos_on_a_rank_one_jacobian_with_rounding_noise(length):
    """Two keys at 100, the rest at 0 or −100 (the battery's two-level rows): J is the two-way
    tie's [[¼, −¼], [−¼, ¼]] plus entries of e^-100, rank one up to rounding; the value is ½
    and never above it (a Krylov direction made of rounding, kept as if it were new, counts the
    top singular value twice: a block variant tried here gave 0.5007)."""
    z = torch.full((1, length), -100.0, dtype=F64)
    z[0, :2] = 100.0
    z[0, 2::3] = 0.0
    result = jacobian.spectral_norm(softmax, z, method="dense_lanczos")
    assert float(result.value) <= 0.5 * (1 + 1e-15)
    close(result.value, [0.5], "two-level row")
    assert bool(result.converged)


def test_vjp_is_autograd_grad_bit_for_bit_and_never_broadcasts():
    """:func:`attnverify.jacobian.vjp` takes ``⟨out, cotangent⟩``'s gradient: the same bits as
    ``torch.autograd.grad(out, wrt, cotangent)``, a float32 output with a float64 cotangent
    included, extreme entries too; a cotangent of another shape is an error, not broadcast."""
    g = torch.Generator().manual_seed(3)
    for dtype, cot_dtype in ((torch.float64, torch.float64), (torch.float32, torch.float64),
                             (torch.float32, torch.float32)):
        z = (torch.randn(4, 9, generator=g, dtype=F64) * 30).to(dtype).requires_grad_(True)
        out = torch.softmax(z * 1e3, -1) * torch.tanh(z)
        cot = torch.randn(4, 9, generator=g, dtype=F64).to(cot_dtype)
        cot[0, :3] = torch.tensor([1e300 if cot_dtype == F64 else 1e30, -0.0, 5e-324
                                   if cot_dtype == F64 else 1e-45])
        (want,) = torch.autograd.grad(out, z, cot.to(dtype), retain_graph=True)
        (got,) = jacobian.vjp(out, z, cot.to(dtype), retain_graph=True)
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want)), dtype
        assert torch.equal(got.isnan(), want.isnan())
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        jacobian.vjp(out, z, torch.ones(9, dtype=out.dtype))


def test_the_workers_backward_passes_are_autograd_grads_bit_for_bit():
    """The worker's vector-Jacobian products (:func:`attnverify.worker._grad`, the gradient of
    ``Σ ⟨out, cotangent⟩``): the same bits as ``torch.autograd.grad(outs, wrt, cotangents)``,
    first order and double backward (the cotangent among the inputs), float32 and float64,
    extreme entries too; a cotangent of another shape, or an output outside the graph, is an
    error, as there, never broadcast or skipped."""
    from attnverify import worker

    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float64, torch.float32):
        z = (torch.randn(4, 9, generator=g, dtype=F64) * 3).to(dtype).requires_grad_(True)
        cot = torch.randn(4, 9, generator=g, dtype=F64).to(dtype).requires_grad_(True)
        with torch.no_grad():
            cot[0, :3] = torch.tensor([1e30, -0.0, 1e-45], dtype=dtype)
        once = torch.softmax(z * 2, -1) * torch.tanh(z)
        with torch.no_grad():  # a first-order product runs with grad mode off in the worker
            (first,) = worker._grad(once, [z], cot, False)
        out = torch.softmax(z * 2, -1) * torch.tanh(z)
        want = torch.autograd.grad(out, [z], cot, create_graph=True)
        got = worker._grad(out, [z], cot, True)
        assert torch.equal(got[0], want[0]) and torch.equal(first, want[0]), dtype
        assert bool((want[0][1:] != 0).all())  # a gradient with something in it
        outer = torch.randn(4, 9, generator=g, dtype=F64).to(dtype)
        want2 = torch.autograd.grad(want, [z, cot], [outer], retain_graph=True)
        got2 = worker._grad(list(got), [z, cot], [outer], False)
        for a, b in zip(got2, want2):
            assert torch.equal(a, b) and bool((b != 0).any()), dtype
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        worker._grad(out, [z], torch.ones(9, dtype=out.dtype), False)
    with pytest.raises(RuntimeError, match="does not require grad"):
        worker._grad([out, z.detach()], [z], [torch.ones_like(out), torch.ones_like(z)], False)


def test_the_checker_never_imports_sympy():
    """No backward pass of the checker's goes through ``torch.autograd.grad``'s tensor-cotangent
    path, which imports ``torch.fx.experimental.symbolic_shapes`` and sympy (start-up time and
    memory of every command): a certification of a normalizer on one process, in a fresh
    interpreter, ends without either (the worker, a process of its own, has them)."""
    code = ("import sys; from attnverify.cli import main; "
            "code = main(['certify', 'softmax', 'ssmax', '--profile', 'dev', '--max-examples', "
            "'4', '--quiet', '--jobs', '1']); "
            "print(code, 'torch.fx.experimental.symbolic_shapes' in sys.modules, "
            "'sympy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.split()[-3:] == ["0", "False", "False"], done.stderr[-600:]
