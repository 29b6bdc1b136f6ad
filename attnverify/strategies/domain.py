"""The value domain of every free parameter, per dtype (issue #25): magnitudes of rows, offsets of
whole rows, shifts, temperatures, constant offsets of float masks.

Each range is where the float64 reference is meaningful for the dtype: every value and every
sum of a row's values (up to ``2**16`` of them) stays finite in the dtype, and ``z/T`` stays
finite too (:func:`temperature_floor`). Draws are log-uniform over the whole range, both signs
where a sign applies, and shrink towards the smallest magnitude (an exponent shrinking to its
lower end), so a failure is reported at the smallest magnitude that still fails.

The decades a run must reach (:func:`decades`) are what ``tests/test_reach.py`` holds the ci
profile to, and what a certificate's coverage reports (:mod:`attnverify.coverage`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from hypothesis import strategies as st

#: Headroom below the dtype's largest finite value: a row of up to ``2**16`` values of this
#: magnitude sums to a finite value (so the reference, and a kernel summing in the dtype, stay
#: finite). Half types are summed in float32 (a kernel summing in float16 is a defect), so
#: theirs only keeps one rounding away from overflow.
HEADROOM = 2.0**16
HALF_HEADROOM = 2.0
#: The smallest magnitude a row scale is drawn at (all dtypes).
SMALLEST = 1e-6
#: Rows "far below zero": every logit below this (FlashInfer's finite initial maximum was -5e4).
FAR_BELOW = -1e4
#: One generated row case in this many is offset as a whole (every logit moved by one constant
#: per row) and one in this many is drawn at a magnitude from the whole range (else the usual
#: 1e-3 … 1e3, where most defects show).
OFFSET_SHARE = 4
WIDE_SHARE = 4
#: The usual magnitudes (most draws).
USUAL = (1e-3, 1e3)
#: Temperatures: the usual range, and the widest one drawn.
USUAL_T = (1e-3, 10.0)
WIDEST_T = (1e-6, 1e6)


def limit(dtype: torch.dtype) -> float:
    """The largest magnitude drawn for ``dtype``: the largest finite value of the precision
    it is computed in (float32 for half types) over :data:`HEADROOM`, and at most half the
    dtype's own largest value."""
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return min(float(torch.finfo(dtype).max) / HALF_HEADROOM,
               float(torch.finfo(work).max) / HEADROOM)


def temperature_range(dtype: torch.dtype) -> tuple[float, float]:
    """The temperatures drawn for ``dtype``: :data:`WIDEST_T` narrowed so that ``1/T`` and
    ``T`` stay well inside its range (float16: ``1e-3 … 1e3``)."""
    lo, hi = WIDEST_T
    room = math.sqrt(float(torch.finfo(dtype).max)) / 8
    return max(lo, 1.0 / room), min(hi, room)


def temperature_floor(magnitude: float, dtype: torch.dtype) -> float:
    """The lowest temperature at which logits of ``magnitude`` stay within :func:`limit` once
    divided by it."""
    return magnitude / limit(dtype) if magnitude > 0 else 0.0


def decades(dtype: torch.dtype, low: float = SMALLEST) -> tuple[int, ...]:
    """The decades ``e`` (magnitudes ``10**e``) of the range drawn for ``dtype``."""
    return tuple(range(math.ceil(math.log10(low)), math.floor(math.log10(limit(dtype))) + 1))


def _exponent(lo: float, hi: float):
    """``log10`` of a magnitude in ``[lo, hi]``, shrinking towards ``lo``'s."""
    a, b = math.log10(lo), math.log10(hi)
    return st.floats(0.0, b - a).map(lambda x: a + x)


@lru_cache(maxsize=64)
def magnitudes(dtype: torch.dtype) -> st.SearchStrategy[float]:
    """Row magnitudes (scales): mostly log-uniform over :data:`USUAL` shrinking to 1, one draw
    in :data:`WIDE_SHARE` log-uniform over ``[SMALLEST, limit(dtype)]``."""
    top = limit(dtype)
    usual = st.floats(math.log10(USUAL[0]), math.log10(min(USUAL[1], top))).map(
        lambda u: 10.0**u)
    wide = _exponent(SMALLEST, top).map(lambda u: min(10.0**u, top))
    return st.one_of(*([usual] * (WIDE_SHARE - 1)), wide)


@lru_cache(maxsize=64)
def offsets(dtype: torch.dtype) -> st.SearchStrategy[float]:
    """A constant added to a whole row: ``±10**u``, ``u`` uniform over ``[0, log10 limit]``
    (shrinking to ``±1``), negative first (rows far below zero are where kernels with a finite
    initial maximum fail)."""
    top = limit(dtype)
    size = _exponent(1.0, top).map(lambda u: min(10.0**u, top))
    return st.tuples(st.sampled_from((-1.0, 1.0)), size).map(lambda p: p[0] * p[1])


@lru_cache(maxsize=64)
def temperatures(dtype: torch.dtype) -> st.SearchStrategy[float]:
    """Temperatures: mostly log-uniform over :data:`USUAL_T` (shrinking to 1), one draw in
    :data:`WIDE_SHARE` over :func:`temperature_range`."""
    lo, hi = temperature_range(dtype)
    usual = st.floats(math.log10(USUAL_T[0]), math.log10(USUAL_T[1])).map(lambda u: 10.0**u)
    wide = st.floats(math.log10(lo), math.log10(hi)).map(lambda u: min(max(10.0**u, lo), hi))
    return st.one_of(*([usual] * (WIDE_SHARE - 1)), wide)


def decade_rows(dtype: torch.dtype, length: int = 9, seed: int = 31) -> torch.Tensor:
    """Rows ``±1.5·10**e·(1 + g/10)`` (float64, ``g`` Gaussian, ``[2·n, length]``) for every
    decade ``e`` of :func:`decades` and both signs: one row per decade and sign, so that a
    single explicit case reaches the whole range of the dtype."""
    g = torch.Generator().manual_seed(seed)
    exps = torch.tensor(decades(dtype), dtype=torch.float64)
    size = 1.5 * torch.pow(10.0, exps).repeat(2)
    sign = torch.cat([torch.ones_like(exps), -torch.ones_like(exps)])
    noise = torch.randn(size.numel(), length, generator=g, dtype=torch.float64)
    rows = (sign * size)[:, None] * (1.0 + noise / 10.0)
    return rows.clamp(-limit(dtype), limit(dtype))


def row_offsets(c: float, rows: int, seed: int) -> torch.Tensor:
    """The offsets of ``rows`` rows (``[rows, 1]``, float64) under a drawn offset ``c``: the
    first row's is ``c``, each other row's a sign and a magnitude log-uniform over ``[1, |c|]``
    seeded by ``seed`` (so that one case reaches many decades, and shrinking ``c`` lowers them
    all)."""
    top = max(abs(float(c)), 1.0)
    g = torch.Generator().manual_seed(int(seed) + 6)
    u = torch.rand(rows, 2, generator=g, dtype=torch.float64)
    out = torch.where(u[:, 1:] < 0.5, -1.0, 1.0) * torch.pow(top, u[:, :1])
    out[0, 0] = float(c)
    return out


def exact_shift(scores: torch.Tensor, c: torch.Tensor):
    """``(a, b, c')``: rows ``a`` and ``b = a + c'`` both exact in the scores' dtype, with ``c'``
    the per-row shift ``c`` (``[R, 1]``) rounded to the grid of the row's largest magnitude and
    ``a`` the scores on that grid (a row far from zero is quantised as the dtype quantises it);
    masked keys stay masked. The shift is then exact: ``f(b) = f(a)`` is the claim itself, with
    no rounding of ``z + c`` to excuse."""
    dtype = scores.dtype
    z = scores.to(torch.float64)
    finite = torch.isfinite(z)
    top = torch.where(finite, z.abs(), torch.zeros_like(z)).amax(-1, keepdim=True)
    c = c.to(torch.float64)
    reach = top + c.abs()
    ulp = torch.full_like(reach, torch.finfo(dtype).eps)
    # the grid: the ulp of the largest value either row reaches (a power of two)
    grid = torch.exp2(torch.floor(torch.log2(reach.clamp_min(1e-300)))) * ulp * 2
    tiny = float(torch.finfo(dtype).tiny)
    grid = grid.clamp_min(tiny)
    a = torch.where(finite, torch.round(z / grid) * grid, z)
    c2 = torch.round(c / grid) * grid
    b = torch.where(finite, a + c2, z)
    return a.to(dtype), b.to(dtype), c2
