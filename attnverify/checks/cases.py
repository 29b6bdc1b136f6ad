"""Cases the properties run on: Hypothesis strategies built from :mod:`attnverify.strategies`,
plus a fixed battery of explicit adversarial cases that every run checks first (so a planted
defect is found under the ci profile whatever the random draws do).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from attnverify import strategies as S
from attnverify.checks.base import Context
from attnverify.checks.layout import space_of
from attnverify.registry import NormalizerSpec
from attnverify.strategies import domain as D
from attnverify.strategies import layouts as LY
from attnverify.strategies.layouts import Layout
from attnverify.strategies.rows import _draw_row_scale, _kind_bounds

F64 = torch.float64

# Every case keeps its scores as canonical [R, L] rows; ``layout`` says how the normalizer is given
# them (rank, axis, memory layout; ``None``: the contiguous [R, L] block with dim=-1). See
# attnverify/strategies/layouts.py and attnverify/checks/layout.py.


class RowCase(NamedTuple):
    scores: torch.Tensor  # [batch, L]
    temperature: float | None
    kind: str
    seed: int
    layout: Layout | None = None
    #: What ``shift_invariant`` multiplies its drawn shifts by (a failure is retried with
    #: shifts a tenth as large and reported at the smallest that fails).
    shift_scale: float = 1.0


class BoundedCase(NamedTuple):
    scores: torch.Tensor  # [batch, L], every logit in [−a, a]
    temperature: float | None
    a: float
    kind: str
    seed: int
    layout: Layout | None = None


class QueryKeyCase(NamedTuple):
    scores: torch.Tensor  # [batch, L] = K q
    temperature: float | None
    delta: torch.Tensor  # [batch]
    kind: str
    seed: int
    layout: Layout | None = None


class EmbeddingCase(NamedTuple):
    scores: torch.Tensor  # [1, L]
    x: torch.Tensor  # [L, d]
    n_top: int
    temperature: float | None
    radius: float
    delta: float
    kind: str
    seed: int
    layout: Layout | None = None


class JacobianCase(NamedTuple):
    scores: torch.Tensor  # [batch, L], float64
    temperature: float | None
    eps: float
    kind: str
    seed: int
    layout: Layout | None = None


class PeakCase(NamedTuple):
    a: float
    temperature: float | None
    seed: int
    layout: Layout | None = None  # of the one-row peaks the check builds


#: Every case type, by name (how a repro names the case it rebuilds).
CASE_TYPES: dict[str, type] = {}


def _temperature(spec: NormalizerSpec, ctx: Context | None = None, *, low: float = 1e-3):
    """The cases' temperature: ``None`` without one; the fixed ``ctx.temperature`` (``--params
    temperature=…``) when set; else drawn from [``low``, 10]."""
    if not spec.takes_temperature:
        return st.none()
    if ctx is not None and ctx.temperature is not None:
        return st.just(ctx.temperature)
    return S.temperatures(min_value=low, max_value=10.0)


def battery_temperature(spec: NormalizerSpec, ctx: Context, default: float = 1.0):
    """The temperature of an explicit case: ``None`` without one, the fixed one, or ``default``."""
    if not spec.takes_temperature:
        return None
    return default if ctx.temperature is None else ctx.temperature


# --------------------------------------------------------------------------------------------
# Rows


def _kinds(spec, kinds, allow_mask) -> tuple[str, ...]:
    """Adversarial kinds for a spec: fully masked rows only for normalizers that claim to handle
    them (``fully_masked_row``), masked keys only where ``allow_mask``."""
    kinds = tuple(kinds or S.ALL_KINDS)
    if not allow_mask:
        kinds = tuple(k for k in kinds if k not in S.MASK_KINDS)
    if "fully_masked_row" not in spec.claims:
        kinds = tuple(k for k in kinds if k != "fully_masked")
    return kinds


#: Most entries (rows × row length) a generated case holds, but for one many-row draw in
#: :data:`LARGE_SHARE`: many rows come with short rows. Below torch's parallel grain (32768
#: elements): an op on more starts OpenMP threads, which on a busy machine costs milliseconds per
#: op.
ELEMENTS = 1 << 14
#: One many-row draw in this many may hold up to the profile's most entries
#: (``ctx.max_elements``): rows × row length past 2**15, 2**16, 2**20, … as the explicit cases
#: of :data:`BATTERY_JOINT` do, rarely enough that such cases stay a small part of a run.
LARGE_SHARE = 32
# Strategies built once: building one inside a draw costs more than the draw (Hypothesis
# inspects it).
_SCALES = S.scales()
_USUAL_T = S.temperatures(min_value=D.USUAL_T[0], max_value=D.USUAL_T[1])
_SEEDS = st.integers(0, 2**32 - 1)
#: The kinds whose rows get no whole-row offset (their magnitude is their point, or they have
#: no finite score).
NO_OFFSET = ("huge_range", "fully_masked", "mixed_scale")


@lru_cache(maxsize=256)
def _choices(values: tuple) -> st.SearchStrategy:
    return st.sampled_from(values)


#: Most rows a generated case holds (a tail of :data:`attnverify.strategies.layouts.ROW_TAILS`).
MANY_ROWS = 4097


def longest_row(rows: int, elements: int) -> int:
    """The longest row ``rows`` rows may have within ``elements`` entries, the rows and the
    length each up to one past a block of that many (``[4097, 513]`` within ``2**21``)."""
    return elements // (rows - 1) + 1 if rows > 1 else elements


def row_cases(spec, ctx: Context, *, kinds=None, allow_mask=True, dtypes=None, max_length=None,
              min_batch=1, many=True, long_share=None):
    """Rows of the adversarial kinds in every layout ``spec`` takes: 1–4 rows, or (one case in
    four, ``many``) a row count just past a chunk boundary up to :data:`MANY_ROWS`, with short
    rows (:data:`ELEMENTS` entries) or, one such case in :data:`LARGE_SHARE`, rows up to
    ``ctx.max_elements`` entries in all; lengths that cross powers of two; any rank, axis and
    memory layout, features combined. ``long_share`` ``N``: rows up to ``max_length`` keys
    but for one case in ``N``, whose rows go up to the profile's longest (``ctx.max_length``)."""
    kinds = _kinds(spec, kinds, allow_mask)
    longest = ctx.max_length
    most = MANY_ROWS if many else 4
    cap = getattr(ctx, "max_rows", None)
    if cap is not None:  # few program instances per call (an interpreted Triton kernel)
        most, min_batch = min(most, cap), min(min_batch, cap)
    options = (kinds, tuple(dtypes or ctx.full_dtypes), max_length or longest,
               min_batch, most, space_of(spec), ctx.device,
               max(ELEMENTS, getattr(ctx, "max_elements", ELEMENTS)),
               (longest, long_share) if long_share else None)
    fixed = ctx.temperature if spec.takes_temperature else None
    return _row_cases(options, (spec.takes_temperature, fixed, wide_values(kinds)))


def wide_values(kinds) -> bool:
    """Whether cases of these kinds range over the whole value domain of their dtype
    (:mod:`attnverify.strategies.domain`): magnitudes, whole-row offsets and temperatures far
    outside the usual ranges. Every property's rows do (a property that left out
    ``huge_range`` would take no huge logits and keep the usual ranges)."""
    return "huge_range" in kinds


def _offset(scores: torch.Tensor, c: float, seed: int) -> torch.Tensor:
    """Every finite score of each row moved by the row's offset under ``c``
    (:func:`attnverify.strategies.domain.row_offsets`; computed in float64, rounded once to
    the dtype)."""
    moved = scores.to(torch.float64) + D.row_offsets(c, scores.shape[0], seed).to(
        scores.device)
    return torch.where(torch.isfinite(scores), moved.to(scores.dtype), scores)


def _draw_temperature(draw, temperature, scores: torch.Tensor, dtype):
    """``None`` without a temperature, the fixed one, else one from
    :func:`attnverify.strategies.domain.temperatures`, raised where ``z/T`` would leave the
    dtype's range (:func:`~attnverify.strategies.domain.temperature_floor`)."""
    takes, fixed, wide = temperature
    if not takes:
        return None
    if fixed is not None:
        return fixed
    if not wide:
        return draw(_USUAL_T)
    t = draw(D.temperatures(dtype))
    finite = scores[torch.isfinite(scores)]
    top = float(finite.abs().max()) if finite.numel() else 0.0
    return max(t, D.temperature_floor(top, dtype))


@st.composite
def _row_cases(draw, options, temperature) -> RowCase:
    kinds, dtypes, max_length, min_batch, many, space, device, large, long_rows = options
    kind = draw(_choices(kinds))
    dtype = draw(_choices(dtypes))
    fewest = max(min_batch, 2 if kind == "mixed_scale" else 1)
    few = max(fewest, min(4, many))
    rows = draw(LY.row_counts(min_rows=fewest, max_rows=few, many=many))
    if long_rows is not None and draw(LY.ints(0, long_rows[1] - 1)) == long_rows[1] - 1:
        max_length = long_rows[0]  # shrinks towards the short rows (draws 0 … N - 2)
    lo, hi = _kind_bounds(kind, 1, max_length)
    longest = ELEMENTS // rows
    if rows > few and large > ELEMENTS and draw(LY.ints(0, LARGE_SHARE - 1)) == LARGE_SHARE - 1:
        longest = longest_row(rows, large)
    length = LY.block_length(draw, lo, max(lo, min(hi, longest)))
    wide = temperature[2]
    scale = _draw_row_scale(draw, kind, D.magnitudes(dtype) if wide else _SCALES, dtype, None)
    seed = draw(_SEEDS)
    built = S.build_rows(kind, length=length, batch=rows, dtype=dtype, scale=scale, seed=seed,
                         device=device)
    scores = built.scores
    # one case in OFFSET_SHARE: each row moved as a whole, far from zero (shrinks to no move)
    if wide and kind not in NO_OFFSET and \
            draw(LY.ints(0, D.OFFSET_SHARE - 1)) == D.OFFSET_SHARE - 1:
        scores = _offset(scores, draw(D.offsets(dtype)), seed)
    layout = LY.draw_layout(draw, rows, length, space)
    return RowCase(scores, _draw_temperature(draw, temperature, scores, dtype), kind, seed,
                   layout)


#: The layouts of the explicit cases, in turn: ``(kind, rank, axis from the end, positive
#: spelling, detail)`` for :func:`attnverify.strategies.layouts.build_layout`; a kind may be
#: several together (a transposed view at an offset, a sliced view with an expanded axis).
BATTERY_LAYOUTS = (
    ("contiguous", 2, -1, False, 0),
    ("transposed", 2, -1, False, 0),
    ("contiguous", 3, -2, True, 1),
    (("permuted", "offset"), 4, -1, False, 3),
    ("strided", 2, -2, False, 0),
    (("expanded", "transposed", "offset"), 4, -1, False, 1),
    ("offset", 1, -1, True, 2),
    (("transposed", "strided"), 4, -3, True, 1),
    (("strided", "offset"), 3, -1, False, 5),
    ("contiguous", 4, -4, False, 0),
    # every axis of rank 4 in both spellings is given at least once (-1 … -4 above, 0 … 1 too)
    (("permuted", "strided", "expanded"), 4, -2, True, 2),
    ("expanded", 4, -1, True, 4),
    (("transposed", "strided", "offset"), 4, -3, False, 6),
    ("permuted", 4, -1, False, 3),
)
#: Rows of an explicit case (one row where its layout has rank 1).
BATTERY_ROWS = 4


class Explicit(NamedTuple):
    """An explicit case of many rows or many entries: ``rows`` × ``length`` scores built from
    ``seed`` (of the kind ``masked`` when ``masked`` and the property takes masked keys, else
    ``gaussian``), given in the layout ``(kind, rank, axis from the end, positive spelling,
    detail)`` of :func:`attnverify.strategies.layouts.build_layout`."""

    rows: int
    length: int
    masked: bool
    layout: tuple
    seed: int


#: The explicit many-row cases: one more or one fewer than a multiple of 64, 128 and 1024 rows
#: (and than 4096), a few keys each (within :data:`ELEMENTS`), contiguous and in views.
BATTERY_MANY = (
    Explicit(4097, 3, False, (("transposed", "offset"), 3, -1, False, 0), 17),
    Explicit(4095, 4, True, (("permuted", "strided"), 4, -1, False, 1), 18),
    Explicit(3073, 5, False, (("expanded", "strided", "offset"), 4, -1, False, 2), 19),
    Explicit(1025, 15, True, ("contiguous", 3, -1, False, 0), 20),
)
#: The explicit cases of many entries (rows × row length across the counts kernels switch
#: paths at: 2**15, 2**16, 2**20, 2**21, row chunks of 32 or 64 at L > 512, L > 2048), largest
#: first; a profile takes those within its most entries and one key past its longest row.
BATTERY_JOINT = (
    Explicit(4097, 513, False, ("contiguous", 2, -1, False, 0), 31),
    Explicit(1025, 2049, False, (("transposed", "offset"), 4, -1, False, 1), 32),
    Explicit(257, 4097, True, (("strided", "offset"), 3, -1, False, 0), 33),
    Explicit(33, 4097, False, (("permuted", "expanded"), 4, -1, False, 3), 34),
    Explicit(257, 257, True, ("transposed", 3, -1, False, 4), 35),
    Explicit(129, 257, False, ("offset", 2, -1, False, 5), 36),
)


#: The cases of :data:`BATTERY_JOINT` with masked keys and at most 2**17 entries (``mask_zero``'s:
#: a masked row of 4097 keys comes in the long rows of every battery, and ``batch_independent``
#: judges the larger masked cases against their rows alone).
JOINT_MASKED = tuple(i for i, e in enumerate(BATTERY_JOINT)
                     if e.masked and e.rows * e.length <= 2**17)


def battery_layout(spec, rows: int, length: int, index: int) -> Layout:
    """The ``index``-th layout of :data:`BATTERY_LAYOUTS` for ``rows`` × ``length``, within
    what ``spec`` takes."""
    kind, rank, from_end, positive, detail = BATTERY_LAYOUTS[index % len(BATTERY_LAYOUTS)]
    return LY.build_layout(rows, length, rank=rank, from_end=from_end, positive=positive,
                           kind=kind, detail=detail, space=space_of(spec))


def _scores(kind: str, length: int, rows: int, dtype, seed: int, device: str,
            scale: float | None = None) -> torch.Tensor:
    return S.build_rows(kind, length=length, batch=rows, dtype=dtype, scale=scale, seed=seed,
                        device=device).scores


#: The scores of an explicit case (many rows or many entries), built once per process (each
#: case gets a copy); few are kept, as they are large.
_explicit_rows = lru_cache(maxsize=64)(_scores)
#: The scores of a battery's small case (a few rows of a few keys), built once per process:
#: every property's battery has them, per unit.
_small_rows = lru_cache(maxsize=1024)(_scores)


def battery_rows(kind: str, *, length: int, batch: int, dtype, seed: int, device,
                 scale: float | None = None) -> torch.Tensor:
    """:func:`attnverify.strategies.rows.build_rows`'s scores for a battery case: a copy of
    those built once per process (:func:`_small_rows`)."""
    return _small_rows(kind, length, batch, dtype, seed, str(device), scale).clone()


def explicit_cases(spec, ctx: Context, entries, *, kinds, dtype,
                   temperature) -> list[RowCase]:
    """The cases of ``entries`` (:class:`Explicit`), each built once per process and copied per
    case, in its layout within what ``spec`` takes."""
    out, cap = [], getattr(ctx, "max_rows", None)
    for entry in entries:
        if cap is not None and entry.rows > cap:  # its row length and layout, fewer rows
            entry = entry._replace(rows=cap)
        kind = "masked" if entry.masked and "masked" in kinds else "gaussian"
        scores = _explicit_rows(kind, entry.length, entry.rows, dtype, entry.seed,
                                str(ctx.device)).clone()
        layout_kind, rank, from_end, positive, detail = entry.layout
        layout = LY.build_layout(entry.rows, entry.length, rank=rank, from_end=from_end,
                                 positive=positive, kind=layout_kind, detail=detail,
                                 space=space_of(spec))
        out.append(RowCase(scores, temperature, kind, entry.seed, layout))
    return out


def joint_entries(ctx: Context, picks=None) -> tuple[Explicit, ...]:
    """The :data:`BATTERY_JOINT` cases ``ctx`` takes (``picks``: only those indices): rows and
    length each up to one past a block within ``ctx.max_elements`` entries, the length up to
    one past ``ctx.max_length``."""
    limit = getattr(ctx, "max_elements", ELEMENTS)
    chosen = BATTERY_JOINT if picks is None else tuple(BATTERY_JOINT[i] for i in picks)
    return tuple(e for e in chosen if e.length <= ctx.max_length + 1
                 and e.length <= longest_row(e.rows, limit))


#: The explicit long rows have ``min(max_length, LONG_ROW)`` keys, the masked ones one more.
LONG_ROW = 4096


def long_battery(spec, ctx: Context, *, kinds, dtype, temperature, min_batch) -> list[RowCase]:
    """Two long rows (``min(max_length, LONG_ROW)`` keys) as one contiguous block, and, where
    the property takes masked keys, three rows one key longer with keys masked, given as a
    transposed view at an offset."""
    length = min(ctx.max_length, LONG_ROW)
    if getattr(ctx, "max_rows", None) is not None:
        min_batch = min(min_batch, ctx.max_rows)
    rows = battery_rows("gaussian", length=length, batch=max(2, min_batch), dtype=dtype,
                        seed=13, device=ctx.device)
    out = [RowCase(rows, temperature, "gaussian", 13, None)]
    if "masked" in kinds:
        masked = Explicit(max(3, min_batch), length + 1, True,
                          (("transposed", "offset"), 3, -1, False, 7), 14)
        out += explicit_cases(spec, ctx, (masked,), kinds=kinds, dtype=dtype,
                              temperature=temperature)
    return out


def row_battery(spec, ctx: Context, *, kinds=None, allow_mask=True, dtypes=None,
                min_batch=1, long=True, many=True, joint=None) -> list[RowCase]:
    """One explicit case per adversarial kind and dtype (:data:`BATTERY_ROWS` rows, each in the
    next layout of :data:`BATTERY_LAYOUTS`), a low-temperature one, the long rows
    (:func:`long_battery`), the many-row cases (``many``, :data:`BATTERY_MANY`) and the cases
    of many entries (``joint``: ``"all"`` or indices into :data:`BATTERY_JOINT`;
    :func:`joint_entries`)."""
    kinds = _kinds(spec, kinds, allow_mask)
    dtypes = tuple(dtypes or ctx.full_dtypes)
    if not dtypes:
        return []
    t = battery_temperature(spec, ctx)
    out = []
    # a unit of one dtype (ctx.unit_dtype) takes the layouts where the unit before it stopped;
    # the cases that are not per dtype belong to the first unit alone
    position = ctx.unit_position(dtypes[0])
    base = position * len(kinds)
    for dtype in dtypes:
        for kind in kinds:
            length = 1 if kind == "single" else 9
            rank = BATTERY_LAYOUTS[(base + len(out)) % len(BATTERY_LAYOUTS)][1]
            count = 1 if rank == 1 and min_batch <= 1 and kind != "mixed_scale" else \
                max(BATTERY_ROWS, min_batch)
            if getattr(ctx, "max_rows", None) is not None:
                count = min(count, max(ctx.max_rows, 2 if kind == "mixed_scale" else 1))
            rows = battery_rows(kind, length=length, batch=count, dtype=dtype, seed=7,
                                device=ctx.device)
            layout = battery_layout(spec, count, length, base + len(out))
            out.append(RowCase(rows, t, kind, 7, layout))
    for dtype in dtypes if wide_values(kinds) else ():
        out += domain_battery(spec, ctx, dtype, base + len(out), kinds=kinds)
    if position:
        return out
    if spec.takes_temperature and ctx.temperature is None:
        rows = battery_rows("gaussian", length=12, batch=2, dtype=dtypes[0], scale=3.0, seed=11,
                            device=ctx.device)
        out.append(RowCase(rows, 1e-3, "gaussian", 11,
                           battery_layout(spec, 2, 12, len(out))))
    if long:
        out += long_battery(spec, ctx, kinds=kinds, dtype=dtypes[0], temperature=t,
                            min_batch=min_batch)
    if many:
        out += explicit_cases(spec, ctx, BATTERY_MANY, kinds=kinds, dtype=dtypes[0],
                              temperature=t)
    if joint is not None:
        entries = joint_entries(ctx, None if joint == "all" else joint)
        out += explicit_cases(spec, ctx, entries, kinds=kinds, dtype=dtypes[0],
                              temperature=t)
    return out


#: The offsets of the explicit rows far from zero (:func:`domain_battery`), each capped at
#: the dtype's :func:`~attnverify.strategies.domain.limit`: just past FlashInfer's finite
#: initial maximum (-5e4) and its test's -524288, far lower, and both ends of the range.
FAR_OFFSETS = (-6e4, -524288.0, -1e9, "-limit", "+limit")


def far_offsets(dtype) -> tuple[float, ...]:
    """:data:`FAR_OFFSETS` for ``dtype`` (each within its range, none repeated)."""
    top = D.limit(dtype)
    out = []
    for c in FAR_OFFSETS:
        value = -top if c == "-limit" else top if c == "+limit" else max(float(c), -top)
        if value not in out:
            out.append(value)
    return tuple(out)


#: Rows of one case of the value domain's battery, at most.
DOMAIN_BLOCK = 64


@lru_cache(maxsize=16)
def _domain_rows(dtype, masked: bool, device: str) -> torch.Tensor:
    """The rows of :func:`domain_battery` before they are split into cases, built once per
    process (each unit gets a copy)."""
    offsets = far_offsets(dtype)
    rows = S.build_rows("gaussian", length=9, batch=len(offsets), dtype=torch.float64, seed=23,
                        device=device).scores
    moved = rows + torch.tensor(offsets, dtype=torch.float64, device=rows.device)[:, None]
    moved = torch.cat([moved, D.decade_rows(dtype).to(rows.device)])
    if masked:
        moved[:, 4] = float("-inf")
    return moved.to(dtype)


def domain_battery(spec, ctx: Context, dtype, index: int, *, kinds) -> list[RowCase]:
    """The explicit cases of the value domain, per dtype: one case whose rows each lie far
    from zero as a whole (a Gaussian row of 9 keys moved by each of :func:`far_offsets`) and
    one row per decade of the dtype's range and sign
    (:func:`attnverify.strategies.domain.decade_rows`), a key masked where the property takes
    masked keys; and, for a normalizer with a temperature (not fixed), rows at the lowest and
    the highest temperature of the dtype's range with logits of that size (``z/T`` about 3)."""
    scores = _domain_rows(dtype, "masked" in kinds, str(ctx.device)).clone()
    t = battery_temperature(spec, ctx)
    # in blocks of at most DOMAIN_BLOCK rows (and the per-call cap of an interpreted kernel):
    # the many-row cases of the battery stay the row-tail counts they are chosen to be
    block = min(DOMAIN_BLOCK, ctx.max_rows or DOMAIN_BLOCK)
    out = [RowCase(part, t, "far_rows", 23, battery_layout(spec, part.shape[0], 9, index))
           for part in scores.split(block)]
    if spec.takes_temperature and ctx.temperature is None:
        for j, temperature in enumerate(D.temperature_range(dtype)):
            size = min(3.0 * temperature, D.limit(dtype))
            rows = battery_rows("gaussian", length=12, batch=2, dtype=dtype, scale=size,
                                seed=29 + j, device=ctx.device)
            out.append(RowCase(rows, temperature, "gaussian", 29 + j,
                               battery_layout(spec, 2, 12, index + 1 + j)))
    return out


# --------------------------------------------------------------------------------------------
# Lemma 1 / Corollary 1 / length awareness


@st.composite
def _with_layout(draw, records, spec, make):
    """A record of ``records`` with a layout of its rows (within what ``spec`` takes), made into
    a case by ``make(record, layout, draw)``."""
    record = draw(records)
    rows, length = record[0].shape if record[0].dim() == 2 else (1, record[0].shape[-1])
    return make(record, LY.draw_layout(draw, rows, length, space_of(spec)), draw)


def bounded_cases(spec, ctx: Context):
    t = _temperature(spec, ctx, low=0.05)
    rows = S.bounded_rows(max_length=min(ctx.max_length, 4096), dtypes=(F64,), device=ctx.device)
    return _with_layout(rows, spec, lambda r, lay, draw: BoundedCase(
        r.scores, draw(t), r.a, r.kind, r.seed, lay))


def query_key_cases(spec, ctx: Context):
    t = _temperature(spec, ctx, low=0.05)
    sets = S.query_key_sets(max_length=min(ctx.max_length, 4096), dtypes=(F64,),
                            device=ctx.device)
    return _with_layout(sets, spec, lambda qk, lay, draw: QueryKeyCase(
        qk.logits, draw(t), qk.delta, qk.kind, qk.seed, lay))


_MARGINS = st.floats(0.5, 4.0)


@st.composite
def peak_cases(draw, spec, ctx: Context):
    """Margins a ∈ [0.5, 4] at the normalizer's own parameters (temperature not varied, unless
    fixed); the one-row peaks the check builds get a drawn layout."""
    t = ctx.temperature if ctx.temperature is not None and spec.takes_temperature else None
    a = draw(_MARGINS)
    seed = draw(LY.ints(0, 2**16))
    return PeakCase(a, t, seed, LY.draw_layout(draw, 1, 16, space_of(spec)))


# --------------------------------------------------------------------------------------------
# Theorems 1 and 2: embeddings plus a logit row of the same length


EMBEDDING_MAX_LENGTH = 256
RANDOM_TOPN_MAX_LENGTH = 10
#: Logit kinds of the row paired with the embeddings (no masks, no huge logits).
EMBEDDING_ROW_KINDS = ("gaussian", "uniform_bounded", "exact_ties", "two_way_tie", "near_ties",
                       "one_hot_like")


@st.composite
def embedding_cases(draw, spec, ctx: Context, *, sphere=False, max_length=EMBEDDING_MAX_LENGTH):
    if sphere:
        emb = draw(S.sphere_embeddings(max_length=max_length, dtypes=(F64,), device=ctx.device))
        x, radius, delta, kind = emb.x, float(emb.M), float(emb.delta), "sphere"
    else:
        emb = draw(S.embedding_sets(max_length=max_length, dtypes=(F64,), device=ctx.device))
        x, radius, delta, kind = emb.x, 0.0, 0.0, emb.kind
    length = x.shape[-2]
    row_kind = draw(_choices(tuple(k for k in EMBEDDING_ROW_KINDS
                                   if _kind_bounds(k, length, length)[0] <= length)))
    scale = _draw_row_scale(draw, row_kind, _SCALES, F64, None)
    seed = draw(_SEEDS)
    rows = S.build_rows(row_kind, length=length, batch=1, dtype=F64, scale=scale, seed=seed,
                        device=ctx.device)
    t = draw(_temperature(spec, ctx, low=0.05))
    layout = LY.draw_layout(draw, 1, length, space_of(spec))
    return EmbeddingCase(rows.scores, x, emb.n_top, t, radius, delta, f"{kind}/{row_kind}",
                         seed, layout)


# --------------------------------------------------------------------------------------------
# Jacobians


JACOBIAN_MAX_LENGTH = 256
JACOBIAN_KINDS = ("gaussian", "two_way_tie", "exact_ties", "near_ties", "one_hot_like",
                  "uniform_bounded")
FD_EPSILONS = (1e-3, 1e-1, 10.0)


def jacobian_cases(spec, ctx: Context, *, max_length=JACOBIAN_MAX_LENGTH):
    t = _temperature(spec, ctx, low=0.01)
    rows = S.logit_rows(min_length=1, max_length=min(ctx.max_length, max_length), batch=1,
                        dtypes=(F64,), kinds=JACOBIAN_KINDS, allow_mask=False, device=ctx.device)
    eps = st.sampled_from(FD_EPSILONS)
    return _with_layout(rows, spec, lambda r, lay, draw: JacobianCase(
        r.scores, draw(t), draw(eps), r.kind, r.seed, lay))


def jacobian_battery(spec, ctx: Context) -> list[JacobianCase]:
    """The two-way tie (Corollary 3's witness), the uniform row and a Gaussian row, each in the
    next layout of :data:`BATTERY_LAYOUTS`."""
    t = battery_temperature(spec, ctx)
    out = []
    for kind, length in (("two_way_tie", 2), ("two_way_tie", 6), ("exact_ties", 5),
                         ("gaussian", 16)):
        rows = battery_rows(kind, length=length, batch=1, dtype=F64, seed=3, device=ctx.device)
        for eps in (FD_EPSILONS[0], FD_EPSILONS[-1]):
            layout = battery_layout(spec, 1, length, len(out))
            out.append(JacobianCase(rows, t, eps, kind, 3, layout))
    return out


CASE_TYPES.update({cls.__name__: cls for cls in (RowCase, BoundedCase, QueryKeyCase,
                                                  EmbeddingCase, JacobianCase, PeakCase)})
