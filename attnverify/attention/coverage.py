"""What an attention target's certificate covered: the shapes, masks and layouts of the cases
its attention-level properties were checked on (the ``attention`` block of ``coverage``,
docs/INTERFACES.md).

Read from each case's recipe (how its tensors were built) and its tensors:

- ``batch``, ``heads``, ``kv_heads``, ``groups`` (query heads per key/value head), ``d``,
  ``d_v``: the values checked, sorted;
- ``l_q``, ``l_k``: ``[fewest, most]`` queries and keys; ``unequal_lengths``: cases with
  ``L_q ≠ L_k``; ``unequal_dims``: cases with ``d ≠ d_v``;
- ``masks``: how the mask was given, in words (``none``, ``is_causal``, or its type and shape,
  with ``expanded`` for stride 0 over the broadcast axes and ``sliced`` for a view of a longer
  buffer: ``bool [B, 1, L_q, L_k] expanded``); ``fully_masked``: the same words for the masks
  that left some query without a key;
- ``qkv_layouts``: how ``q``, ``k``, ``v`` were given (``bhld``, ``hf``, ``cache``, ``qkv``;
  :mod:`attnverify.attention.cases`).
"""

from __future__ import annotations

from typing import Any

SETS = ("batch", "heads", "kv_heads", "groups", "d", "d_v")
SPANS = ("l_q", "l_k")
WORDS = ("masks", "fully_masked", "qkv_layouts")
SHAPE_TEXT = {"full": "[B, H, L_q, L_k]", "batch": "[B, 1, L_q, L_k]",
              "heads": "[1, H, L_q, L_k]", "shared": "[1, 1, L_q, L_k]", "2d": "[L_q, L_k]",
              "keys": "[B, 1, 1, L_k]"}


def mask_words(recipe: dict[str, Any]) -> str:
    """How a recipe's mask is given, in words."""
    from attnverify.attention.cases import mask_form  # torch-free: merge reads coverage

    kind = recipe.get("mask", "none")
    if kind in ("none", "causal"):
        return "is_causal" if kind == "causal" else "none"
    pattern, mask_type, shape, view, _ = mask_form(recipe)
    text = f"{mask_type} {SHAPE_TEXT.get(shape, shape)}"
    return text if view == "plain" else f"{text} {view}"


class AttentionCoverage:
    """The attention cases a property was checked on, accumulated case by case."""

    def __init__(self) -> None:
        self.sets: dict[str, set[int]] = {k: set() for k in SETS}
        self.spans: dict[str, list[int]] = {k: [] for k in SPANS}
        self.words: dict[str, set[str]] = {k: set() for k in WORDS}
        self.unequal = 0
        self.unequal_dims = 0

    def add(self, case) -> None:
        from attnverify.attention.cases import has_dead_rows  # torch-free: merge reads coverage

        q, k, v = case.q, case.k, case.v
        r = getattr(case, "recipe", None) or {}
        b, h, l_q = int(q.shape[0]), int(q.shape[1]), int(q.shape[-2])
        h_kv, l_k = int(k.shape[1]), int(k.shape[-2])
        for name, value in (("batch", b), ("heads", h), ("kv_heads", h_kv),
                            ("groups", h // max(1, h_kv)), ("d", int(q.shape[-1])),
                            ("d_v", int(v.shape[-1]))):
            self.sets[name].add(value)
        self.spans["l_q"].append(l_q)
        self.spans["l_k"].append(l_k)
        self.unequal += int(l_q != l_k)
        self.unequal_dims += int(int(q.shape[-1]) != int(v.shape[-1]))
        words = mask_words(r) if r else ("is_causal" if case.is_causal else
                                         "none" if case.attn_mask is None else "given")
        self.words["masks"].add(words)
        if has_dead_rows(case):
            self.words["fully_masked"].add(words)
        self.words["qkv_layouts"].add(str(r.get("layout", "bhld")))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: sorted(v) for k, v in self.sets.items()}
        out.update({k: [min(v), max(v)] if v else None for k, v in self.spans.items()})
        out["unequal_lengths"] = self.unequal
        out["unequal_dims"] = self.unequal_dims
        out.update({k: sorted(v) for k, v in self.words.items()})
        return out


def merge(blocks: list[dict]) -> dict[str, Any] | None:
    """The union of attention blocks."""
    blocks = [b for b in blocks if b]
    if not blocks:
        return None
    out: dict[str, Any] = {k: sorted({x for b in blocks for x in b.get(k) or []})
                           for k in (*SETS, *WORDS)}
    for key in SPANS:
        spans = [b[key] for b in blocks if b.get(key)]
        out[key] = [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else None
    out["unequal_lengths"] = sum(b.get("unequal_lengths", 0) for b in blocks)
    out["unequal_dims"] = sum(b.get("unequal_dims", 0) for b in blocks)
    return {k: out[k] for k in (*SETS, *SPANS, "unequal_lengths", "unequal_dims", *WORDS)}


def _values(values: list[int]) -> str:
    if not values:
        return "-"
    return ", ".join(str(v) for v in values) if len(values) <= 8 else \
        f"{values[0]}–{values[-1]} ({len(values)} values)"


def _span(span) -> str:
    return "-" if not span else (str(span[0]) if span[0] == span[1] else f"{span[0]}–{span[1]}")


def _forms(words: list[str]) -> str:
    """Mask words summarised: ``bool, additive in 6 shapes ([L_q, L_k], …); expanded, sliced;
    is_causal, none``."""
    tensors = [w for w in words if "[" in w]
    other = [w for w in words if "[" not in w]
    parts = []
    if tensors:
        types = sorted({w.split(" ", 1)[0] for w in tensors})
        shapes = sorted({w[w.index("["):w.index("]") + 1] for w in tensors},
                        key=lambda t: list(SHAPE_TEXT.values()).index(t)
                        if t in SHAPE_TEXT.values() else 99)
        views = sorted({w[w.index("]") + 2:] for w in tensors if not w.endswith("]")})
        parts.append(f"{', '.join(types)} in {len(shapes)} shape{'s' * (len(shapes) > 1)} "
                     f"({', '.join(shapes)})" + (f", also {', '.join(views)}" if views else ""))
    if other:
        parts.append(", ".join(other))
    return "; ".join(parts) or "-"


def describe(block: dict[str, Any] | None) -> str:
    """One line: ``batch 1–4; heads 1, 2, …; kv heads …; groups …; d …; d_v …; L_q 1–129;
    L_k 1–4096 (L_q ≠ L_k in 300 cases); masks …; fully masked rows under …; q/k/v …``."""
    if not block:
        return "no attention cases"
    return "; ".join([
        f"batch {_values(block.get('batch') or [])}",
        f"heads {_values(block.get('heads') or [])}",
        f"kv heads {_values(block.get('kv_heads') or [])}",
        f"groups {_values(block.get('groups') or [])}",
        f"d {_values(block.get('d') or [])}", f"d_v {_values(block.get('d_v') or [])}",
        f"L_q {_span(block.get('l_q'))}",
        f"L_k {_span(block.get('l_k'))} (L_q ≠ L_k in {block.get('unequal_lengths', 0)} cases)",
        f"masks {_forms(block.get('masks') or [])}",
        f"fully masked rows under {_forms(block.get('fully_masked') or [])}",
        f"q/k/v {', '.join(block.get('qkv_layouts') or []) or '-'}",
    ])
