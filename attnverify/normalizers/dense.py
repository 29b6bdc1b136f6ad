"""Dense normalizers: softmax and the maps built around it or in its place.

Every function maps scores along ``dim`` (``-inf`` = masked key) to weights of the same shape and
dtype; see :mod:`attnverify.normalizers.rows` for the masking and precision conventions.
"""

from __future__ import annotations

import math

import torch

from attnverify.normalizers.rows import (
    NEG_INF,
    check_temperature,
    finish,
    fully_masked,
    masked,
    prepare,
    row_max,
    safe_divide,
    unmasked_count,
)


def softmax(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Softmax with temperature: ``α_i = exp(z_i/T) / Σ_j exp(z_j/T)``.

    Output: the probability simplex (every weight > 0 for unmasked keys, rows sum to 1).
    Claims: simplex, shift invariance, order preservation; it is the general normalizer of
    Mudarisov et al. 2025 (arXiv:2508.17821) with ``F = exp(l/T)``, so Lemma 1, Corollary 1,
    Lemma 2 and the corrected Corollary 3 apply.

    Runs ``torch.softmax`` (max-shifted; half types accumulate in float32 inside it). With a
    temperature the row maximum is subtracted before dividing, ``(z − max z)/T``: the same
    values as ``z/T`` up to the shift softmax ignores, but large scores neither overflow
    (``−3e38/0.5`` is ``−inf`` in float32) nor lose their differences to the rounding of
    ``z/T``. The shift is detached (softmax's gradient does not see it) and is 0 for a row
    without a finite maximum, so masked, NaN and +inf rows keep their meaning. A fully masked
    row, where ``torch.softmax`` gives NaN, returns zeros: only such rows are recomputed, found
    from the first column, so the common path costs one kernel. The fused CPU kernel is a
    separate target, ``softmax_fused`` (:mod:`attnverify.normalizers.fused`).
    """
    check_temperature(temperature)
    x = scores
    if temperature != 1.0:
        x = prepare(scores)
        x = (x - row_max(x, dim)) / temperature
    y = torch.softmax(x, dim)
    return finish(_zero_masked_rows(x, y, dim), scores)


def _zero_masked_rows(x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """Replace the NaN rows that ``torch.softmax`` gives for fully masked rows by zeros."""
    if y.numel() == 0 or not bool(torch.isnan(y.narrow(dim, 0, 1)).any()):
        return y
    bad = fully_masked(x, dim)
    if not bool(bad.any()):
        return y
    safe = torch.softmax(x.masked_fill(bad, 0.0), dim)
    return safe.masked_fill(bad, 0.0)


def ssmax(
    scores: torch.Tensor, dim: int = -1, s: float = 0.43, temperature: float = 1.0
) -> torch.Tensor:
    """Scalable-Softmax: ``softmax(s · log(n) · z / T)``, n = number of unmasked keys in the row.

    Output: the simplex. Length-aware: the scale grows with log n so that a fixed-margin peak
    keeps its weight as the context grows, escaping Lemma 1's 1/L decay. Not the broken port
    ``exp(z − s·log n)``, which is identical to softmax.
    Source: Nakanishi 2025, arXiv:2501.19399.
    """
    check_temperature(temperature)
    x = prepare(scores)  # the temperature goes to softmax, applied after its shift
    n = unmasked_count(x, dim).clamp_min(1.0)
    # shifted before scaling too (softmax ignores the shift): s·log(n)·z would round away the
    # differences of scores near 1e6 before softmax could subtract their maximum
    shifted = x - row_max(x, dim)
    scaled = torch.where(masked(x), NEG_INF, (s * torch.log(n)) * shifted)
    return finish(softmax(scaled, dim, temperature=temperature), scores)


def softmax1(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Softmax₁ ("quiet attention", a learned sink): ``exp(z_i) / (1 + Σ_j exp(z_j))``.

    Output: the sub-simplex (weights > 0, rows sum to less than 1; a row of very negative scores
    attends to nothing). Max-shifted by ``m = max(0, max z)``, which shifts the ``+1`` to
    ``exp(−m)`` too, so neither term overflows. A fully masked row gives zeros naturally.
    """
    x = prepare(scores, temperature)
    m = row_max(x, dim).clamp_min(0.0)
    e = torch.exp(x - m)
    return finish(e / (torch.exp(-m) + e.sum(dim=dim, keepdim=True)), scores)


def sa_softmax(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Self-Adjust Softmax: ``(z − min(z_min, 0)) / (max(0, z_max) − min(z_min, 0)) ⊙ softmax(z)``.

    Output: nonnegative and not normalised (each weight is softmax scaled by a factor in
    [0, 1], so rows sum to at most 1). Masked keys give 0, not ``−inf · 0 = NaN``; a row whose
    unmasked scores are all 0 has a 0/0 factor, taken as 0 (declared policy), so it gives zeros.
    Source: Zheng et al. 2025, arXiv:2502.18277.
    """
    # The factor is scale-invariant, so it is computed on z itself; the temperature goes to
    # softmax, which applies it after the shift (z/T first would overflow for huge z).
    check_temperature(temperature)
    x = prepare(scores)
    mask = masked(x)
    finite = torch.where(mask, torch.zeros_like(x), x)
    lo = torch.where(mask, torch.full_like(x, math.inf), x).amin(dim=dim, keepdim=True)
    lo = lo.clamp_max(0.0)
    hi = x.amax(dim=dim, keepdim=True).clamp_min(0.0)
    factor = torch.where(mask, torch.zeros_like(x), safe_divide(finite - lo, hi - lo))
    return finish(factor * softmax(x, dim, temperature=temperature), scores)


def sigmoid(
    scores: torch.Tensor, dim: int = -1, bias: float | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """Sigmoid attention: ``σ(z/T + b)`` with ``b = −log n`` by default (n = unmasked keys).

    Output: nonnegative, not normalised (each weight in (0, 1) independently). With the default
    bias the row total stays O(1) as the context grows. Masked keys give σ(−inf) = 0 and do not
    count in n. Source: Ramapuram et al. 2024, arXiv:2409.04431.
    """
    x = prepare(scores, temperature)
    if bias is None:
        b = -torch.log(unmasked_count(x, dim).clamp_min(1.0))
    else:
        b = torch.as_tensor(float(bias), dtype=x.dtype, device=x.device)
    return finish(torch.sigmoid(x + b), scores)


def softpick(
    scores: torch.Tensor, dim: int = -1, eps: float = 1e-6, temperature: float = 1.0
) -> torch.Tensor:
    """Softpick: ``ReLU(e^z − 1) / (Σ_j |e^{z_j} − 1| + ε)``.

    Output: the sub-simplex with exact zeros (keys with z ≤ 0 get 0; rows sum to at most 1).
    Computed max-shifted by ``m = max(0, max z)``: numerator and denominator are multiplied by
    ``e^{−m}``, so ``e^{z−m} − e^{−m}`` never overflows; for |z| < 1 the term is
    ``e^{−m}·expm1(z)``, since ``e^z − 1`` cancels there (tiny bfloat16 scores lost every digit).
    Masked keys are left out of the denominator (a plain port adds |0 − 1| = 1 per masked key).
    Source: Zuhri et al. 2025, arXiv:2504.20966.
    """
    x = prepare(scores, temperature)
    m = row_max(x, dim).clamp_min(0.0)
    near = x.abs() < 1.0
    small = torch.exp(-m) * torch.expm1(torch.where(near, x, torch.zeros_like(x)))
    shifted = torch.where(near, small, torch.exp(x - m) - torch.exp(-m))
    shifted = torch.where(masked(x), torch.zeros_like(x), shifted)
    den = shifted.abs().sum(dim=dim, keepdim=True) + eps * torch.exp(-m)
    return finish(torch.relu(shifted) / den, scores)


def stablemax_s(x: torch.Tensor) -> torch.Tensor:
    """``s(x) = x + 1`` for x ≥ 0 and ``1 / (1 − x)`` for x < 0: positive, increasing, C¹."""
    return torch.where(x >= 0, x.clamp_min(0.0) + 1.0, 1.0 / (1.0 - x.clamp_max(0.0)))


def stablemax_ds(x: torch.Tensor) -> torch.Tensor:
    """Derivative of :func:`stablemax_s`: 1 for x ≥ 0, ``1 / (1 − x)²`` for x < 0."""
    return torch.where(x >= 0, torch.ones_like(x), (1.0 - x.clamp_max(0.0)) ** -2)


def stablemax(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Stablemax: ``s(z_i/T) / Σ_j s(z_j/T)`` with ``s`` from :func:`stablemax_s`.

    Output: the simplex (all unmasked weights > 0). A general normalizer with a strictly positive,
    length-independent ``F = s``, so Lemma 1 and Lemma 2 apply. **Not** shift-invariant.
    ``s`` grows linearly, so huge scores do not overflow; each row is divided by its largest
    ``s`` before summing so that even ``1e38`` in float32 stays finite.
    Source: Prieto et al. 2025, arXiv:2501.04697.
    """
    x = prepare(scores, temperature)
    s = stablemax_s(x)
    s = s / s.detach().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    return finish(safe_divide(s, s.sum(dim=dim, keepdim=True)), scores)


def relu_norm(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """ReLU normalisation: ``ReLU(z) / Σ_j ReLU(z_j)``.

    Output: the simplex where defined (exact zeros for z ≤ 0). A row with no positive score has
    no defined output; the declared policy returns zeros for it, as for a fully masked row.
    Scale-invariant, so the temperature has no effect; it is accepted for uniformity.
    """
    x = prepare(scores, temperature)
    r = torch.relu(x)
    r = r / r.detach().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(r.dtype).tiny)
    return finish(safe_divide(r, r.sum(dim=dim, keepdim=True)), scores)


def dagpam(
    scores: torch.Tensor, dim: int = -1, lam: float = 0.5, temperature: float = 1.0
) -> torch.Tensor:
    """daGPAM, single-row form: ``(1 + λ)·softmax(z/T) − λ·softmax(−z/T)``.

    Output: affine — rows sum to exactly 1 and entries lie in ``[−λ, 1 + λ]``; weights may be
    negative. Paper B's two-map layer with its approximation ``Q⁻ ≈ −Q⁺`` (docs/THEORY.md §6).
    Masked keys stay masked in both maps. Source: Heo & Choi, arXiv:2410.15578.
    """
    check_temperature(temperature)
    x = prepare(scores)  # the temperature goes to softmax, applied after its shift
    neg = torch.where(masked(x), NEG_INF, -x)
    pos_w = softmax(x, dim, temperature=temperature)
    neg_w = softmax(neg, dim, temperature=temperature)
    return finish((1.0 + lam) * pos_w - lam * neg_w, scores)
