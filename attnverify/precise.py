"""Deciding in higher precision a ``falsify`` case that float64 cannot decide (issue #25.7).

A case's float64 values can break a bound by no more than their rounding explains
(``max_weight < 1`` at a weight computed as 1.0), or meet a point where the expression might
have no value within that rounding. Float64 cannot tell there whether the exact values hold or
break the bound: at ``L = 1`` a softmax weight is exactly 1 and ``max_weight < 1`` is false; at
``L = 2`` with a logit gap of 40 it is ``1 − 4.2·10⁻¹⁸`` and the bound holds, yet both round
to 1.0. Such a case is evaluated again on the *same input* (its float64 logits and temperature
are exact numbers) in interval arithmetic at :data:`BITS` bits (``mpmath.iv``: every interval
contains the exact value), the quantities and then the expression; the bound is decided when the
intervals of its sides are apart (:func:`decide`).

What can be computed that way:

- the quantities of the input itself (``L``, ``L_padded``, ``n_unmasked``, ``T``, ``a``,
  ``logit_gap``, ``lambda``), for every target;
- the weights and the quantities made of them (``max_weight``, ``min_weight``, ``sum_weight``,
  ``sum_sq_weight``, ``entropy``, ``n_support``) only for the built-ins, from their defining
  formulas (those of :mod:`attnverify.normalizers.reference`, ported here: exponentials in
  intervals, the thresholds of sparsemax and 1.5-entmax in exact rational arithmetic). The
  checker knows a built-in by the target string it was given itself (or, for a spec given in
  Python, by its function being the built-in's), never by what a worker says.

Everything else is :class:`Undecided`, with the reason: a user's normalizer runs in its worker in
float64 only (its code cannot be evaluated in higher precision), α-entmax at α other than 1, 1.5
and 2 has no closed form here, and the Jacobian quantities are not computed in intervals. An
undecided case stays what float64 made it: not a violation, reported as undecided.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import mpmath
import torch
from mpmath import iv

from attnverify import expr as E
from attnverify.quantities import LAMBDA_PARAMS
from attnverify.registry import builtins
from attnverify.remote import RemoteFunction

#: Working precisions of the interval evaluation, in bits (float64 carries 53), tried in turn
#: while the sides' intervals overlap: a weight ``1 − e^{−2a/T}`` at the search's largest
#: ``a/T`` (about 316) needs about 920 bits to be told from 1.
PRECISIONS = (256, 2048)
BITS = PRECISIONS[0]
#: The work a precision may take, as distinct unmasked logits × bits: a precision beyond it is
#: not tried (a row of 4096 distinct logits is evaluated at 256 bits; one of 512 at 2048).
MAX_WORK = 4096 * 256

#: Quantities of the input alone: computed exactly for every target.
INPUT_QUANTITIES = frozenset({"L", "L_padded", "n_unmasked", "T", "a", "logit_gap", "lambda"})
#: Quantities made of the weights: computed for the built-ins only.
WEIGHT_QUANTITIES = frozenset({"max_weight", "min_weight", "sum_weight", "sum_sq_weight",
                               "entropy", "n_support"})


class Undecided(Exception):
    """Higher precision cannot decide the case; the message says why."""


@dataclass(frozen=True)
class Decision:
    """A case decided in higher precision: ``verdict`` is ``"holds"``, ``"fails"`` or
    ``"undefined"`` (the exact expression has no value there); ``lhs``/``rhs`` are the sides'
    intervals as decimal strings ``(lo, hi)`` (None where undefined)."""

    verdict: str
    lhs: tuple[str, str] | None
    rhs: tuple[str, str] | None
    bits: int = BITS
    #: ``LHS − RHS`` to 6 digits (``"0"`` where both sides are the same exact number).
    difference: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"by": "mpmath", "bits": self.bits, "verdict": self.verdict,
                "lhs": None if self.lhs is None else list(self.lhs),
                "rhs": None if self.rhs is None else list(self.rhs),
                "lhs_minus_rhs": self.difference or None}

    def text(self) -> str:
        """``LHS = …, RHS = …, LHS − RHS ≈ …`` for the console."""
        return (f"LHS {_show(self.lhs)}, RHS {_show(self.rhs)}"
                + (f", LHS - RHS = {self.difference}" if self.difference else ""))


def _show(side: tuple[str, str] | None) -> str:
    if side is None:
        return "has no value"
    lo, hi = side
    return f"= {lo}" if lo == hi else f"in [{lo}, {hi}]"



# --------------------------------------------------------------------------------------------
# Which built-in a spec is (the checker's own knowledge)


def builtin_of(spec: Any) -> str | None:
    """The built-in id ``spec`` runs, or None (a user's target). A spec opened behind the
    process boundary is the built-in when the checker's own target string names it (built-ins
    take precedence in the loader); a spec in this process when its function is the built-in's."""
    table = builtins()
    name = getattr(spec, "target", "") or getattr(spec, "id", "")
    builtin = table.get(name)
    if builtin is None:
        return None
    fn = getattr(spec, "fn", None)
    if fn is builtin.fn or (isinstance(fn, RemoteFunction) and spec.target == name):
        return name
    return None


def _parameters(spec: Any, builtin: str | None, params: Mapping[str, Any],
                temperature: float | None) -> dict[str, Any]:
    """The parameters of the case: the built-in's defaults (the spec's own only where it runs in
    this process), the search's ``params``, the case's temperature."""
    if builtin is not None:
        table = builtins()[builtin]
        own = dict(table.params)
        if spec.fn is table.fn:  # in this process: its parameters are the spec's own
            own.update(spec.params)
    else:
        own = dict(getattr(spec, "params", {}) or {})
    merged = {**own, **dict(params or {})}
    if "temperature" in own:
        if temperature is not None:
            merged["temperature"] = float(temperature)
    else:
        merged.pop("temperature", None)
    return merged


# --------------------------------------------------------------------------------------------
# Interval helpers


def _iv(x: Any):
    return iv.mpf(x)


def _lo(x) -> mpmath.mpf:
    return mpmath.mpf(x.a)


def _hi(x) -> mpmath.mpf:
    return mpmath.mpf(x.b)


def _span(lo, hi):
    return iv.mpf([lo, hi])


def _imax(xs):
    return _span(max(_lo(x) for x in xs), max(_hi(x) for x in xs))


def _imin(xs):
    return _span(min(_lo(x) for x in xs), min(_hi(x) for x in xs))


def _iabs(x):
    lo, hi = _lo(x), _hi(x)
    if lo >= 0:
        return x
    if hi <= 0:
        return -x
    return _span(0, max(-lo, hi))


def _positive_part(x):
    lo, hi = _lo(x), _hi(x)
    if lo >= 0:
        return x
    if hi <= 0:
        return _iv(0)
    return _span(0, hi)


def _from_fraction(q: Fraction):
    return _iv(q.numerator) / q.denominator


# --------------------------------------------------------------------------------------------
# The built-ins' formulas on the distinct unmasked logits (each with its count)


Levels = tuple[list[float], list[int]]  # distinct unmasked logits (descending) and their counts


def _softmax(z: list, counts: list[int], shift) -> list:
    """``exp(z_i − shift) / Σ_j exp(z_j − shift)`` (any point ``shift``: it cancels exactly)."""
    e = [iv.exp(zi - shift) for zi in z]
    total = sum((c * ei for c, ei in zip(counts, e)), _iv(0))
    return [ei / total for ei in e]


def _scaled(levels: Levels, t: float) -> tuple[list, Any]:
    """``z = x/T`` as intervals, and a point near their largest as the shift."""
    values, _ = levels
    return [_iv(v) / t for v in values], _iv(max(values) / t)


def _w_softmax(levels, p):
    z, shift = _scaled(levels, p.get("temperature", 1.0))
    return _softmax(z, levels[1], shift)


def _w_ssmax(levels, p):
    values, counts = levels
    n = sum(counts)
    factor = float(p.get("s", 0.43)) * iv.log(max(n, 1)) / float(p.get("temperature", 1.0))
    top = max(values)
    z = [factor * (_iv(v) - top) for v in values]
    return _softmax(z, counts, _iv(0))


def _w_softmax1(levels, p):
    z, _ = _scaled(levels, p.get("temperature", 1.0))
    m = _iv(max(max(levels[0]) / float(p.get("temperature", 1.0)), 0.0))
    e = [iv.exp(zi - m) for zi in z]
    total = iv.exp(-m) + sum((c * ei for c, ei in zip(levels[1], e)), _iv(0))
    return [ei / total for ei in e]


def _w_sa_softmax(levels, p):
    values, counts = levels
    lo, hi = min(min(values), 0.0), max(max(values), 0.0)
    soft = _w_softmax(levels, p)
    if hi == lo:  # an all-zero row: the factor is 0/0, taken as 0
        return [_iv(0) for _ in values]
    span = _iv(hi) - lo
    return [(_iv(v) - lo) / span * s for v, s in zip(values, soft)]


def _w_sigmoid(levels, p):
    values, counts = levels
    t = float(p.get("temperature", 1.0))
    bias = p.get("bias")
    b = -iv.log(max(sum(counts), 1)) if bias is None else _iv(float(bias))
    return [1 / (1 + iv.exp(-(_iv(v) / t + b))) for v in values]


def _w_softpick(levels, p):
    values, counts = levels
    t = float(p.get("temperature", 1.0))
    d = [iv.expm1(_iv(v) / t) for v in values]
    # the sign of expm1(v/T) is the sign of v (T > 0): decided on the float, exactly
    num = [di if v > 0 else _iv(0) for v, di in zip(values, d)]
    mag = [di if v >= 0 else -di for v, di in zip(values, d)]
    den = sum((c * m for c, m in zip(counts, mag)), _iv(0)) + float(p.get("eps", 1e-6))
    return [x / den for x in num]


def _w_stablemax(levels, p):
    values, counts = levels
    t = float(p.get("temperature", 1.0))
    s = [(_iv(v) / t + 1) if v >= 0 else 1 / (1 - _iv(v) / t) for v in values]
    total = sum((c * si for c, si in zip(counts, s)), _iv(0))
    return [si / total for si in s]


def _w_relu_norm(levels, p):
    values, counts = levels
    t = float(p.get("temperature", 1.0))
    r = [_iv(v) / t if v > 0 else _iv(0) for v in values]
    if all(v <= 0 for v in values):
        return [_iv(0) for _ in values]  # the policy: a row with no positive score gives zeros
    total = sum((c * ri for c, ri in zip(counts, r)), _iv(0))
    return [ri / total for ri in r]


def _w_dagpam(levels, p):
    values, counts = levels
    lam = float(p.get("lam", 0.5))
    z, shift = _scaled(levels, p.get("temperature", 1.0))
    up = _softmax(z, counts, shift)
    neg = [-zi for zi in z]
    down = _softmax(neg, counts, _iv(-min(values) / float(p.get("temperature", 1.0))))
    return [(1 + lam) * u - lam * d for u, d in zip(up, down)]


def _rational_levels(levels: Levels, t: float) -> list[Fraction]:
    return [Fraction(v) / Fraction(t) for v in levels[0]]


def _w_sparsemax(levels, p):
    """Exact: ``τ`` from the sorted row in rationals (a group of tied keys is in the support or
    out of it as one: ``1 + k·z > Σ_{i≤k} z_i`` does not depend on ``k`` within the group)."""
    z = _rational_levels(levels, float(p.get("temperature", 1.0)))
    counts = levels[1]
    size, total = 0, Fraction(0)
    for zi, c in zip(z, counts):  # descending
        if 1 + size * zi > total:
            size, total = size + c, total + c * zi
        else:
            break
    tau = (total - 1) / size
    return [_from_fraction(max(zi - tau, Fraction(0))) for zi in z]


def _w_entmax15(levels, p):
    """``[x/2 − τ]₊²``: the support exact in rationals (``τ_k ≤ x_(k)`` ⇔ ``(μ_k − x_(k))² ≤
    δ_k``), then ``τ = μ_K − sqrt(δ_K)`` in intervals."""
    z = _rational_levels(levels, float(p.get("temperature", 1.0)))
    top = z[0]
    x = [(zi - top) / 2 for zi in z]
    counts = levels[1]
    k, s1, s2 = 0, Fraction(0), Fraction(0)
    best = None
    for xi, c in zip(x, counts):
        for _ in range(c):
            k, s1, s2 = k + 1, s1 + xi, s2 + xi * xi
            mean, mean_sq = s1 / k, s2 / k
            delta = (1 - k * (mean_sq - mean * mean)) / k
            d = mean - xi
            if d * d <= max(delta, Fraction(0)):
                best = (mean, max(delta, Fraction(0)))
            else:
                break
        else:
            continue
        break
    mean, delta = best
    tau = _from_fraction(mean) - iv.sqrt(_from_fraction(delta))
    return [_positive_part(_from_fraction(xi) - tau) ** 2 for xi in x]


def _w_entmax_alpha(levels, p):
    alpha = float(p.get("alpha", 1.5))
    table = {1.0: _w_softmax, 2.0: _w_sparsemax, 1.5: _w_entmax15}
    if alpha not in table:
        raise Undecided(f"α-entmax at α = {alpha:g} has no closed form to evaluate in higher "
                        "precision (only α = 1, 1.5, 2)")
    return table[alpha](levels, p)


#: The weights of each built-in on the distinct unmasked logits, from its defining formula.
FORMULAS: dict[str, Callable[[Levels, dict], list]] = {
    "softmax": _w_softmax,
    "ssmax": _w_ssmax,
    "softmax1": _w_softmax1,
    "sa_softmax": _w_sa_softmax,
    "sigmoid": _w_sigmoid,
    "softpick": _w_softpick,
    "stablemax": _w_stablemax,
    "relu_norm": _w_relu_norm,
    "dagpam": _w_dagpam,
    "sparsemax": _w_sparsemax,
    "entmax15": _w_entmax15,
    "entmax_alpha": _w_entmax_alpha,
    "softmax_fused": _w_softmax,  # softmax in a fused kernel: the same map
}


# --------------------------------------------------------------------------------------------
# Quantities


def quantities(names, spec: Any, row: torch.Tensor, temperature: float | None,
               params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The named quantities of the case as intervals (:class:`Undecided` where one cannot be
    computed in higher precision: the module docstring says which)."""
    names = set(names)
    builtin = builtin_of(spec)
    p = _parameters(spec, builtin, params or {}, temperature)
    row = row.detach().to(torch.float64).reshape(-1)
    live = [float(v) for v in row[torch.isfinite(row)].tolist()]
    counter = Counter(live)
    values = sorted(counter, reverse=True)
    levels: Levels = (values, [counter[v] for v in values])
    out: dict[str, Any] = {}
    n = len(live)
    t = float(p["temperature"]) if "temperature" in p else 1.0
    for name in names & INPUT_QUANTITIES:
        if name in ("L", "n_unmasked"):
            out[name] = _iv(n)
        elif name == "L_padded":
            out[name] = _iv(int(row.numel()))
        elif name == "T":
            out[name] = _iv(t)
        elif name == "a":
            if not n:
                raise Undecided("no unmasked key")
            out[name] = _iv(max(abs(v) for v in live))
        elif name == "logit_gap":
            if n < 2 or levels[1][0] >= 2:
                out[name] = _iv(0)
            else:
                out[name] = _iv(values[0]) - values[1]
        elif name == "lambda":
            lam = next((p[k] for k in LAMBDA_PARAMS if k in p), 0.0)
            out[name] = _iv(float(lam))
    wanted = names & WEIGHT_QUANTITIES
    rest = names - INPUT_QUANTITIES - WEIGHT_QUANTITIES
    if rest:
        raise Undecided(f"{', '.join(sorted(rest))} is not computed in higher precision")
    if not wanted:
        return out
    if builtin is None:
        raise Undecided("the weights of a normalizer that is not a built-in are computed by its "
                        "own code, in float64 only")
    if not n:
        raise Undecided("no unmasked key")
    if len(values) * iv.prec > MAX_WORK:
        raise Undecided(f"a row of {len(values)} distinct logits is too long to evaluate at "
                        f"{iv.prec} bits")
    if builtin not in FORMULAS:
        raise Undecided(f"the built-in {builtin} has no formula here to evaluate in higher "
                        "precision")
    weights = FORMULAS[builtin](levels, p)
    counts = levels[1]
    for name in wanted:
        if name == "sum_weight" and builtin in EXACT_SUM and _any_positive(weights):
            out[name] = _iv(1)  # Σ_i f_i / Σ_j f_j, or τ solving Σ [x − τ]₊^{1/(α−1)} = 1
        else:
            out[name] = _weight_quantity(name, weights, counts)
    return out


#: The built-ins whose weights sum to exactly 1 by construction (a ratio of a sum to itself,
#: a threshold that solves the sum, or daGPAM's (1 + λ)·1 − λ·1), which interval arithmetic
#: alone would only enclose.
EXACT_SUM = frozenset({"softmax", "ssmax", "stablemax", "relu_norm", "dagpam", "sparsemax",
                       "entmax15", "entmax_alpha", "softmax_fused"})


def _any_positive(weights: list) -> bool:
    """Some weight is certainly nonzero (relu_norm's row with no positive score is all zeros)."""
    return any(_lo(w) > 0 or _hi(w) < 0 for w in weights)


def _weight_quantity(name: str, w: list, counts: list[int]):
    if name == "max_weight":
        return _imax(w)
    if name == "min_weight":
        return _imin(w)
    if name == "sum_weight":
        return sum((c * x for c, x in zip(counts, w)), _iv(0))
    if name == "sum_sq_weight":
        return sum((c * x * x for c, x in zip(counts, w)), _iv(0))
    if name == "n_support":
        total = 0
        for c, x in zip(counts, w):
            if _lo(x) > 0 or _hi(x) < 0:
                total += c
            elif not (_lo(x) == 0 and _hi(x) == 0):
                raise Undecided("a weight too close to 0 to tell whether it is 0")
        return _iv(total)
    # entropy: −Σ α log α over the positive weights
    total = _iv(0)
    for c, x in zip(counts, w):
        if _lo(x) == 0 and _hi(x) == 0:
            continue
        if _lo(x) <= 0:
            raise Undecided("a weight too close to 0 to tell whether it is 0")
        total += -c * x * iv.log(x)
    return total


# --------------------------------------------------------------------------------------------
# The expression in intervals


class _NoValue(ArithmeticError):
    """The expression may have no value on these intervals."""


def _power(x, y):
    if _lo(y) == _hi(y) and mpmath.isint(_lo(y)):
        n = int(_lo(y))
        if n < 0 and _lo(x) <= 0 <= _hi(x):
            raise _NoValue("a negative power of an interval containing 0")
        return x ** n
    if _lo(x) <= 0:
        raise _NoValue("a base that may be ≤ 0 with a fractional exponent")
    return iv.exp(y * iv.log(x))


def _divide(x, y):
    if _lo(y) <= 0 <= _hi(y):
        raise _NoValue("a divisor that may be 0")
    return x / y


def _domain(low, strict: bool, fn):
    def apply(x):
        if _lo(x) < low or (strict and _lo(x) == low):
            raise _NoValue("an argument outside the function's domain")
        return fn(x)

    return apply


def _tanh(x):
    return 1 - 2 / (iv.exp(2 * x) + 1)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "exp": iv.exp,
    "log": _domain(0, True, iv.log),
    "sqrt": _domain(0, False, iv.sqrt),
    "abs": _iabs,
    "min": lambda *xs: _imin(xs),
    "max": lambda *xs: _imax(xs),
    "tanh": _tanh,
    "sinh": lambda x: (iv.exp(x) - iv.exp(-x)) / 2,
    "cosh": lambda x: (iv.exp(x) + iv.exp(-x)) / 2,
    "log1p": _domain(-1, True, iv.log1p),
    "expm1": iv.expm1,
}
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _divide,
    "**": _power,
}


def interval(node: E.Node, values: Mapping[str, Any]):
    """``node`` over the quantities' intervals ``values`` (:class:`_NoValue` where it may have
    none)."""
    if isinstance(node, E.Number):
        return iv.mpf(node.text) if node.text else _iv(node.value)
    if isinstance(node, E.Name):
        return values[node.name]
    if isinstance(node, E.Constant):
        return {"pi": iv.pi, "e": iv.e}[node.name]
    if isinstance(node, E.Negate):
        return -interval(node.operand, values)
    if isinstance(node, E.Binary):
        return _BINARY[node.op](interval(node.left, values), interval(node.right, values))
    if isinstance(node, E.Call):
        return _FUNCTIONS[node.function](*(interval(a, values) for a in node.args))
    raise TypeError(f"unknown node {type(node).__name__}")


# --------------------------------------------------------------------------------------------
# The decision


def decide(ineq: E.Inequality, spec: Any, row: torch.Tensor, temperature: float | None,
           params: Mapping[str, Any] | None, *, rtol: float, atol: float) -> Decision:
    """The inequality on the exact values of the case: ``lhs ≤ rhs`` fails when the whole LHS
    interval lies beyond ``rhs + atol + rtol·|rhs|`` for every point of the RHS interval and holds
    when it lies within it; a strict ``lhs < rhs`` fails when ``lo(LHS) ≥ hi(RHS)`` and holds
    when ``hi(LHS) < lo(RHS)``. Raises :class:`Undecided` where the intervals overlap or a
    quantity cannot be computed in higher precision."""
    reason = ""
    for bits in PRECISIONS:
        try:
            return _decide(ineq, spec, row, temperature, params, rtol, atol, bits)
        except _Overlap as exc:
            reason = str(exc)
        except Undecided:
            if not reason:
                raise
            raise Undecided(reason) from None
    raise Undecided(reason)


class _Overlap(Undecided):
    """The sides' intervals overlap at this precision (a higher one may separate them)."""


def _decide(ineq, spec, row, temperature, params, rtol, atol, bits) -> Decision:
    old = iv.prec, mpmath.mp.prec
    iv.prec = mpmath.mp.prec = bits  # the intervals' ends are read at the same precision
    try:
        values = quantities(ineq.names, spec, row, temperature, params)
        try:
            lhs, rhs = interval(ineq.lhs, values), interval(ineq.rhs, values)
        except _NoValue as exc:
            raise Undecided(f"the expression may have no value here ({exc})") from None
        if not all(mpmath.isfinite(v) for side in (lhs, rhs) for v in (_lo(side), _hi(side))):
            raise Undecided("a side is infinite")
        gap = lhs - rhs
        if _lo(gap) == _hi(gap):
            diff = mpmath.nstr(_lo(gap), 6)
        else:
            diff = "~" + mpmath.nstr((_lo(gap) + _hi(gap)) / 2, 6)
        sides = (_strings(lhs), _strings(rhs), bits, diff)
        if ineq.strict:
            if _lo(lhs) >= _hi(rhs):
                return Decision("fails", *sides)
            if _hi(lhs) < _lo(rhs):
                return Decision("holds", *sides)
        else:
            edge = rhs + atol + rtol * _iabs(rhs)
            if _lo(lhs) > _hi(edge):
                return Decision("fails", *sides)
            if _hi(lhs) <= _lo(edge):
                return Decision("holds", *sides)
        raise _Overlap(f"the sides overlap even at {bits} bits (LHS {_show(sides[0])}, "
                       f"RHS {_show(sides[1])}): an exact equality is decided only where both "
                       "sides are computed exactly")
    finally:
        iv.prec, mpmath.mp.prec = old


def _strings(x) -> tuple[str, str]:
    """The interval's ends to 25 significant digits (one string twice where it is a point)."""
    lo, hi = _lo(x), _hi(x)
    if lo == hi:
        text = mpmath.nstr(lo, 25)
        return (text, text)
    return (mpmath.nstr(lo, 25), mpmath.nstr(hi, 25))

