"""How far an attention kernel's output may be from the float64 reference.

The rule, per output element of query row ``i`` (``u`` = unit roundoff of the input dtype,
``u₃₂`` = float32's, ``V∞`` = the largest ``|v|`` of that batch and head, ``d`` the head dimension,
``L`` the number of keys)::

    |out − ref| ≤ atol + rtol·|ref| + (min(2·δs_i, 2) + u + (2 + √L)·u₃₂) · V∞
    δs_i = scale · (2 + √d) · u · max_j Σ_c |q_ic|·|k_jc|  [+ 2·u·max_j |s_ij|]
           (j over the keys row i attends; the bracket where a score modification or an
           additive mask changes the scores: ALiBi's slope·(j − i) reaches hundreds at L = 1024,
           and the kernel rounds the sum in its own precision)

- ``atol``/``rtol``: the one per-dtype table (:mod:`attnverify.tolerances`): rounding of the output.
- ``δs_i``: the rounding of the scores the kernel forms itself, ``Q·Kᵀ·scale`` in its own
  precision (a dot product of ``d`` terms, then the scale; ``√d`` is the usual growth of
  blocked/pairwise sums, the 2 the rounding of the product and of the scale). It is relative to
  ``Σ|q||k|``, not to the score, so it is large at large logits and under cancellation. A score
  error ``δs`` moves the weights by ``α_j(δs_j − Σ α δs)``, so the output by at most ``2·δs·V∞``
  (and never by more than ``2·V∞``: a convex combination stays in the hull).
- ``u·V∞``: a kernel may store the weights in the input dtype before ``P·V`` (flash kernels do).
- ``(2 + √L)·u₃₂·V∞``: the softmax sum and ``P·V`` accumulate over ``L`` keys, in float32 at
  least. Accumulating them in float16 is a defect, not rounding: a float16 sum of 4096 equal
  weights stalls at 2048 and doubles every weight, which this rule catches.

Gradients use the same terms relative to the largest reference gradient (see :func:`grad_allowed`).
"""

from __future__ import annotations

import math

import torch

from attnverify.attention.reference import group_matmul
from attnverify.tolerances import tol_for

F64 = torch.float64
U32 = torch.finfo(torch.float32).eps / 2


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else abs(float(scale))


def score_error(q, k, scale, dtype, allowed=None) -> torch.Tensor:
    """``δs_i`` ``[batch, heads, L_q, 1]`` in float64 (``k`` has the query's heads, or ``H_kv``
    of them read as GQA groups: :func:`~attnverify.attention.reference.group_matmul`)."""
    d = q.shape[-1]
    mag = group_matmul(q.to(F64).abs(), k.to(F64).abs().transpose(-2, -1))
    if allowed is not None:
        mag = mag.masked_fill(~allowed, 0.0)
    worst = mag.amax(dim=-1, keepdim=True) if mag.shape[-1] else mag.sum(-1, keepdim=True)
    return _scale(q, scale) * (2.0 + math.sqrt(d)) * unit_roundoff(dtype) * worst


def output_allowed(ref, q, k, v, scale, dtype, allowed=None, scores=None) -> torch.Tensor:
    """The allowed ``|out − ref|`` per element (float64, ``ref``'s shape). ``k`` and ``v`` have
    the query's heads or ``H_kv`` of them (GQA, as :func:`score_error`). ``scores``: the final
    float64 scores (after score modification and additive mask), when they differ from
    ``scale·q·kᵀ``."""
    t = tol_for(dtype)
    v_inf = v.to(F64).abs().amax(dim=(-2, -1), keepdim=True)
    if v_inf.dim() >= 3 and q.dim() >= 3 and v_inf.shape[-3] not in (1, q.shape[-3]):
        # GQA: V∞ of each key/value head for each of its query heads (one number a head).
        v_inf = v_inf.repeat_interleave(q.shape[-3] // v_inf.shape[-3], dim=-3)
    length = k.shape[-2]
    ds = score_error(q, k, scale, dtype, allowed)
    if scores is not None:
        ds = ds + 2.0 * unit_roundoff(dtype) * _largest(scores, allowed)
    ds = ds.clamp_max(1.0)
    slack = 2.0 * ds + unit_roundoff(dtype) + (2.0 + math.sqrt(length)) * U32
    return t.atol + t.rtol * ref.abs() + slack * v_inf


def _largest(scores: torch.Tensor, allowed) -> torch.Tensor:
    """``max_j |s_ij|`` over the keys each query attends (finite scores only)."""
    mag = scores.to(F64).abs().nan_to_num(0.0, 0.0, 0.0)
    if allowed is not None:
        mag = mag.masked_fill(~allowed, 0.0)
    return mag.amax(dim=-1, keepdim=True) if mag.shape[-1] else mag.sum(-1, keepdim=True)


def grad_allowed(ref_grad, q, k, scale, dtype) -> torch.Tensor:
    """Allowed ``|g − g_ref|``: ``atol + rtol·|g_ref| + c·max|g_ref|`` with
    ``c = 4·max δs + (4 + √L + √d)·u``."""
    t = tol_for(dtype)
    ds = float(score_error(q, k, scale, dtype).max()) if q.numel() and k.numel() else 0.0
    c = 4.0 * min(ds, 1.0) + (4.0 + math.sqrt(k.shape[-2]) + math.sqrt(q.shape[-1])) * (
        unit_roundoff(dtype))
    top = float(ref_grad.abs().max()) if ref_grad.numel() else 0.0
    return t.atol + t.rtol * ref_grad.abs() + c * top
