"""falsify without false alarms: every true statement of THEORY.md §2–6 survives the search, the
false ones and the strict inequalities that equality breaks are falsified, quantities keep their
meaning on masked rows, and an expression without a value is "undefined", not a violation.

Every search runs with the fixed seed 0 and a small budget of 200 evaluations (Hypothesis seeded by
falsify).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnverify.certify import make_context
from attnverify.expr import parse_inequality
from attnverify.falsify import FalsifyCase, evaluate, falsify, notes
from attnverify.registry import load_target

#: Rows up to 64 keys keep the Jacobian quantities cheap; ``max_examples`` is falsify's budget of
#: evaluations.
CTX = dataclasses.replace(make_context("dev", max_examples=200, seed=0), max_length=64)
NEG = -math.inf

#: True statements of THEORY.md §2–6 written with falsify's quantities (all over the unmasked keys).
TRUE = [
    ("softmax", "max_weight <= exp(2*a/T)/L"),  # Lemma 1 / Corollary 1, upper
    ("softmax", "min_weight >= exp(-2*a/T)/L"),  # Lemma 1 / Corollary 1, lower
    ("stablemax", "max_weight <= (1 + a/T)**2/L"),  # Lemma 1, C2 = s(a/T)/s(−a/T)
    ("stablemax", "min_weight >= 1/((1 + a/T)**2*L)"),  # Lemma 1, C1 = 1/C2
    ("softmax", "jacobian_spectral <= exp(2*a/T)*(1 + exp(2*a/T))/(L*T)"),  # Lemma 2, derived
    ("softmax", "jacobian_entry <= 1/(4*T)"),  # Corollary 3, entry-wise
    ("softmax", "jacobian_spectral <= 1/(2*T)"),  # Corollary 3, corrected
    ("softmax", "jacobian_l1_total <= 2*(1 - 1/L)/T"),  # Lemma 3, ℓ1
    ("softmax", "jacobian_l1_total <= 2*(1 - sum_sq_weight)/T"),  # Lemma 3, the identity
    ("softmax", "jacobian_l1_total >= 2*(1 - sum_sq_weight)/T"),
    ("softmax", "sum_weight <= 1"),  # §1: the simplex
    ("softmax", "sum_weight >= 1"),
    ("dagpam", "max_weight <= 1 + lambda"),  # §6: daGPAM's range
    ("dagpam", "min_weight >= -lambda"),
    ("dagpam", "sum_weight >= 1"),  # §6: rows sum to 1
    ("dagpam", "sum_weight <= 1"),
    ("softmax", "L >= 1"),
]

#: False as written (THEORY.md §5–6), or strict inequalities that exact equality breaks (L = 1).
FALSE = [
    ("softmax", "jacobian_spectral <= 1/(4*T)"),  # Corollary 3 as stated
    ("softmax", "jacobian_frobenius <= sqrt(L - 1)/(L*T)"),  # Lemma 3, Frobenius reading
    ("softmax", "L > 1"),
    ("softmax", "L_padded > L"),
    ("sparsemax", "min_weight > 0"),  # an exact zero weight
]


@pytest.mark.parametrize("target, text", TRUE)
def test_true_statements_are_not_falsified(target, text):
    res = falsify(load_target(target), text, CTX)
    w = res.witness
    assert not res.falsified, f"{target}: {text} falsified at {w.to_json() if w else None}"
    # searched, or decided for every input by its quantities' ranges (sum_weight <= 1, L >= 1)
    assert res.examples > 0 or res.ranges.verdict == "holds"


@pytest.mark.parametrize("target, text", FALSE)
def test_false_and_strict_statements_are_falsified(target, text):
    res = falsify(load_target(target), text, CTX)
    assert res.falsified, f"{target}: {text} not falsified ({res.examples} cases)"


@pytest.mark.parametrize("text", ["L > 1", "L_padded > L"])
def test_strict_inequalities_are_falsified_by_exact_equality_at_one_key(text):
    w = falsify(load_target("softmax"), text, CTX).witness
    assert w.values.get("L", 1) == 1 and w.lhs == w.rhs  # equality, at a row of one live key


def test_equality_of_rounded_values_does_not_falsify_a_strict_inequality():
    # a user's softmax: its max weight is 1.0 at one key, and also at (100, -100) where it is
    # 1 - e^-200; its code runs in float64 only, so a weight computed as 1.0 may be below 1 and
    # equality there is no violation; it is reported as a case float64 could not decide (the
    # built-in softmax is decided in higher precision: tests/test_falsify_precision.py)
    from pathlib import Path

    user = str(Path(__file__).parent / "fixtures" / "user_normalizers.py") + ":plain"
    res = falsify(load_target(user), "max_weight < 1", CTX)
    assert not res.falsified and res.search.within_rounding > 0
    assert any("rounding" in note for note in notes(res))


def test_the_tolerance_neither_excuses_nor_convicts_a_strict_inequality():
    strict = parse_inequality("max_weight < 1", ["max_weight"])
    assert not strict.holds({"max_weight": 1.0}, rtol=1e-9, atol=1e-9)  # exact equality
    assert strict.holds({"max_weight": 1.0 - 1e-12}, rtol=1e-9, atol=1e-9)  # below: holds
    assert not strict.holds({"max_weight": 1.0 + 1e-12}, rtol=1e-9, atol=1e-9)
    # the same value known only to ± 1e-12 cannot decide equality
    assert strict.holds({"max_weight": 1.0}, errors={"max_weight": 1e-12})
    positive = parse_inequality("min_weight > 0", ["min_weight"])  # 0 < min_weight
    assert positive.holds({"min_weight": 3.7e-44}, rtol=1e-7, atol=1e-7)  # it was "falsified"
    assert not positive.holds({"min_weight": 0.0}, rtol=1e-7, atol=1e-7)  # an exact zero
    loose = parse_inequality("max_weight <= 1", ["max_weight"])
    assert loose.holds({"max_weight": 1.0 + 1e-12}, rtol=1e-9, atol=1e-9)


def test_lemma1_on_a_masked_row_uses_the_unmasked_length():
    # two live keys (±0.1) and eight masked: max weight 0.55 ≤ e^0.2/2 = 0.61; with the padded
    # length (10) the bound would read 0.12 and raise a false alarm
    row = torch.tensor([0.1, -0.1] + [NEG] * 8, dtype=torch.float64)
    ev = evaluate(load_target("softmax"), parse_inequality("max_weight <= exp(2*a/T)/L"),
                  FalsifyCase(row, 1.0, "masked", 0), {})
    assert not ev.fails and not ev.undefined
    assert ev.values == {"max_weight": pytest.approx(0.549834, rel=1e-5), "a": 0.1, "T": 1.0,
                         "L": 2.0}
    padded = evaluate(load_target("softmax"), parse_inequality("L_padded <= 10"),
                      FalsifyCase(row, 1.0, "masked", 0), {})
    assert padded.values["L_padded"] == 10 and not padded.fails


def test_an_expression_without_a_value_is_undefined_not_a_violation():
    # sparsemax gives exact zeros: min_weight·log(min_weight) = 0·(−∞) is NaN there
    spec = load_target("sparsemax")
    ineq = parse_inequality("min_weight*log(min_weight) <= 0")
    ev = evaluate(spec, ineq, FalsifyCase(torch.tensor([5.0, 0.0], dtype=torch.float64), 1.0,
                                          "gaussian", 0), {})
    assert ev.undefined and not ev.fails
    res = falsify(spec, "min_weight*log(min_weight) <= 0", CTX)
    assert not res.falsified and res.undefined > 0 and res.undefined_example is not None


def test_a_nan_quantity_is_a_failure_not_undefined():
    ineq = parse_inequality("max_weight <= 1", ["max_weight"])
    assert ineq.verdict({"max_weight": math.nan}) == "fails"
    assert parse_inequality("max_weight*log(0) <= 1", ["max_weight"]).verdict(
        {"max_weight": 0.0}) == "undefined"


def test_a_fixed_temperature_is_used_by_every_case():
    # (T*L <= 0.5*L: T alone would be decided by its range, with no case)
    res = falsify(load_target("softmax"), "T*L <= 0.5*L", CTX, params={"temperature": 0.5})
    assert not res.falsified and res.worst.case.temperature == 0.5
    assert falsify(load_target("softmax"), "T < 0.5", CTX, params={"temperature": 0.5}).falsified
