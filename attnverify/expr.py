"""The restricted expression language of ``attnverify falsify`` (docs/INTERFACES.md).

An inequality ``LHS <= RHS`` (also ``<``, ``>=``, ``>``; ``>=`` / ``>`` are flipped so the parsed
form always reads ``lhs ≤ rhs`` or ``lhs < rhs``) over numbers, the quantities of a generated case
(:mod:`attnverify.quantities`), the constants ``pi`` and ``e``, ``+ - * / **``, unary minus,
parentheses and the functions ``exp log sqrt abs min max tanh sinh cosh log1p expm1`` (``min`` /
``max`` take two or more arguments).

A hand-written tokenizer and recursive-descent parser build a small tree; nothing is ``eval``ed or
compiled. Every error is a :class:`~attnverify.errors.UsageError` with a one-line message naming
the offending token and its column. Evaluation runs in torch (float64 for plain numbers), so the
same tree evaluates floats (IEEE semantics: ``log 0 = -inf``, overflow gives ``inf``) and torch
scalars with autograd, for gradient refinement of a witness. A function outside its domain
gives NaN (``log1p(-2)``, ``sqrt(-1)``), which the verdict reads as *undefined*, never as a
violation; overflow (``sinh(1000)``) gives ``±inf``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

import torch

from attnverify import intervals as I
from attnverify.errors import UsageError
from attnverify.quantities import QUANTITIES

FUNCTIONS: dict[str, tuple[Callable[..., torch.Tensor], int]] = {
    "exp": (torch.exp, 1),
    "log": (torch.log, 1),
    "sqrt": (torch.sqrt, 1),
    "abs": (torch.abs, 1),
    "min": (lambda *xs: _fold(torch.minimum, xs), 2),
    "max": (lambda *xs: _fold(torch.maximum, xs), 2),
    "tanh": (torch.tanh, 1),
    "sinh": (torch.sinh, 1),
    "cosh": (torch.cosh, 1),
    "log1p": (torch.log1p, 1),
    "expm1": (torch.expm1, 1),
}
#: Named constants (reserved: a quantity cannot take these names).
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}
VARIADIC = {"min", "max"}
COMPARISONS = {"<=": "<=", "<": "<", ">=": "<=", ">": "<"}

#: Limits of an expression (beyond them: a usage error, never a RecursionError): its length in
#: characters, and its depth: parentheses, function calls, signs, powers and each operator of a
#: chain (``1+1+1`` is three deep) add one level.
MAX_LENGTH = 2000
MAX_DEPTH = 64

_TOKEN = re.compile(  # ASCII only: Python's \d would read '١' (Arabic-Indic one) as a digit
    r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*|<=|>=|==|!=|[-+*/(),<>^=]))",
    re.ASCII,
)


def _quote(text: str) -> str:
    """The expression as the user typed it, in double quotes (``repr`` if it holds one, or a
    character that would break the one-line message), cut after 120 characters."""
    if len(text) > 120:
        text = text[:120] + "…"
    return f'"{text}"' if '"' not in text and text.isprintable() else repr(text)


def _exactly(text: str, value: float) -> bool:
    """Whether the double ``value`` is the decimal ``text`` itself (not its nearest double). An
    overflow or underflow is not; ``Fraction`` only sees exponents a finite, nonzero double can
    have, so it stays cheap."""
    mantissa = text.lower().split("e")[0]
    if value == 0.0:
        return not any(c in "123456789" for c in mantissa)
    return math.isfinite(value) and Fraction(text) == Fraction(value)


def _fold(op, xs):
    out = xs[0]
    for x in xs[1:]:
        out = op(out, x)
    return out


# --------------------------------------------------------------------------------------------
# Tokens


@dataclass(frozen=True)
class Token:
    kind: str  # "number" | "name" | "op" | "end"
    text: str
    column: int  # 1-based


def tokenize(text: str) -> list[Token]:
    """Tokens of ``text``, ending with an ``end`` token; a stray character is a usage error.

    Only ASCII whitespace separates tokens (as only ASCII digits and letters make them): any
    other character, a no-break space included, is named with its code point and column."""
    if len(text) > MAX_LENGTH:
        raise UsageError(f"the expression is {len(text)} characters long; at most {MAX_LENGTH} "
                         "are allowed")
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip(_ASCII_SPACE) == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.lastgroup is None:
            column = pos + len(text[pos:]) - len(text[pos:].lstrip(_ASCII_SPACE)) + 1
            raise UsageError(f"unexpected character {_describe(text[column - 1])} at column "
                             f"{column} in {_quote(text)}")
        kind = match.lastgroup
        tokens.append(Token(kind, match.group(kind), match.start(kind) + 1))
        pos = match.end()
    tokens.append(Token("end", "", len(text) + 1))
    return tokens


#: What ``\s`` matches under ``re.ASCII``: the only whitespace between tokens.
_ASCII_SPACE = " \t\n\r\f\v"


def _describe(char: str) -> str:
    """``'x'``, or for a character outside printable ASCII its code point and Unicode name:
    ``'\\xa0' (U+00A0 NO-BREAK SPACE)``."""
    if char.isascii() and char.isprintable():
        return repr(char)

    name = unicodedata.name(char, "")
    return f"{char!r} (U+{ord(char):04X}{' ' + name if name else ''})"


# --------------------------------------------------------------------------------------------
# The tree


class Node:
    """An expression node: ``evaluate(values)`` returns a torch scalar (or tensor)."""

    def evaluate(self, values: Mapping[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def interval(self, values: Mapping[str, float], errors: Mapping[str, float]) -> I.Interval:
        """Every value the expression may take when each quantity ``q`` lies within
        ``errors[q]`` of ``values[q]`` (:mod:`attnverify.intervals`; raises
        :class:`~attnverify.intervals.Singular` where it may have none)."""
        raise NotImplementedError

    def names(self) -> frozenset[str]:
        return frozenset()


@dataclass(frozen=True)
class Number(Node):
    value: float
    #: Whether the double ``value`` is the number as written (``0.5``: yes; ``0.1``: its nearest).
    exact: bool = True
    #: The number as written (``attnverify.precise`` reads it at its own precision).
    text: str = field(default="", compare=False)

    def evaluate(self, values):
        return torch.tensor(self.value, dtype=torch.float64)

    def interval(self, values, errors):
        return I.exact(self.value) if self.exact else I.nearest(self.value)

    def __str__(self):
        text = repr(float(self.value))
        return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Name(Node):
    name: str

    def evaluate(self, values):
        if self.name not in values:
            raise KeyError(f"no value for quantity {self.name!r}")
        value = values[self.name]
        return value if torch.is_tensor(value) else torch.tensor(float(value), dtype=torch.float64)

    def interval(self, values, errors):
        return I.around(float(values[self.name]), float(errors.get(self.name, 0.0)))

    def names(self):
        return frozenset({self.name})

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class Constant(Node):
    """A named constant (:data:`CONSTANTS`), printed by its name."""

    name: str

    def evaluate(self, values):
        return torch.tensor(CONSTANTS[self.name], dtype=torch.float64)

    def interval(self, values, errors):
        return I.nearest(CONSTANTS[self.name])

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class Negate(Node):
    operand: Node

    def evaluate(self, values):
        return -self.operand.evaluate(values)

    def interval(self, values, errors):
        return I.neg(self.operand.interval(values, errors))

    def names(self):
        return self.operand.names()

    def __str__(self):
        return f"(-{self.operand})"


_BINARY = {
    "+": torch.add,
    "-": torch.sub,
    "*": torch.mul,
    "/": torch.div,
    "**": torch.pow,
}
_INTERVAL_BINARY = {"+": I.add, "-": I.sub, "*": I.mul, "/": I.div, "**": I.power}


@dataclass(frozen=True)
class Binary(Node):
    op: str
    left: Node
    right: Node

    def evaluate(self, values):
        return _BINARY[self.op](self.left.evaluate(values), self.right.evaluate(values))

    def interval(self, values, errors):
        return _INTERVAL_BINARY[self.op](self.left.interval(values, errors),
                                         self.right.interval(values, errors))

    def names(self):
        return self.left.names() | self.right.names()

    def __str__(self):
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True)
class Call(Node):
    function: str
    args: tuple[Node, ...]

    def evaluate(self, values):
        return FUNCTIONS[self.function][0](*(a.evaluate(values) for a in self.args))

    def interval(self, values, errors):
        return I.apply(self.function, *(a.interval(values, errors) for a in self.args))

    def names(self):
        return frozenset().union(*(a.names() for a in self.args))

    def __str__(self):
        return f"{self.function}({', '.join(map(str, self.args))})"


# --------------------------------------------------------------------------------------------
# The parser


class _Parser:
    """Recursive descent over :func:`tokenize`'s tokens.

    ``expr := term (('+'|'-') term)*``, ``term := unary (('*'|'/') unary)*``,
    ``unary := ('-'|'+') unary | power``, ``power := atom ('**' unary)?`` (right-associative;
    ``-2**2 = -4`` as in Python), ``atom := NUMBER | NAME | FUNC '(' expr (',' expr)* ')' |
    '(' expr ')'``.
    """

    def __init__(self, text: str, known: Iterable[str]) -> None:
        self.order = tuple(dict.fromkeys(known))
        self.text, self.known = text, frozenset(self.order)
        self.tokens, self.pos = tokenize(text), 0
        self.depth = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def fail(self, what: str, token: Token | None = None) -> UsageError:
        token = token or self.token
        if token.kind == "end":
            where = "end of input"
        else:
            where = f"{token.text!r} at column {token.column}"
        return UsageError(f"{what}: {where} in {_quote(self.text)}")

    def expect(self, text: str) -> None:
        if self.token.text != text or self.token.kind != "op":
            raise self.fail(f"expected {text!r}")
        self.take()

    def expr(self) -> Node:
        node = self.term()
        while self.token.kind == "op" and self.token.text in "+-":
            node = Binary(self.take().text, node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.token.kind == "op" and self.token.text in ("*", "/"):
            node = Binary(self.take().text, node, self.unary())
        return node

    def unary(self) -> Node:
        # every nesting (parentheses, call arguments, signs, powers) passes through here
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"the expression is nested more than {MAX_DEPTH} levels deep")
        try:
            if self.token.kind == "op" and self.token.text in "+-":
                sign = self.take().text
                operand = self.unary()
                return Negate(operand) if sign == "-" else operand
            return self.power()
        finally:
            self.depth -= 1

    def power(self) -> Node:
        base = self.atom()
        if self.token.kind == "op" and self.token.text == "**":
            self.take()
            return Binary("**", base, self.unary())
        if self.token.kind == "op" and self.token.text == "^":
            raise self.fail("'^' is not an operator here, write '**' for a power")
        return base

    def atom(self) -> Node:
        token = self.token
        if token.kind == "number":
            text = self.take().text
            value = float(text)
            return Number(value, exact=_exactly(text, value), text=text)
        if token.kind == "name":
            return self.name_or_call()
        if token.kind == "op" and token.text == "(":
            self.take()
            node = self.expr()
            self.expect(")")
            return node
        raise self.fail("expected a number, a quantity, a function or '('")

    def name_or_call(self) -> Node:
        token = self.take()
        is_call = self.token.kind == "op" and self.token.text == "("
        if token.text in FUNCTIONS:
            if not is_call:
                raise self.fail(
                    f"function {token.text!r} needs arguments, e.g. {token.text}(L)", token
                )
            return self.call(token)
        if is_call:
            known = ", ".join(FUNCTIONS)
            raise self.fail(f"unknown function {token.text!r} (functions: {known})", token)
        if token.text in CONSTANTS:
            return Constant(token.text)
        if token.text not in self.known:
            known = ", ".join(self.order)
            raise UsageError(
                f"unknown quantity {token.text!r} at column {token.column} in "
                f"{_quote(self.text)} (known: {known}; constants: {', '.join(CONSTANTS)})"
            )
        return Name(token.text)

    def call(self, token: Token) -> Node:
        self.expect("(")
        args = [self.expr()]
        while self.token.kind == "op" and self.token.text == ",":
            self.take()
            args.append(self.expr())
        self.expect(")")
        arity = FUNCTIONS[token.text][1]
        variadic = token.text in VARIADIC
        if (variadic and len(args) < arity) or (not variadic and len(args) != arity):
            need = f"at least {arity}" if variadic else str(arity)
            raise self.fail(f"{token.text} takes {need} argument(s), got {len(args)}", token)
        return Call(token.text, tuple(args))

    def check_depth(self, *nodes: Node) -> None:
        """Usage error when a tree is deeper than :data:`MAX_DEPTH` (measured without recursion,
        as evaluating and printing it recurse)."""
        stack = [(node, 1) for node in nodes]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise UsageError(f"the expression is more than {MAX_DEPTH} levels deep (a chain "
                                 f"of operators counts one level each) in {_quote(self.text)}")
            children = [getattr(node, name, None) for name in ("left", "right", "operand")]
            children += list(getattr(node, "args", ()))
            stack.extend((child, depth + 1) for child in children if isinstance(child, Node))

    def end(self) -> None:
        if self.token.kind != "end":
            raise self.fail("unexpected token")


# --------------------------------------------------------------------------------------------
# Public API


class Judgement(NamedTuple):
    """The inequality at one point (:meth:`Inequality.judge`)."""

    lhs: float
    rhs: float
    #: ``lhs / rhs`` where ``rhs > 0``; NaN where ``rhs ≤ 0`` (no meaningful ratio) or a side has
    #: no value.
    ratio: float
    #: ``"holds"``, ``"fails"`` or ``"undefined"``.
    verdict: str
    #: The signed violation margin (:func:`margin`): ``> 0`` (strict: ``≥ 0``) where the values
    #: break the bound beyond the tolerance, bounded in ``[−1, 1]``; NaN where a side has no value.
    margin: float = math.nan
    #: Float64 cannot decide: the values hold or break the bound by no more than the rounding of
    #: the quantities (and of the expression's own arithmetic) can explain; read as holding (not
    #: a violation, ``verdict == "holds"``) unless higher precision decides it
    #: (:mod:`attnverify.precise`).
    rounding: bool = False


def margin(lhs: float, rhs: float, slack: float = 0.0) -> float:
    """The signed, scale-free violation margin of ``lhs ≤ rhs + slack``:
    ``(lhs − rhs − slack) / (|lhs| + |rhs| + slack)``, in ``[−1, 1]``, continuous wherever one of
    the sides is nonzero, increasing in ``lhs`` and decreasing in ``rhs`` whatever their signs,
    ``> 0`` exactly when ``lhs > rhs + slack``. For positive sides (and no slack) it is
    ``(r − 1)/(r + 1)`` of the ratio ``r = lhs/rhs``, so it ranks cases as the ratio does. An
    infinite side gives ``±1`` (equal infinities 0); NaN where a side is NaN."""
    if math.isnan(lhs) or math.isnan(rhs):
        return math.nan
    if lhs == rhs and (slack == 0.0 or math.isinf(lhs)):
        return 0.0
    if math.isinf(lhs) or math.isinf(rhs):
        return 1.0 if lhs > rhs else -1.0
    scale = max(abs(lhs), abs(rhs), slack)
    if scale == 0.0:
        return 0.0
    lhs, rhs, slack = lhs / scale, rhs / scale, slack / scale
    return (lhs - rhs - slack) / (abs(lhs) + abs(rhs) + slack)


@dataclass(frozen=True)
class Inequality:
    """A parsed ``lhs ≤ rhs`` (``strict``: ``lhs < rhs``), as written in ``text``.

    How a case is judged (:meth:`judge`): ``lhs ≤ rhs`` fails when ``lhs > rhs + slack`` with
    ``slack = atol + rtol·|rhs|``; a strict ``lhs < rhs`` fails when ``lhs ≥ rhs`` (no tolerance:
    it neither excuses nor convicts). Either is a violation only if it survives the rounding:
    with each quantity known to ``± errors[q]`` and the expression evaluated in interval
    arithmetic (:mod:`attnverify.intervals`), the whole interval of ``lhs`` must lie beyond the
    whole interval of ``rhs`` (``lo(lhs) > hi(rhs) + slack``; strict: ``lo(lhs) ≥ hi(rhs)``).
    Where an interval meets a point where the expression has no value (``log1p(−sum_weight)``
    with ``sum_weight`` rounded to 1) the case is undefined, like a side with no value.

    Margin forms: ``violation = lhs − rhs`` (``> 0``, or ``≥ 0`` when strict, means the values
    break it); :func:`margin` is its signed, scale-free form (what the search climbs);
    ``ratio = lhs / rhs`` is defined for ``rhs > 0`` (``> 1`` means it breaks) and is NaN for
    ``rhs ≤ 0``.
    """

    text: str
    lhs: Node
    rhs: Node
    strict: bool

    @property
    def names(self) -> frozenset[str]:
        return self.lhs.names() | self.rhs.names()

    @property
    def normalized(self) -> str:
        return f"{self.lhs} {'<' if self.strict else '<='} {self.rhs}"

    def evaluate(self, values: Mapping[str, Any]) -> tuple[Any, Any]:
        """``(lhs, rhs)``: floats when every value is a plain number, torch tensors otherwise."""
        lhs, rhs = self.lhs.evaluate(values), self.rhs.evaluate(values)
        if any(torch.is_tensor(values[n]) for n in self.names):
            return lhs, rhs
        return float(lhs), float(rhs)

    def violation(self, values: Mapping[str, Any]) -> Any:
        """``lhs − rhs``: positive when ``lhs ≤ rhs`` fails."""
        lhs, rhs = self.evaluate(values)
        return lhs - rhs

    def ratio(self, values: Mapping[str, Any]) -> Any:
        """``lhs / rhs`` for ``rhs > 0``; NaN for ``rhs ≤ 0`` (see the class docstring)."""
        lhs, rhs = self.evaluate(values)
        if torch.is_tensor(lhs) or torch.is_tensor(rhs):
            lhs, rhs = (torch.as_tensor(v, dtype=torch.float64) for v in (lhs, rhs))
            return torch.where(rhs > 0, lhs / rhs, torch.full_like(lhs / rhs, math.nan))
        return _ratio(lhs, rhs)

    def holds(self, values: Mapping[str, Any], *, rtol: float = 0.0, atol: float = 0.0,
              errors: Mapping[str, float] | None = None) -> bool:
        """Whether the inequality holds at ``values`` (:meth:`judge`); a side with no value (NaN)
        never holds."""
        return self.judge(values, rtol=rtol, atol=atol, errors=errors).verdict == "holds"

    def verdict(self, values: Mapping[str, Any], *, rtol: float = 0.0, atol: float = 0.0,
                errors: Mapping[str, float] | None = None) -> str:
        """``"holds"``, ``"fails"`` or ``"undefined"`` at one point. Undefined: every quantity is
        a number but a side has none (0·log 0, log or sqrt of a negative, 0/0, ∞ − ∞), or only
        the rounding of the quantities could give it one; that is not a violation. A quantity
        that is NaN (the normalizer's output) fails."""
        return self.judge(values, rtol=rtol, atol=atol, errors=errors).verdict

    def judge(self, values: Mapping[str, Any], *, rtol: float = 0.0, atol: float = 0.0,
              errors: Mapping[str, float] | None = None) -> Judgement:
        """The inequality at one point of plain numbers (the class docstring says how);
        ``errors`` maps a quantity to how far its exact value may lie from ``values`` (absent:
        exact). The tree is evaluated once, and in intervals only where the point breaks it."""
        lhs, rhs = (float(v) for v in self.evaluate(values))
        ratio = _ratio(lhs, rhs)
        slack = 0.0 if self.strict or not math.isfinite(rhs) else atol + rtol * abs(rhs)
        m = margin(lhs, rhs, slack)
        if any(_is_nan(values[n]) for n in self.names):
            return Judgement(lhs, rhs, ratio, "fails", m)
        if math.isnan(lhs) or math.isnan(rhs):
            return Judgement(lhs, rhs, ratio, "undefined", m)
        breaks = m >= 0 if self.strict else m > 0
        plain = {n: float(values[n]) for n in self.names}
        try:
            left = self.lhs.interval(plain, errors or {})
            right = self.rhs.interval(plain, errors or {})
        except I.Singular:
            if not breaks:  # holds at the point; within the rounding it may have no value
                return Judgement(lhs, rhs, ratio, "holds", m, rounding=True)
            return Judgement(lhs, rhs, ratio, "undefined", m)
        if not breaks:
            within = left[1] < right[0] if self.strict else left[1] <= right[0] + slack
            return Judgement(lhs, rhs, ratio, "holds", m, rounding=not within)
        beyond = left[0] >= right[1] if self.strict else left[0] > right[1] + slack
        if beyond:
            return Judgement(lhs, rhs, ratio, "fails", m)
        return Judgement(lhs, rhs, ratio, "holds", m, rounding=True)


def enclose(node: Node, ranges: Mapping[str, I.Interval]) -> I.Interval:
    """Every value ``node`` takes while each quantity ``q`` ranges over ``ranges[q]``
    (:mod:`attnverify.intervals`; raises :class:`~attnverify.intervals.Singular` where it may
    have none)."""
    if isinstance(node, Name):
        return ranges[node.name]
    if isinstance(node, (Number, Constant)):
        return node.interval({}, {})
    if isinstance(node, Negate):
        return I.neg(enclose(node.operand, ranges))
    if isinstance(node, Binary):
        return _INTERVAL_BINARY[node.op](enclose(node.left, ranges), enclose(node.right, ranges))
    if isinstance(node, Call):
        return I.apply(node.function, *(enclose(a, ranges) for a in node.args))
    raise TypeError(f"unknown node {type(node).__name__}")


def over_ranges(ineq: Inequality, ranges: Mapping[str, I.Interval], *, rtol: float = 0.0,
                atol: float = 0.0) -> tuple[str | None, I.Interval | None, I.Interval | None]:
    """The inequality over whole ranges of its quantities: ``("holds", lhs, rhs)`` when it holds
    at every point of them (``hi(lhs) ≤ lo(rhs)``; strict: ``<``), ``("fails", …)`` when it fails
    at every point beyond the tolerance (``lo(lhs) > hi(rhs) + atol + rtol·max|rhs|``; strict:
    ``lo(lhs) ≥ hi(rhs)``), else ``(None, …)``; ``(None, None, None)`` where a side may have no
    value."""
    try:
        lhs, rhs = enclose(ineq.lhs, ranges), enclose(ineq.rhs, ranges)
    except I.Singular:
        return None, None, None
    if ineq.strict:
        if lhs[1] < rhs[0]:
            return "holds", lhs, rhs
        if lhs[0] >= rhs[1]:
            return "fails", lhs, rhs
        return None, lhs, rhs
    if lhs[1] <= rhs[0]:
        return "holds", lhs, rhs
    reach = max(abs(rhs[0]), abs(rhs[1]))
    if math.isfinite(rhs[1]) and lhs[0] > rhs[1] + atol + rtol * reach:
        return "fails", lhs, rhs
    return None, lhs, rhs


def _ratio(lhs: float, rhs: float) -> float:
    return lhs / rhs if rhs > 0 and not math.isnan(lhs) else math.nan


def _is_nan(value: Any) -> bool:
    if torch.is_tensor(value):
        return bool(torch.isnan(value).any())
    return math.isnan(float(value))


def parse_expression(text: str, known: Iterable[str]) -> Node:
    """Parse an arithmetic expression over the quantity names ``known``."""
    parser = _Parser(text, known)
    node = parser.expr()
    parser.end()
    parser.check_depth(node)
    return node


def parse_inequality(text: str, known: Iterable[str] | None = None) -> Inequality:
    """Parse ``"LHS <= RHS"`` (or ``<``, ``>=``, ``>``) into an :class:`Inequality`.

    ``known`` are the allowed quantity names; default: :data:`attnverify.quantities.QUANTITIES`.
    """
    if known is None:
        known = QUANTITIES
    parser = _Parser(text, known)
    left = parser.expr()
    op = parser.token
    if op.kind != "op" or op.text not in COMPARISONS:
        if op.kind == "op" and op.text in ("==", "!=", "="):
            raise parser.fail("only <=, <, >=, > compare here", op)
        raise parser.fail("expected a comparison (<=, <, >=, >)")
    parser.take()
    right = parser.expr()
    if parser.token.kind == "op" and parser.token.text in COMPARISONS:
        raise parser.fail("only one comparison is allowed")
    parser.end()
    parser.check_depth(left, right)
    lhs, rhs = (left, right) if op.text in ("<=", "<") else (right, left)
    return Inequality(text=text, lhs=lhs, rhs=rhs, strict=op.text in ("<", ">"))
