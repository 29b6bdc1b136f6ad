"""Theorem 2 of paper A on batches of attention rows: N_s/N and both bounds.

Hypotheses [stated, docs/THEORY.md §4]: every embedding lies on the sphere of radius M (the value
vectors are projected onto it: :func:`to_sphere`) and pairwise distances are at least δ > 0
(δ = the empirical minimum over the row's keys: :func:`prefix_min_distance`).

A selected token ``i ∈ I_N`` is *separable* when ``‖α_i x_i − s‖ < r`` with
``r = min_{j∉I_N} ‖s − α_j x_j‖`` [choice: strict]. Shapes follow :mod:`.distance`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnverify.empirical.distance import (
    order_rows,
    pairwise_distances,
    residual_norms,
    selected_mask,
)
from attnverify.empirical.extraction import SharedRows

#: Points closer than this (relative to the radius) count as duplicates, not as δ.
DUPLICATE_TOLERANCE = 1e-6


def to_sphere(x: torch.Tensor, radius: float = 1.0) -> torch.Tensor:
    """Project each vector onto the sphere of radius ``radius`` (zero vectors stay zero)."""
    norm = x.norm(dim=-1, keepdim=True)
    return x * (radius / norm.clamp_min(torch.finfo(x.dtype).tiny))


def on_sphere(x, radius: float = 1.0):
    """:func:`to_sphere` for a tensor or a :class:`~attnverify.empirical.extraction.SharedRows`
    view (projected once per stored vector, not once per head)."""

    if isinstance(x, SharedRows):
        return x.map(lambda base: to_sphere(base, radius))
    return to_sphere(x, radius)


def prefix_min_distance(x: torch.Tensor, radius: float = 1.0):
    """δ of every causal prefix: ``delta[b, j] = min_{i<k≤j} ‖x_i − x_k‖``, ``[b, n]``.

    [choice] Pairs closer than ``DUPLICATE_TOLERANCE·radius`` (the same vector twice, e.g. a
    repeated token in a RoPE model's first layer) violate the δ > 0 hypothesis; they are left
    out of δ and counted instead: ``duplicates[b, j]`` pairs in the prefix. Computed in float64.
    """
    x = x.to(torch.float64)
    dist = pairwise_distances(x)
    n = x.shape[-2]
    earlier = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1)  # [k, i]: i < k
    duplicate = (dist < DUPLICATE_TOLERANCE * radius) & earlier
    dist.masked_fill_(~earlier | duplicate, float("inf"))
    delta = torch.cummin(dist.amin(-1), dim=-1).values
    return delta, torch.cumsum(duplicate.sum(-1), dim=-1)


@dataclass
class Separation:
    """Per row and N (``[b, R, k]``): N_s/N, the bounds of Theorem 2, the radius r."""

    ratio: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    radius: torch.Tensor


def separation(alpha, x, valid, delta, n_values: torch.Tensor, sphere: float = 1.0):
    """N_s/N with Theorem 2's bounds [stated form, docs/THEORY.md §4], for every N at once.

    ``x`` must already lie on the sphere of radius ``sphere``; ``delta`` is ``[b, R]``.
    Bounds: ``1 − (1/(rN)) Σ_{i∈I_N} ξ_i ≤ N_s/N ≤ (1/N) Σ_{i∈I_N} exp(−(r − ξ_i)²/(16M²))``
    with ``ξ_i² = M²B_i² − (δ²/2)(B_i² − Q_i)``, ``B_i = Σ_{j∈I_N∖i} α_j``,
    ``Q_i = Σ_{j∈I_N∖i} α_j²`` [derived]. The lower bound is a theorem for α ≥ 0; the upper
    bound is false per instance (docs/THEORY.md) and is reported as measured.
    """
    o = order_rows(alpha, x, valid, "top")
    g, _ = residual_norms(o, n_values)
    m = int(n_values.max())
    b, r, k, n = g.shape
    top = g.gather(-1, o.index[..., None, :m].expand(b, r, k, m))  # selection order
    g.masked_fill_(selected_mask(o, n_values), float("inf"))
    radius = g.masked_fill_(~o.valid[..., None, :], float("inf")).amin(-1)
    in_set = torch.arange(m, device=g.device)[None, :] < n_values[:, None]  # [k, m]
    count = ((top < radius[..., None]) & in_set).to(g.dtype).sum(-1)
    nf = n_values.to(g.dtype)
    xi = _xi(o.top(m)[0], delta, n_values, sphere)  # [b,R,k,m]
    xi_sum = xi.masked_fill(~in_set, 0.0).sum(-1)
    tail = torch.exp(-(radius[..., None] - xi).square() / (16 * sphere**2))
    upper = tail.masked_fill(~in_set, 0.0).sum(-1) / nf
    lower = 1 - xi_sum / (radius * nf)
    return Separation(ratio=count / nf, lower=lower, upper=upper, radius=radius)


def _xi(top, delta, n_values, sphere: float) -> torch.Tensor:
    """``ξ_i`` for every N and every i < max N (selection order): ``[b, R, k, m]``; ``top`` are
    the weights of the first m selected keys, ``[b, R, m]``."""
    mass = torch.cumsum(top, -1)[..., n_values - 1][..., None]  # [b,R,k,1]
    power = torch.cumsum(top.square(), -1)[..., n_values - 1][..., None]
    rest = mass - top[..., None, :]  # B_i
    rest_sq = power - top.square()[..., None, :]  # Q_i
    d2 = delta.square()[..., None, None]
    xi_sq = sphere**2 * rest.square() - d2 / 2 * (rest.square() - rest_sq)
    return xi_sq.clamp_min(0.0).sqrt()


def row_entropy(alpha, valid) -> torch.Tensor:
    """Shannon entropy ``−Σ α log α`` (nats) of each row over its valid keys, ``[b, R]``.

    Meaningful for nonnegative weights; negative weights are clipped to 0 first.
    """
    valid = torch.broadcast_to(valid, alpha.shape)
    p = alpha.clamp_min(0.0).masked_fill(~valid, 0.0)
    logp = torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))
    return -(p * logp).sum(-1)


def separable_sets(alpha, x, valid, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For one N: the selected keys ``I_N`` ``[b, R, N]`` (selection order) and whether each is
    separable (``‖α_i x_i − s‖ < r``) ``[b, R, N]``; ``x`` already on the sphere. The same
    criterion as :func:`separation`, kept per key so the sets of several heads can be joined."""
    o = order_rows(alpha, x, valid, "top")
    n_values = torch.tensor([n], device=alpha.device)
    g, _ = residual_norms(o, n_values)
    g = g[..., 0, :]  # [b, R, keys]
    chosen = o.index[..., :n]
    top = g.gather(-1, chosen)
    outside = selected_mask(o, n_values)[..., 0, :] | ~o.valid
    radius = g.masked_fill(outside, float("inf")).amin(-1)
    return chosen, top < radius[..., None]
