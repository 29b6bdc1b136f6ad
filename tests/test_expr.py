"""Tests of :mod:`attnverify.expr`: the ``falsify`` inequality language."""

from __future__ import annotations

import math

import pytest
import torch

from attnverify.errors import UsageError
from attnverify.expr import parse_expression, parse_inequality

KNOWN = ("L", "T", "a", "max_weight", "jacobian_spectral", "lambda")
VALUES = {"L": 4.0, "T": 0.5, "a": 2.0, "max_weight": 0.3, "jacobian_spectral": 1.0, "lambda": 0.5}


def value(text: str, values=VALUES) -> float:
    return float(parse_expression(text, KNOWN).evaluate(values))


@pytest.mark.parametrize(
    "text,want",
    [
        ("2 + 3 * 4", 14.0),
        ("(2 + 3) * 4", 20.0),
        ("2 - 3 - 4", -5.0),  # left-associative
        ("24 / 4 / 3", 2.0),
        ("2 ** 3 ** 2", 512.0),  # right-associative
        ("-2 ** 2", -4.0),  # as in Python: -(2**2)
        ("2 ** -1", 0.5),
        ("--3", 3.0),
        ("+3", 3.0),
        ("1e-3 * 1000", 1.0),
        ("1.5e2", 150.0),
        (".5 + 1.", 1.5),
        ("1 / (4 * T)", 0.5),
        ("exp(0) + log(1) + sqrt(9) + abs(-2)", 6.0),
        ("min(L, T, a)", 0.5),
        ("max(1, L)", 4.0),
        ("lambda * 2", 1.0),  # a Python keyword is an ordinary quantity name here
        ("max_weight*L", 1.2),
    ],
)
def test_arithmetic_precedence_and_functions(text, want):
    assert value(text) == pytest.approx(want, rel=1e-15), text


def test_comparisons_normalise_to_less_or_equal():
    ineq = parse_inequality("jacobian_spectral >= 1 / (4 * T)", KNOWN)
    assert str(ineq.lhs) == "(1 / (4 * T))" and str(ineq.rhs) == "jacobian_spectral"
    assert not ineq.strict
    assert ineq.names == {"T", "jacobian_spectral"}
    assert ineq.text == "jacobian_spectral >= 1 / (4 * T)"
    assert ineq.evaluate(VALUES) == (0.5, 1.0)
    strict = parse_inequality("a > L", KNOWN)
    assert strict.strict and strict.normalized == "L < a"
    assert parse_inequality("L < a", KNOWN).strict


def test_ratio_violation_and_holds():
    # jacobian_spectral = 1 against 1/(4T) = 0.5: violated by the ratio 2.
    ineq = parse_inequality("jacobian_spectral <= 1 / (4 * T)", KNOWN)
    assert ineq.ratio(VALUES) == 2.0
    assert ineq.violation(VALUES) == 0.5
    assert not ineq.holds(VALUES)
    assert ineq.holds(VALUES, atol=0.5)
    assert ineq.holds(VALUES, rtol=1.0)
    ok = parse_inequality("max_weight <= 1", KNOWN)
    assert ok.ratio(VALUES) == pytest.approx(0.3) and ok.holds(VALUES)


def test_ratio_with_a_nonpositive_right_side_is_nan_and_the_margin_still_ranks():
    # a <= -1 at a = 2: broken; -3 <= -a: holds; a <= 0: broken. No ratio where RHS <= 0, but
    # the margin (lhs - rhs)/(|lhs| + |rhs|) says how far, with the sign of the verdict
    fails = parse_inequality("a <= -1", KNOWN)
    holds = parse_inequality("-3 <= -1 * a", KNOWN)
    zero = parse_inequality("a <= 0", KNOWN)
    assert math.isnan(fails.ratio(VALUES)) and not fails.holds(VALUES)
    assert math.isnan(holds.ratio(VALUES)) and holds.holds(VALUES)
    assert math.isnan(zero.ratio(VALUES)) and zero.violation(VALUES) == 2.0
    assert fails.judge(VALUES).margin == pytest.approx(3 / 3)
    assert holds.judge(VALUES).margin == pytest.approx((-3 + 2) / 5)
    assert zero.judge(VALUES).margin == 1.0


def test_strict_inequality_fails_on_equality():
    ineq = parse_inequality("L < 4", KNOWN)
    assert not ineq.holds(VALUES)
    assert parse_inequality("L <= 4", KNOWN).holds(VALUES)


def test_ieee_semantics_instead_of_exceptions():
    assert value("log(0)") == -math.inf
    assert value("1 / 0") == math.inf
    assert value("exp(1000)") == math.inf
    assert math.isnan(value("sqrt(-1)"))
    nan_ineq = parse_inequality("sqrt(-1) <= 1", KNOWN)
    assert not nan_ineq.holds(VALUES), "NaN must never count as holding"


def test_evaluates_torch_values_with_autograd():
    T = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    values = {**VALUES, "T": T}
    ineq = parse_inequality("jacobian_spectral <= 1 / (4 * T)", KNOWN)
    lhs, rhs = ineq.evaluate(values)
    assert torch.is_tensor(rhs)
    ratio = ineq.ratio(values)
    ratio.backward()
    # ratio = 4·T·1 → d/dT = 4
    assert float(T.grad) == pytest.approx(4.0)


@pytest.mark.parametrize(
    "text,message",
    [
        ("foo <= 1", "unknown quantity 'foo' at column 1 in \"foo <= 1\" (known: L, T, a,"),
        ("sin(L) <= 1", "unknown function 'sin' (functions: exp, log, sqrt, abs, min, max, tanh, "
         "sinh, cosh, log1p, expm1)"),
        ("exp <= 1", "function 'exp' needs arguments"),
        ("min(L) <= 1", "min takes at least 2 argument(s), got 1"),
        ("exp(L, T) <= 1", "exp takes 1 argument(s), got 2"),
        ("L + 1", "expected a comparison (<=, <, >=, >): end of input"),
        ("1 <= L <= 3", "only one comparison is allowed: '<=' at column 8"),
        ("L == 3", "only <=, <, >=, > compare here: '==' at column 3"),
        ("L = 3", "only <=, <, >=, > compare here"),
        ("L <= $", "unexpected character '$' at column 6"),
        ("2 ^ 3 <= L", "write '**' for a power"),
        ("(L <= 1", "expected ')': '<=' at column 4"),
        ("L <= 1 2", "unexpected token: '2' at column 8"),
        ("L <=", "expected a number, a quantity, a function or '(': end of input"),
        ("2L <= 1", "expected a comparison"),
        ("__import__('os') <= 1", 'unexpected character "\'" at column 12'),
        ("__import__(1) <= 1", "unknown function '__import__'"),
        ("L.real <= 1", "unexpected character '.' at column 2"),
        ("", "expected a number, a quantity, a function or '(': end of input"),
    ],
)
def test_errors_are_one_line_usage_errors_naming_the_token(text, message):
    with pytest.raises(UsageError) as info:
        parse_inequality(text, KNOWN)
    text_of_error = str(info.value)
    assert message in text_of_error, text_of_error
    assert "\n" not in text_of_error


def test_default_names_are_the_quantities():
    from attnverify.quantities import QUANTITIES

    ineq = parse_inequality("jacobian_entry <= 1 / (4 * T)")
    assert ineq.names <= set(QUANTITIES)
    with pytest.raises(UsageError, match="unknown quantity 'bogus'"):
        parse_inequality("bogus <= 1")


def test_missing_value_is_a_key_error():
    with pytest.raises(KeyError, match="'a'"):
        parse_inequality("a <= 1", KNOWN).evaluate({"L": 1.0})


# --------------------------------------------------------------------------------------------
# Functions and constants added by issue #18


@pytest.mark.parametrize(
    "text,want",
    [
        ("tanh(1)", (math.e - 1 / math.e) / (math.e + 1 / math.e)),
        ("sinh(1)", (math.e - 1 / math.e) / 2),
        ("cosh(1)", (math.e + 1 / math.e) / 2),
        ("cosh(a)**2 - sinh(a)**2", 1.0),  # a = 2: rounding of two squares near 14
        ("log1p(e - 1)", 1.0),
        ("expm1(log(2))", 1.0),
        ("log1p(1e-20)", 1e-20),  # log1p and expm1 keep the digits log(1 + x) would lose
        ("expm1(1e-20)", 1e-20),
        ("pi", math.pi),
        ("e", math.e),
        ("2*pi*e", 2 * math.pi * math.e),
        ("tanh(a/T) + 1", math.tanh(4.0) + 1),
        ("1e-3*e", 1e-3 * math.e),  # a number's exponent is not the constant
    ],
)
def test_hyperbolic_functions_log1p_expm1_and_constants(text, want):
    assert value(text) == pytest.approx(want, rel=1e-14, abs=1e-300), text


def test_new_functions_follow_ieee_semantics_undefined_not_violation():
    assert math.isnan(value("log1p(-2)"))
    assert value("log1p(-1)") == -math.inf
    assert value("sinh(1000)") == math.inf and value("sinh(-1000)") == -math.inf
    assert value("cosh(1000)") == math.inf and value("expm1(1000)") == math.inf
    assert value("tanh(1000)") == 1.0 and value("expm1(-1000)") == -1.0
    undefined = parse_inequality("log1p(-2) <= max_weight", KNOWN)
    assert undefined.verdict(VALUES) == "undefined"  # no value: not a violation
    overflow = parse_inequality("cosh(1000) - sinh(1000) <= max_weight", KNOWN)  # inf - inf
    assert overflow.verdict(VALUES) == "undefined"
    assert parse_inequality("sinh(1000) <= max_weight", KNOWN).verdict(VALUES) == "fails"


def test_constants_print_by_name_and_are_not_quantities():
    ineq = parse_inequality("max_weight <= pi/e", KNOWN)
    assert ineq.normalized == "max_weight <= (pi / e)"
    assert ineq.names == {"max_weight"}
    from attnverify.quantities import QUANTITIES

    assert not {"pi", "e"} & set(QUANTITIES)
    with pytest.raises(UsageError, match=r"constants: pi, e"):
        parse_inequality("tau <= 1", KNOWN)
    with pytest.raises(UsageError, match="unknown function 'pi'"):
        parse_inequality("pi(1) <= 1", KNOWN)
    with pytest.raises(UsageError, match="tanh takes 1 argument"):
        parse_inequality("tanh(L, T) <= 1", KNOWN)
    with pytest.raises(UsageError, match="function 'log1p' needs arguments"):
        parse_inequality("log1p <= 1", KNOWN)


def test_the_limits_hold_for_the_new_functions():
    deep = "tanh(" * 70 + "L" + ")" * 70 + " <= 1"
    with pytest.raises(UsageError, match="nested more than 64 levels"):
        parse_inequality(deep, KNOWN)
    with pytest.raises(UsageError, match="at most 2000"):
        parse_inequality("L <= " + "+".join(["e"] * 1200), KNOWN)
