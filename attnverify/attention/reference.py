"""The float64 eager reference: matmul, score modification, mask, normalizer, matmul.

``eager(q, k, v, attn_mask, is_causal, scale, enable_gqa, normalizer=..., score_mod=...)``
computes, in float64, ``out = α(scale·q·kᵀ + mod + mask) · v`` with SDPA's conventions:

- a boolean ``attn_mask`` is ``True`` where a query may attend; an additive one is added to
  the scores (``-inf`` masks);
- ``is_causal`` is **top-left aligned**: query ``i`` attends keys ``j ≤ i`` whatever ``L_q`` and
  ``L_k`` (``torch.ones(L_q, L_k).tril()``, as ``scaled_dot_product_attention`` documents);
- ``enable_gqa`` repeats each key/value head ``H / H_kv`` times *interleaved*
  (``repeat_interleave`` along the head dim: query head ``h`` reads key head ``h // g``); the
  reference computes that without making the repeated copy (:func:`group_matmul`);
- a query whose keys are all masked gets the zero vector (the built-in normalizers give an
  all-zero row, and torch's SDPA backends do the same since 2.5).

The result is returned in float64; callers compare the kernel's output against it.
"""

from __future__ import annotations

import math

import torch

from attnverify.attention import mods
from attnverify.registry import load_target

F64 = torch.float64
NEG_INF = float("-inf")


def expand_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value heads repeated to ``heads`` query heads, interleaved (GQA): for calling a kernel
    on repeated heads. The reference and the tolerance never build it (:func:`group_matmul`)."""
    kv = t.shape[-3]
    if kv == heads:
        return t
    return t.repeat_interleave(heads // kv, dim=-3)


def group_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ expand_heads(b, H)`` for ``a`` ``[..., H, M, K]`` and ``b`` ``[..., H_kv, K, N]``
    (``H_kv`` dividing ``H``: head ``h`` of ``a`` times head ``h // (H / H_kv)`` of ``b``), without
    that copy of ``b``. The ``g = H / H_kv`` heads of ``a`` that read one head of ``b`` are
    adjacent (``h = kv·g + j``), so ``a`` viewed as ``[..., H_kv, g·M, K]`` multiplies ``b`` as it
    is. (Broadcasting ``b`` by ``expand`` would not do: ``matmul`` copies expanded batch dims.)
    Heads that match, or do not divide, are left to ``@``."""
    if a.dim() < 3 or b.dim() < 3:
        return a @ b
    heads, kv = a.shape[-3], b.shape[-3]
    if heads == kv or not kv or heads % kv:
        return a @ b
    m = a.shape[-2]
    out = a.reshape(*a.shape[:-3], kv, heads // kv * m, a.shape[-1]) @ b
    return out.reshape(*out.shape[:-3], heads, m, out.shape[-1])


def allowed_and_bias(attn_mask, is_causal: bool, l_q: int, l_k: int, device="cpu"):
    """``(allowed, bias)``: a boolean tensor of keys each query may attend (broadcastable) and an
    additive float64 bias (or ``None``)."""
    allowed = torch.ones(l_q, l_k, dtype=torch.bool, device=device)
    if is_causal:
        allowed = allowed.tril()
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask.to(device)
        else:
            bias = attn_mask.to(device=device, dtype=F64)
    return allowed, bias


def scores_of(q, k, scale, *, score_mod=None, mod_params=None, gqa=True):
    """``scale·q·kᵀ`` (+ the score modification) in float64, ``[batch, heads, L_q, L_k]``; ``k``
    has the query's heads or ``H_kv`` of them, read as GQA groups (:func:`group_matmul`).
    ``gqa=False``: heads that differ broadcast as ``matmul``'s batch dims do (SDPA without
    ``enable_gqa``)."""
    q, k = q.to(F64), k.to(F64)
    mm = group_matmul if gqa else torch.matmul
    s = mm(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if score_mod is not None:
        s = mods.apply(score_mod, s, **(mod_params or {}))
    return s


def eager(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *,
          normalizer="softmax", score_mod=None, mod_params=None):
    """The float64 reference output ``[batch, heads, L_q, d_v]`` (see the module docstring)."""

    # GQA: k and v keep their H_kv heads; group_matmul reads each for its g query heads.
    s = scores_of(q, k, scale, score_mod=score_mod, mod_params=mod_params, gqa=enable_gqa)
    allowed, bias = allowed_and_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    if score_mod is not None:
        allowed = allowed & mods.allowed(score_mod, q.shape[-2], k.shape[-2], q.device,
                                         **(mod_params or {}))
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~allowed, NEG_INF)
    norm = load_target(normalizer)
    w = norm(s.reshape(-1, s.shape[-1]), dim=-1).reshape(s.shape)
    w = torch.where(torch.isneginf(s).all(dim=-1, keepdim=True), torch.zeros_like(w), w)
    return (group_matmul if enable_gqa else torch.matmul)(w, v.to(F64))


def eager_weights(q, k, attn_mask=None, is_causal=False, scale=None, *, normalizer="softmax"):
    """The float64 reference weights ``[batch, heads, L_q, L_k]`` (``v = I``)."""
    eye = torch.eye(k.shape[-2], dtype=F64, device=k.device).expand(*k.shape[:-1], k.shape[-2])
    return eager(q, k, eye, attn_mask, is_causal, scale, normalizer=normalizer)
