"""Theorem 1 of [A]: how far the top-N context vector sits from the tokens it leaves out.

[A] Mudarisov et al., arXiv:2508.17821, §4 (docs/THEORY.md §3). For one query row with weights ``α``
(``[..., L]``) and embeddings ``x`` (``[..., L, d]``), a selected set ``I_N`` (a boolean mask
``[..., L]``) gives the context vector ``s = Σ_{i∈I_N} α_i x_i``, the top-N mass
``ᾱ_N = Σ_{i∈I_N} α_i`` and the cumulative distance ``d̃ = Σ_{i∉I_N} ‖α_i x_i − s‖₂`` (a sum of
norms). Every function is pure; tolerances are the caller's.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch
from torch import Tensor

#: Largest row length for which E[d̃] is computed by enumerating every N-subset (docs/THEORY.md §3).
EXACT_MAX_LENGTH = 14

#: Elements of the ``[subsets, ..., L, d]`` work tensor held at once by the E[d̃] computations.
CHUNK_ELEMENTS = 1 << 22


def top_n_indices(alpha: Tensor, n: int) -> Tensor:
    """Indices ``[..., n]`` of the ``n`` largest weights, largest first, ties to the lower index.

    ``I_N`` of docs/THEORY.md (tie-break [choice]). A stable descending sort keeps equal weights in
    index order, which ``torch.topk`` does not promise.
    """
    if not 0 <= n <= alpha.shape[-1]:
        raise ValueError(f"n={n} is outside [0, L={alpha.shape[-1]}]")
    order = torch.sort(alpha, dim=-1, descending=True, stable=True).indices
    return order[..., :n]


def top_n_mask(alpha: Tensor, n: int) -> Tensor:
    """Boolean mask ``[..., L]`` of ``I_N`` (see :func:`top_n_indices`)."""
    mask = torch.zeros(alpha.shape, dtype=torch.bool, device=alpha.device)
    return mask.scatter(-1, top_n_indices(alpha, n), True)


def context_vector(alpha: Tensor, x: Tensor, mask: Tensor) -> Tensor:
    """``s = Σ_{i∈I_N} α_i x_i`` (``[..., d]``) of Theorem 1."""
    return ((alpha * mask).unsqueeze(-1) * x).sum(dim=-2)


def cumulative_distance(alpha: Tensor, x: Tensor, mask: Tensor) -> Tensor:
    """``d̃ = Σ_{i∉I_N} ‖α_i x_i − s‖₂`` (``[...]``) of Theorem 1: a sum of norms, [stated]."""
    s = context_vector(alpha, x, mask)
    gaps = torch.linalg.vector_norm(alpha.unsqueeze(-1) * x - s.unsqueeze(-2), dim=-1)
    return (gaps * ~mask).sum(dim=-1)


def cross_diameter(x: Tensor, mask: Tensor) -> Tensor:
    """``d_1 = max_{i∉I_N, j∈I_N} ‖x_i − x_j‖₂`` (``[...]``); 0 when either side is empty."""
    dist = torch.cdist(x, x)
    pairs = (~mask).unsqueeze(-1) & mask.unsqueeze(-2)
    return torch.where(pairs, dist, torch.zeros_like(dist)).amax(dim=(-2, -1))


def thm1_fixed_bound(alpha: Tensor, x: Tensor, mask: Tensor) -> Tensor:
    """Theorem 1.1 of [A] (§4, [stated]): the right side of
    ``d̃ ≤ (1 − ᾱ_N)·d_1 + max_{j∈I_N}‖x_j‖ · [ᾱ_N(L − N) − (1 − ᾱ_N)]`` for a fixed ``I_N``.

    Proof [derived]: ``s = ᾱ_N x̃`` with ``x̃`` a convex combination of the selected embeddings,
    so ``‖α_i x_i − s‖ ≤ α_i d_1 + (ᾱ_N − α_i)·max‖x_j‖``; sum over ``i ∉ I_N``.
    Hypotheses: ``α ≥ 0``, ``Σα = 1`` and ``α_i ≤ ᾱ_N`` off the set — a theorem for simplex
    normalizers only; for a signed one (daGPAM) it may fail. Norm: Euclidean on embeddings.
    """
    abar = (alpha * mask).sum(dim=-1)
    n = mask.sum(dim=-1).to(alpha.dtype)
    norms = torch.linalg.vector_norm(x, dim=-1)
    max_norm = torch.where(mask, norms, torch.zeros_like(norms)).amax(dim=-1)
    length = alpha.shape[-1]
    return (1 - abar) * cross_diameter(x, mask) + max_norm * (abar * (length - n) - (1 - abar))


def jensen_main_term(alpha: Tensor, x: Tensor, n: int) -> Tensor:
    """Theorem 1.2 of [A] (§4, [derived form]): the main term
    ``((L−N)/L) · Σ_{i=1..L} ‖c_i x_i − x̄‖₂``, ``c_i = α_i(1 + N/(L−1))``,
    ``x̄ = (N/(L−1))·Σ_j α_j x_j``.

    With ``I_N`` uniform among the N-subsets, ``P(i ∉ I_N) = (L−N)/L`` and
    ``E[s | i ∉ I_N] = x̄ − (N/(L−1)) α_i x_i``, so Jensen's inequality gives
    ``E[d̃] ≥ main term``: the checkable statement is ``ε = E[d̃] − main ≥ 0``. Needs ``L ≥ 2``.
    """
    length = alpha.shape[-1]
    ratio = n / (length - 1)
    xbar = ratio * (alpha.unsqueeze(-1) * x).sum(dim=-2)
    c = alpha * (1 + ratio)
    gaps = torch.linalg.vector_norm(c.unsqueeze(-1) * x - xbar.unsqueeze(-2), dim=-1)
    return (length - n) / length * gaps.sum(dim=-1)


def all_subset_masks(length: int, n: int, *, device=None) -> Tensor:
    """Every N-subset of ``range(L)`` as a boolean mask ``[C(L, N), L]``, lexicographic order."""
    combos = torch.tensor(list(itertools.combinations(range(length), n)), dtype=torch.long)
    masks = torch.zeros(math.comb(length, n), length, dtype=torch.bool, device=device)
    return masks.scatter(1, combos.reshape(len(masks), n).to(device), True)


def random_subset_masks(length: int, n: int, samples: int, generator: torch.Generator) -> Tensor:
    """``samples`` uniform N-subsets of ``range(L)`` as boolean masks ``[samples, L]``."""
    keys = torch.rand(samples, length, generator=generator)
    picks = keys.argsort(dim=-1)[:, :n]
    return torch.zeros(samples, length, dtype=torch.bool).scatter(1, picks, True)


def distances_over_subsets(alpha: Tensor, x: Tensor, masks: Tensor) -> Tensor:
    """``d̃`` for every subset in ``masks`` (``[S, L]``): a tensor ``[S, ...]``, chunked in S."""
    batch = alpha.shape[:-1]
    per_subset = max(1, alpha.numel() * x.shape[-1])
    chunk = max(1, CHUNK_ELEMENTS // per_subset)
    view = (-1,) + (1,) * len(batch) + (alpha.shape[-1],)
    parts = [
        cumulative_distance(alpha, x, part.to(alpha.device).reshape(view))
        for part in masks.split(chunk)
    ]
    return torch.cat(parts).reshape((len(masks),) + batch)


def expected_distance_exact(
    alpha: Tensor, x: Tensor, n: int, *, max_length: int = EXACT_MAX_LENGTH
) -> Tensor:
    """``E[d̃]`` over ``I_N`` uniform among all N-subsets, by enumerating them (exact).

    Theorem 1.2's expectation. Refuses ``L > max_length`` (``C(L, N)`` subsets are summed).
    """
    length = alpha.shape[-1]
    if length > max_length:
        raise ValueError(f"exact E[d̃] enumerates C(L, N) subsets: L={length} > {max_length}")
    return distances_over_subsets(alpha, x, all_subset_masks(length, n)).mean(dim=0)


class MonteCarlo(NamedTuple):
    """A Monte-Carlo mean with its standard error ``std / √samples`` and how it was drawn."""

    mean: Tensor
    stderr: Tensor
    samples: int
    seed: int


def expected_distance_mc(
    alpha: Tensor, x: Tensor, n: int, *, samples: int, seed: int
) -> MonteCarlo:
    """``E[d̃]`` over uniform N-subsets, estimated from ``samples`` seeded draws.

    The subsets come from a CPU ``torch.Generator`` seeded with ``seed``, so the estimate is
    reproducible; ``stderr`` is the sample standard deviation over ``√samples``.
    """
    generator = torch.Generator().manual_seed(seed)
    masks = random_subset_masks(alpha.shape[-1], n, samples, generator)
    values = distances_over_subsets(alpha, x, masks)
    if samples > 1:
        stderr = values.std(dim=0) / math.sqrt(samples)
    else:
        stderr = torch.full_like(values[0], float("inf"))
    return MonteCarlo(values.mean(dim=0), stderr, samples, seed)


class RandomTopN(NamedTuple):
    """Theorem 1.2 on one configuration: ``E[d̃]``, the Jensen main term and ``ε = E − main``.

    ``stderr`` is 0 when ``exact`` (enumeration), the Monte-Carlo standard error otherwise.
    """

    expected: Tensor
    stderr: Tensor
    main: Tensor
    epsilon: Tensor
    exact: bool
    samples: int
    seed: int


def thm1_random(
    alpha: Tensor,
    x: Tensor,
    n: int,
    *,
    samples: int = 4096,
    seed: int = 0,
    max_length: int = EXACT_MAX_LENGTH,
) -> RandomTopN:
    """Theorem 1.2 of [A] (§4, [derived form]): ``E[d̃] = main term + ε`` with ``ε ≥ 0``.

    ``E`` is exact (enumeration) for ``L ≤ max_length`` and Monte-Carlo (``samples`` draws,
    ``seed``) otherwise. The paper's "ε is small" is [false] in general: report ``ε``, do not
    assert it small.
    """
    main = jensen_main_term(alpha, x, n)
    if alpha.shape[-1] <= max_length:
        expected = expected_distance_exact(alpha, x, n, max_length=max_length)
        count = math.comb(alpha.shape[-1], n)
        zero = torch.zeros_like(expected)
        return RandomTopN(expected, zero, main, expected - main, True, count, seed)
    mc = expected_distance_mc(alpha, x, n, samples=samples, seed=seed)
    return RandomTopN(mc.mean, mc.stderr, main, mc.mean - main, False, samples, seed)
