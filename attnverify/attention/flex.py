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
#: Seconds an example may take beyond the per-example time limit: a graph compiles on first use
#: (minutes on a cold inductor cache on a CPU), in the worker process the kernel runs in.
COMPILE_S = 600.0
#: Folded (batch·heads) head counts are padded to these: torch compiles head counts in.
HEADS, GQA_KV_HEADS = 16, 4


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
    """Head dimensions are zero-padded to 64 or 128 (exact: zero products), so that two
    compiled graphs per dtype serve every ``d``."""
    return 64 if d <= 64 else max(128, 1 << (d - 1).bit_length())


def _pad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    extra = length - t.shape[dim]
    if extra <= 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - (dim % t.dim())) + [0, extra]
    return torch.nn.functional.pad(t, pad)


def _head_bucket(n: int, fixed: int) -> int:
    """Head counts are compiled in: pad to ``fixed`` (or the next power of two above it)."""
    return fixed if n <= fixed else 1 << (n - 1).bit_length()


def _fold(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, L, d] → [1, B·H, L, d]``: batch folded into heads (GQA's mapping is kept:
    query head ``b·H + h`` reads key head ``b·H_kv + h // g``)."""
    return t.reshape(1, -1, *t.shape[-2:])


def _mark_dynamic(q, k, v, bias) -> None:
    """Heads, queries and keys dynamic from the first compile (``maybe_``: no error where
    torch specialises one anyway)."""
    import torch._dynamo

    for t, dims in ((q, (1, 2)), (k, (1, 2)), (v, (1, 2)), (bias, (1, 2, 3))):
        for dim in dims:
            torch._dynamo.maybe_mark_dynamic(t, dim)


def flex(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *, mod="",
         window=8, cap=20.0):
    """FlexAttention (compiled) with SDPA's signature and an optional named score mod.

    The call is brought to a canonical form that keeps the compiled graphs few (compiling one
    costs seconds): batch folded into heads and padded to a fixed head count (compiled in), at
    least 2 queries and keys (size 1 would be specialised), head dimensions zero-padded to 64
    or 128, the mask as one bias, the head, query and key dimensions marked dynamic, the scale
    applied to ``q`` beforehand (a float argument would be compiled in as a constant: one graph
    per scale). Padded queries are sliced away and padded keys masked, so the result is the
    kernel's on the true inputs; ALiBi slopes follow the true head index."""
    b, heads, l_q, d = q.shape
    l_k, d_v = k.shape[-2], v.shape[-1]
    width = head_dim_bucket(max(d, d_v))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bias = _fold(_bias(attn_mask, is_causal, q, k, l_q, l_k))
    qf, kf, vf = _fold(q), _fold(k), _fold(v)
    group = heads // k.shape[1] if enable_gqa else 1
    n_kv = _head_bucket(kf.shape[1], HEADS if group == 1 else GQA_KV_HEADS)
    qf = _pad(_pad(_pad(qf, width, -1), max(2, l_q), -2), n_kv * group, 1)
    kf = _pad(_pad(_pad(kf, width, -1), max(2, l_k), -2), n_kv, 1)
    vf = _pad(_pad(_pad(vf, width, -1), max(2, l_k), -2), n_kv, 1)
    bias = _pad(_pad(_pad(bias, max(2, l_q), -2), max(2, l_k), -1), n_kv * group, 1)
    if l_k < 2:
        bias[..., l_k:] = NEG_INF
    slopes = torch.zeros(qf.shape[1], dtype=torch.float32, device=q.device)
    if mod == "alibi":
        from attnverify.attention.mods import alibi_slopes

        true = alibi_slopes(heads, dtype=torch.float32, device=q.device).repeat(b)
        slopes[: true.numel()] = true
    _mark_dynamic(qf, kf, vf, bias)
    # the scale multiplies q here: a Python float argument would be compiled in as a constant
    out = compiled()(qf * scale, kf, vf, bias, slopes, 1.0, mod or "", int(window), float(cap),
                     group > 1)
    return out[:, : b * heads, :l_q, :d_v].reshape(b, heads, l_q, d_v)


def _direct_call(q, k, v, bias, scale, gqa: bool):
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(s, b, h, i, j):
        return s + bias[b, h, i, j]

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale, enable_gqa=gqa)


@functools.cache
def compiled_direct():
    """``torch.compile`` of a plain FlexAttention call, for :func:`flex_direct`."""
    _raise_recompile_limit()
    return torch.compile(_direct_call)


def flex_direct(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """FlexAttention compiled and called on the inputs as they are (no canonical form): what a
    direct ``torch.compile(flex_attention)`` wrapper runs, one compiled graph per shape family.
    Slow to certify (seconds per compile); the mask and causal triangle as one bias."""
    bias = _bias(attn_mask, is_causal, q, k, q.shape[-2], k.shape[-2])
    return compiled_direct()(q, k, v, bias, scale, bool(enable_gqa))
