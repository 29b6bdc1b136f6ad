"""What a certificate covered: the inputs each property gave the normalizer.

certify adds every case it checks (battery and Hypothesis) to a :class:`Coverage`; a property's
result carries its block (``PropertyResult.coverage``) and a target's JSON the union over its
properties, with, per property, the fields where that property covered something else
(:func:`target_block`). The block (docs/INTERFACES.md, "coverage"):

- ``cases``: cases checked;
- ``dtypes``, ``ranks``, ``axes`` (``dim`` as given: ``-1`` and ``1`` are both listed when both
  spellings were used), ``layouts`` (the kinds of :mod:`attnverify.strategies.layouts`);
- ``row_length`` and ``row_count`` ``[fewest, most]`` (rows as the normalizer was given them,
  copies along a stride-0 axis included);
- ``elements`` ``[fewest, most]``: the entries of the tensor given (rows × row length, the joint
  size the two ranges alone do not tell); ``large_cases``: how many cases held more than
  :data:`LARGE` entries, and ``large_sizes`` the ``[rows, row length]`` of those, largest first
  (at most :data:`LARGE_SIZES` of them);
- ``masked_keys`` and ``fully_masked_rows``: how many cases had a masked key in a live row, and a
  row with every key masked;
- ``temperature``: ``[lowest, highest]``, or ``null`` when no case had one;
- ``values``: ``[lowest, highest]`` finite score; ``magnitudes``: ``[smallest, largest]``
  largest ``|score|`` of a row (zero rows aside); ``decades``: per dtype, ``{"+": runs, "-":
  runs}``, the decades ``e`` (``10**e ≤ |z| < 10**(e+1)``) of each row's largest ``|score|``
  by its sign, as runs ``[[first, last], …]`` of consecutive decades;
  ``far_below``: how many cases had a row whose every finite score lies below ``-1e4``
  (:data:`attnverify.strategies.domain.FAR_BELOW`); ``shifts``: ``[smallest, largest]`` ``|c|``
  that ``shift_invariant`` added to a row, and ``shift_decades`` their decades (``null`` where
  no shift was made); for attention cases ``mask_bias``, ``[lowest, highest]`` finite entry of
  an additive mask; ``judged_rows``: ``[judged, rows]`` for the derivative properties
  (``gradient``, ``double_backward``): of the rows with a live key, how many had their derivative
  compared with central differences within an allowance below the derivative's own size (the
  others: on a kink, or beyond the differences' resolution at their magnitude, as rows of
  ``|z|/T`` above about ``1e8`` in float64), ``null`` for other properties;
- ``declared``: the layouts and axes the normalizer declares it takes (``null``: none declared,
  held to every one).

Cases without rows of scores (a margin for the length-awareness peak) count in ``cases`` and
``temperature`` only; attention cases count their queries' rows (``B·H·L_q``) and keys.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any

from attnverify.attention.coverage import AttentionCoverage
from attnverify.attention.coverage import merge as merge_attention

FIELDS = ("cases", "dtypes", "ranks", "axes", "layouts", "row_length", "row_count",
          "elements", "large_cases", "large_sizes", "masked_keys", "fully_masked_rows",
          "temperature", "values", "magnitudes", "decades", "far_below", "shifts",
          "shift_decades", "mask_bias", "judged_rows")
#: Every finite score of a row below this: the row is "far below zero" (the value of
#: :data:`attnverify.strategies.domain.FAR_BELOW`; not imported: the report needs no torch).
FAR_BELOW = -1e4
#: The coverage the check being run reports into (:func:`recording`, :func:`note_shifts`).
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("attnverify_coverage", default=None)


@contextlib.contextmanager
def recording(coverage: Coverage):
    """While open, what a check reports it exercised (:func:`note_shifts`) goes to
    ``coverage``."""
    token = _CURRENT.set(coverage)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def note_shifts(shifts) -> None:
    """The shifts ``|c|`` a check added to rows (a tensor or numbers), counted in the coverage
    being recorded (none: ignored)."""
    coverage = _CURRENT.get()
    if coverage is None:
        return
    try:
        values = [abs(float(c)) for c in (shifts.flatten().tolist() if hasattr(
            shifts, "flatten") else shifts)]
    except (TypeError, ValueError):
        return
    for c in values:
        if c > 0 and math.isfinite(c):
            coverage.shifts.append(c)
            coverage.shift_decades.add(_decade(c))


def note_judged(judged: int, rows: int) -> None:
    """A derivative check judged ``judged`` of ``rows`` rows of its case (the others not
    judged: on a kink, or beyond the resolution of the differences), counted in the coverage
    being recorded (none: ignored)."""
    coverage = _CURRENT.get()
    if coverage is None:
        return
    coverage.judged[0] += int(judged)
    coverage.judged[1] += int(rows)


def _decade(x: float) -> int:
    return math.floor(math.log10(x))


def _decades(mags) -> set[int]:
    """``{_decade(m)}`` over a float64 array of positive magnitudes, in numpy: the few within
    rounding of a power of ten go through :func:`_decade` itself, so both count alike."""
    import numpy as np  # torch-free: with torch, on a case's path only; merge needs neither

    logs = np.log10(mags)
    near = np.abs(logs - np.rint(logs)) < 1e-9
    out = set(np.floor(logs[~near]).astype(np.int64).tolist())
    out.update(_decade(m) for m in mags[near].tolist())
    return out


#: Cases of more entries than this (torch's parallel grain, where many kernels take another
#: path) are counted in ``large_cases`` and listed in ``large_sizes``.
LARGE = 2**15
#: The most ``[rows, row length]`` pairs ``large_sizes`` lists.
LARGE_SIZES = 16
#: Cases of at most this many entries are counted in Python floats (:meth:`Coverage._small`).
SMALL = 512


class Coverage:
    """The inputs a property was checked on, accumulated case by case."""

    def __init__(self) -> None:
        self.cases = 0
        self.dtypes: set[str] = set()
        self.ranks: set[int] = set()
        self.axes: set[int] = set()
        self.layouts: set[str] = set()
        self.lengths: list[int] = []
        self.rows: list[int] = []
        self.elements: list[int] = []
        self.large: set[tuple[int, int]] = set()
        self.large_cases = 0
        self.masked = 0
        self.fully = 0
        self.temperatures: list[float] = []
        self.values: list[float] = []
        self.magnitudes: list[float] = []
        self.decades: dict[str, dict[str, set[int]]] = {}
        self.far_below = 0
        self.shifts: list[float] = []
        self.shift_decades: set[int] = set()
        self.mask_bias: list[float] = []
        self.judged = [0, 0]
        self.attention = None  # attnverify.attention.coverage.AttentionCoverage

    def add(self, case: Any) -> None:
        """Count one case (never raises: coverage is a report, not a check)."""
        try:
            self._add(case)
        except Exception:  # noqa: BLE001 - an odd case is still counted
            pass

    def _add(self, case: Any) -> None:
        import torch  # torch-free: merge reads coverage

        self.cases += 1
        t = getattr(case, "temperature", None)
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            self.temperatures.append(float(t))
        scores = getattr(case, "scores", None)
        if isinstance(scores, torch.Tensor) and scores.dim() == 2:
            self._rows(case, scores)
        elif isinstance(getattr(case, "q", None), torch.Tensor):
            self._attention(case)

    def _rows(self, case, scores) -> None:
        import torch  # torch-free: merge reads coverage

        from attnverify.strategies.layouts import plain  # torch-free: merge reads coverage

        count, length = scores.shape
        layout = getattr(case, "layout", None)
        layout = plain(count, length) if layout is None else layout.fit(count, length)
        dtype = str(scores.dtype).removeprefix("torch.")
        self.dtypes.add(dtype)
        self.ranks.add(layout.rank)
        self.axes.add(layout.dim)
        self.layouts.update(layout.kinds)
        self._size(layout.rows_given, length)
        if count and length and count * length <= SMALL and scores.is_floating_point():
            # a small case (most are) in Python floats: each numpy or torch call costs more
            # than the arithmetic; the counts are the same, value for value (tests/test_coverage)
            self._small(scores.detach().cpu().tolist(), dtype)
            return
        # one conversion, then numpy: each torch operation costs more than the arithmetic
        z = scores.detach().to(device="cpu", dtype=torch.float64).numpy()
        masked = z == -math.inf
        dead = masked.all(axis=-1)
        self.masked += int(bool((masked & ~dead[:, None]).any()))
        self.fully += int(bool(dead.any())) if length else 0
        self._values(z, dtype)

    def _small(self, rows: list, dtype: str) -> None:
        """:meth:`_rows`'s counts and :meth:`_values` of rows given as lists of floats (at least
        one row of at least one key)."""
        ninf = -math.inf
        masked = dead = False
        lows, highs = [], []
        for row in rows:
            n = row.count(ninf)
            if n:
                if n == len(row):
                    dead = True
                else:
                    masked = True
            finite = [v for v in row if v - v == 0]  # not ±inf, not NaN
            if finite:
                lows.append(min(finite))
                highs.append(max(finite))
        self.masked += int(masked)
        self.fully += int(dead)
        if lows:
            self._extremes(lows, highs, dtype)

    def _extremes(self, lows: list, highs: list, dtype: str) -> None:
        """The values, magnitudes and decades of rows whose lowest and highest finite scores
        are ``lows`` and ``highs`` (floats, one pair per row with a finite score)."""
        self.values += [min(lows) + 0.0, max(highs) + 0.0]  # + 0.0: a zero is 0.0, not -0.0
        self.far_below += int(any(h < FAR_BELOW for h in highs))
        # the row's largest |z|, signed; zero rows aside
        top = [h if abs(h) >= abs(lo) else lo for lo, h in zip(lows, highs)]
        top = [t for t in top if t != 0]
        if top:
            mags = [abs(t) for t in top]
            self.magnitudes += [min(mags), max(mags)]
            seen = self.decades.setdefault(dtype, {"+": set(), "-": set()})
            seen["+"].update(_decade(t) for t in top if t > 0)
            seen["-"].update(_decade(-t) for t in top if t < 0)

    def _values(self, z, dtype: str) -> None:
        """The values, magnitudes and decades (by sign) of the rows' finite scores (``z``: the
        rows as a float64 array, ``dtype`` the scores' own), as :meth:`_extremes` counts them."""
        import numpy as np  # torch-free: with torch, on a case's path only; merge needs neither

        finite = np.isfinite(z)
        low = np.where(finite, z, math.inf).min(axis=-1)
        live = low < math.inf  # a row with a finite score
        if not live.any():
            return
        low = low[live]
        high = np.where(finite, z, -math.inf).max(axis=-1)[live]
        self.values += [float(low.min()) + 0.0, float(high.max()) + 0.0]
        self.far_below += int(bool((high < FAR_BELOW).any()))
        top = np.where(np.abs(high) >= np.abs(low), high, low)  # the row's largest |z|, signed
        top = top[top != 0]
        if top.size:
            mags = np.abs(top)
            self.magnitudes += [float(mags.min()), float(mags.max())]
            seen = self.decades.setdefault(dtype, {"+": set(), "-": set()})
            seen["+"].update(_decades(mags[top > 0]))
            seen["-"].update(_decades(mags[top < 0]))

    def _attention(self, case) -> None:
        import torch  # torch-free: merge reads coverage

        from attnverify.attention.cases import has_dead_rows  # torch-free: merge reads coverage

        q, k = case.q, case.k
        self.dtypes.add(str(q.dtype).removeprefix("torch."))
        self.ranks.add(q.dim())
        self.axes.add(-1)
        for t in (q, k, case.v):
            self.layouts.update(_tensor_layouts(t))
        mask = getattr(case, "attn_mask", None)
        if mask is not None and 0 in mask.stride():
            self.layouts.add("expanded")
        if mask is not None and mask.dtype != torch.bool and mask.numel():
            finite = mask[torch.isfinite(mask)]
            if finite.numel():
                self.mask_bias += [float(finite.min()), float(finite.max())]
        self._size(int(math.prod(q.shape[:-1])), int(k.shape[-2]))
        self.masked += int(mask is not None or bool(getattr(case, "is_causal", False)))
        self.fully += int(has_dead_rows(case))
        if self.attention is None:
            self.attention = AttentionCoverage()
        self.attention.add(case)

    def _size(self, rows: int, length: int) -> None:
        self.lengths.append(length)
        self.rows.append(rows)
        self.elements.append(rows * length)
        if rows * length > LARGE:
            self.large_cases += 1
            self.large.add((rows, length))

    def to_json(self, declared: dict | None = None) -> dict[str, Any] | None:
        """The block (``None`` before any case)."""
        if not self.cases:
            return None
        from attnverify.strategies.layouts import KINDS  # torch-free: merge reads coverage

        return {
            "cases": self.cases,
            "dtypes": sorted(self.dtypes, key=_dtype_order),
            "ranks": sorted(self.ranks),
            "axes": sorted(self.axes),
            "layouts": [k for k in KINDS if k in self.layouts],
            "row_length": _span(self.lengths),
            "row_count": _span(self.rows),
            "elements": _span(self.elements),
            "large_cases": self.large_cases,
            "large_sizes": _largest(self.large),
            "masked_keys": self.masked,
            "fully_masked_rows": self.fully,
            "temperature": _span(self.temperatures),
            "values": _span(self.values),
            "magnitudes": _span(self.magnitudes),
            "decades": {d: {sign: runs(v) for sign, v in signs.items()}
                        for d, signs in sorted(self.decades.items(),
                                               key=lambda kv: _dtype_order(kv[0]))},
            "far_below": self.far_below,
            "shifts": _span(self.shifts),
            "shift_decades": sorted(self.shift_decades) if self.shifts else None,
            "mask_bias": _span(self.mask_bias),
            "judged_rows": list(self.judged) if self.judged[1] else None,
            "declared": declared,
            **({"attention": self.attention.to_json()} if self.attention is not None else {}),
        }


def _tensor_layouts(t) -> set[str]:
    """The layout kinds of an attention input: ``offset`` (a non-zero storage offset),
    ``transposed`` (a permutation of a dense block), ``strided`` (gaps: a slice of a longer
    buffer), else ``contiguous``."""
    out = {"offset"} if t.storage_offset() else set()
    if t.is_contiguous():
        return out or {"contiguous"}
    order = sorted(range(t.dim()), key=lambda i: -t.stride(i))
    step, dense = 1, True
    for i in reversed(order):
        if t.shape[i] > 1 and t.stride(i) != step:
            dense = False
        step *= t.shape[i]
    return out | {"transposed" if dense else "strided"}


def _span(values: list) -> list | None:
    return [min(values), max(values)] if values else None


def _largest(sizes) -> list[list[int]]:
    """The ``[rows, length]`` pairs with the most entries first, at most :data:`LARGE_SIZES`."""
    ordered = sorted({tuple(s) for s in sizes}, key=lambda s: (-s[0] * s[1], -s[1]))
    return [list(s) for s in ordered[:LARGE_SIZES]]


def _dtype_order(name: str) -> int:
    order = ("float16", "bfloat16", "float32", "float64")
    return order.index(name) if name in order else len(order)


def merge(blocks: list[dict]) -> dict[str, Any] | None:
    """The union of property blocks (cases summed, ranges widened)."""
    blocks = [b for b in blocks if b]
    if not blocks:
        return None
    from attnverify.strategies.layouts import KINDS  # torch-free: merge reads coverage

    def union(key, order=None):
        values = {v for b in blocks for v in (b.get(key) or [])}
        return sorted(values, key=order) if order else sorted(values)

    def widest(key):
        spans = [b[key] for b in blocks if b.get(key)]
        return [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else None

    layouts = union("layouts")
    declared = next((b["declared"] for b in blocks if b.get("declared")), None)
    return {
        "cases": sum(b.get("cases", 0) for b in blocks),
        "dtypes": union("dtypes", _dtype_order),
        "ranks": union("ranks"),
        "axes": union("axes"),
        "layouts": [k for k in KINDS if k in layouts],
        "row_length": widest("row_length"),
        "row_count": widest("row_count"),
        "elements": widest("elements"),
        "large_cases": sum(b.get("large_cases", 0) for b in blocks),
        "large_sizes": _largest(s for b in blocks for s in (b.get("large_sizes") or [])),
        "masked_keys": sum(b.get("masked_keys", 0) for b in blocks),
        "fully_masked_rows": sum(b.get("fully_masked_rows", 0) for b in blocks),
        "temperature": widest("temperature"),
        "values": widest("values"),
        "magnitudes": widest("magnitudes"),
        "decades": _decades_union(blocks),
        "far_below": sum(b.get("far_below", 0) or 0 for b in blocks),
        "shifts": widest("shifts"),
        "shift_decades": (sorted({e for b in blocks for e in b.get("shift_decades") or []})
                          if any(b.get("shifts") for b in blocks) else None),
        "mask_bias": widest("mask_bias"),
        "judged_rows": _judged_union(blocks),
        "declared": declared,
        **_attention_union(blocks),
    }


def _judged_union(blocks: list[dict]) -> list[int] | None:
    parts = [b["judged_rows"] for b in blocks if b.get("judged_rows")]
    return [sum(p[0] for p in parts), sum(p[1] for p in parts)] if parts else None


def runs(values) -> list[list[int]]:
    """Sorted integers as runs of consecutive ones: ``{1, 2, 3, 7}`` → ``[[1, 3], [7, 7]]``."""
    out: list[list[int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def expand(spans) -> set[int]:
    """The integers of :func:`runs`' output."""
    return {v for lo, hi in spans or [] for v in range(int(lo), int(hi) + 1)}


def _decades_union(blocks: list[dict]) -> dict[str, Any]:
    dtypes = sorted({d for b in blocks for d in (b.get("decades") or {})}, key=_dtype_order)
    return {d: {sign: runs(set().union(*(expand(((b.get("decades") or {}).get(d) or {}).get(
        sign)) for b in blocks))) for sign in ("+", "-")} for d in dtypes}


def _attention_union(blocks: list[dict]) -> dict[str, Any]:
    """``{"attention": the union}`` when a block has attention cases, else ``{}``."""
    parts = [b["attention"] for b in blocks if b.get("attention")]
    if not parts:
        return {}

    return {"attention": merge_attention(parts)}


#: Fields compared per property in :func:`target_block` (counts of cases always differ).
COMPARED = ("dtypes", "ranks", "axes", "layouts", "row_length", "row_count", "elements",
            "temperature", "magnitudes", "shifts")


def target_block(results) -> dict[str, Any] | None:
    """A target's coverage: the union of its results' blocks, and ``properties``: per property,
    the fields of :data:`COMPARED` where its block differs from the union."""
    blocks = {r.property: r.coverage for r in results if getattr(r, "coverage", None)}
    total = merge(list(blocks.values()))
    if total is None:
        return None
    total["properties"] = {
        prop: diff for prop, block in blocks.items()
        if (diff := {k: block.get(k) for k in COMPARED if block.get(k) != total.get(k)})}
    return total


# --------------------------------------------------------------------------------------------
# Words


def _range(span, unit: str = "") -> str:
    if not span:
        return "none"
    lo, hi = span
    fmt = (lambda v: f"{v:g}") if isinstance(lo, float) else str
    return f"{fmt(lo)}{unit}" if lo == hi else f"{fmt(lo)}–{fmt(hi)}{unit}"


def describe(block: dict | None) -> str:
    """One line: ``1234 cases; float32, float64; ranks 1–4; dim -4…3; layouts …; rows 1–4097;
    row length 1–4097; entries 1–2101761 (30 cases above 32768, the largest [4097, 513],
    [1025, 2049], [257, 4097]); masked keys in 300 cases, fully masked rows in 40;
    T 0.001–10``."""
    if not block:
        return "no cases"
    ranks = block.get("ranks") or []
    rank = _range([min(ranks), max(ranks)]) if ranks else "none"
    axes = block.get("axes") or []
    dims = ", ".join(str(a) for a in axes) if len(axes) <= 3 else f"{min(axes)}…{max(axes)}"
    parts = [f"{block.get('cases', 0)} cases", ", ".join(block.get("dtypes") or []) or "-",
             f"rank {rank}", f"dim {dims or '-'}",
             f"layouts {', '.join(block.get('layouts') or []) or '-'}",
             f"rows {_range(block.get('row_count'))}",
             f"row length {_range(block.get('row_length'))}",
             _entries(block),
             f"masked keys in {block.get('masked_keys', 0)} cases, fully masked rows in "
             f"{block.get('fully_masked_rows', 0)}"]
    if block.get("values"):
        parts.append(_magnitudes(block))
    if block.get("shifts"):
        parts.append(f"shifts ±{_range(block['shifts'])}")
    if block.get("mask_bias"):
        parts.append(f"mask biases {_range(block['mask_bias'])}")
    if block.get("temperature"):
        parts.append(f"T {_range(block['temperature'])}")
    judged = block.get("judged_rows")
    if judged and judged[0] < judged[1]:
        parts.append(f"derivatives judged on {judged[0]} of {judged[1]} rows (the others on a "
                     "kink or beyond the differences' resolution)")
    cap = block.get("per_call")
    if isinstance(cap, dict) and cap.get("rows"):
        heads = (f", {cap['batch_heads']} batch × heads and {cap['queries']} queries"
                 if cap.get("batch_heads") else "")
        factor = cap.get("time_limit_factor")
        more = f", {factor:g}× the time limit per example" if factor else ""
        parts.append(f"at most {cap['rows']} rows{heads} per call ({cap.get('reason', '')}"
                     f"{more})")
    return "; ".join(parts)


def _magnitudes(block: dict) -> str:
    """``scores -3.4e+33–5e+33, |z| 1e-06–5e+33 (decades -6…33 both signs), rows far below
    zero in 12 cases``."""
    text = f"scores {_range(block.get('values'))}"
    if block.get("magnitudes"):
        text += f", |z| {_range(block['magnitudes'])}"
    words = []
    for dtype, signs in (block.get("decades") or {}).items():
        seen = {s: expand(signs.get(s)) for s in ("+", "-")}
        every = seen["+"] | seen["-"]
        if every:
            both = len(seen["+"] & seen["-"])
            words.append(f"{dtype} {len(every)} decades {min(every)}…{max(every)}"
                         f" ({both} in both signs)")
    if words:
        text += f" ({'; '.join(words)})"
    return text + f", rows far below zero in {block.get('far_below', 0)} cases"


def _entries(block: dict) -> str:
    """``entries 1–2101761 (30 cases above 32768, the largest [4097, 513], …)``."""
    text = f"entries {_range(block.get('elements'))}"
    large = block.get("large_cases") or 0
    if large:
        sizes = ", ".join(str(list(s)) for s in (block.get("large_sizes") or [])[:3])
        text += f" ({large} case{'s' if large > 1 else ''} above {LARGE}, the largest {sizes})"
    return text


def describe_difference(diff: dict) -> str:
    """``float64 only; rows 1–4097`` for a property's differing fields."""
    out = []
    for key, value in diff.items():
        if key in ("row_length", "row_count", "elements", "temperature", "magnitudes",
                   "shifts"):
            name = {"row_length": "row length", "row_count": "rows", "elements": "entries",
                    "temperature": "T", "magnitudes": "|z|", "shifts": "shifts"}[key]
            out.append(f"{name} {_range(value)}")
        elif value is None:
            out.append(f"no {key}")
        else:
            out.append(f"{key} {', '.join(str(v) for v in value)}")
    return "; ".join(out)


def certified_for(declared: dict | None) -> str:
    """What the verdict covers, in words: ``every layout; any axis; ranks 1–4`` or the declared
    restrictions."""
    from attnverify.strategies.layouts import layout_space  # torch-free: merge reads coverage

    if not declared:
        return layout_space().words()
    return layout_space(declared.get("layouts"), declared.get("dims")).words()
