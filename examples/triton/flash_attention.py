"""A flash-attention forward in Triton with SDPA's signature: query blocks per program, an online
softmax over key blocks, boolean and additive masks in any shape SDPA broadcasts (read through
their strides, stride 0 included), ``is_causal`` (top-left aligned), ``scale`` and GQA
(``enable_gqa``). q, k, v and the mask may be any strided views; nothing is copied.

    attnverify certify --attention examples/triton/flash_attention.py:spec

``spec`` declares what it takes (``attention_spec``): softmax, GQA, float32 / float64 / float16,
head dimensions up to 128, no backward (a forward kernel: the gradient properties say so).
"""

import math

import torch
import triton
import triton.language as tl

from attnverify import attention_spec

BLOCK_M = 16  # queries per program
BLOCK_N = 64  # keys per step of the loop (few steps: the interpreter pays per step)


@triton.jit
def _flash_forward(Q, K, V, M, O,
                   sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                   smb, smh, smm, smn, sob, soh, som, sod,
                   H, GROUP, L_Q, L_K, D, D_V, scale,
                   HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   ACC: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    h_kv = h // GROUP  # query head h reads key/value head h // (H / H_kv)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=(offs_m[:, None] < L_Q) & (offs_d[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], ACC)
    end = L_K
    if CAUSAL:  # keys past the block's last query are masked for every query of it
        end = tl.minimum(L_K, (start_m + 1) * BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + b * skb + h_kv * skh + cols[:, None] * skn + offs_d[None, :] * skd,
                    mask=(cols[:, None] < L_K) & (offs_d[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(k), out_dtype=ACC) * scale
        keep = (offs_m[:, None] < L_Q) & (cols[None, :] < L_K)
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        if HAS_MASK:
            s += tl.load(M + b * smb + h * smh + offs_m[:, None] * smm + cols[None, :] * smn,
                         mask=keep, other=0.0).to(ACC)
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a query with no key yet
        alpha = tl.exp(m_i - safe)
        p = tl.exp(s - safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + h_kv * svh + cols[:, None] * svn + offs_dv[None, :] * svd,
                    mask=(cols[:, None] < L_K) & (offs_dv[None, :] < D_V), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=ACC)
        m_i = m_new
    # a query that may attend no key gets 0 (SDPA's math backend gives NaN there)
    out = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    tl.store(O + b * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
             out.to(O.dtype.element_ty), mask=(offs_m[:, None] < L_Q) & (offs_dv[None, :] < D_V))


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` for q [B, H, L_q, d], k [B, H_kv,
    L_k, d], v [B, H_kv, L_k, d_v] (H_kv < H with ``enable_gqa``)."""
    if dropout_p:
        raise ValueError("dropout is not supported")
    if attn_mask is not None and is_causal:
        raise ValueError("give attn_mask or is_causal, not both (as SDPA)")
    B, H, L_Q, D = query.shape
    H_KV, L_K, D_V = key.shape[-3], key.shape[-2], value.shape[-1]
    if H != H_KV and not (enable_gqa and H % H_KV == 0):
        raise ValueError(f"{H} query heads over {H_KV} key/value heads need enable_gqa")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty(B, H, L_Q, D_V, dtype=query.dtype, device=query.device)
    mask = None
    if attn_mask is not None:
        mask = attn_mask
        if mask.dtype == torch.bool:  # True = may attend: 0 there, -inf elsewhere
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~mask, float("-inf"))
        mask = mask.expand(B, H, L_Q, L_K)  # stride 0 along the broadcast axes: no copy
    acc = tl.float64 if query.dtype == torch.float64 else tl.float32
    m = mask if mask is not None else out
    if B * H and L_Q:
        grid = (triton.cdiv(L_Q, BLOCK_M), B * H)
        _flash_forward[grid](
            query, key, value, m, out, *query.stride(), *key.stride(), *value.stride(),
            *m.stride(), *out.stride(), H, H // H_KV, L_Q, L_K, D, D_V, scale,
            HAS_MASK=mask is not None, CAUSAL=bool(is_causal), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            BLOCK_D=max(16, triton.next_power_of_2(D)),
            BLOCK_DV=max(16, triton.next_power_of_2(D_V)), ACC=acc)
    return out


spec = attention_spec(attention, id="triton_flash", gqa=True,
                      dtypes=(torch.float32, torch.float64, torch.float16), max_head_dim=128,
                      differentiable=False,
                      description="Triton flash-attention forward (examples/triton)")
