"""Theorem 2 of [A]: how many selected tokens a single head can separate geometrically.

[A] Mudarisov et al., arXiv:2508.17821, §5 (docs/THEORY.md §4). Embeddings ``x`` ``[..., L, d]`` lie
on the sphere of radius ``M`` and are pairwise at least ``δ`` apart; ``I_N`` is a boolean mask
``[..., L]`` (see :func:`attnverify.bounds.theorem1.top_n_mask`) and ``s = Σ_{i∈I_N} α_i x_i``.
Every function is pure; tolerances are the caller's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnverify.bounds.theorem1 import context_vector


def project_to_sphere(x: Tensor, radius: float | Tensor = 1.0) -> Tensor:
    """``M · x / ‖x‖₂`` along the last dimension: Theorem 2's projection onto the sphere [stated].

    Hypothesis: ``x ≠ 0`` (a zero vector has no direction and gives NaN).
    """
    return radius * x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def min_pairwise_distance(x: Tensor) -> Tensor:
    """``δ = min_{i≠j} ‖x_i − x_j‖₂`` (``[...]``): the empirical separation of Theorem 2.

    Direct differences, not cdist's matrix-product shortcut, which cancels to 0 for close pairs.
    """
    dist = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    eye = torch.eye(x.shape[-2], dtype=torch.bool, device=x.device)
    return dist.masked_fill(eye, float("inf")).amin(dim=(-2, -1))


def offset_norms(alpha: Tensor, x: Tensor, mask: Tensor) -> Tensor:
    """``‖α_i x_i − s‖₂`` for every key ``i`` (``[..., L]``)."""
    s = context_vector(alpha, x, mask)
    return torch.linalg.vector_norm(alpha.unsqueeze(-1) * x - s.unsqueeze(-2), dim=-1)


def _radius(gaps: Tensor, mask: Tensor) -> Tensor:
    return gaps.masked_fill(mask, float("inf")).amin(dim=-1)


def separation_radius(alpha: Tensor, x: Tensor, mask: Tensor) -> Tensor:
    """``r = min_{i∉I_N} ‖s − α_i x_i‖₂`` [stated]; ``+inf`` when every key is selected."""
    return _radius(offset_norms(alpha, x, mask), mask)


def separable_mask(alpha: Tensor, x: Tensor, mask: Tensor) -> Tensor:
    """Selected keys with ``‖α_i x_i − s‖ < r`` (strict [choice]: the closest non-selected point
    lies on the boundary of the closed ball)."""
    gaps = offset_norms(alpha, x, mask)
    return mask & (gaps < _radius(gaps, mask).unsqueeze(-1))


def separable_fraction(alpha: Tensor, x: Tensor, mask: Tensor) -> Tensor:
    """``N_s / N`` (``[...]``): the fraction of selected keys that are separable."""
    return separable_mask(alpha, x, mask).sum(-1).to(alpha.dtype) / mask.sum(-1).to(alpha.dtype)


def xi(alpha: Tensor, mask: Tensor, radius: float | Tensor, delta: float | Tensor) -> Tensor:
    """``ξ_i`` (``[..., L]``) of Theorem 2, [derived]:
    ``ξ_i² = M²·(Σ_{j∈I_N∖i} α_j)² − (δ²/2)·Σ_{j≠k ∈ I_N∖i} α_j α_k`` (ordered pairs).

    From ``⟨x_j, x_k⟩ = M² − ‖x_j − x_k‖²/2 ≤ M² − δ²/2`` on the sphere: for ``α ≥ 0`` and
    ``i ∈ I_N``, ``‖s − α_i x_i‖ = ‖Σ_{j∈I_N∖i} α_j x_j‖ ≤ ξ_i``. For ``i ∉ I_N`` the entry uses
    ``I_N`` itself (it bounds ``‖s‖``); Theorem 2 reads only the selected entries. Negative
    ``ξ²`` (rounding, or a hypothesis broken) is clamped at 0.
    """
    sel = alpha * mask
    others = sel.sum(-1, keepdim=True) - sel
    squares = (sel * sel).sum(-1, keepdim=True) - sel * sel
    cross = others * others - squares
    xi_sq = radius**2 * others * others - (delta**2 / 2) * cross
    return xi_sq.clamp_min(0.0).sqrt()


def thm2_lower_bound(xi_values: Tensor, r: Tensor, mask: Tensor) -> Tensor:
    """Theorem 2 of [A] (§5, [stated form], valid): ``N_s/N ≥ 1 − (1/(rN))·Σ_{i∈I_N} ξ_i``.

    Holds per instance for ``α ≥ 0`` on the sphere: ``ξ_i < r`` makes ``i`` separable, and at
    most ``Σξ_i / r`` selected keys have ``ξ_i ≥ r``. Often vacuous (negative).
    """
    n = mask.sum(-1).to(xi_values.dtype)
    total = torch.where(mask, xi_values, torch.zeros_like(xi_values)).sum(-1)
    return 1 - total / (r * n)


def thm2_upper_bound(xi_values: Tensor, r: Tensor, mask: Tensor, radius: float | Tensor) -> Tensor:
    """Theorem 2 of [A] (§5, [stated form], **[false]** per instance):
    ``E[N_s]/N ≤ (1/N)·Σ_{i∈I_N} exp(−(r − ξ_i)²/(16 M²))``.

    A uniform-sphere simulation violates it in a sizeable fraction of draws (docs/THEORY.md §4);
    whether it holds on average over draws is measured, not assumed.
    """
    n = mask.sum(-1).to(xi_values.dtype)
    terms = torch.exp(-((r.unsqueeze(-1) - xi_values) ** 2) / (16 * radius**2))
    return torch.where(mask, terms, torch.zeros_like(terms)).sum(-1) / n
