"""The attention-level property ids (``attnverify properties`` lists them in their own section).

They apply only to attention targets (``certify --attention``), on top of every normalizer
property of the lifted kernel (:mod:`attnverify.attention.lift`). Every one except the two
claimable ones (``attn_convex_hull``, ``attn_fully_masked_row``) is checked on every attention
target where it applies; a property that does not apply says why (``not_applicable``).
"""

from __future__ import annotations

import functools

import torch

from attnverify.attention import cases as AC
from attnverify.attention import checks as K
from attnverify.attention.shrink import shrink_case
from attnverify.checks.base import LOW_PRECISION, Property

#: Masks of the universal properties: every pattern (no query left without a key).
ALL_MASKS = tuple(m for m in AC.MASK_KINDS if m != "fully_masked")
#: Patterns that take a tensor (every shape, type and view is drawn for them).
PATTERNS = tuple(AC.PATTERN_SHAPES)
#: Score mods that depend on key positions (key permutation cannot hold).
POSITIONAL_MODS = ("causal", "sliding_window", "alibi")
GRADIENT_MAX_KEYS = 128
#: Lengths that are not multiples of a tiled kernel's block sizes, at a small head dimension.
TILE_TAILS = ({"b": 1, "h": 1, "h_kv": 1, "l_q": 40, "l_k": 40, "d": 16},
              {"b": 2, "h": 2, "h_kv": 2, "l_q": 9, "l_k": 40, "d": 16},
              {"b": 1, "h": 1, "h_kv": 1, "l_q": 129, "l_k": 129, "d": 64})
#: What models pass: q, k, v as transposed views of [B, L, H, d] (the Hugging Face layout),
#: L_q ≠ L_k either side of the 64 and 128 blocks, many heads, a different mask per batch
#: element broadcast over the heads with stride 0.
MODEL_LAYOUTS = ({"b": 2, "h": 8, "h_kv": 8, "l_q": 65, "l_k": 127, "d": 16, "layout": "hf",
                  "mask": "batch_bool"},
                 {"b": 1, "h": 16, "h_kv": 16, "l_q": 129, "l_k": 63, "d": 8, "layout": "hf"},
                 {"b": 2, "h": 4, "h_kv": 4, "l_q": 63, "l_k": 129, "d": 8, "layout": "hf",
                  "mask": "padding"})
#: The big shapes of real models, which Hypothesis reaches only now and then within a ci budget:
#: 32 heads, batch 4, Llama's 32 query heads over 8 key/value heads, a group of 8 (MQA), 3
#: key/value heads, head dimensions that are not powers of two with d_v ≠ d, a KV-cache slice,
#: fused QKV and fused KV buffers.
BIG_SHAPES = ({"b": 1, "h": 32, "l_q": 9, "l_k": 17, "d": 8, "layout": "hf"},
              {"b": 4, "h": 3, "l_q": 6, "l_k": 9, "mask": "bool", "mask_shape": "batch",
               "mask_view": "expanded"},
              {"b": 1, "h": 32, "h_kv": 8, "l_q": 17, "l_k": 65, "d": 64, "layout": "hf",
               "mask": "padded_causal", "mask_view": "expanded"},
              {"b": 2, "h": 8, "h_kv": 1, "l_q": 5, "l_k": 9, "d": 16, "layout": "cache"},
              {"b": 1, "h": 12, "h_kv": 3, "l_q": 7, "l_k": 7, "d": 24, "d_v": 40,
               "layout": "qkv"},
              {"b": 2, "h": 4, "l_q": 9, "l_k": 33, "d": 80, "d_v": 48, "layout": "cache"},
              {"b": 2, "h": 2, "l_q": 3, "l_k": 65, "d": 12, "d_v": 6, "layout": "qkv",
               "mask": "bool", "mask_shape": "2d"})
#: Float masks of large constant offsets (every finite bias moved by the same constant: the
#: rows move as a whole and the output must not change): just past FlashInfer's finite initial
#: maximum (-5e4), its test's -524288, far lower, and a large positive one.
OFFSET_MASKS = ({"mask": "additive", "offset": -6e4}, {"mask": "additive", "offset": -524288.0,
                                                       "mask_shape": "keys"},
                {"mask": "additive", "offset": -1e9, "mask_shape": "2d"},
                {"mask": "additive", "offset": 1e6, "mask_shape": "batch"})
#: GQA at the groups and key/value head counts of real models (2 to 8 per group, 1 to 8
#: key/value heads) in every layout.
GQA_SHAPES = ({"h": 4, "h_kv": 2}, {"h": 6, "h_kv": 2, "mask": "bool"},
              {"h": 8, "h_kv": 2, "layout": "hf"}, {"h": 8, "h_kv": 4, "layout": "qkv"},
              {"h": 8, "h_kv": 1, "layout": "cache"}, {"h": 12, "h_kv": 3, "d": 12, "d_v": 24},
              {"b": 1, "h": 32, "h_kv": 4, "l_q": 5, "l_k": 9, "layout": "hf",
               "mask": "bool", "mask_shape": "batch", "mask_view": "expanded"})


def mask_battery(mask_type: str = "bool", *, dead: bool = False, pattern: str = "bool"):
    """One recipe per mask shape SDPA broadcasts and per view (plain, expanded with stride 0,
    sliced from a longer buffer), at batch 3 and 4 heads (a square 2-D mask: a kernel that
    reads it transposed differs)."""
    out = []
    for shape in AC.PATTERN_SHAPES[pattern]:
        for view in ("plain", "sliced") if shape == "full" else AC.MASK_VIEWS:
            out.append({"b": 3, "h": 4, "l_q": 6, "l_k": 6 if shape == "2d" else 7,
                        "mask": pattern, "mask_type": mask_type, "mask_shape": shape,
                        "mask_view": view, "dead": dead})
    return tuple(out)


def _a(spec):
    return K.attention_of(spec)


def full_dtypes(a, ctx) -> tuple[torch.dtype, ...]:
    """The float32 / float64 dtypes of ``--dtypes`` the kernel takes (float32 if none)."""
    out = tuple(d for d in ctx.full_dtypes if a.supports(d))
    return out or tuple(d for d in (torch.float32, torch.float64) if a.supports(d))[:1]


def low_dtypes(a) -> tuple[torch.dtype, ...]:
    return tuple(d for d in LOW_PRECISION if a.supports(d))


def _grad_dtype(a) -> tuple[torch.dtype, ...]:
    return (torch.float64,) if a.supports(torch.float64) else (torch.float32,)


def _max_keys(ctx) -> int:
    return max(1, min(ctx.max_length, AC.MAX_KEYS))


def _prop(id, statement, check, *, masks=ALL_MASKS, dtypes=full_dtypes, applies=None,
          battery=(), gqa=None, scale=0.5, universal=True, **recipe_options):
    """A property over generated Q/K/V recipes; ``battery`` recipes are checked first."""
    max_keys = recipe_options.pop("max_keys", None)

    def dtypes_of(spec, ctx):
        out = dtypes(_a(spec), ctx) if dtypes is full_dtypes else dtypes(_a(spec))
        if ctx.unit_dtype is not None:  # one unit of the run (attnverify.shard)
            out = tuple(d for d in out if d == ctx.unit_dtype)
        return out

    def cases(spec, ctx):
        a = _a(spec)
        mixed = ("mixed" if a.gqa else False) if gqa is None else gqa
        options = {"masks": masks, "max_keys": min(max_keys or AC.MAX_KEYS, _max_keys(ctx)),
                   "gqa": mixed, "device": ctx.device, "max_head_dim": a.max_head_dim,
                   "cap": getattr(ctx, "max_programs", None), **recipe_options}
        return AC.recipes(dtypes=dtypes_of(spec, ctx), **options).map(AC.build)

    def explicit(spec, ctx):
        a = _a(spec)
        dtype = str(dtypes_of(spec, ctx)[0]).removeprefix("torch.")
        out = []
        for over in battery:
            r = AC.recipe(dtype=dtype, device=ctx.device, **over)
            if getattr(ctx, "max_programs", None) is not None:
                r = AC.capped(r, *ctx.max_programs)
            if gqa is None and not a.gqa and r["h"] != r["h_kv"]:
                continue
            if a.max_head_dim is not None and max(r["d"], r["d_v"]) > a.max_head_dim:
                continue
            out.append(AC.build(r))
        return out

    def applicable(spec, ctx):
        a = _a(spec)
        if not dtypes_of(spec, ctx):
            return "the kernel takes none of the dtypes this property needs"
        return applies(a, ctx) if applies else None

    return Property(id=id, statement=statement, cases=cases, check=check, explicit=explicit,
                    applies=applicable, universal=universal, examples_scale=scale,
                    dtypes=dtypes_of, shrink=functools.partial(
                        shrink_case, domain=mask_domain(masks, recipe_options.get(
                            "mask_types", AC.MASK_TYPES))))


def mask_domain(masks, mask_types):
    """``recipe -> bool``: its mask is one of the patterns ``masks`` name (an older kind counts as
    its pattern) and, for a tensor, of one of ``mask_types``."""
    names = {AC.LEGACY.get(m, (m,))[0] for m in masks}

    def inside(r: dict) -> bool:
        kind = r.get("mask", "none")
        if kind in ("none", "causal"):
            return kind in names
        pattern, mask_type, *_ = AC.mask_form(r)
        return pattern in names and mask_type in mask_types

    return inside


def _needs_gqa(a, ctx):
    return None if a.gqa else "the kernel does not take enable_gqa (declare gqa=True)"


def _needs_simplex(a, ctx):
    return None if a.space == "simplex" else f"the kernel's normalizer space is {a.space!r}"


def _not_positional(a, ctx):
    if a.score_mod in POSITIONAL_MODS:
        return f"the {a.score_mod} score modification depends on key positions"
    return None


def _not_alibi(a, ctx):
    return "ALiBi slopes depend on the number of heads" if a.score_mod == "alibi" else None


def _needs_low(a, ctx):
    return None if low_dtypes(a) else "the kernel takes neither float16 nor bfloat16"


def _needs_grad(a, ctx):
    if not a.differentiable:
        return "the kernel has no backward here (declared differentiable=False)"
    return None


def _low(a):
    return low_dtypes(a)


_ALL = [
    _prop("attn_reference", "output equals the float64 eager reference (matmul, mask, "
          "normalizer, matmul) for any mask, scale and GQA setting, within the score-rounding "
          "tolerance", K.check_reference,
          battery=({"d": 16}, {"mask": "bool", "scale": 0.5}, {"mask": "causal", "l_q": 3},
                   {"h": 4, "h_kv": 2, "mask": "bool"}, *TILE_TAILS, *MODEL_LAYOUTS,
                   *BIG_SHAPES)),
    _prop("attn_bool_mask", "a boolean mask (True = may attend) is honoured in every shape SDPA "
          "broadcasts ([L_q, L_k], [1, 1, L_q, L_k], [B, 1, L_q, L_k], [B, H, L_q, L_k], …), "
          "expanded with stride 0 or sliced: output equals the reference and keys masked for "
          "every query have no influence at all",
          K.check_mask, masks=PATTERNS, mask_types=("bool",),
          battery=({"mask": "bool"}, {"mask": "columns", "l_k": 9}, {"mask": "band"},
                   MODEL_LAYOUTS[0], *mask_battery("bool"))),
    _prop("attn_additive_mask", "an additive float mask is added to the scores (-inf masks) in "
          "every shape SDPA broadcasts, expanded with stride 0 or sliced", K.check_mask,
          masks=PATTERNS, mask_types=("additive",),
          battery=({"mask": "additive"}, *mask_battery("additive"), *OFFSET_MASKS)),
    _prop("attn_causal", "is_causal=True is top-left aligned: query i attends keys j ≤ i, "
          "also when L_q ≠ L_k", K.check_reference, masks=("causal",),
          battery=({"mask": "causal", "l_q": 3, "l_k": 6}, {"mask": "causal", "l_q": 6, "l_k": 3},
                   {"mask": "causal", "l_q": 5, "l_k": 5})),
    _prop("attn_padding", "a key padding mask [B, 1, 1, L_k] (as given, expanded or sliced): "
          "padded keys are inert and the output equals the kernel on the valid keys alone",
          K.check_padding, masks=("padding",), mask_types=("bool",),
          battery=({"mask": "padding", "l_k": 9},
                   {"b": 4, "h": 3, "mask": "padding", "l_k": 9, "mask_view": "expanded"})),
    _prop("attn_sliding_window", "a causal sliding-window mask (i − w < j ≤ i) is honoured",
          K.check_mask, masks=("window",),
          battery=({"mask": "window", "l_q": 8, "l_k": 8, "window": 3},)),
    _prop("attn_fully_masked_row", "a query that may attend no key gets exactly 0 (no NaN), "
          "whatever the mask's shape, type and view; the other queries are unchanged; for a "
          "differentiable kernel its dq is exactly 0 (no NaN) and dk, dv take nothing from it",
          K.check_fully_masked, masks=PATTERNS, dead=True,
          battery=({"mask": "fully_masked"}, *mask_battery("bool", dead=True),
                   *mask_battery("additive", dead=True)[::2],
                   {"b": 2, "h": 4, "l_q": 6, "l_k": 6, "mask": "padded_causal", "dead": True,
                    "mask_view": "expanded"}), universal=False),
    _prop("attn_convex_hull", "each output row lies in the convex hull of the values of the "
          "keys it attends (simplex normalizers)", K.check_convex_hull,
          masks=("none", "bool", "columns"), applies=_needs_simplex, universal=False,
          battery=({}, {"mask": "bool", "mag": 10.0})),
    _prop("attn_key_permutation", "permuting keys and values (and the mask's key axis) leaves "
          "the output unchanged", K.check_key_permutation,
          masks=("none", "bool", "columns", "padding", "additive"), applies=_not_positional,
          battery=({"mask": "bool", "l_k": 9},)),
    _prop("attn_gqa", "enable_gqa=True with H_kv < H key/value heads (any divisor, groups up "
          "to 16) equals repeating them (repeat_interleave) and the reference", K.check_gqa,
          gqa=True, applies=_needs_gqa, battery=GQA_SHAPES),
    _prop("attn_batch_head_independent", "each (batch, head) computed alone equals it "
          "computed inside a batch of very different slices", K.check_batch_head_independent,
          masks=("none", "bool", "causal", "batch_bool"), applies=_not_alibi, min_batch=2,
          battery=({"b": 2, "h": 2}, {"b": 2, "h": 3, "h_kv": 3, "l_q": 5, "l_k": 65,
                                      "layout": "hf", "mask": "batch_bool"},
                   {"b": 4, "h": 17, "l_q": 3, "l_k": 5})),
    _prop("attn_low_precision", "float16 / bfloat16 outputs match the float64 reference of the "
          "same inputs within the dtype's tolerance plus score rounding", K.check_low_precision,
          masks=("none", "bool", "causal"), dtypes=_low, applies=_needs_low,
          positive_v=True, max_keys=4096, head_dims=AC.SMALL_HEAD_DIMS,
          battery=({"l_q": 2, "l_k": 4096, "mag": 0.1, "b": 1, "h": 1, "h_kv": 1},
                   {"mask": "bool"})),
    _prop("attn_gradients", "gradients w.r.t. q, k and v equal the float64 eager reference's "
          "autograd gradients, and are exactly 0 for keys and values no query attends",
          K.check_gradients, dtypes=lambda a: _grad_dtype(a),
          applies=_needs_grad, max_keys=GRADIENT_MAX_KEYS, scale=0.3,
          battery=({"mask": "bool"}, {"mask": "causal", "l_q": 4, "l_k": 6},
                   {"mask": "columns", "l_k": 9}, {"b": 2, "mask": "padding", "l_k": 9},
                   {"b": 2, "h": 4, "h_kv": 4, "l_q": 9, "l_k": 65, "d": 8, "layout": "hf",
                    "mask": "batch_bool"},
                   {"b": 3, "h": 4, "h_kv": 2, "l_q": 6, "l_k": 6, "d": 12, "d_v": 20,
                    "layout": "qkv"})),
]

ATTENTION_PROPERTIES: dict[str, Property] = {p.id: p for p in _ALL}
