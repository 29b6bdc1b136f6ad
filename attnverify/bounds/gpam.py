"""Paper [B]'s claims: daGPAM's range and row sum, and Lemma 3 on the total softmax gradient.

[B] Heo, Choi, *Generalized Probabilistic Attention Mechanism in Transformers*, arXiv:2410.15578
(docs/THEORY.md §6). ``p`` is a softmax row (``[..., L]``) and ``J = (diag p − ppᵀ)/T`` its Jacobian
(``∂P_ij/∂A_ik = P_ij(δ_jk − P_ik)`` in [B]'s notation, ``T = 1``). Every function is pure;
tolerances are the caller's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnverify.bounds.jacobian_bounds import softmax_spectral_bound

Number = float | int | Tensor

#: Every daGPAM row sums to exactly this [B, stated].
GPAM_ROW_SUM = 1.0


def dagpam_reference(scores: Tensor, lam: Number, temperature: Number = 1.0) -> Tensor:
    """daGPAM on one logit row [B, derived form]: ``(1+λ)·softmax(l/T) − λ·softmax(−l/T)``.

    [B] combines two softmax maps ``P = (1+λ)P⁺ − λP⁻``; as a map of one row docs/THEORY.md §6 uses
    the paper's own approximation ``Q⁻ ≈ −Q⁺``. A reference for tests, not the built-in.
    """
    z = scores / temperature
    return (1 + lam) * torch.softmax(z, -1) - lam * torch.softmax(-z, -1)


def gpam_range(lam: Number) -> tuple[Tensor, Tensor]:
    """daGPAM's entry range [B, stated]: every weight lies in ``[−λ, 1+λ]`` (for ``λ ≥ 0``).

    ``(1+λ)P⁺ − λP⁻`` with ``P⁺, P⁻ ∈ [0, 1]``; rows sum to ``(1+λ) − λ = 1``
    (:data:`GPAM_ROW_SUM`). Returns ``(lower, upper)``.
    """
    lam = torch.as_tensor(lam, dtype=torch.float64)
    return -lam, 1 + lam


def softmax_jacobian_l1_total(p: Tensor, temperature: Number = 1.0) -> Tensor:
    """``Σ_jk |J_jk| = 2(1 − Σ_j p_j²)/T`` for the softmax Jacobian [derived, exact].

    The diagonal gives ``Σ p_j(1 − p_j) = 1 − Σp²`` and the off-diagonal ``Σ_{j≠k} p_j p_k =
    1 − Σp²`` (rows of ``p`` on the simplex).
    """
    return 2 * (1 - (p * p).sum(-1)) / temperature


def lemma3_l1_bound(length: Number, temperature: Number = 1.0) -> Tensor:
    """Lemma 3 of [B], entry-wise ℓ1 total ([stated claim, derived form], true):
    ``Σ_jk |J_jk| = 2(1 − Σp²)/T ≤ 2(1 − 1/L)/T``, with equality at the uniform row.

    ``Σp² ≥ 1/L`` on the simplex (Cauchy–Schwarz), so the total is largest at ``p = 1/L``.
    """
    length, temperature = (torch.as_tensor(t, dtype=torch.float64) for t in (length, temperature))
    return 2 * (1 - 1 / length) / temperature


def softmax_jacobian_frobenius(p: Tensor, temperature: Number = 1.0) -> Tensor:
    """``‖J‖_F`` of the softmax Jacobian [derived, exact]:
    ``‖J‖_F² = (Σp² − 2Σp³ + (Σp²)²)/T²``.

    Expand ``Σ_j p_j²(1 − p_j)² + Σ_{j≠k} p_j² p_k²``. At the uniform row it is
    ``√(L−1)/(L·T)``; at the two-way tie ``(½, ½, 0, …)`` it is ``1/(2T)`` (``‖J‖_F² = ¼``).
    """
    s2 = (p * p).sum(-1)
    s3 = (p * p * p).sum(-1)
    return (s2 - 2 * s3 + s2 * s2).clamp_min(0.0).sqrt() / temperature


def lemma3_frobenius_uniform(length: Number, temperature: Number = 1.0) -> Tensor:
    """Lemma 3 of [B] read for the Frobenius norm (**[false]**): the claim is that ``‖J‖_F`` is
    largest at the uniform row, i.e. ``‖J‖_F ≤ √(L−1)/(L·T)``; this returns that claimed maximum.

    False for ``L ≥ 3``: the maximum of ``‖J‖_F`` over the simplex is ``1/(2T)``
    (:func:`frobenius_maximum`) at a two-way tie, and ``√(L−1)/L < ½`` once ``L ≥ 3``.
    """
    length, temperature = (torch.as_tensor(t, dtype=torch.float64) for t in (length, temperature))
    return torch.sqrt(length - 1) / (length * temperature)


def frobenius_maximum(temperature: Number = 1.0) -> Tensor:
    """The true maximum of the softmax ``‖J‖_F`` over the simplex: ``1/(2T)``
    (``‖J‖_F² = 1/(4T²)``), attained at a two-way tie ``p = (½, ½, 0, …)`` for every ``L ≥ 2``.

    Proof: ``(Σp²)² ≤ Σp·Σp³ = Σp³`` (Cauchy–Schwarz), so ``T²‖J‖_F² ≤ Σp² − Σp³ =
    Σ p_j·p_j(1 − p_j) ≤ ¼·Σp_j = ¼``, with equality at the two-way tie.

    docs/THEORY.md §6 quotes the value ``¼``: that is the squared norm ``‖J‖_F²`` at ``T = 1``.
    The value equals the spectral bound, attained at the same row.
    """
    return softmax_spectral_bound(temperature)
