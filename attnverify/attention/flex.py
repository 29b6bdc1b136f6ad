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
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnverify.attention.mods import alibi_slopes

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
#: Folded (batch·heads) heads are cut into chunks of these (padded): torch compiles head counts
#: in, so every call of any batch and head count runs the same few graphs.
HEADS, GQA_KV_HEADS = 16, 4
#: GQA groups are padded to this many query heads per key/value head (larger ones first become
#: smaller groups over repeated key/value heads).
GQA_GROUP = 4


def unavailable() -> str:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401 - optional dependency: torch 2.5+
    except ImportError as exc:
        return f"torch {torch.__version__} has no FlexAttention ({exc})"
    return ""


def flash_unavailable() -> str:
    """Why SDPA's flash backend cannot run here, or ``""`` (probed once on a tiny input)."""

    q = torch.zeros(1, 1, 2, 8)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    except RuntimeError as exc:
        return f"SDPA's flash backend is not available here ({str(exc).splitlines()[0]})"
    return ""


def _raise_recompile_limit() -> None:
    import torch._dynamo  # heavy: torch._dynamo, only a flex call

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


def _flex_call(q, k, v, bias, slopes, scale, mod: str, window: int, cap: float, gqa: bool):
    # heavy: torch._dynamo, only a flex call
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


def _regroup(k: torch.Tensor, v: torch.Tensor, group: int):
    """``(k, v, group)`` with each key/value head repeated ``f`` times (interleaved, the
    smallest ``f`` dividing the group with ``group / f ≤`` :data:`GQA_GROUP`): one compiled GQA
    graph serves every group (inductor's CPU template also fails to compile some larger groups
    once the lengths are dynamic)."""
    f = min(x for x in range(1, group + 1) if group % x == 0 and group // x <= GQA_GROUP)
    if f == 1:
        return k, v, group
    return k.repeat_interleave(f, dim=1), v.repeat_interleave(f, dim=1), group // f


def _fold(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, L, d] → [1, B·H, L, d]``: batch folded into heads (GQA's mapping is kept:
    query head ``b·H + h`` reads key head ``b·H_kv + h // g``)."""
    return t.reshape(1, -1, *t.shape[-2:])


def _pad_group(t: torch.Tensor, group: int, bucket: int) -> torch.Tensor:
    """``[1, n·group, …] → [1, n·bucket, …]``: each key/value head's query heads padded to
    ``bucket`` (query head ``i·bucket + r`` still reads key head ``i``)."""
    if group == bucket:
        return t
    grouped = t.reshape(-1, group, *t.shape[2:])
    return _pad(grouped, bucket, 1).reshape(1, -1, *t.shape[2:])


def _mark_dynamic(q, k, v, bias) -> None:
    """Queries and keys dynamic from the first compile (``maybe_``: no error where torch
    specialises one anyway)."""
    import torch._dynamo  # heavy: torch._dynamo, only a flex call

    for t, dims in ((q, (2,)), (k, (2,)), (v, (2,)), (bias, (2, 3))):
        for dim in dims:
            torch._dynamo.maybe_mark_dynamic(t, dim)


def flex(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *, mod="",
         window=8, cap=20.0):
    """FlexAttention (compiled) with SDPA's signature and an optional named score mod.

    The call is brought to a canonical form that keeps the compiled graphs few (compiling one
    costs seconds): batch folded into heads and cut into chunks of a fixed head count
    (:data:`HEADS` query heads; with GQA :data:`GQA_KV_HEADS` key/value heads, each with its
    query heads padded to a group of :data:`GQA_GROUP`), one call per chunk; at least 2 queries
    and keys (size 1 would be specialised), head dimensions zero-padded to 64 or 128, the mask as
    one bias, the query and key dimensions marked dynamic, the scale applied to ``q`` beforehand
    (a float argument would be compiled in as a constant: one graph per scale). Padded queries are
    sliced away and padded keys masked, so the result is the kernel's on the true inputs; ALiBi
    slopes follow the true head index."""
    b, heads, l_q, d = q.shape
    l_k, d_v = k.shape[-2], v.shape[-1]
    width = head_dim_bucket(max(d, d_v))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    k, v, group = _regroup(k, v, heads // k.shape[1] if enable_gqa else 1)
    bucket = GQA_GROUP if group > 1 else 1
    kv_chunk = GQA_KV_HEADS if group > 1 else HEADS
    slopes = torch.zeros(b * heads, dtype=torch.float32, device=q.device)
    if mod == "alibi":
        slopes = alibi_slopes(heads, dtype=torch.float32, device=q.device).repeat(b)
    bias = _fold(_bias(attn_mask, is_causal, q, k, l_q, l_k))
    qf, bias, slopes = (_pad_group(t, group, bucket) for t in
                        (_fold(q * scale), bias, slopes[None, :, None, None]))
    kf, vf = _fold(k), _fold(v)
    n_kv = -(-kf.shape[1] // kv_chunk) * kv_chunk
    qf = _pad(_pad(_pad(qf, width, -1), max(2, l_q), -2), n_kv * bucket, 1)
    kf = _pad(_pad(_pad(kf, width, -1), max(2, l_k), -2), n_kv, 1)
    vf = _pad(_pad(_pad(vf, width, -1), max(2, l_k), -2), n_kv, 1)
    bias = _pad(_pad(_pad(bias, max(2, l_q), -2), max(2, l_k), -1), n_kv * bucket, 1)
    slopes = _pad(slopes, n_kv * bucket, 1).reshape(-1)
    if l_k < 2:
        bias[..., l_k:] = NEG_INF
    outs = []
    q_chunk = kv_chunk * bucket
    for c in range(n_kv // kv_chunk):
        qs, ks = slice(c * q_chunk, (c + 1) * q_chunk), slice(c * kv_chunk, (c + 1) * kv_chunk)
        # fresh tensors, never views: torch guards on a view's base (a recompile each time a
        # chunk is, or is not, a view)
        args = [t.clone(memory_format=torch.contiguous_format)
                for t in (qf[:, qs], kf[:, ks], vf[:, ks], bias[:, qs])]
        _mark_dynamic(*args)
        # the scale multiplied q above: a Python float argument would be compiled in
        outs.append(compiled()(*args, slopes[qs].clone(), 1.0, mod or "", int(window),
                               float(cap), group > 1))
    out = torch.cat(outs, dim=1)
    if bucket != group:  # drop each group's padded query heads
        out = out.reshape(-1, bucket, *out.shape[2:])[:, :group].reshape(1, -1, *out.shape[2:])
    return out[:, : b * heads, :l_q, :d_v].reshape(b, heads, l_q, d_v)


def _direct_call(q, k, v, bias, scale, gqa: bool):
    # heavy: torch._dynamo, only a flex call
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
