"""Logit rows: :func:`logit_rows` (the adversarial kinds) and :func:`bounded_rows` (every logit in
``[-a, a]``, Lemma 1), with their deterministic builders."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from attnverify.strategies.records import BoundedRows, Rows
from attnverify.strategies.scalars import (
    _SEEDS,
    DEFAULT_DTYPES,
    FLOAT_DTYPES,
    _check_common,
    _draw_batch,
    _draw_bounds,
    _draw_dtype,
    _draw_kind,
    _draw_length,
    _sampled,
    scales,
)
from attnverify.strategies.tensors import (
    _Ctx,
    _ctx,
    _finish,
    _floor_to_dtype,
    _positions,
    _rand,
    _randint,
    _randn,
    _signs,
    _work,
)
from attnverify.strategies.validation import (
    _any_strategy,
    _check_choices,
    _check_device,
    _check_int,
    _check_length_options,
    _check_member,
    _check_positive,
    _positive_check,
    _resolve,
    _static,
)

#: Adversarial kinds of :func:`logit_rows`, simplest first (shrinking moves towards the first).
ALL_KINDS = (
    "gaussian",
    "uniform_bounded",
    "exact_ties",
    "two_way_tie",
    "near_ties",
    "huge_range",
    "masked",
    "fully_masked",
    "single",
    "mixed_scale",
    "one_hot_like",
)
#: Kinds that put ``-inf`` (masked keys) into the scores; excluded when ``allow_mask=False``.
MASK_KINDS = ("masked", "fully_masked")
#: Kinds of :func:`bounded_rows`: uniform in [−a, a]; every logit ±a; one +a and the rest −a.
BOUNDED_KINDS = ("uniform", "extremes", "peak")
#: Magnitudes of ``huge_range`` rows, all far beyond fp32 ``exp`` overflow (≈ 88.7).
HUGE_MAGNITUDES = (1e4, 1e8, 1e30)
#: How far below the two equal maxima the rest of a ``two_way_tie`` row lies.
TIE_GAP = 1e3
#: How far the peak of a ``one_hot_like`` row lies above the rest.
PEAK_MARGIN = 1e3
#: Row scales of ``mixed_scale`` span ``scale·10**lo … scale·10**hi``.
MIXED_EXPONENTS = (-6.0, 4.0)
#: (shortest, longest) row length each kind allows; None = unbounded.
_KIND_LENGTHS: dict[str, tuple[int, int | None]] = {
    "single": (1, 1),
    "exact_ties": (2, None),
    "two_way_tie": (2, None),
    "near_ties": (2, None),
    "masked": (2, None),
    "one_hot_like": (2, None),
}


def _gaussian(c: _Ctx) -> torch.Tensor:
    return c.scale * _randn(c, c.batch, c.length)


def _uniform_bounded(c: _Ctx) -> torch.Tensor:
    """Uniform in ``[-a, a]``, ``a`` = scale rounded towards zero into the dtype (so the bound
    holds after conversion)."""
    edge = _floor_to_dtype(min(c.scale, torch.finfo(c.dtype).max), c.dtype)
    return edge * (2 * _rand(c, c.batch, c.length) - 1)


def _exact_ties(c: _Ctx) -> torch.Tensor:
    """1 to min(L-1, 4) distinct levels per row (1 = all equal), so every row has a tie."""
    m = int(_randint(c, 1, max(1, min(c.length - 1, 4)) + 1))
    levels = c.scale * _randn(c, c.batch, m)
    return levels.gather(1, _randint(c, 0, m, c.batch, c.length))


def _two_way_tie(c: _Ctx) -> torch.Tensor:
    """Two equal maxima, the rest at least ``TIE_GAP`` below (Corollary 3's witness)."""
    top = c.scale * _randn(c, c.batch, 1)
    rest = top - TIE_GAP - c.scale * _rand(c, c.batch, c.length)
    return rest.scatter(1, _positions(c, 2), top.expand(-1, 2))


def _near_ties(c: _Ctx) -> torch.Tensor:
    """Values ``base + k ulp`` of the target dtype, k = 0 … span (each present), span ≤ 3."""
    span = int(_randint(c, 1, min(3, c.length - 1) + 1))
    magnitude = min(c.scale, torch.finfo(c.dtype).max / 2)
    x = (magnitude * (2 * _rand(c, c.batch, 1) - 1)).to(c.dtype).expand(-1, c.length)
    steps = _randint(c, 0, span + 1, c.batch, c.length)
    every = torch.arange(span + 1, device=c.device).expand(c.batch, -1)
    steps = steps.scatter(1, _positions(c, span + 1), every)
    up = torch.full_like(x, math.inf)
    for step in range(span):
        x = torch.where(steps > step, torch.nextafter(x, up), x)
    return x


def _huge_range(c: _Ctx) -> torch.Tensor:
    """Uniform in ``[-s, s]`` with ``+s`` (and ``-s`` when L ≥ 2) present; ``s`` is huge."""
    x = c.scale * (2 * _rand(c, c.batch, c.length) - 1)
    k = min(2, c.length)
    ends = torch.tensor([c.scale, -c.scale][:k], dtype=x.dtype, device=c.device)
    return x.scatter(1, _positions(c, k), ends.expand(c.batch, -1))


def _masked(c: _Ctx) -> torch.Tensor:
    """Gaussian rows with some ``-inf`` keys; every row keeps ≥ 1 unmasked and ≥ 1 masked key."""
    x = _gaussian(c)
    mask = _rand(c, c.batch, c.length) < 0.1 + 0.8 * _rand(c, 1)
    pos = _positions(c, 2)
    mask = mask.scatter(1, pos[:, :1], False).scatter(1, pos[:, 1:], True)
    return x.masked_fill(mask, -math.inf)


def _fully_masked(c: _Ctx) -> torch.Tensor:
    """Gaussian rows, a random non-empty set of them entirely ``-inf``."""
    x = _gaussian(c)
    rows = _rand(c, c.batch) < 0.5
    rows[_randint(c, 0, c.batch, 1)] = True
    return x.masked_fill(rows[:, None], -math.inf)


def _mixed_scale(c: _Ctx) -> torch.Tensor:
    """Row ``r`` has scale ``scale·10**e_r``, ``e`` spread over ``MIXED_EXPONENTS``."""
    lo, hi = MIXED_EXPONENTS
    if c.batch == 1:
        exps = lo + (hi - lo) * _rand(c, 1)
    else:
        grid = torch.linspace(lo, hi, c.batch, device=c.device, dtype=_work(c.device))
        exps = grid[torch.randperm(c.batch, generator=c.g, device=c.device)]
    return c.scale * torch.pow(10.0, exps)[:, None] * _randn(c, c.batch, c.length)


def _one_hot_like(c: _Ctx) -> torch.Tensor:
    """Gaussian rows with one logit ``PEAK_MARGIN`` above the row's maximum."""
    x = _gaussian(c)
    peak = x.amax(dim=1, keepdim=True) + PEAK_MARGIN
    return x.scatter(1, _positions(c, 1), peak)


_ROW_BUILDERS: dict[str, Callable[[_Ctx], torch.Tensor]] = {
    "gaussian": _gaussian,
    "uniform_bounded": _uniform_bounded,
    "exact_ties": _exact_ties,
    "two_way_tie": _two_way_tie,
    "near_ties": _near_ties,
    "huge_range": _huge_range,
    "masked": _masked,
    "fully_masked": _fully_masked,
    "single": _gaussian,
    "mixed_scale": _mixed_scale,
    "one_hot_like": _one_hot_like,
}


def _kind_bounds(kind: str, lo: int, hi: int) -> tuple[int, int]:
    """The length range of ``kind`` intersected with ``[lo, hi]`` (may be empty)."""
    klo, khi = _KIND_LENGTHS.get(kind, (1, None))
    return max(lo, klo), min(hi, hi if khi is None else khi)


def _kind_problem(kind: str, lo: int, hi: int, names: tuple[str, str], **known: Any) -> str | None:
    """Why ``kind`` cannot be built with these options, or None.

    ``known`` holds the options known so far: ``batch``, ``max_abs``, ``allow_mask`` (absent or
    None = unknown, no constraint).
    """
    klo, khi = _KIND_LENGTHS.get(kind, (1, None))
    if khi is not None and lo > khi:
        return f"needs length <= {khi}, but {names[0]}={lo}"
    if hi < klo:
        return f"needs length >= {klo}, but {names[1]}={hi}"
    if kind in MASK_KINDS and known.get("allow_mask") is False:
        return "puts -inf into the scores, but allow_mask=False"
    if kind == "mixed_scale" and known.get("batch") == 1:
        return "needs batch >= 2, but batch=1"
    max_abs = known.get("max_abs")
    if kind == "huge_range" and max_abs is not None and max_abs < HUGE_MAGNITUDES[0]:
        return f"needs max_abs >= {HUGE_MAGNITUDES[0]:g}, but max_abs={max_abs!r}"
    return None


def _check_row_key(kind, length, batch, dtype, scale, seed, max_abs) -> None:
    """Validate the arguments of :func:`build_rows`."""
    _check_member("kind", kind, ALL_KINDS)
    _check_int("length", length, 1)
    _check_int("batch", batch, 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_positive("scale", scale)
    _check_int("seed", seed, 0, 2**64 - 1)
    _static(max_abs, _positive_check("max_abs", optional=True))
    problem = _kind_problem(kind, length, length, ("length", "length"), max_abs=max_abs)
    if problem:
        raise InvalidArgument(f"kind={kind!r} {problem}")


def build_rows(
    kind: str,
    *,
    length: int,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    scale: float | None = None,
    seed: int = 0,
    max_abs: float | None = None,
    device: Any = "cpu",
) -> Rows:
    """Build the ``[batch, length]`` logit rows of one adversarial ``kind`` (see
    :func:`logit_rows`), deterministically from ``seed``.

    ``scale`` is the kind's magnitude (the std, the bound ``a``, the huge ``s`` of
    ``huge_range``, the base of ``mixed_scale``'s row scales); None means 1.0, and
    ``HUGE_MAGNITUDES[0]`` for ``huge_range``. Finite entries are clamped to ``±max_abs`` and to
    the range of ``dtype``.
    """
    if scale is None:
        scale = HUGE_MAGNITUDES[0] if kind == "huge_range" else 1.0
    _check_row_key(kind, length, batch, dtype, scale, seed, max_abs)
    c = _ctx(seed, device, dtype, scale, batch=batch, length=length)
    scores = _finish(_ROW_BUILDERS[kind](c), dtype, max_abs)
    return Rows(scores, kind, length, batch, dtype, float(scale), seed, max_abs)


def logit_rows(
    *,
    min_length: int | SearchStrategy[int] = 1,
    max_length: int | SearchStrategy[int] = 64,
    batch: int | SearchStrategy[int] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    kinds: Sequence[str] | SearchStrategy[str] | None = None,
    scale: float | SearchStrategy[float] | None = None,
    max_abs: float | SearchStrategy[float] | None = None,
    allow_mask: bool = True,
    device: Any = "cpu",
) -> SearchStrategy[Rows]:
    """Batched logit rows ``[batch, L]`` of adversarial kinds, as :class:`Rows`.

    Kinds (``ALL_KINDS``, simplest first): ``gaussian`` (N(0, scale²)); ``uniform_bounded``
    (uniform in [−scale, scale]); ``exact_ties`` (1–4 distinct levels per row, 1 = all equal);
    ``two_way_tie`` (two equal maxima, the rest ``TIE_GAP`` or more below: Corollary 3's
    witness); ``near_ties`` (values ``k`` ulps of the dtype apart, built with
    ``torch.nextafter``); ``huge_range`` (uniform in ``[−s, s]`` with ``±s`` present, ``s`` from
    ``HUGE_MAGNITUDES`` that fit the dtype and ``max_abs``: ``exp`` overflows in fp32);
    ``masked`` (some ``-inf`` keys, at least one unmasked per row); ``fully_masked`` (at least
    one whole row ``-inf``); ``single`` (L = 1); ``mixed_scale`` (row scales spread from
    1e-6·scale to 1e4·scale); ``one_hot_like`` (one logit ``PEAK_MARGIN`` above the rest).

    ``kinds=None`` uses every kind the other options allow; an explicit kind that they rule
    out (``single`` with ``min_length > 1``, ``masked`` with ``allow_mask=False``, …) is an
    error. ``batch=None`` draws 1–4 rows (2–4 for ``mixed_scale``); ``scale=None`` draws from
    :func:`scales`; ``max_abs`` caps every finite ``|score|`` (the margins of ``two_way_tie`` and
    ``one_hot_like`` shrink with it). Shrinks towards the shortest length, the first kind and
    dtype, one row, scale 1 and seed 0.
    """
    _check_length_options(min_length, max_length)
    _check_common(batch, dtypes, device)
    _static(scale, _positive_check("scale"))
    _static(max_abs, _positive_check("max_abs", optional=True))
    kinds = _static_row_kinds(kinds, min_length, max_length, batch, max_abs, allow_mask)
    scale = scales() if scale is None else scale
    options = (min_length, max_length, batch, dtypes, kinds, scale, max_abs)
    return _logit_rows(options, bool(allow_mask), device)


def _static_row_kinds(kinds, min_length, max_length, batch, max_abs, allow_mask):
    """Validate explicit kinds against the options known now; default to all that fit."""
    _check_choices("kinds", kinds if kinds is not None else ALL_KINDS, ALL_KINDS)
    if isinstance(kinds, SearchStrategy):
        return kinds
    lo, hi = (1, math.inf) if _any_strategy(min_length, max_length) else (min_length, max_length)
    known = {
        "batch": None if _any_strategy(batch) else batch,
        "max_abs": None if _any_strategy(max_abs) else max_abs,
        "allow_mask": bool(allow_mask),
    }
    names = ("min_length", "max_length")
    if kinds is None:
        return tuple(k for k in ALL_KINDS if not _kind_problem(k, lo, hi, names, **known))
    for kind in kinds:
        problem = _kind_problem(kind, lo, hi, names, **known)
        if problem:
            raise InvalidArgument(f"kinds contains {kind!r}, which {problem}")
    return tuple(kinds)


@st.composite
def _logit_rows(draw: Callable, options: tuple, allow_mask: bool, device: Any) -> Rows:
    min_length, max_length, batch, dtypes_, kinds, scale, max_abs = options
    lo, hi = _draw_bounds(draw, min_length, max_length)
    max_abs = _resolve(draw, max_abs, _positive_check("max_abs", optional=True))
    dtype = _draw_dtype(draw, dtypes_)
    known = {"batch": batch if isinstance(batch, int) else None, "max_abs": max_abs}
    kind = _draw_row_kind(draw, kinds, lo, hi, dict(known, allow_mask=allow_mask))
    length = _draw_length(draw, *_kind_bounds(kind, lo, hi))
    rows = _draw_batch(draw, batch, 2 if kind == "mixed_scale" else 1)
    scale = _draw_row_scale(draw, kind, scale, dtype, max_abs)
    seed = draw(_SEEDS)
    return build_rows(
        kind, length=length, batch=rows, dtype=dtype, scale=scale, seed=seed,
        max_abs=max_abs, device=_resolve(draw, device, _check_device),
    )  # fmt: skip


def _draw_row_kind(draw: Callable, kinds: Any, lo: int, hi: int, known: dict) -> str:
    """A kind that fits the drawn options (a drawn kind that does not fit is an error)."""
    names = ("min_length", "max_length")
    if isinstance(kinds, SearchStrategy):
        kind = _draw_kind(draw, kinds, ALL_KINDS)
        problem = _kind_problem(kind, lo, hi, names, **known)
        if problem:
            raise InvalidArgument(f"kinds drew {kind!r}, which {problem}")
        return kind
    fitting = [k for k in kinds if not _kind_problem(k, lo, hi, names, **known)]
    if not fitting:
        raise InvalidArgument(
            f"no kind in kinds={kinds!r} fits min_length={lo}, max_length={hi}, "
            f"batch={known['batch']!r}, max_abs={known['max_abs']!r}, "
            f"allow_mask={known['allow_mask']!r}"
        )
    return draw(_sampled(tuple(fitting)))


def _draw_row_scale(draw: Callable, kind: str, scale: Any, dtype: torch.dtype, max_abs) -> float:
    """The kind's magnitude: a huge one for ``huge_range``, else ``scale`` capped by max_abs."""
    cap = torch.finfo(dtype).max if max_abs is None else min(max_abs, torch.finfo(dtype).max)
    if kind == "huge_range":
        return draw(_sampled(tuple(m for m in HUGE_MAGNITUDES if m <= cap)))
    return min(float(_resolve(draw, scale, _positive_check("scale"))), cap)


# --------------------------------------------------------------------------- bounded rows


def _bounded_extremes(c: _Ctx) -> torch.Tensor:
    return c.scale * _signs(c, c.batch, c.length)


def _bounded_peak(c: _Ctx) -> torch.Tensor:
    """One logit ``+a``, the rest ``-a`` (the fixed-margin peak of docs/THEORY.md §2)."""
    x = torch.full((c.batch, c.length), -c.scale, device=c.device, dtype=_work(c.device))
    return x.scatter(1, _positions(c, 1), c.scale)


_BOUNDED_BUILDERS = {
    "uniform": _uniform_bounded,
    "extremes": _bounded_extremes,
    "peak": _bounded_peak,
}


def build_bounded_rows(
    kind: str,
    *,
    a: float,
    length: int,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: Any = "cpu",
) -> BoundedRows:
    """Build ``[batch, length]`` rows with every logit in ``[-a, a]`` (``±a`` is rounded towards
    zero into ``dtype``, so the bound holds exactly after conversion)."""
    _check_member("kind", kind, BOUNDED_KINDS)
    _check_positive("a", a)
    _check_int("length", length, 1)
    _check_int("batch", batch, 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_int("seed", seed, 0, 2**64 - 1)
    edge = _floor_to_dtype(min(a, torch.finfo(dtype).max), dtype)
    c = _ctx(seed, device, dtype, edge, batch=batch, length=length)
    scores = _finish(_BOUNDED_BUILDERS[kind](c), dtype, a)
    return BoundedRows(scores, float(a), kind, length, batch, dtype, seed)


def bounded_rows(
    *,
    a: float | SearchStrategy[float] | None = None,
    min_length: int | SearchStrategy[int] = 1,
    max_length: int | SearchStrategy[int] = 64,
    batch: int | SearchStrategy[int] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    kinds: Sequence[str] | SearchStrategy[str] = BOUNDED_KINDS,
    device: Any = "cpu",
) -> SearchStrategy[BoundedRows]:
    """Rows with every logit in ``[-a, a]`` (Lemma 1's hypotheses), as :class:`BoundedRows`.

    Kinds (``BOUNDED_KINDS``): ``uniform``; ``extremes`` (every logit ``±a``); ``peak`` (one
    ``+a``, the rest ``-a``, the tight case). ``a=None`` draws from
    ``scales(min_value=1e-2, max_value=10)``, shrinking to 1.
    """
    _static(a, _positive_check("a"))
    _check_length_options(min_length, max_length)
    _check_common(batch, dtypes, device)
    _check_choices("kinds", kinds, BOUNDED_KINDS)
    a = scales(min_value=1e-2, max_value=10.0) if a is None else a
    return _bounded_rows((a, min_length, max_length, batch, dtypes, kinds), device)


@st.composite
def _bounded_rows(draw: Callable, options: tuple, device: Any) -> BoundedRows:
    a, min_length, max_length, batch, dtypes_, kinds = options
    lo, hi = _draw_bounds(draw, min_length, max_length)
    dtype = _draw_dtype(draw, dtypes_)
    kind = _draw_kind(draw, kinds, BOUNDED_KINDS)
    length = _draw_length(draw, lo, hi)
    rows = _draw_batch(draw, batch)
    a = _resolve(draw, a, _positive_check("a"))
    seed = draw(_SEEDS)
    return build_bounded_rows(
        kind, a=a, length=length, batch=rows, dtype=dtype, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip
