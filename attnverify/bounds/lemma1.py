"""Lemma 1 and Corollary 1 of [A]: the weights of a length-independent normalizer vanish as 1/L.

[A] Mudarisov, Burtsev, Petrova, State, *Limitations of Normalization in Attention Mechanism*,
arXiv:2508.17821, §3 (docs/THEORY.md §2). The normalizer is the general form
``α_i = F(l_i) / Σ_j F(l_j)`` with ``F`` smooth, strictly positive and independent of ``L``.
Every function here is pure and broadcasts over leading dimensions; tolerances are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Number = float | int | Tensor


def kernel_extremes(
    F: Callable[[Tensor, float], Tensor],
    a: Number,
    temperature: float = 1.0,
    *,
    points: int = 1025,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, Tensor]:
    """``(min F, max F)`` over the interval ``[-a, a]``, on a grid of ``points`` logits.

    The grid holds both endpoints (and 0 when ``points`` is odd), so the result is exact for a
    monotone ``F`` (softmax's ``exp``, stablemax's ``s``, every built-in kernel) and a grid
    approximation otherwise. ``a`` may be a tensor of any shape; the result has that shape.
    """
    a = torch.as_tensor(a, dtype=dtype)
    grid = a.unsqueeze(-1) * torch.linspace(-1.0, 1.0, points, dtype=dtype)
    values = F(grid, temperature)
    return values.amin(dim=-1), values.amax(dim=-1)


def lemma1_weight_bounds(F_min: Number, F_max: Number, length: Number) -> tuple[Tensor, Tensor]:
    """Lemma 1 of [A] (§3, constants [derived]): ``C1/L ≤ α_i ≤ C2/L`` for every key ``i``.

    Claim: if ``F`` does not depend on ``L`` and every logit lies in ``[-a, a]``, then with
    ``C2 = max_[-a,a] F / min_[-a,a] F`` and ``C1 = 1/C2``
    ``α_i = F(l_i) / Σ_j F(l_j) ∈ [min F / (L max F), max F / (L min F)] = [C1/L, C2/L]``.
    Hypotheses: ``F > 0`` on ``[-a, a]`` (``F_min > 0``), ``L`` = number of unmasked keys.
    The paper states the 1/L form; the constants are derived from its proof.
    Returns ``(lower, upper)``.
    """
    F_min, F_max, length = (torch.as_tensor(t, dtype=torch.float64) for t in (F_min, F_max, length))
    c2 = F_max / F_min
    return 1.0 / (c2 * length), c2 / length


def cor1_delta(q: Tensor, k: Tensor) -> Tensor:
    """``Δ = ‖q‖₂ · max_j ‖k_j‖₂`` of Corollary 1 (so every logit ``q·k_j`` lies in ``[-Δ, Δ]``).

    Shapes: ``q`` is ``[..., d]``, ``k`` is ``[..., L, d]``; the result is ``[...]``.
    """
    return torch.linalg.vector_norm(q, dim=-1) * torch.linalg.vector_norm(k, dim=-1).amax(-1)


def cor1_softmax_weight_bounds(
    delta: Number, length: Number, temperature: Number = 1.0
) -> tuple[Tensor, Tensor]:
    """Corollary 1 of [A] (§3, [stated]): softmax weights obey
    ``(1/L)·exp(−2Δ/T) ≤ α_i ≤ (1/L)·exp(2Δ/T)``, ``Δ = ‖q‖·max_j ‖k_j‖``.

    It is Lemma 1 with ``F = exp(l/T)`` on ``[-Δ, Δ]`` (``C2 = e^{2Δ/T}``). Hypothesis: every
    logit lies in ``[-Δ, Δ]`` (true for ``l_j = q·k_j`` by Cauchy–Schwarz). Returns
    ``(lower, upper)``.
    """
    delta, length, temperature = (
        torch.as_tensor(t, dtype=torch.float64) for t in (delta, length, temperature)
    )
    c2 = torch.exp(2.0 * delta / temperature)
    return 1.0 / (c2 * length), c2 / length


def fixed_margin_peak(length: int, a: float, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """The row ``(+a, −a, …, −a)`` of length ``L``: one key ahead of the rest by a fixed margin.

    The witness of docs/THEORY.md §2 for length awareness: a length-independent ``F`` (Lemma 1)
    gives the peak a weight ``≤ C2/L → 0``; a length-aware normalizer (Scalable-Softmax) must
    not let it decay like 1/L.
    """
    row = torch.full((length,), -float(a), dtype=dtype)
    row[0] = float(a)
    return row


def softmax_peak_weight(length: Number, a: Number, temperature: Number = 1.0) -> Tensor:
    """Softmax weight of the peak of :func:`fixed_margin_peak`: ``1 / (1 + (L−1)·e^{−2a/T})``.

    Exact (a closed form, not a bound); it decays like ``e^{2a/T}/L`` as ``L → ∞``.
    """
    length, a, temperature = (
        torch.as_tensor(t, dtype=torch.float64) for t in (length, a, temperature)
    )
    return 1.0 / (1.0 + (length - 1.0) * torch.exp(-2.0 * a / temperature))
