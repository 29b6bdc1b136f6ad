"""FlexAttention behind SDPA's signature, compiled once per process and cached.

SDPA's ``attn_mask`` and ``is_causal`` become one additive bias (``0`` / ``-inf`` for a boolean
mask, the values of a float mask; zeros without a mask) that a ``score_mod`` reads, and head
dimensions are zero-padded to a power of two, so that a few compiled graphs (per dtype, head-dim
bucket and GQA setting; sequence lengths dynamic after the first recompile) serve every call.
Compiling costs seconds per graph on CPU: this is what keeps ``certify --attention flex`` within
its budget. The named
modifications of :mod:`attnverify.attention.mods` are applied inside the same ``score_mod``, in the
reference's order: soft-capping, ALiBi, the bias, then the causal / sliding-window mask.

On CPU, torch runs FlexAttention forward only (float32, float16, bfloat16; no backward) through
its C++ inductor template: the gradient property is skipped there with that reason.
"""

from __future__ import annotations

import functools
import math

import torch

NEG_INF = float("-inf")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: The lifting (``K = I``) needs ``d = L``; longer rows are checked through generated Q, K, V.
MAX_HEAD_DIM = 128
#: FlexAttention has no backward on CPU in torch 2.13.
DIFFERENTIABLE = torch.cuda.is_available()
#: Compiled graphs kept per function; every mask kind, dtype and GQA setting adds one.
RECOMPILE_LIMIT = 64


def unavailable() -> str:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no FlexAttention ({exc})"
    return ""


def flash_unavailable() -> str:
    """Why SDPA's flash backend cannot run here, or ``""`` (probed once on a tiny input)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.zeros(1, 1, 2, 8)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    except RuntimeError as exc:
        return f"SDPA's flash backend is not available here ({str(exc).splitlines()[0]})"
    return ""


def _raise_recompile_limit() -> None:
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


def _flex_call(q, k, v, bias, slopes, scale, mod: str, window: int, cap: float, gqa: bool):
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(s, b, h, i, j):
        if mod == "softcap":
            s = cap * torch.tanh(s / cap)
        if mod == "alibi":
            s = s + slopes[h] * (j - i)
        if bias is not None:
            s = s + bias[b, h, i, j]
        if mod == "causal":
            s = torch.where(j <= i, s, NEG_INF)
        if mod == "sliding_window":
            s = torch.where((j <= i) & (j > i - window), s, NEG_INF)
        return s

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale, enable_gqa=gqa)


@functools.cache
def compiled():
    """``torch.compile(_flex_call)``, built on first use and kept for the process."""
    _raise_recompile_limit()
    return torch.compile(_flex_call)


def _bias(attn_mask, is_causal, q, k, l_q: int, l_k: int) -> torch.Tensor:
    """The additive bias ``[B, H, L_q', L_k']`` of the padded call: the mask, the causal
    triangle, and ``-inf`` on padded keys (always a tensor: one graph for every mask kind)."""
    b, h = q.shape[0], q.shape[1]
    work = torch.float32 if q.dtype != torch.float64 else q.dtype
    bias = torch.zeros(b, h, l_q, l_k, dtype=work, device=q.device)
    rows, cols = q.shape[-2], k.shape[-2]
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            add = torch.zeros(attn_mask.shape, dtype=work, device=q.device)
            add = add.masked_fill(~attn_mask, NEG_INF)
        else:
            add = attn_mask.to(work)
        bias[..., :rows, :cols] += add.expand(b, h, rows, cols)
    if is_causal:
        causal = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril()
        bias[..., :rows, :cols].masked_fill_(~causal, NEG_INF)
    bias[..., cols:] = NEG_INF
    return bias


def head_dim_bucket(d: int) -> int:
    """Head dimensions are padded with zeros to a power of two ≥ 16 (exact: zero products),
    so that a few compiled graphs serve every d."""
    return max(16, 1 << (max(d, 1) - 1).bit_length())


def _pad(t: torch.Tensor, length: int) -> torch.Tensor:
    extra = length - t.shape[-1]
    return torch.nn.functional.pad(t, (0, extra)) if extra > 0 else t


def flex(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *, mod="",
         window=8, cap=20.0):
    """FlexAttention (compiled) with SDPA's signature and an optional named score mod.

    Head dimensions are zero-padded to :func:`head_dim_bucket` (the scale stays ``1/√d`` of the
    true ``d``), the output sliced back; sequence lengths are left as they are (dynamic)."""
    d, d_v = q.shape[-1], v.shape[-1]
    width = head_dim_bucket(max(d, d_v))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bias = _bias(attn_mask, is_causal, q, k, q.shape[-2], k.shape[-2])
    slopes = None
    if mod == "alibi":
        from attnverify.attention.mods import alibi_slopes

        slopes = alibi_slopes(q.shape[1], dtype=torch.float32, device=q.device)
    qp, kp, vp = (_pad(t, width) for t in (q, k, v))
    out = compiled()(qp, kp, vp, bias, slopes, scale, mod or "", int(window), float(cap),
                     bool(enable_gqa))
    return out[..., :d_v]
