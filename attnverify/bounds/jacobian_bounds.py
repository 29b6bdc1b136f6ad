"""Lemma 2 and Corollary 3 of [A]: how sensitive the weights are to the logits.

[A] Mudarisov et al., arXiv:2508.17821, §6 (docs/THEORY.md §5). ``J = ∂α/∂l`` is the Jacobian of one
row's weights with respect to its logits (``J[..., i, k] = ∂α_i/∂l_k``). Every function is pure
and broadcasts over leading dimensions; tolerances are the caller's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

Number = float | int | Tensor


def general_jacobian(F_values: Tensor, dF_values: Tensor) -> Tensor:
    """Jacobian of the general normalizer ``α_i = F(l_i)/S``, ``S = Σ_j F(l_j)`` [derived, exact]:
    ``∂α_i/∂l_k = (δ_ik − α_i)·F'(l_k)/S``, i.e. ``J = (I − α 1ᵀ)·diag(F')/S``.

    ``F_values`` and ``dF_values`` are ``F(l)`` and ``F'(l)`` on the row (``[..., L]``); the result
    is ``[..., L, L]``. Not symmetric unless ``F' ∝ F`` (softmax).
    """
    S = F_values.sum(-1, keepdim=True)
    alpha = F_values / S
    eye = torch.eye(F_values.shape[-1], dtype=F_values.dtype, device=F_values.device)
    return (eye - alpha.unsqueeze(-1)) * (dF_values / S).unsqueeze(-2)


def lemma2_bound(F_values: Tensor, dF_values: Tensor) -> Tensor:
    """Lemma 2 of [A] (§6, [derived form]): ``‖J‖₂ ≤ (max|F'| / (L·min F))·(1 + max F / min F)``.

    Max and min run over the row's logits (``[..., L]`` in, ``[...]`` out). Proof: ``S ≥ L·min F``
    and ``‖I − α1ᵀ‖₂ ≤ 1 + ‖α‖₂√L ≤ 1 + L·max α ≤ 1 + max F/min F``. Norm: spectral.
    Hypotheses: ``F > 0``, smooth, independent of ``L`` (the general normalizer of §1).
    """
    length = F_values.shape[-1]
    f_min, f_max = F_values.amin(-1), F_values.amax(-1)
    return dF_values.abs().amax(-1) / (length * f_min) * (1 + f_max / f_min)


def softmax_jacobian(alpha: Tensor, temperature: Number = 1.0) -> Tensor:
    """Softmax Jacobian at temperature ``T`` [derived, exact]: ``J = (diag(α) − α αᵀ)/T``.

    ``alpha = softmax(l/T)`` is ``[..., L]``; the result ``[..., L, L]`` is symmetric positive
    semi-definite with ``J·1 = 0``.
    """
    return (torch.diag_embed(alpha) - alpha.unsqueeze(-1) * alpha.unsqueeze(-2)) / temperature


def cor3_entrywise_bound(temperature: Number = 1.0) -> Tensor:
    """Corollary 3 of [A], entry-wise (§6, true, tight): ``max_ik |J_ik| ≤ 1/(4T)`` for softmax.

    ``|α_i(δ_ik − α_k)| ≤ max(α(1−α), α_i α_k) ≤ ¼``; equality at a two-way tie (diagonal).
    """
    return 1.0 / (4.0 * torch.as_tensor(temperature, dtype=torch.float64))


def softmax_spectral_bound(temperature: Number = 1.0) -> Tensor:
    """Corrected Corollary 3, spectral (docs/THEORY.md §5, true, tight): softmax ``‖J‖₂ ≤ 1/(2T)``.

    ``J ⪰ 0`` and ``λ_max(diag α − ααᵀ) ≤ ½``; equality at the two-way tie ``α = (½, ½, 0, …)``,
    where ``J = (1/T)·[[¼, −¼], [−¼, ¼]] ⊕ 0`` has eigenvalue ``1/(2T)``.
    """
    return 1.0 / (2.0 * torch.as_tensor(temperature, dtype=torch.float64))


def cor3_paper_bound(temperature: Number = 1.0) -> Tensor:
    """Corollary 3 of [A] **as stated** (§6): ``‖∇_l α‖₂ ≤ min{1/(4T), √2}`` — **[false]** for the
    spectral norm.

    The two-way tie gives ``‖J‖₂ = 1/(2T)``, twice the claim whenever ``1/(4T) ≤ √2``; the
    form is right entry-wise (:func:`cor3_entrywise_bound`).
    """
    return torch.clamp(cor3_entrywise_bound(temperature), max=math.sqrt(2.0))


def fd_estimator_bound(temperature: Number, eps: Number) -> Tensor:
    """Bound on the finite-difference estimator of Algorithm 5 of [A] (§6):
    ``δ = ‖softmax((l + εv)/T) − softmax(l/T)‖₂ / ε ≤ min{1/(2T), √2/ε}`` for a unit ``v``.

    [derived]: the mean value theorem with ``‖J‖₂ ≤ 1/(2T)`` gives the first term; any two points
    of the simplex are at most ``√2`` apart in ℓ2, which gives the second.
    """
    temperature, eps = (torch.as_tensor(t, dtype=torch.float64) for t in (temperature, eps))
    return torch.minimum(1.0 / (2.0 * temperature), math.sqrt(2.0) / eps)


def two_way_tie_logits(length: int, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """The witness row ``(0, 0, −∞, …, −∞)``: softmax gives exactly ``α = (½, ½, 0, …)``.

    There ``‖J‖₂ = 1/(2T)`` (Cor 3 as stated is exceeded by the ratio 2), ``max|J_ik| = 1/(4T)``
    and ``‖J‖_F = 1/(2T)`` (the Frobenius maximum, see :mod:`attnverify.bounds.gpam`).
    """
    if length < 2:
        raise ValueError(f"a two-way tie needs length ≥ 2, got {length}")
    row = torch.full((length,), float("-inf"), dtype=dtype)
    row[:2] = 0.0
    return row
