"""Inputs of the attention-level properties: ``Q``, ``K``, ``V`` and a mask, built from a small
*recipe* (structural parameters and a seed) that Hypothesis draws and shrinks.

The recipe is a plain dict of ints, floats and strings; :func:`build` turns it into an
:class:`AttnCase` deterministically, so that a counterexample is reproduced from its recipe alone
(``python -m attnverify.attention.repro``).

Query/key kinds (the embedding settings of the papers, ``Δ = ‖q‖·max‖k‖``): ``gaussian``;
``aligned`` (every key ``±`` a multiple of one query direction: large logits, exact ties);
``duplicates`` (repeated keys: exact ties); ``mixed_norms`` (key norms over four decades).
Mask kinds: ``none``, ``bool`` (random, every query keeps a key), ``band`` (symmetric window),
``window`` (causal sliding window), ``columns`` (keys masked for every query), ``padding``
(``[B, 1, 1, L_k]`` valid prefix per batch), ``fully_masked`` (some queries see no key),
``additive`` (finite biases and ``-inf``), ``causal`` (``is_causal=True``), ``batch_bool`` (a
different random mask per batch element, expanded over the heads with stride 0, as a model
broadcasts one padding-and-causal mask to every head).

Layouts (the recipe's ``layout``): ``bhld`` (contiguous ``[B, H, L, d]``) or ``hf`` (``q``, ``k``,
``v`` as transposed views of contiguous ``[B, L, H, d]`` buffers, the Hugging Face layout:
``x.view(B, L, H, d).transpose(1, 2)``). Lengths cross the block sizes of tiled kernels (64,
128) with tails, ``L_q ≠ L_k``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from hypothesis import strategies as st

QK_KINDS = ("gaussian", "aligned", "duplicates", "mixed_norms")
MASK_KINDS = ("none", "bool", "band", "window", "columns", "padding", "fully_masked", "additive",
              "causal", "batch_bool")
LAYOUTS = ("bhld", "hf")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
HEAD_DIMS = (4, 8, 16, 32, 64)
MAGNITUDES = (0.1, 1.0, 3.0, 10.0)
#: Longest key sequence the generated cases reach (the low-precision battery goes to 4096).
MAX_KEYS = 1024
MAX_QUERIES = 129


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


def _keep_one(allowed: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Every query keeps at least one key (a random one)."""
    pick = torch.randint(0, allowed.shape[-1], allowed.shape[:-1] + (1,), generator=g)
    return allowed.scatter(-1, pick, True)


def _mask(r: dict, g: torch.Generator):
    """``(attn_mask, is_causal)`` of the recipe's mask kind."""
    b, h, l_q, l_k, kind = r["b"], r["h"], r["l_q"], r["l_k"], r["mask"]
    i = torch.arange(l_q)[:, None]
    j = torch.arange(l_k)[None, :]
    p = float(r.get("keep", 0.5))
    if kind == "causal":
        return None, True
    if kind == "bool":
        return _keep_one(torch.rand(b, h, l_q, l_k, generator=g) < p, g), False
    if kind == "band":
        w = max(1, int(r.get("window", 4)))
        return ((j - i).abs() < w).expand(b, h, l_q, l_k).clone(), False
    if kind == "window":
        w = max(1, int(r.get("window", 4)))
        return ((j <= i) & (j > i - w)).expand(b, 1, l_q, l_k).clone(), False
    if kind == "columns":
        cols = torch.rand(b, 1, 1, l_k, generator=g) < p
        cols[..., 0] = True
        return cols, False
    if kind == "padding":
        n = torch.randint(1, l_k + 1, (b, 1, 1, 1), generator=g)
        return j[None, None] < n, False
    if kind == "fully_masked":
        allowed = _keep_one(torch.rand(b, h, l_q, l_k, generator=g) < p, g)
        dead = torch.rand(b, h, l_q, 1, generator=g) < 0.4
        dead[0, 0, 0, 0] = True
        return allowed & ~dead, False
    if kind == "batch_bool":
        per_batch = _keep_one(torch.rand(b, 1, l_q, l_k, generator=g) < p, g)
        return per_batch.expand(b, h, l_q, l_k), False
    if kind == "additive":
        bias = torch.randn(b, h, l_q, l_k, generator=g, dtype=torch.float64) * 3
        drop = ~_keep_one(torch.rand(b, h, l_q, l_k, generator=g) < p, g)
        return bias.masked_fill(drop, float("-inf")), False
    return None, False


def build(recipe: dict[str, Any]) -> AttnCase:
    """The case of a recipe (deterministic: same recipe, same tensors)."""
    r = dict(recipe)
    g = _gen(r["seed"])
    dtype = DTYPES[r["dtype"]]
    q, k = _qk(r, g)
    v = _values(r, g)
    mask, causal = _mask(r, g)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    scale = None if r["scale"] == "default" else float(r["scale"])
    device = r.get("device", "cpu")
    q, k, v = (t.to(dtype=dtype, device=device) for t in (q, k, v))
    if r.get("layout", "bhld") == "hf":  # views of [B, L, H, d] buffers
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    if mask is not None:
        mask = mask.to(device)
    return AttnCase(q, k, v, mask, causal, scale, r["h"] != r["h_kv"], r)


def _lengths(lo: int, hi: int):
    """Mostly short lengths, sometimes long ones (powers of two and their neighbours)."""
    hi = max(lo, hi)
    small = st.integers(lo, min(hi, 16))
    if hi <= 16:
        return small
    big = st.sampled_from([n for n in (31, 33, 40, 63, 64, 65, 127, 128, 129, 255, 257, 512,
                                       1000, 1023, 1024, 1025, 2048, 4096) if lo <= n <= hi])
    return st.one_of(small, st.integers(lo, hi), big)


def recipes(*, dtypes, masks=("none",), max_keys=MAX_KEYS, gqa=False, head_dims=HEAD_DIMS,
            min_keys=1, positive_v=False, scales=("default", "explicit"), device="cpu",
            min_batch=1):
    """Hypothesis strategy of recipes; ``gqa=True`` draws fewer key/value heads than query heads,
    ``gqa="mixed"`` sometimes."""
    names = [str(d).removeprefix("torch.") for d in dtypes]

    @st.composite
    def draw(draw):
        h_kv = draw(st.sampled_from((1, 2)))
        group = draw(st.sampled_from({True: (2, 3), "mixed": (1, 2, 3)}.get(gqa, (1,))))
        d = draw(st.sampled_from(head_dims))
        scale_mode = draw(st.sampled_from(scales))
        return {
            "b": draw(st.integers(min_batch, 2)), "h": h_kv * group, "h_kv": h_kv,
            "l_q": draw(_lengths(1, MAX_QUERIES)), "l_k": draw(_lengths(min_keys, max_keys)),
            "d": d, "d_v": d,
            "dtype": draw(st.sampled_from(names)), "qk": draw(st.sampled_from(QK_KINDS)),
            "mag": draw(st.sampled_from(MAGNITUDES)), "mask": draw(st.sampled_from(masks)),
            "keep": draw(st.sampled_from((0.5, 0.1, 0.9))), "window": draw(st.integers(1, 8)),
            "scale": ("default" if scale_mode == "default"
                      else draw(st.sampled_from((0.5, 1.0, 1.0 / math.sqrt(d) * 2)))),
            "positive_v": positive_v, "device": device,
            "seed": draw(st.integers(0, 2**16)), "layout": draw(st.sampled_from(LAYOUTS)),
        }

    return draw()


def recipe(**over) -> dict[str, Any]:
    """A fixed recipe (the batteries): small defaults, any field overridden."""
    base = {"b": 2, "h": 2, "h_kv": 2, "l_q": 5, "l_k": 7, "d": 8, "d_v": 8, "dtype": "float32",
            "qk": "gaussian", "mag": 1.0, "mask": "none", "keep": 0.5, "window": 3,
            "scale": "default", "positive_v": False, "device": "cpu", "seed": 5}
    out = {**base, **over}
    if "d_v" not in over:
        out["d_v"] = out["d"]
    return out
