"""Interval arithmetic for ``falsify`` expressions: what an expression may be, given how far each
quantity may lie from the float64 value computed for it.

An interval is a pair ``(lo, hi)`` of floats with ``lo ≤ hi`` (``±inf`` allowed). Every operation
returns an interval that contains the exact result for every point of its arguments' intervals:
an endpoint computed in floating point is moved one unit in the last place outwards (two for a
function of the math library, which is not correctly rounded) unless the operation was exact
(checked with :class:`fractions.Fraction` for ``+ − × ÷`` and integer powers, and at the few
points where a function's value is exact: ``exp 0``, ``log 1``, …). Where an argument's interval
meets a point at which the operation has no value although the computed argument does not
(``log`` of an interval reaching below 0, a divisor interval containing 0, ``x**y`` with ``x``
possibly negative and ``y`` not an integer) the operation raises :class:`Singular`: the exact
expression might have no value there, so nothing can be decided from it.

Plain ``math`` on floats; imports nothing of attnverify (:mod:`attnverify.expr` uses it).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from fractions import Fraction

Interval = tuple[float, float]
INF = math.inf


class Singular(ArithmeticError):
    """An argument's interval meets a point where the operation has no value."""


def exact(value: float) -> Interval:
    return (value, value)


def around(value: float, error: float) -> Interval:
    """``value ± error`` (an ``error`` of 0 keeps the value exact)."""
    if not error or not math.isfinite(value):
        return (value, value)
    return (_down(value - error), _up(value + error))


def nearest(value: float) -> Interval:
    """The interval of a float that is the nearest double to some number (``pi``, ``0.1``)."""
    return (math.nextafter(value, -INF), math.nextafter(value, INF))


def _down(x: float, ulps: int = 1) -> float:
    for _ in range(ulps):
        x = math.nextafter(x, -INF)
    return x


def _up(x: float, ulps: int = 1) -> float:
    for _ in range(ulps):
        x = math.nextafter(x, INF)
    return x


def _away(r: float, lower: bool) -> float:
    """An endpoint ``r`` that is not exact, moved outwards (an overflow to ``±inf`` stands for a
    finite value beyond the largest double)."""
    if math.isinf(r):
        if r > 0:
            return sys.float_info.max if lower else r
        return r if lower else -sys.float_info.max
    return math.nextafter(r, -INF if lower else INF)


def _check(x: Interval) -> Interval:
    lo, hi = x
    if math.isnan(lo) or math.isnan(hi):
        raise Singular("no value")
    return x


# --------------------------------------------------------------------------------------------
# Arithmetic


def neg(x: Interval) -> Interval:
    return (-x[1], -x[0])


def _endpoint(fop, qop, a: float, b: float, lower: bool) -> float:
    """One endpoint of ``a op b``: exact when ``Fraction`` says so or an argument is infinite
    (the result is then that infinity), else moved outwards."""
    r = fop(a, b)
    if math.isnan(r):
        raise Singular("no value")
    if not (math.isfinite(a) and math.isfinite(b)):
        return r
    if math.isfinite(r):
        fast = _FAST_EXACT.get(qop)
        if fast is not None and _safe(a) and _safe(b) and _safe(r):
            if fast(a, b, r):
                return r
            return _away(r, lower)
        try:
            if qop(Fraction(a), Fraction(b)) == Fraction(r):
                return r
        except ZeroDivisionError:
            pass
    return _away(r, lower)


#: Magnitudes where the error-free transformations below neither overflow nor lose bits to
#: underflow (zero included): outside them, exactness is checked with :class:`Fraction`.
_SAFE_LO, _SAFE_HI = 2.0**-400, 2.0**400
_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a double into two 26-bit halves


def _safe(x: float) -> bool:
    return x == 0.0 or _SAFE_LO <= abs(x) <= _SAFE_HI


def _product_error(a: float, b: float, p: float) -> float:
    """``a·b − p`` exactly (Dekker's TwoProduct; ``p`` the rounded product, all in the safe
    range)."""
    c = _SPLIT * a
    a_hi = c - (c - a)
    a_lo = a - a_hi
    c = _SPLIT * b
    b_hi = c - (c - b)
    b_lo = b - b_hi
    return ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _sum_exact(a: float, b: float, s: float) -> bool:
    """Whether ``s = a + b`` exactly (Knuth's TwoSum error is 0)."""
    bb = s - a
    return (a - (s - bb)) + (b - bb) == 0.0


def _product_exact(a: float, b: float, p: float) -> bool:
    return _product_error(a, b, p) == 0.0


def _quotient_exact(a: float, b: float, q: float) -> bool:
    """Whether ``q = a / b`` exactly: ``q·b`` is exactly ``a``."""
    return q * b == a and _product_error(q, b, q * b) == 0.0


def add(x: Interval, y: Interval) -> Interval:
    return (_endpoint(_fadd, _qadd, x[0], y[0], True), _endpoint(_fadd, _qadd, x[1], y[1], False))


def sub(x: Interval, y: Interval) -> Interval:
    return add(x, neg(y))


def mul(x: Interval, y: Interval) -> Interval:
    corners = [(a, b) for a in x for b in y]
    los = [_endpoint(_fmul, _qmul, a, b, True) for a, b in corners]
    his = [_endpoint(_fmul, _qmul, a, b, False) for a, b in corners]
    return (min(los), max(his))


def div(x: Interval, y: Interval) -> Interval:
    if y[0] <= 0.0 <= y[1]:
        if y[0] != y[1]:
            raise Singular("a divisor interval contains 0")
        if x[0] > 0:  # a positive number over an exact zero: as IEEE, +inf
            return (INF, INF)
        if x[1] < 0:
            return (-INF, -INF)
        raise Singular("0/0")
    corners = [(a, b) for a in x for b in y]
    los = [_endpoint(_fdiv, _qdiv, a, b, True) for a, b in corners]
    his = [_endpoint(_fdiv, _qdiv, a, b, False) for a, b in corners]
    return (min(los), max(his))


def _fadd(a, b):
    return a + b


def _fmul(a, b):
    if (a == 0 and math.isinf(b)) or (b == 0 and math.isinf(a)):
        return math.nan
    return a * b


def _fdiv(a, b):
    if math.isinf(a) and math.isinf(b):
        return math.nan
    return a / b


def _qadd(a, b):
    return a + b


def _qmul(a, b):
    return a * b


def _qdiv(a, b):
    return a / b


#: The float test of exactness of each operation (the ``Fraction`` one is the fallback).
_FAST_EXACT = {_qadd: _sum_exact, _qmul: _product_exact, _qdiv: _quotient_exact}


def power(x: Interval, y: Interval) -> Interval:
    """``x ** y``: integer exponents by monotone pieces; otherwise ``x ≥ 0`` is needed, and the
    extremes lie at the corners (``x**y`` is monotone in each argument on ``x ≥ 0``)."""
    if y[0] == y[1] and math.isfinite(y[0]) and float(y[0]).is_integer():
        return _integer_power(x, int(y[0]))
    if x[0] < 0:
        raise Singular("a negative base with a fractional exponent")
    corners = [_pow(a, b) for a in x for b in y]
    lo = min(corners, key=lambda c: c[0])
    hi = max(corners, key=lambda c: c[0])
    return (lo[0] if lo[1] else _away(lo[0], True) if math.isinf(lo[0]) else _down(lo[0], 2),
            hi[0] if hi[1] else _away(hi[0], False) if math.isinf(hi[0]) else _up(hi[0], 2))


def _pow(a: float, b: float) -> tuple[float, bool]:
    """``a ** b`` for ``a ≥ 0`` and whether it is exact (the limits at 0 and ∞ included)."""
    if a == 0.0:
        return (INF if b < 0 else (1.0 if b == 0 else 0.0)), True
    if math.isinf(a) or math.isinf(b):
        try:
            return math.pow(a, b), True
        except (OverflowError, ValueError):
            return INF, True
    if a == 1.0 or b == 0.0:
        return 1.0, True
    try:
        return math.pow(a, b), False
    except OverflowError:
        return INF, False


def _integer_power(x: Interval, n: int) -> Interval:
    if n == 0:
        return (1.0, 1.0)
    if n < 0:
        if x[0] <= 0.0 <= x[1]:
            if x[0] == x[1]:
                return (INF, INF)
            raise Singular("a negative power of an interval containing 0")
        return div((1.0, 1.0), _integer_power(x, -n))
    lo, hi = x
    if n % 2 == 0 and lo < 0 < hi:
        return (0.0, _ipow(hi if hi > -lo else lo, n, up=True))
    if n % 2 == 0 and hi <= 0:
        lo, hi = -hi, -lo
    return (_ipow(lo, n, up=False), _ipow(hi, n, up=True))


def _ipow(a: float, n: int, *, up: bool) -> float:
    try:
        r = math.pow(a, n)
    except OverflowError:
        r = math.copysign(INF, a) if n % 2 else INF
    if not math.isfinite(a):
        return r
    if math.isfinite(r) and abs(n) <= 64 and Fraction(a) ** n == Fraction(r):
        return r
    return _up(r, 2) if up else _down(r, 2)


# --------------------------------------------------------------------------------------------
# Functions


def _monotone(fn: Callable[[float], float], exact_at: dict[float, float]):
    """An increasing function ``fn`` (which returns ``±inf`` on overflow and NaN outside its
    domain): endpoints moved two ulps outwards, except at the points of ``exact_at`` and at
    infinite arguments."""

    def apply(x: Interval) -> Interval:
        out = []
        for v, lower in ((x[0], True), (x[1], False)):
            if v in exact_at:
                out.append(exact_at[v])
                continue
            r = fn(v)
            if math.isnan(r):
                raise Singular("no value")
            if math.isinf(v):
                out.append(r)
            elif math.isinf(r):
                out.append(_away(r, lower))
            else:
                out.append(_down(r, 2) if lower else _up(r, 2))
        return (out[0], out[1])

    return apply


def _overflow(fn: Callable[[float], float], sign_of_argument: bool = False):
    """``fn`` with ``OverflowError`` read as ``+inf`` (``±inf`` with the argument's sign) and
    ``ValueError`` as NaN."""

    def safe(v: float) -> float:
        try:
            return fn(v)
        except OverflowError:
            return math.copysign(INF, v) if sign_of_argument else INF
        except ValueError:
            return math.nan

    return safe


_exp = _overflow(lambda v: 0.0 if v == -INF else math.exp(v))
_log = _overflow(lambda v: -INF if v == 0 else math.log(v))
_log1p = _overflow(lambda v: -INF if v == -1 else math.log1p(v))
_expm1 = _overflow(lambda v: -1.0 if v == -INF else math.expm1(v))
_sinh = _overflow(lambda v: v if math.isinf(v) else math.sinh(v), sign_of_argument=True)
_cosh = _overflow(lambda v: INF if math.isinf(v) else math.cosh(v))


def _domain(low: float, fn):
    """``fn`` defined on ``[low, ∞]``: an interval reaching below ``low`` is singular."""

    def apply(x: Interval) -> Interval:
        if x[0] < low:
            raise Singular(f"the interval reaches below {low:g}")
        return fn(x)

    return apply


def _sqrt(x: Interval) -> Interval:
    out = []
    for v, lower in ((x[0], True), (x[1], False)):
        r = math.sqrt(v)
        if math.isinf(v) or Fraction(r) ** 2 == Fraction(v):
            out.append(r)
        else:
            out.append(_down(r) if lower else _up(r))
    return (out[0], out[1])


def _cosh_interval(x: Interval) -> Interval:
    lo, hi = x
    f = _monotone(_cosh, {0.0: 1.0})
    if lo >= 0:
        return f(x)
    if hi <= 0:
        return f((-hi, -lo))
    return (1.0, f((0.0, max(-lo, hi)))[1])


def _abs(x: Interval) -> Interval:
    lo, hi = x
    if lo >= 0:
        return x
    if hi <= 0:
        return (-hi, -lo)
    return (0.0, max(-lo, hi))


def _min(*xs: Interval) -> Interval:
    return (min(x[0] for x in xs), min(x[1] for x in xs))


def _max(*xs: Interval) -> Interval:
    return (max(x[0] for x in xs), max(x[1] for x in xs))


#: The interval version of every function of :data:`attnverify.expr.FUNCTIONS`.
FUNCTIONS: dict[str, Callable[..., Interval]] = {
    "exp": _monotone(_exp, {0.0: 1.0, -INF: 0.0, INF: INF}),
    "log": _domain(0.0, _monotone(_log, {1.0: 0.0, 0.0: -INF, INF: INF})),
    "sqrt": _domain(0.0, _sqrt),
    "abs": _abs,
    "min": _min,
    "max": _max,
    "tanh": _monotone(math.tanh, {0.0: 0.0, INF: 1.0, -INF: -1.0}),
    "sinh": _monotone(_sinh, {0.0: 0.0, INF: INF, -INF: -INF}),
    "cosh": _cosh_interval,
    "log1p": _domain(-1.0, _monotone(_log1p, {0.0: 0.0, -1.0: -INF, INF: INF})),
    "expm1": _monotone(_expm1, {0.0: 0.0, INF: INF, -INF: -1.0}),
}


def apply(name: str, *args: Interval) -> Interval:
    """The function ``name`` on intervals (:class:`Singular` where it may have no value)."""
    return _check(FUNCTIONS[name](*(_check(a) for a in args)))
