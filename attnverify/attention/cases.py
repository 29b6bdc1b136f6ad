"""Inputs of the attention-level properties: ``Q``, ``K``, ``V`` and a mask, built from a small
*recipe* (structural parameters and a seed) that Hypothesis draws and shrinks.

The recipe is a plain dict of ints, floats and strings; :func:`build` turns it into an
:class:`AttnCase` deterministically, so that a counterexample is reproduced from its recipe alone
(``python -m attnverify.attention.repro``). A recipe without one of the later fields (an older
certificate's) builds as it always did, but for a band or window past the last key.

**Shapes.** ``b`` batch elements (1–4), ``h`` query heads (1 to 64: the head counts of real
models and their neighbours), ``h_kv`` key/value heads (any divisor of ``h``: GQA groups up to
16), head dimensions ``d`` and ``d_v`` drawn independently (powers of two and not), ``L_q`` and
``L_k`` either side of the block sizes of tiled kernels (64, 128) with tails. The queries' scores
(``b·h·L_q·L_k``) stay within :data:`BUDGET`, and each of ``Q``, ``K``, ``V`` (keys and values
counted at every query head) within :data:`ELEMENTS`: each size reaches its largest value, but
not all of them in one case.

**Query/key kinds** (the embedding settings of the papers, ``Δ = ‖q‖·max‖k‖``): ``gaussian``;
``aligned`` (every key ``±`` a multiple of one query direction: large logits, exact ties);
``duplicates`` (repeated keys: exact ties); ``mixed_norms`` (key norms over four decades).

**Masks** (``mask``, the pattern): ``none``, ``bool`` (random, every query keeps a key),
``band`` (symmetric window), ``window`` (causal sliding window; for both, a query past the last
key's window keeps the last key, so that only ``dead`` leaves a query without a key),
``columns`` (keys masked for
every query), ``padding`` (valid prefix of the keys per batch element), ``padded_causal``
(per-batch padding combined with a causal triangle: a decoder's mask; left padding when the
recipe asks for fully masked rows, whose padded queries then see no key), ``causal``
(``is_causal=True``, no tensor). How the pattern is given:

- ``mask_type``: ``bool`` (True = may attend) or ``additive`` (finite biases, ``-inf`` where a
  key may not be attended); an additive mask may carry a constant ``offset`` added to every
  finite bias (drawn one time in four over the dtype's whole range, both signs:
  :func:`attnverify.strategies.domain.offsets`), which moves every row as a whole and so
  changes nothing;
- ``mask_shape``: every shape SDPA broadcasts to ``[B, H, L_q, L_k]``: ``full`` ``[B, H, L_q,
  L_k]``, ``batch`` ``[B, 1, L_q, L_k]`` (the Hugging Face shape), ``heads`` ``[1, H, L_q, L_k]``,
  ``shared`` ``[1, 1, L_q, L_k]``, ``2d`` ``[L_q, L_k]``, ``keys`` ``[B, 1, 1, L_k]``; the
  pattern is drawn at that shape, so a broadcast mask differs per batch element or head only
  where its shape says so;
- ``mask_view``: ``plain``; ``expanded`` (the broadcast mask expanded to ``[B, H, L_q, L_k]``
  with stride 0, as a model broadcasts one mask to every head); ``sliced`` (a view
  ``[..., :L_q, :L_k]`` of a longer buffer, as a cached causal mask is sliced; the buffer's
  other entries are visibly wrong: ``False`` or ``37.0``);
- ``dead``: some query rows see no key at all, in any shape (for a ``keys`` or ``batch`` mask a
  whole batch element or query row, broadcast over the heads).

The older kinds stay readable: ``additive`` (= ``bool`` with ``mask_type: additive``),
``fully_masked`` (= ``bool`` with ``dead``), ``batch_bool`` (= ``bool`` of shape ``batch``,
expanded).

**Layouts** of ``q``, ``k``, ``v`` (the recipe's ``layout``): ``bhld`` (contiguous ``[B, H, L,
d]``); ``hf`` (transposed views of contiguous ``[B, L, H, d]`` buffers, the Hugging Face layout:
``x.view(B, L, H, d).transpose(1, 2)``); ``cache`` (``k`` and ``v`` slices
``[:, :, s:s + L_k]`` of a longer key/value cache at a non-zero storage offset, its unused
entries large); ``qkv`` (``q``, ``k``, ``v`` offset views of one fused projection buffer ``[B, L,
(H + H_kv)·d + H_kv·d_v]``; for ``L_q ≠ L_k`` the keys and values share a fused ``[B, L_k,
H_kv·(d + d_v)]`` buffer).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, NamedTuple

import torch
from hypothesis import strategies as st

from attnverify.attention.reference import allowed_and_bias
from attnverify.strategies import domain

QK_KINDS = ("gaussian", "aligned", "duplicates", "mixed_norms")
#: Mask patterns (``none`` and ``causal`` build no tensor); the last three are the older
#: spellings of a pattern with its type, shape, view or dead rows.
MASK_KINDS = ("none", "bool", "band", "window", "columns", "padding", "padded_causal", "causal",
              "additive", "fully_masked", "batch_bool")
MASK_TYPES = ("bool", "additive")
#: Every mask shape SDPA broadcasts, by name: its size along (batch, heads, queries, keys);
#: ``2d`` has no batch and head axes.
MASK_SHAPES = {"full": ("b", "h", "q", "k"), "batch": ("b", 1, "q", "k"),
               "heads": (1, "h", "q", "k"), "shared": (1, 1, "q", "k"), "2d": ("q", "k"),
               "keys": ("b", 1, 1, "k")}
MASK_VIEWS = ("plain", "expanded", "sliced")
#: The shapes each pattern can take (a pattern over query positions needs the query axis).
PATTERN_SHAPES = {"bool": tuple(MASK_SHAPES), "band": ("full", "batch", "heads", "shared", "2d"),
                  "window": ("batch", "full", "heads", "shared", "2d"),
                  "columns": ("keys",), "padding": ("keys",),
                  "padded_causal": ("batch", "full", "shared", "2d")}
#: The older kinds: ``(pattern, overrides)``.
LEGACY = {"additive": ("bool", {"mask_type": "additive"}),
          "fully_masked": ("bool", {"dead": True}),
          "batch_bool": ("bool", {"mask_shape": "batch", "mask_view": "expanded"})}
#: The shape a pattern takes when the recipe names none (what the first releases built).
NATURAL_SHAPE = {"bool": "full", "band": "full", "window": "batch", "columns": "keys",
                 "padding": "keys", "padded_causal": "batch"}
LAYOUTS = ("bhld", "hf", "cache", "qkv")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
#: Head dimensions: powers of two first (shrinking goes there), then others (6: not a multiple
#: of 4; 12 and 24: not of 8 or 16; 40, 48, 80, 96: multiples of 8 or 16, not powers of two).
HEAD_DIMS = (4, 8, 16, 32, 64, 128, 6, 12, 24, 40, 48, 80, 96)
#: Head dimensions up to 64 (properties whose kernels compile a graph per head-dim bucket).
SMALL_HEAD_DIMS = tuple(d for d in HEAD_DIMS if d <= 64)
MAGNITUDES = (0.1, 1.0, 3.0, 10.0)
#: Longest key sequence the generated cases reach (the low-precision battery goes to 4096).
MAX_KEYS = 1024
MAX_QUERIES = 129
MAX_BATCH = 4
MAX_HEADS = 64
#: Query head counts beyond 1–4: those of real models and their neighbours.
HEAD_COUNTS = (5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 40, 64)
#: GQA groups (query heads per key/value head) and key/value head counts.
GROUPS = (2, 3, 4, 8, 5, 16)
KV_HEADS = (1, 2, 3, 4, 8, 5, 6)
#: Most scores (``b·h·L_q·L_k``) a generated case has: big shapes get shorter sequences.
BUDGET = 1 << 18
#: Most entries a generated case's ``[b, h, L, max(d, d_v)]`` query, key or value (the keys and
#: values repeated to the query heads, as a GQA check does) has: many heads of a wide head
#: dimension get shorter sequences (every length, head count and ``d`` is still reached).
ELEMENTS = 1 << 21
#: What the unused entries of a sliced buffer hold (a kernel that reads them is visibly wrong).
FILL_KEYS, FILL_ADDITIVE = 1e3, 37.0


class AttnCase(NamedTuple):
    q: torch.Tensor  # [B, H, L_q, d]
    k: torch.Tensor  # [B, H_kv, L_k, d]
    v: torch.Tensor  # [B, H_kv, L_k, d_v]
    attn_mask: torch.Tensor | None  # bool (True = may attend) or additive, broadcastable
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    recipe: dict[str, Any]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _qk(r: dict, g: torch.Generator):
    b, h, h_kv, l_q, l_k, d = r["b"], r["h"], r["h_kv"], r["l_q"], r["l_k"], r["d"]
    mag = float(r["mag"])
    q = torch.randn(b, h, l_q, d, generator=g, dtype=torch.float64) * mag
    kind = r["qk"]
    if kind == "aligned":
        u = torch.randn(b, h_kv, 1, d, generator=g, dtype=torch.float64)
        u = u / u.norm(dim=-1, keepdim=True)
        c = torch.randint(-3, 4, (b, h_kv, l_k, 1), generator=g).to(torch.float64)
        k = c * u * mag
        q = q + u.repeat_interleave(h // h_kv, dim=1) * mag * 2
    elif kind == "duplicates":
        base = torch.randn(b, h_kv, max(1, l_k // 3), d, generator=g, dtype=torch.float64)
        idx = torch.randint(0, base.shape[-2], (l_k,), generator=g)
        k = base[:, :, idx] * mag
    elif kind == "mixed_norms":
        k = torch.randn(b, h_kv, l_k, d, generator=g, dtype=torch.float64)
        k = k * torch.pow(10.0, torch.rand(b, h_kv, l_k, 1, generator=g, dtype=torch.float64)
                          * 4 - 2) * mag
    else:
        k = torch.randn(b, h_kv, l_k, d, generator=g, dtype=torch.float64) * mag
    return q, k


def _values(r: dict, g: torch.Generator) -> torch.Tensor:
    shape = (r["b"], r["h_kv"], r["l_k"], r["d_v"])
    if r.get("positive_v"):
        return 0.5 + torch.rand(*shape, generator=g, dtype=torch.float64)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# --------------------------------------------------------------------------------------------
# Masks


def _keep_one(allowed: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Every query keeps at least one key (a random one)."""
    pick = torch.randint(0, allowed.shape[-1], allowed.shape[:-1] + (1,), generator=g)
    return allowed.scatter(-1, pick, True)


def mask_form(r: dict) -> tuple[str, str, str, str, bool]:
    """``(pattern, type, shape, view, dead)`` of a recipe's mask (the older kinds resolved)."""
    kind = r.get("mask", "none")
    pattern, over = LEGACY.get(kind, (kind, {}))
    r = {**r, **over}
    shape = r.get("mask_shape") or NATURAL_SHAPE.get(pattern, "full")
    return (pattern, r.get("mask_type") or "bool", shape, r.get("mask_view") or "plain",
            bool(r.get("dead", False)))


def explicit(r: dict) -> dict:
    """``r`` with an older mask kind spelled as its pattern and fields (the same tensors)."""
    if r.get("mask") not in LEGACY:
        return r
    pattern, kind, shape, view, dead = mask_form(r)
    return {**r, "mask": pattern, "mask_type": kind, "mask_shape": shape, "mask_view": view,
            "dead": dead}


def _dims(shape: str, r: dict) -> tuple[int, int, int, int]:
    """The mask's sizes along (batch, heads, queries, keys) (``2d``: batch and heads of 1)."""
    sizes = {"b": r["b"], "h": r["h"], "q": r["l_q"], "k": r["l_k"], 1: 1}
    axes = MASK_SHAPES[shape]
    return tuple(sizes[a] for a in ((1, 1) + axes if len(axes) == 2 else axes))


def _pattern(pattern: str, dims, dead: bool, r: dict, g: torch.Generator) -> torch.Tensor:
    """Boolean ``dims``: the keys each query may attend (a key for every query unless
    ``dead``: then some rows, at the mask's own shape, see none)."""
    allowed = _allowed(pattern, dims, dead, r, g)
    if pattern in ("band", "window"):  # a query past the last key + w keeps the last key
        last = torch.arange(dims[-1]) == dims[-1] - 1
        allowed = allowed | (~allowed.any(-1, keepdim=True) & last)
    if dead and pattern != "padded_causal":  # that one has its padded queries
        rows = torch.rand(*dims[:-1], 1, generator=g) < 0.4
        rows.view(-1)[0] = True
        allowed = allowed & ~rows
    return allowed


def _allowed(pattern: str, dims, dead: bool, r: dict, g: torch.Generator) -> torch.Tensor:
    b, h, l_q, l_k = dims
    i = torch.arange(l_q)[:, None]
    j = torch.arange(l_k)[None, :]
    p = float(r.get("keep", 0.5))
    w = max(1, int(r.get("window", 4)))
    if pattern == "band":
        return ((j - i).abs() < w).expand(dims)
    if pattern == "window":
        return ((j <= i) & (j > i - w)).expand(dims)
    if pattern in ("columns", "padding"):
        if pattern == "columns":
            keys = torch.rand(b, 1, 1, l_k, generator=g) < p
            keys[..., 0] = True
        else:
            n = torch.randint(1, l_k + 1, (b, 1, 1, 1), generator=g)
            keys = j[None, None] < n
        return keys.expand(dims)
    if pattern == "padded_causal":
        n = torch.randint(1, l_k + 1, (b, 1, 1, 1), generator=g)  # valid keys per element
        if dead:  # left padding: the first l_k − n keys are padding, their queries see none
            n[0] = torch.randint(0, l_k, (1,), generator=g)  # element 0 has padding
            return ((j <= i) & (j >= l_k - n)).expand(dims)
        return ((j <= i) & (j < n)).expand(dims)  # right padding: never a dead query
    return _keep_one(torch.rand(*dims, generator=g) < p, g)


def _mask(r: dict, g: torch.Generator):
    """``(attn_mask at its shape or None, is_causal, view)``: float64 biases or booleans."""
    if r["mask"] == "causal":
        return None, True, "plain"
    if r["mask"] == "none":
        return None, False, "plain"
    pattern, kind, shape, view, dead = mask_form(r)
    if pattern not in PATTERN_SHAPES:
        raise ValueError(f"unknown mask {r['mask']!r} (one of {', '.join(MASK_KINDS)})")
    if shape not in PATTERN_SHAPES[pattern]:
        raise ValueError(f"mask {r['mask']!r} does not take mask_shape {shape!r} (one of "
                         f"{', '.join(PATTERN_SHAPES[pattern])})")
    if kind not in MASK_TYPES or view not in MASK_VIEWS:
        raise ValueError(f"mask_type must be one of {MASK_TYPES}, mask_view one of {MASK_VIEWS}")
    dims = _dims(shape, r)
    bias = torch.randn(*dims, generator=g, dtype=torch.float64) * 3 + float(
        r.get("offset", 0.0)) if kind == "additive" else None
    allowed = _pattern(pattern, dims, dead, r, g).contiguous()
    if bias is not None:
        allowed = bias.masked_fill(~allowed, float("-inf"))
    if shape == "2d":
        allowed = allowed[0, 0]
    return allowed, False, view


def _view_mask(mask: torch.Tensor, view: str, r: dict) -> torch.Tensor:
    """The mask (already in its dtype and on its device) given as ``view``."""
    if view == "expanded":
        return mask.expand(r["b"], r["h"], r["l_q"], r["l_k"])
    if view == "sliced":
        grow = [0] * (mask.dim() - 2) + [0 if mask.shape[-2] == 1 else 3, 5]
        fill = False if mask.dtype == torch.bool else FILL_ADDITIVE
        buf = torch.full([n + e for n, e in zip(mask.shape, grow)], fill, dtype=mask.dtype,
                         device=mask.device)
        region = buf[..., : mask.shape[-2], : mask.shape[-1]]
        region.copy_(mask)
        return region
    return mask


# --------------------------------------------------------------------------------------------
# Layouts of q, k, v


def _hf(t: torch.Tensor) -> torch.Tensor:
    """A transposed view of a contiguous ``[B, L, H, d]`` buffer."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _cache_slice(t: torch.Tensor, fill: float) -> torch.Tensor:
    """``t`` as ``cache[:, :, s:s + L]`` of a longer cache ``[B, H, L + extra, d]`` (s = 2)."""
    b, h, length, d = t.shape
    extra = max(5, length // 4)
    cache = torch.full((b, h, length + extra, d), fill, dtype=t.dtype, device=t.device)
    cache[:, :, 2:2 + length] = t
    return cache[:, :, 2:2 + length]


def _fused(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``parts`` (``[B, H_i, L, d_i]``, one length) as offset views of one fused projection
    buffer ``[B, L, Σ H_i·d_i]``: ``buf[..., o:o + H·d].view(B, L, H, d).transpose(1, 2)``."""
    b, length = parts[0].shape[0], parts[0].shape[2]
    widths = [t.shape[1] * t.shape[3] for t in parts]
    buf = torch.cat([t.transpose(1, 2).reshape(b, length, w) for t, w in zip(parts, widths)],
                    dim=-1)
    out, start = [], 0
    for t, w in zip(parts, widths):
        out.append(buf[..., start:start + w].view(b, length, t.shape[1], t.shape[3])
                   .transpose(1, 2))
        start += w
    return out


def _arrange(q, k, v, layout: str):
    if layout == "hf":
        return _hf(q), _hf(k), _hf(v)
    if layout == "cache":
        return q, _cache_slice(k, FILL_KEYS), _cache_slice(v, FILL_KEYS)
    if layout == "qkv":
        if q.shape[2] == k.shape[2]:
            return tuple(_fused([q, k, v]))
        return (_hf(q), *_fused([k, v]))
    if layout != "bhld":
        raise ValueError(f"unknown layout {layout!r} (one of {', '.join(LAYOUTS)})")
    return q, k, v


def build(recipe: dict[str, Any]) -> AttnCase:
    """The case of a recipe (deterministic: same recipe, same tensors)."""
    r = dict(recipe)
    if r["h"] % r["h_kv"]:
        raise ValueError(f"h={r['h']} is not a multiple of h_kv={r['h_kv']}")
    g = _gen(r["seed"])
    dtype = DTYPES[r["dtype"]]
    q, k = _qk(r, g)
    v = _values(r, g)
    mask, causal, view = _mask(r, g)
    scale = None if r["scale"] == "default" else float(r["scale"])
    device = r.get("device", "cpu")
    q, k, v = (t.to(dtype=dtype, device=device) for t in (q, k, v))
    q, k, v = _arrange(q, k, v, r.get("layout", "bhld"))
    if mask is not None:
        mask = mask.to(device=device, dtype=mask.dtype if mask.dtype == torch.bool else dtype)
        mask = _view_mask(mask, view, r)
    return AttnCase(q, k, v, mask, causal, scale, r["h"] != r["h_kv"], r)


# --------------------------------------------------------------------------------------------
# Strategies


# Every strategy below is built once per distinct set of parameters and reused by every draw:
# building (and Hypothesis validating) a fresh ``one_of``/``sampled_from`` tree inside each draw
# cost most of a draw's time.


@cache
def _ints(lo: int, hi: int):
    return st.integers(lo, hi)


@cache
def _among(values: tuple):
    return st.sampled_from(values)


@cache
def _lengths(lo: int, hi: int):
    """Mostly short lengths, sometimes long ones (powers of two and their neighbours)."""
    hi = max(lo, hi)
    small = _ints(lo, min(hi, 16))
    if hi <= 16:
        return small
    big = [n for n in (31, 33, 40, 63, 64, 65, 127, 128, 129, 255, 257, 512, 1000, 1023, 1024,
                       1025, 2048, 4096) if lo <= n <= hi]
    return st.one_of(small, _ints(lo, hi), _among(tuple(big or [hi])))


def _heads(draw, gqa, max_heads: int) -> tuple[int, int]:
    """``(h, h_kv)``: ``gqa=False`` one key/value head per query head; ``True`` fewer (a group of
    2 to 16 over 1 to 8 key/value heads); ``"mixed"`` either."""
    if gqa is False:
        h = draw(_same_heads(max_heads))
        return h, h
    groups = [n for n in ((1, *GROUPS) if gqa == "mixed" else GROUPS) if n <= max_heads] or [1]
    group = draw(_mostly(_among(tuple(groups[:3])), _among(tuple(groups))))
    kv = draw(_kv_heads(group, max_heads))
    return kv * group, kv


@cache
def _same_heads(max_heads: int):
    counts = tuple(n for n in HEAD_COUNTS if n <= max_heads)
    small = _ints(1, min(4, max_heads))
    return _mostly(small, _among(counts)) if counts else small


@cache
def _kv_heads(group: int, max_heads: int):
    kvs = tuple(n for n in KV_HEADS if n * group <= max_heads) or (1,)
    return _mostly(_among(kvs[:2]), _among(kvs))


@cache
def _mostly(common, rare):
    """``common`` three times in four, else ``rare`` (shrinking goes to ``common``): the big
    shapes stay reachable without making every example slow."""
    return st.one_of(common, common, common, rare)


def _mask_fields(draw, masks, mask_types, dead: bool, dtype: str) -> dict[str, Any]:
    kind = draw(_among(tuple(masks)))
    out = {"mask": kind, "dead": dead and kind not in ("none", "causal")}
    if kind in PATTERN_SHAPES:
        out["mask_type"] = draw(_among(tuple(mask_types)))
        shape = draw(_among(tuple(PATTERN_SHAPES[kind])))
        views = ("plain", "sliced") if shape == "full" else MASK_VIEWS
        out.update(mask_shape=shape, mask_view=draw(_among(tuple(views))))
        if out["mask_type"] == "additive":
            out["offset"] = draw(_offsets(dtype))
    return out


@cache
def _offsets(dtype: str):
    """The constant offset of an additive mask: none three times in four, else
    :func:`attnverify.strategies.domain.offsets` of the dtype (a large constant a kernel must
    not take for "masked")."""
    return st.one_of(st.just(0.0), st.just(0.0), st.just(0.0), domain.offsets(DTYPES[dtype]))


def recipes(*, dtypes, masks=("none",), max_keys=MAX_KEYS, gqa=False, head_dims=HEAD_DIMS,
            min_keys=1, positive_v=False, scales=("default", "explicit"), device="cpu",
            min_batch=1, max_batch=MAX_BATCH, max_heads=MAX_HEADS, mask_types=MASK_TYPES,
            dead=False, max_head_dim=None, layouts=LAYOUTS, budget=BUDGET, elements=ELEMENTS,
            cap=None):
    """Hypothesis strategy of recipes; ``gqa=True`` draws fewer key/value heads than query heads,
    ``gqa="mixed"`` sometimes. ``max_head_dim`` caps ``d`` and ``d_v`` (a kernel's declared
    limit); ``dead``: every mask has query rows that see no key; ``cap``
    ``(programs, queries)``: each recipe :func:`capped`."""
    names = [str(d).removeprefix("torch.") for d in dtypes]
    dims = [d for d in head_dims if max_head_dim is None or d <= max_head_dim] or [
        min(head_dims)]

    common = tuple(x for x in dims if x <= 64 and not x & (x - 1)) or tuple(dims)
    batches = _mostly(_ints(min_batch, max(min_batch, 2)),
                      _ints(min_batch, max(min_batch, max_batch)))
    head_dim = st.one_of(_among(common), _among(tuple(dims)))
    fixed = {name: _among(tuple(values)) for name, values in (
        ("scale_mode", scales), ("dtype", names), ("qk", QK_KINDS), ("mag", MAGNITUDES),
        ("keep", (0.5, 0.1, 0.9)), ("layout", layouts))}
    window, seed = _ints(1, 8), _ints(0, 2**16)

    @st.composite
    def draw(draw):
        b = draw(batches)
        h, h_kv = _heads(draw, gqa, max_heads)
        d = draw(head_dim)
        d_v = draw(_value_dims(d, tuple(dims)))
        room = max(1, budget // (b * h))
        longest = max(1, elements // (b * h * max(d, d_v)))
        l_q = draw(_lengths(1, min(MAX_QUERIES, longest, max(1, room // max(1, min_keys)))))
        l_k = draw(_lengths(min_keys, max(min_keys, min(max_keys, longest, room // l_q))))
        scale_mode = draw(fixed["scale_mode"])
        dtype = draw(fixed["dtype"])
        out = {
            "b": b, "h": h, "h_kv": h_kv, "l_q": l_q, "l_k": l_k, "d": d, "d_v": d_v,
            "dtype": dtype, "qk": draw(fixed["qk"]), "mag": draw(fixed["mag"]),
            **_mask_fields(draw, masks, mask_types, dead, dtype),
            "keep": draw(fixed["keep"]), "window": draw(window),
            "scale": ("default" if scale_mode == "default"
                      else draw(_explicit_scales(d))),
            "positive_v": positive_v, "device": device,
            "seed": draw(seed), "layout": draw(fixed["layout"]),
        }
        return out if cap is None else capped(out, *cap)

    return draw()


@cache
def _value_dims(d: int, dims: tuple):
    return st.one_of(st.just(d), st.just(d), _among(dims))


@cache
def _explicit_scales(d: int):
    return _among((0.5, 1.0, 1.0 / math.sqrt(d) * 2))


def capped(r: dict[str, Any], programs: int, queries: int) -> dict[str, Any]:
    """``r`` with at most ``programs`` batch elements × query heads and ``queries`` queries (an
    interpreted Triton kernel pays per program instance), its GQA group kept where it fits;
    every other field (lengths of the keys, ``d``, mask, layout, dtype, magnitude) as it was."""
    r = dict(r)
    r["l_q"] = min(r["l_q"], queries)
    h, h_kv = r["h"], max(1, r["h_kv"])
    group = h // h_kv if h % h_kv == 0 else 1
    if group > programs:
        group = max(g for g in (1, *GROUPS) if g <= programs)
    h_kv = max(1, min(h_kv, programs // group))
    r["h"], r["h_kv"] = h_kv * group, h_kv
    r["b"] = max(1, min(r["b"], programs // r["h"]))
    return r


def recipe(**over) -> dict[str, Any]:
    """A fixed recipe (the batteries): small defaults, any field overridden."""
    base = {"b": 2, "h": 2, "h_kv": 2, "l_q": 5, "l_k": 7, "d": 8, "d_v": 8, "dtype": "float32",
            "qk": "gaussian", "mag": 1.0, "mask": "none", "keep": 0.5, "window": 3,
            "scale": "default", "positive_v": False, "device": "cpu", "seed": 5}
    out = {**base, **over}
    if "d_v" not in over:
        out["d_v"] = out["d"]
    if "h_kv" not in over and "h" in over:
        out["h_kv"] = out["h"]
    return out


def has_dead_rows(case: AttnCase) -> bool:
    """A query of ``case`` sees no key (under its mask and causal triangle)."""

    q, k = case.q, case.k
    allowed, bias = allowed_and_bias(case.attn_mask, case.is_causal, q.shape[-2], k.shape[-2],
                                     q.device)
    if bias is not None:
        allowed = allowed & ~torch.isneginf(bias)
    return bool((~allowed.expand(*q.shape[:-1], k.shape[-2]).any(-1)).any())


def scores_of(r: dict[str, Any]) -> int:
    """How many scores a recipe's case forms (``b·h·L_q·L_k``): the size shrinking lowers."""
    return int(r["b"]) * int(r["h"]) * int(r["l_q"]) * int(r["l_k"])
