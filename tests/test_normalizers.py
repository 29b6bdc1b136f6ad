"""Each built-in against an independent reference, hand-computed cases, masks, dtypes, gradients.

References are written in NumPy float64 straight from the definitions in NORMALIZERS.md (sort-based
thresholds for sparsemax / entmax), independent of the torch code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnverify.normalizers import BUILTINS

NEG_INF = float("-inf")


# ------------------------------------------------------------------------------------------
# NumPy references (one row, unmasked)


def ref_softmax(z, temperature=1.0):
    e = np.exp((z - z.max()) / temperature)
    return e / e.sum()


def ref_sparsemax(z, temperature=1.0):
    z = z / temperature
    s = np.sort(z)[::-1]
    k = np.arange(1, len(z) + 1)
    cs = np.cumsum(s) - 1
    kmax = k[k * s > cs].max()
    tau = cs[kmax - 1] / kmax
    return np.maximum(z - tau, 0)


def ref_entmax(z, alpha, temperature=1.0):
    """α-entmax by high-precision bisection on τ (independent of the code under test)."""
    if alpha == 1.0:
        return ref_softmax(z, temperature)
    x = (alpha - 1) * (z / temperature)
    x = x - x.max()
    lo, hi = -1.0, 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        total = (np.maximum(x - mid, 0) ** (1 / (alpha - 1))).sum()
        lo, hi = (mid, hi) if total >= 1 else (lo, mid)
    p = np.maximum(x - lo, 0) ** (1 / (alpha - 1))
    return p / p.sum()


def ref_ssmax(z, s=0.43, temperature=1.0):
    return ref_softmax(s * math.log(len(z)) * z, temperature)


def ref_sa_softmax(z, temperature=1.0):
    z = z / temperature
    lo, hi = min(z.min(), 0.0), max(z.max(), 0.0)
    factor = (z - lo) / (hi - lo) if hi > lo else np.zeros_like(z)
    return factor * ref_softmax(z)


def ref_sigmoid(z, bias=None, temperature=1.0):
    b = -math.log(len(z)) if bias is None else bias
    return 1 / (1 + np.exp(-(z / temperature + b)))


def ref_softpick(z, eps=1e-6, temperature=1.0):
    e = np.expm1(z / temperature)
    return np.maximum(e, 0) / (np.abs(e).sum() + eps)


def ref_stablemax(z, temperature=1.0):
    x = z / temperature
    s = np.where(x >= 0, x + 1, 1 / (1 - np.minimum(x, 0)))
    return s / s.sum()


def ref_softmax1(z, temperature=1.0):
    e = np.exp(z / temperature)
    return e / (1 + e.sum())


def ref_relu_norm(z, temperature=1.0):
    r = np.maximum(z, 0)
    return r / r.sum() if r.sum() > 0 else np.zeros_like(z)


def ref_dagpam(z, lam=0.5, temperature=1.0):
    return (1 + lam) * ref_softmax(z, temperature) - lam * ref_softmax(-z, temperature)


REFERENCES = {
    "softmax": ref_softmax,
    "sparsemax": ref_sparsemax,
    "entmax15": lambda z, temperature=1.0: ref_entmax(z, 1.5, temperature),
    "entmax_alpha": lambda z, alpha=1.5, temperature=1.0: ref_entmax(z, alpha, temperature),
    "ssmax": ref_ssmax,
    "sa_softmax": ref_sa_softmax,
    "sigmoid": ref_sigmoid,
    "softpick": ref_softpick,
    "stablemax": ref_stablemax,
    "softmax1": ref_softmax1,
    "relu_norm": ref_relu_norm,
    "dagpam": ref_dagpam,
    "softmax_fused": ref_softmax,  # the fused kernel: softmax's map (tests/test_fused.py)
}
IDS = list(BUILTINS)


def run(name, z, **params):
    return BUILTINS[name](torch.as_tensor(z, dtype=torch.float64), **params).numpy()


def test_all_twelve_registered():
    assert IDS == list(REFERENCES), "BUILTINS must list the twelve of NORMALIZERS.md in order"


# ------------------------------------------------------------------------------------------
# Hand-computed cases


def test_softmax_hand_computed():
    # softmax(0, log 3) = (1, 3) / 4
    np.testing.assert_allclose(run("softmax", [0.0, math.log(3.0)]), [0.25, 0.75], rtol=1e-15)
    # temperature 2 halves the logits: softmax(0, 2 log 3 / 2)
    np.testing.assert_allclose(
        run("softmax", [0.0, 2 * math.log(3.0)], temperature=2.0), [0.25, 0.75], rtol=1e-15
    )


def test_sparsemax_hand_computed():
    # z = (1, 0.2, -1): τ = (1 + 0.2 − 1)/2 = 0.1 → (0.9, 0.1, 0)
    np.testing.assert_allclose(run("sparsemax", [1.0, 0.2, -1.0]), [0.9, 0.1, 0.0], atol=1e-15)
    # a gap ≥ 1 gives a one-hot row
    np.testing.assert_array_equal(run("sparsemax", [2.0, 1.0, 0.0]), [1.0, 0.0, 0.0])


def test_entmax15_hand_computed():
    # z = (2, 0): x = z/2 = (1, 0); τ = 0 gives (1−0)² = 1 and x₂ = 0 ≤ τ → (1, 0)
    np.testing.assert_allclose(run("entmax15", [2.0, 0.0]), [1.0, 0.0], atol=1e-15)
    # ties: uniform
    np.testing.assert_allclose(run("entmax15", [0.3, 0.3, 0.3, 0.3]), [0.25] * 4, atol=1e-15)


def test_stablemax_hand_computed():
    # s(1) = 2, s(0) = 1, s(-1) = 1/2 → (2, 1, 0.5) / 3.5
    np.testing.assert_allclose(
        run("stablemax", [1.0, 0.0, -1.0]), np.array([2, 1, 0.5]) / 3.5, rtol=1e-15
    )


def test_softmax1_hand_computed():
    # exp(0)/(1 + exp(0) + exp(0)) = 1/3 each
    np.testing.assert_allclose(run("softmax1", [0.0, 0.0]), [1 / 3, 1 / 3], rtol=1e-15)


def test_softpick_hand_computed():
    # e^{log 3} − 1 = 2, e^{−log 2} − 1 = −1/2: weights (2, 0) / (2.5 + eps)
    out = run("softpick", [math.log(3.0), -math.log(2.0)], eps=0.0)
    np.testing.assert_allclose(out, [0.8, 0.0], rtol=1e-15)


def test_sa_softmax_hand_computed():
    # z = (1, -1): lo = -1, hi = 1 → factor (1, 0); softmax(1, -1) = (e², 1)/(e² + 1)
    np.testing.assert_allclose(
        run("sa_softmax", [1.0, -1.0]), [math.e**2 / (math.e**2 + 1), 0.0], rtol=1e-15
    )


def test_ssmax_is_not_the_broken_port():
    z = np.array([1.0, 0.0, -0.5, 0.25])
    assert not np.allclose(run("ssmax", z), ref_softmax(z)), "ssmax must not equal softmax"
    np.testing.assert_allclose(run("ssmax", z), ref_ssmax(z), rtol=1e-14)


def test_dagpam_range_and_sum():
    z = np.array([3.0, -3.0, 0.0])
    out = run("dagpam", z, lam=0.5)
    assert out.min() < 0, "daGPAM must be able to give negative weights"
    assert abs(out.sum() - 1) < 1e-15 and out.min() >= -0.5 and out.max() <= 1.5


def test_sigmoid_default_bias():
    # σ(0 − log 4) = 1/(1 + 4) = 0.2
    np.testing.assert_allclose(run("sigmoid", [0.0] * 4), [0.2] * 4, rtol=1e-15)


def test_relu_norm_no_positive_row_policy():
    np.testing.assert_array_equal(run("relu_norm", [-1.0, 0.0, -2.0]), [0.0, 0.0, 0.0])


# ------------------------------------------------------------------------------------------
# Random rows against the references, fp64


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_random_rows_match_reference(name, temperature):
    rng = np.random.default_rng(sum(map(ord, name)))
    for length in (1, 2, 5, 33, 200):
        for scale in (0.1, 1.0, 5.0):
            z = rng.normal(size=length) * scale
            got = run(name, z, temperature=temperature)
            want = REFERENCES[name](z, temperature=temperature)
            np.testing.assert_allclose(
                got, want, rtol=1e-9, atol=1e-12, err_msg=f"{name} L={length} scale={scale}"
            )


@pytest.mark.parametrize("alpha", [1.0, 1.2, 1.5, 1.8, 2.0, 3.0])
def test_entmax_alpha_matches_reference(alpha):
    rng = np.random.default_rng(7)
    z = rng.normal(size=50) * 2
    np.testing.assert_allclose(run("entmax_alpha", z, alpha=alpha), ref_entmax(z, alpha), atol=1e-9)


@pytest.mark.parametrize("alpha", [1.01, 1.25, 1.75, 1.999, 2.5, 4.0])
def test_entmax_alpha_threshold_hand_computed(alpha):
    """τ of α-entmax on ``x = (α−1)(z − max z)``: a row of L equal keys has ``p = 1/L``, so
    ``τ = −(1/L)^{α−1}``; two keys at 0 and the rest far below (outside the support) give
    ``τ = −(1/2)^{α−1}``. For α < 2 the bisection is finished by Newton's method, for α > 2 it
    runs to the end: both to within a few ulps of the exact value."""
    from attnverify.normalizers.sparse import _bisect_tau

    for length in (1, 2, 7, 4096):
        x = torch.zeros(1, length, dtype=torch.float64)
        want = -(1.0 / length) ** (alpha - 1.0)
        assert float(_bisect_tau(x, alpha)) == pytest.approx(want, rel=1e-14, abs=1e-15)
    x = torch.full((1, 9), -(alpha - 1.0) * 50.0, dtype=torch.float64)
    x[0, :2] = 0.0
    want = -(0.5) ** (alpha - 1.0)
    assert float(_bisect_tau(x, alpha)) == pytest.approx(want, rel=1e-14, abs=1e-15)


@pytest.mark.parametrize("alpha", [1.01, 1.25, 1.75, 1.999])
def test_entmax_alpha_newton_agrees_with_full_bisection(alpha):
    """The Newton finish lands where bisection to float64 resolution does, on rows of every
    scale (ties, a two-key top, spread rows) and in float32."""
    from attnverify.normalizers import sparse

    def bisection(x):
        lo, width, power = torch.full_like(x[..., :1], -1.0), 1.0, 1.0 / (alpha - 1.0)
        for _ in range(sparse._mantissa_bits(x.dtype) + 2):
            width /= 2.0
            mid = lo + width
            lo = torch.where(((x - mid).clamp_min(0.0) ** power).sum(-1, keepdim=True) >= 1.0,
                             mid, lo)
        return lo

    g = torch.Generator().manual_seed(5)
    for length in (2, 3, 50, 1000):
        for scale in (1e-4, 1.0, 40.0):
            z = torch.randn(6, length, generator=g, dtype=torch.float64) * scale
            z[0] = 0.0
            z[1, :2] = 3 * scale
            x = (alpha - 1.0) * (z - z.amax(-1, keepdim=True))
            torch.testing.assert_close(sparse._bisect_tau(x, alpha), bisection(x),
                                       rtol=0, atol=1e-14)
            x32 = x.float()
            torch.testing.assert_close(sparse._bisect_tau(x32, alpha), bisection(x32),
                                       rtol=0, atol=4e-7)


def test_entmax_alpha_endpoints_are_exact():
    z = torch.randn(8, 31, dtype=torch.float64)
    sm, sp, ea = BUILTINS["softmax"], BUILTINS["sparsemax"], BUILTINS["entmax_alpha"]
    torch.testing.assert_close(ea(z, alpha=1.0), sm(z), rtol=0, atol=0)
    torch.testing.assert_close(ea(z, alpha=2.0), sp(z), rtol=0, atol=0)


def test_entmax_package_oracle_where_it_is_right():
    entmax = pytest.importorskip("entmax")
    z = torch.randn(16, 300, dtype=torch.float64) * 3
    torch.testing.assert_close(BUILTINS["sparsemax"](z), entmax.sparsemax(z, dim=-1))
    torch.testing.assert_close(BUILTINS["entmax15"](z), entmax.entmax15(z, dim=-1))
    ours = BUILTINS["entmax_alpha"](z, alpha=1.3)
    theirs = entmax.entmax_bisect(z, alpha=1.3, dim=-1, n_iter=80)
    torch.testing.assert_close(ours, theirs)


def test_sparse_solvers_fall_back_on_adversarial_rows():
    # geometric spacing makes Michelot's fixed point walk one element per step (> 24 steps)
    z = torch.tensor([[-(2.0**-k) * 0.03 for k in range(64)]], dtype=torch.float64)
    z = z + torch.linspace(0, 1e-9, 64, dtype=torch.float64)
    for name in ("sparsemax", "entmax15"):
        want = REFERENCES[name](z[0].numpy())
        np.testing.assert_allclose(BUILTINS[name](z)[0].numpy(), want, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Dimensions, batches, masks


@pytest.mark.parametrize("name", IDS)
def test_any_dim_and_batch_shape(name):
    spec = BUILTINS[name]
    x = torch.randn(3, 5, 7, 4, dtype=torch.float64)
    want = spec(x, dim=-1)
    for dim in (0, 1, 2):
        moved = x.movedim(-1, dim)
        got = spec(moved, dim=dim)
        assert got.shape == moved.shape
        torch.testing.assert_close(got.movedim(dim, -1), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", IDS)
def test_masked_key_is_zero_and_others_unchanged(name):
    spec = BUILTINS[name]
    z = torch.tensor([0.7, -1.2, 2.0, 0.1, -0.3], dtype=torch.float64)
    for k in range(5):
        masked = z.clone()
        masked[k] = NEG_INF
        out = spec(masked)
        keep = torch.arange(5) != k
        assert out[k].item() == 0.0, f"{name}: masked key {k} got {out[k].item()}"
        torch.testing.assert_close(out[keep], spec(z[keep]), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_fully_masked_row_returns_zeros(name, dtype):
    x = torch.randn(3, 6).to(dtype)
    x[1] = NEG_INF
    out = BUILTINS[name](x)
    assert out.dtype == dtype
    assert torch.equal(out[1], torch.zeros(6, dtype=dtype)), f"{name}: {out[1]}"
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", IDS)
def test_fully_masked_row_has_finite_gradient(name):
    x = torch.randn(2, 5, dtype=torch.float64)
    x[0] = NEG_INF
    x.requires_grad_(True)
    BUILTINS[name](x).square().sum().backward()
    assert torch.isfinite(x.grad[1]).all()
    assert torch.equal(x.grad[0], torch.zeros(5, dtype=torch.float64))


# ------------------------------------------------------------------------------------------
# Dtypes and huge logits


TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6}


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_dtypes_match_float64(name, dtype):
    x = (torch.randn(4, 64, dtype=torch.float64) * 2).to(dtype)
    out = BUILTINS[name](x)
    assert out.dtype == dtype and out.shape == x.shape
    want = BUILTINS[name](x.to(torch.float64))
    torch.testing.assert_close(out.to(torch.float64), want, rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("magnitude", [1e4, 1e30])
def test_huge_logits_stay_finite(name, magnitude):
    x = torch.tensor([[magnitude, -magnitude, 0.5 * magnitude, 0.0]], dtype=torch.float32)
    out = BUILTINS[name](x)
    assert torch.isfinite(out).all(), f"{name} at ±{magnitude}: {out}"
    if BUILTINS[name].space == "simplex":
        assert abs(out.sum().item() - 1.0) < 1e-5, f"{name} row sum {out.sum().item()}"


def test_huge_logits_keep_the_winner():
    x = torch.tensor([[1e4, -1e4, 0.0]], dtype=torch.float32)
    for name in ("softmax", "sparsemax", "entmax15", "entmax_alpha", "ssmax", "stablemax"):
        out = BUILTINS[name](x)
        assert out[0, 0].item() > 0.99, f"{name}: {out}"


@pytest.mark.parametrize("name", IDS)
def test_does_not_mutate_input(name):
    x = torch.randn(3, 9)
    x[0, 2] = NEG_INF
    before = x.clone()
    BUILTINS[name](x)
    assert torch.equal(x, before)


def test_bad_parameters_raise_value_error():
    x = torch.randn(4)
    with pytest.raises(ValueError, match="temperature"):
        BUILTINS["softmax"](x, temperature=0.0)
    with pytest.raises(ValueError, match="alpha"):
        BUILTINS["entmax_alpha"](x, alpha=0.5)


# ------------------------------------------------------------------------------------------
# Gradients


def _away_from_kinks(name, length, seed):
    """Rows whose values avoid the non-differentiable points of each map."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, length, generator=g, dtype=torch.float64)
    if name in ("relu_norm", "softpick", "sa_softmax", "stablemax"):
        x = x + torch.sign(x) * 0.2  # keep away from 0
    return x.requires_grad_(True)


@pytest.mark.parametrize("name", IDS)
def test_gradcheck(name):
    x = _away_from_kinks(name, 6, 0)
    spec = BUILTINS[name]
    assert torch.autograd.gradcheck(lambda t: spec(t, temperature=0.7), (x,))


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_alpha"])
def test_forward_mode_and_vmap(name):
    spec = BUILTINS[name]
    x = torch.randn(3, 8, dtype=torch.float64)
    v = torch.randn(3, 8, dtype=torch.float64)
    _, jvp = torch.func.jvp(lambda t: spec(t), (x,), (v,))
    jac = torch.autograd.functional.jacobian(lambda t: spec(t[None])[0], x[0])
    torch.testing.assert_close(jvp[0], jac @ v[0])
    batched = torch.func.vmap(lambda t: spec(t))(x)
    torch.testing.assert_close(batched, spec(x))


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_alpha"])
def test_double_backward(name):
    x = torch.randn(1, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: BUILTINS[name](t), (x,))


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_jacobian_support_weights_fast_path_is_exact(alpha, dtype):
    """``p^{2−α}`` on the support and exactly 0 off it, whichever path computes it: the backward's
    fast path (grad mode off: clamp, power, times sign(p)) and the double-backward one."""
    from attnverify.normalizers import sparse

    p = torch.tensor([[0.0, 0.25, 0.0, 0.7, 0.05, 0.0]], dtype=dtype)
    expected = torch.where(p > 0, p.clamp_min(1e-300) ** (2.0 - alpha), torch.zeros_like(p))
    with torch.no_grad():
        fast = sparse._support_weights(p, alpha)
    with torch.enable_grad():
        slow = sparse._support_weights(p, alpha)
    for s in (fast, slow):
        torch.testing.assert_close(s, expected, rtol=2 * torch.finfo(dtype).eps, atol=0)
        assert (s[p == 0] == 0).all()


@pytest.mark.parametrize("name", ["dagpam", "sa_softmax", "ssmax"])
def test_softmax_based_maps_apply_the_temperature_after_the_shift(name):
    """z/T first overflows (−3e38/0.5 = −inf, a row that looks fully masked: dagpam's rows then
    summed to 0, not 1) and rounds away differences near 1e6; softmax's own (z − max)/T does not."""
    fn = BUILTINS[name]
    huge = torch.tensor([[-3e38, -2e38]])
    big = torch.tensor([[1e6 + 1, 1e6 + 2, 1e6, 1e6 - 3]])
    for z, t in ((huge, 0.5), (big, 0.3)):
        zd = z.double()
        p = torch.softmax((zd - zd.amax(-1, keepdim=True)) / t, -1)
        if name == "ssmax":  # s·log(n)·z, n = 2 and 4 keys: the shift is scaled too
            c = 0.43 * math.log(z.shape[-1])
            expected = torch.softmax(c * (zd - zd.amax(-1, keepdim=True)) / t, -1)
        elif name == "dagpam":
            q = torch.softmax((zd.amin(-1, keepdim=True) - zd) / t, -1)
            expected = 1.5 * p - 0.5 * q
        else:
            lo, hi = zd.amin(-1, keepdim=True).clamp_max(0), zd.amax(-1, keepdim=True).clamp_min(0)
            expected = (zd - lo) / (hi - lo) * p
        torch.testing.assert_close(fn(z, temperature=t).double(), expected, rtol=1e-5, atol=1e-6)
