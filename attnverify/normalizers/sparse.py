"""Sparse normalizers: sparsemax, 1.5-entmax and α-entmax.

α-entmax (Peters, Niculae & Martins 2019) solves
``argmax_{p ∈ Δ} pᵀz + H^T_α(p)``, whose solution is ``p_i = [(α−1) z_i − τ]₊^{1/(α−1)}`` with
the threshold ``τ`` fixed by ``Σ p = 1``. α = 2 is sparsemax, the Euclidean projection of ``z``
onto the simplex (Martins & Astudillo 2016); α → 1 is softmax. Outputs lie on the simplex and
have exact zeros.

Thresholds are found without a full sort where possible:

- sparsemax: Michelot's fixed point ``τ ← (Σ_{z>τ} z − 1) / |{z > τ}|`` from ``τ = max z − 1``.
  It increases monotonically and stops on the exact support (Michelot 1986), usually in a few
  steps; rows still moving after ``_MAX_FIXED_POINT`` steps are finished by the sort method.
- 1.5-entmax: Newton's method on ``f(τ) = Σ [x − τ]₊² − 1`` (convex and decreasing, so the
  iterates rise monotonically to the root) until the support is stable, then the exact
  closed form on that support, verified; unverified rows use the sort method.
- α-entmax: bisection on τ ∈ [−1, 0) with as many steps as the dtype has mantissa bits,
  then the row is renormalised (as ``entmax_bisect`` does).

Scores are shifted by the row maximum first (all three maps are shift-invariant), so huge
logits do not lose the threshold to rounding. Backward and forward-mode derivatives use the
closed-form Jacobian ``J = diag(s) − s sᵀ / Σ s`` with ``s = p^{2−α}`` on the support.
"""

from __future__ import annotations

import math

import torch

from attnverify.normalizers.dense import softmax
from attnverify.normalizers.rows import NEG_INF, check_temperature, finish, prepare, row_max

_MAX_FIXED_POINT = 24


# --------------------------------------------------------------------------------------------
# Thresholds on rows along the last dimension, already shifted so that each row's max is 0.


def _shift(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift rows (last dim) to max 0; returns the shifted rows and the fully-masked flags."""
    m = z.amax(dim=-1, keepdim=True)
    dead = ~torch.isfinite(m)
    return z - torch.where(dead, torch.zeros_like(m), m), dead


def _sparsemax_sorted_tau(x: torch.Tensor) -> torch.Tensor:
    """Sort-based sparsemax threshold for rows of ``x`` (reference and fallback)."""
    srt, _ = torch.sort(x, dim=-1, descending=True)
    k = torch.arange(1, x.shape[-1] + 1, device=x.device, dtype=x.dtype)
    csum = torch.where(torch.isfinite(srt), srt, torch.zeros_like(srt)).cumsum(-1) - 1.0
    support = (k * srt > csum) & torch.isfinite(srt)
    size = support.sum(-1, keepdim=True).clamp_min(1)
    return csum.gather(-1, size - 1) / size.to(x.dtype)


def _sparsemax_tau(x: torch.Tensor) -> torch.Tensor:
    """Michelot's fixed point for the sparsemax threshold (rows of max 0, last dim)."""
    tau = torch.full_like(x[..., :1], -1.0)
    count = torch.full_like(tau, x.shape[-1] + 1.0)
    for _ in range(_MAX_FIXED_POINT):
        support = x > tau
        new_count = support.sum(-1, keepdim=True).to(x.dtype)
        tau = (torch.where(support, x, torch.zeros_like(x)).sum(-1, keepdim=True) - 1.0) / new_count
        if bool((new_count == count).all()):
            return tau
        count = new_count
    moving = (new_count != count).squeeze(-1)
    tau[moving] = _sparsemax_sorted_tau(x[moving])
    return tau


def _entmax15_sorted_tau(x: torch.Tensor) -> torch.Tensor:
    """Sort-based 1.5-entmax threshold (Peters et al. 2019, Alg. 2) for rows of ``x``."""
    srt, _ = torch.sort(x, dim=-1, descending=True)
    finite = torch.isfinite(srt)
    v = torch.where(finite, srt, torch.zeros_like(srt))
    k = torch.arange(1, x.shape[-1] + 1, device=x.device, dtype=x.dtype)
    mean = v.cumsum(-1) / k
    mean_sq = (v * v).cumsum(-1) / k
    delta = (1.0 - k * (mean_sq - mean * mean)) / k
    tau = mean - torch.sqrt(delta.clamp_min(0.0))
    support = (tau <= srt) & finite
    size = support.sum(-1, keepdim=True).clamp_min(1)
    return tau.gather(-1, size - 1)


def _entmax15_closed_form(x: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """τ with ``Σ_S (x − τ)² = 1`` and ``τ < mean_S x``, for a given support S."""
    k = support.sum(-1, keepdim=True).to(x.dtype).clamp_min(1.0)
    v = torch.where(support, x, torch.zeros_like(x))
    mean = v.sum(-1, keepdim=True) / k
    ss = torch.where(support, (x - mean) ** 2, torch.zeros_like(x)).sum(-1, keepdim=True)
    return mean - torch.sqrt(((1.0 - ss) / k).clamp_min(0.0))


def _entmax15_tau(x: torch.Tensor) -> torch.Tensor:
    """Newton from below on ``Σ[x − τ]₊² = 1``, then the exact closed form on the support."""
    tau = torch.full_like(x[..., :1], -1.0)
    count = torch.full_like(tau, -1.0)
    for _ in range(_MAX_FIXED_POINT):
        gap = (x - tau).clamp_min(0.0)
        f = (gap * gap).sum(-1, keepdim=True) - 1.0
        tau = tau + f / (2.0 * gap.sum(-1, keepdim=True))
        new_count = (x > tau).sum(-1, keepdim=True).to(x.dtype)
        if bool((new_count == count).all()):
            break
        count = new_count
    exact = _entmax15_closed_form(x, x > tau)
    inside = torch.where(x > tau, x, torch.full_like(x, float("inf"))).amin(-1, keepdim=True)
    outside = torch.where(x > tau, torch.full_like(x, NEG_INF), x).amax(-1, keepdim=True)
    bad = ((exact >= inside) | (exact < outside)).squeeze(-1)
    if bool(bad.any()):
        exact[bad] = _entmax15_sorted_tau(x[bad])
    return exact


def _mantissa_bits(dtype: torch.dtype) -> int:
    return int(round(-math.log2(torch.finfo(dtype).eps)))


def _bisect_tau(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """τ for α-entmax on ``x = (α−1)(z − max z)``: the root in [−1, 0) of the decreasing
    ``f(τ) = Σ (x − τ)₊^p − 1``, ``p = 1/(α−1)``.

    For α < 2 (``p > 1``) ``f`` is convex, so Newton's method from a point left of the root
    climbs to it without passing it: bisection to a bracket of ``2^-b`` (``b`` a quarter of the
    dtype's mantissa bits), then Newton steps from the bracket's left end, each kept inside the
    bracket and never backwards, until no row moves; a few steps where full bisection takes
    the mantissa's length in steps, each a power of every entry. For α > 2 ``f`` is not convex
    across the support's edges: bisection to the dtype's resolution."""
    lo = torch.full_like(x[..., :1], -1.0)
    width = 1.0
    power = 1.0 / (alpha - 1.0)
    bits = _mantissa_bits(x.dtype)
    newton = power > 1.0
    for _ in range(bits // 4 if newton else bits + 2):
        width /= 2.0
        mid = lo + width
        total = ((x - mid).clamp_min(0.0) ** power).sum(-1, keepdim=True)
        lo = torch.where(total >= 1.0, mid, lo)
    if not newton:
        return lo
    hi = lo + width
    for _ in range(NEWTON_STEPS):
        d = (x - lo).clamp_min(0.0)
        lower = d ** (power - 1.0)
        total = (lower * d).sum(-1, keepdim=True)
        slope = power * lower.sum(-1, keepdim=True)  # −f′(τ) > 0: the row's max is 0 > τ
        step = (total - 1.0) / slope
        new = torch.where(step > 0, torch.minimum(lo + step, hi), lo)
        if torch.equal(new, lo):
            break
        lo = new
    return lo


#: At most this many Newton steps after the bisection (:func:`_bisect_tau`); converging
#: quadratically from a bracket of 2^-13, a row needs a handful.
NEWTON_STEPS = 40


# --------------------------------------------------------------------------------------------
# Forward solvers: rows along ``dim``, any batch shape, returning weights.


def _solve_sparsemax(z: torch.Tensor) -> torch.Tensor:
    x, dead = _shift(z)
    p = (x - _sparsemax_tau(x)).clamp_min(0.0)
    return p.masked_fill(dead, 0.0)


def _solve_entmax15(z: torch.Tensor) -> torch.Tensor:
    x, dead = _shift(z)
    x = x * 0.5
    p = (x - _entmax15_tau(x)).clamp_min(0.0) ** 2
    return p.masked_fill(dead, 0.0)


def _solve_bisect(z: torch.Tensor, alpha: float) -> torch.Tensor:
    x, dead = _shift(z)
    x = x * (alpha - 1.0)
    p = (x - _bisect_tau(x, alpha)).clamp_min(0.0) ** (1.0 / (alpha - 1.0))
    p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return p.masked_fill(dead, 0.0)


def _solve(z: torch.Tensor, dim: int, alpha: float) -> torch.Tensor:
    z = z.movedim(dim, -1).contiguous()
    if alpha == 2.0:
        p = _solve_sparsemax(z)
    elif alpha == 1.5:
        p = _solve_entmax15(z)
    else:
        p = _solve_bisect(z, alpha)
    return p.movedim(-1, dim)


# --------------------------------------------------------------------------------------------
# Autograd: closed-form Jacobian-vector products, usable by torch.func (jvp, vjp, vmap).


def _support_weights(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s = p^{2−α}`` on the support, 0 off it.

    For α < 2 a plain power already gives exact zeros off the support. Under double backward
    (grad mode on inside ``backward``) the power is clamped first, so that
    ``d/dp p^{2−α} = ∞`` at ``p = 0`` cannot turn into NaN.
    """
    # p ≥ 0, so sign(p) is the support's indicator (1 on it, 0 off it): one cheap pass.
    if alpha == 2.0:
        return torch.sign(p)
    tiny = torch.finfo(p.dtype).tiny
    if alpha == 1.5 and not torch.is_grad_enabled():
        # sqrt(clamp(p, tiny)), zeroed off the support by sign(p): torch's sqrt of 0 took 5× its
        # time on other inputs on the benchmark CPU, and most of p is 0. (A subnormal
        # p ∈ (0, tiny) gets sqrt(tiny), 1e-19 in float32: far below tolerance.) Not for other
        # α: there pow of 0 is fast and pow of tiny values 3× slower.
        return p.clamp_min(tiny).sqrt_().mul_(torch.sign(p))
    if alpha < 2.0 and not torch.is_grad_enabled():
        return p ** (2.0 - alpha)
    return torch.where(p > 0, p.clamp_min(tiny) ** (2.0 - alpha), torch.zeros_like(p))


def _jacobian_apply(p: torch.Tensor, v: torch.Tensor, dim: int, alpha: float) -> torch.Tensor:
    """``J v`` with ``J = diag(s) − s sᵀ / Σ s``, ``s = p^{2−α}`` on the support (J symmetric)."""
    s = _support_weights(p, alpha)
    sv = s * v
    total = s.sum(dim, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return sv.addcmul_(s, sv.sum(dim, keepdim=True) / total, value=-1.0)


class _Entmax(torch.autograd.Function):
    @staticmethod
    def forward(z, dim, alpha):
        return _solve(z, dim, alpha)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, dim, alpha = inputs
        ctx.dim, ctx.alpha = dim, alpha
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _jacobian_apply(p, grad, ctx.dim, ctx.alpha), None, None

    @staticmethod
    def jvp(ctx, dz, _dim, _alpha):
        (p,) = ctx.saved_tensors
        return _jacobian_apply(p, dz, ctx.dim, ctx.alpha)

    @staticmethod
    def vmap(info, in_dims, z, dim, alpha):
        z = z.movedim(in_dims[0], 0) if in_dims[0] is not None else z
        inner = dim if dim < 0 else dim + 1
        return _Entmax.apply(z, inner, alpha), 0


def _entmax(scores: torch.Tensor, dim: int, alpha: float, temperature: float) -> torch.Tensor:
    x = prepare(scores)
    if x.numel() == 0:
        return finish(x.clone(), scores)
    check_temperature(temperature)
    if temperature != 1.0:  # (z − max z)/T: a near tie of z stays resolved at a small T
        x = (x - row_max(x, dim)) / temperature
    return finish(_Entmax.apply(x, dim, float(alpha)), scores)


def sparsemax(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Sparsemax: the Euclidean projection of ``z/T`` onto the simplex, ``[z/T − τ]₊``.

    Output: the simplex with exact zeros; shift-invariant and order-preserving. Threshold by
    Michelot's fixed point (sort fallback). A fully masked row returns zeros.
    Source: Martins & Astudillo 2016, arXiv:1602.02068.
    """
    return _entmax(scores, dim, 2.0, temperature)


def entmax15(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """1.5-entmax: ``[(z/T)/2 − τ]₊²`` with τ such that the row sums to 1.

    Output: the simplex with exact zeros (sparser than softmax, denser than sparsemax).
    Threshold by Newton's method then the exact closed form on the support (sort fallback).
    Source: Peters, Niculae & Martins 2019, arXiv:1905.05702.
    """
    return _entmax(scores, dim, 1.5, temperature)


def entmax_alpha(
    scores: torch.Tensor, dim: int = -1, alpha: float = 1.5, temperature: float = 1.0
) -> torch.Tensor:
    """α-entmax for any α ≥ 1: ``[(α−1) z/T − τ]₊^{1/(α−1)}``, rows summing to 1.

    α = 1 is exactly :func:`softmax` and α = 2 exactly :func:`sparsemax` (the ``entmax``
    package's bisection returns the uniform row at α = 1); α = 1.5 uses the exact 1.5-entmax
    solver; other α use bisection to the dtype's precision, then renormalise. Large α is
    ill-conditioned in float32 (``p^{2−α}`` in the Jacobian). Output: the simplex.
    Source: Peters, Niculae & Martins 2019; Blondel et al. 2020 (bisection).
    """
    alpha = float(alpha)
    if not alpha >= 1.0:
        raise ValueError(f"alpha must be >= 1, got {alpha!r}")
    check_temperature(temperature)
    if alpha == 1.0:
        return softmax(scores, dim, temperature=temperature)
    return _entmax(scores, dim, alpha, temperature)
