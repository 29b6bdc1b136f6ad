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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from attnverify.errors import UsageError

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
    """Tokens of ``text``, ending with an ``end`` token; a stray character is a usage error."""
    if len(text) > MAX_LENGTH:
        raise UsageError(f"the expression is {len(text)} characters long; at most {MAX_LENGTH} "
                         "are allowed")
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.lastgroup is None:
            column = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise UsageError(
                f"unexpected character {text[column - 1]!r} at column {column} in {_quote(text)}"
            )
        kind = match.lastgroup
        tokens.append(Token(kind, match.group(kind), match.start(kind) + 1))
        pos = match.end()
    tokens.append(Token("end", "", len(text) + 1))
    return tokens


# --------------------------------------------------------------------------------------------
# The tree


class Node:
    """An expression node: ``evaluate(values)`` returns a torch scalar (or tensor)."""

    def evaluate(self, values: Mapping[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def names(self) -> frozenset[str]:
        return frozenset()


@dataclass(frozen=True)
class Number(Node):
    value: float

    def evaluate(self, values):
        return torch.tensor(self.value, dtype=torch.float64)

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

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class Negate(Node):
    operand: Node

    def evaluate(self, values):
        return -self.operand.evaluate(values)

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


@dataclass(frozen=True)
class Binary(Node):
    op: str
    left: Node
    right: Node

    def evaluate(self, values):
        return _BINARY[self.op](self.left.evaluate(values), self.right.evaluate(values))

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
            return Number(float(self.take().text))
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


@dataclass(frozen=True)
class Inequality:
    """A parsed ``lhs ≤ rhs`` (``strict``: ``lhs < rhs``), as written in ``text``.

    Margin forms: ``violation = lhs − rhs`` (``> 0``, or ``≥ 0`` when strict, means the
    inequality fails) is defined everywhere; ``ratio = lhs / rhs`` is defined for ``rhs > 0``
    (``> 1`` means it fails), and for ``rhs ≤ 0`` is ``+inf`` when it fails and ``-inf`` when it
    holds, so a search that maximises the ratio treats every failure there as the worst.
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
        """``lhs / rhs`` for ``rhs > 0``; ``±inf`` for ``rhs ≤ 0`` (see the class docstring)."""
        lhs, rhs = self.evaluate(values)
        return self._ratio(lhs, rhs)

    def holds(self, values: Mapping[str, Any], *, rtol: float = 0.0, atol: float = 0.0) -> bool:
        """Whether ``lhs ≤ rhs + atol + rtol·|rhs|``; strict: ``lhs < rhs − atol − rtol·|rhs|``
        (the tolerance never lets equality pass a strict inequality: it counts against the
        claim). NaN never holds."""
        lhs, rhs = (float(v) for v in self.evaluate(values))
        return self._holds(lhs, rhs, rtol, atol)

    def verdict(self, values: Mapping[str, Any], *, rtol: float = 0.0,
                atol: float = 0.0) -> str:
        """``"holds"``, ``"fails"`` or ``"undefined"`` at one point. Undefined: every quantity is
        a number but a side has none (0·log 0, log or sqrt of a negative, 0/0, ∞ − ∞); that is
        not a violation. A quantity that is NaN (the normalizer's output) fails."""
        return self.judge(values, rtol=rtol, atol=atol)[3]

    def judge(self, values: Mapping[str, Any], *, rtol: float = 0.0,
              atol: float = 0.0) -> tuple[float, float, float, str]:
        """``(lhs, rhs, ratio, verdict)`` at one point of plain numbers, the tree evaluated once
        (:meth:`ratio` and :meth:`verdict` in one pass)."""
        lhs, rhs = (float(v) for v in self.evaluate(values))
        ratio = float(self._ratio(lhs, rhs))
        if any(_is_nan(values[n]) for n in self.names):
            return lhs, rhs, ratio, "fails"
        if math.isnan(lhs) or math.isnan(rhs):
            return lhs, rhs, ratio, "undefined"
        return lhs, rhs, ratio, "holds" if self._holds(lhs, rhs, rtol, atol) else "fails"

    def _ratio(self, lhs, rhs) -> Any:
        if rhs > 0:
            return lhs / rhs
        return math.inf if self._fails(lhs, rhs) else -math.inf

    def _holds(self, lhs: float, rhs: float, rtol: float, atol: float) -> bool:
        slack = atol + rtol * abs(rhs) if math.isfinite(rhs) else 0.0
        return not self._fails(lhs, rhs - slack if self.strict else rhs + slack)

    def _fails(self, lhs, rhs) -> bool:
        lhs, rhs = float(lhs), float(rhs)
        if math.isnan(lhs) or math.isnan(rhs):
            return True
        return lhs >= rhs if self.strict else lhs > rhs


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
        from attnverify.quantities import QUANTITIES

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
