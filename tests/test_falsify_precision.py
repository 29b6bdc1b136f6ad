"""falsify at the rounding edge (issue #25.7): a case float64 cannot decide is decided in higher
precision on the same input where attnverify can compute its quantities exactly enough (the
built-ins' formulas, the input's own quantities), and stays undecided, never a violation,
where it cannot (a user's normalizer, whose code runs in float64 only)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import mpmath
import pytest
import torch

from attnverify import precise
from attnverify.certify import make_context
from attnverify.expr import parse_inequality
from attnverify.falsify import FalsifyCase, evaluate, falsify, notes, result_json, summary
from attnverify.normalizers import reference
from attnverify.registry import load_target

CTX = dataclasses.replace(make_context("dev", max_examples=200, seed=0), max_length=64)
USER = str(Path(__file__).parent / "fixtures" / "user_normalizers.py") + ":plain"


def _case(row, t=1.0):
    return FalsifyCase(torch.tensor(row, dtype=torch.float64), t, "hand", 0)


# -- hand-computed cases first


def test_one_key_has_weight_exactly_one_so_the_strict_bound_fails():
    # L = 1: the softmax weight is e^0/e^0 = 1 exactly; float64 gives 1.0, which within its
    # rounding could lie below 1; the exact evaluation says 1 < 1 is false
    ev = evaluate(load_target("softmax"), parse_inequality("max_weight < 1"), _case([0.0]), {})
    assert ev.fails and ev.decided_by == "mpmath"
    assert ev.precise.verdict == "fails"
    assert ev.precise.lhs == ("1.0", "1.0") and ev.precise.rhs == ("1.0", "1.0")


def test_a_gap_of_40_rounds_to_one_in_float64_but_holds_exactly():
    # L = 2, logits (0, −40): max weight 1/(1 + e^−40) = 1 − 4.2483542552915889e−18, computed
    # as 1.0 in float64; the exact value is below 1, so max_weight < 1 holds
    ev = evaluate(load_target("softmax"), parse_inequality("max_weight < 1"), _case([0.0, -40.0]),
                  {})
    assert ev.values["max_weight"] == 1.0  # what float64 computes
    assert not ev.fails and ev.decided_by == "mpmath" and ev.precise.verdict == "holds"
    exact = 1 / (1 + mpmath.exp(mpmath.mpf(-40)))
    lo, hi = (mpmath.mpf(v) for v in ev.precise.lhs)
    assert lo <= exact + mpmath.mpf(10) ** -24 and exact - mpmath.mpf(10) ** -24 <= hi
    assert float(ev.precise.difference.lstrip("~")) == pytest.approx(-4.2483542552915889e-18)


def test_a_weight_within_e_to_the_minus_600_of_one_is_decided_at_the_higher_precision():
    # logits (300, −300): 1 − e^−600 needs about 870 bits to be told from 1
    ev = evaluate(load_target("softmax"), parse_inequality("max_weight < 1"),
                  _case([300.0, -300.0]), {})
    assert not ev.fails and ev.decided_by == "mpmath" and ev.precise.bits > 870


def test_a_sum_of_exactly_one_breaks_a_strict_bound_below_one():
    # sparsemax's weights sum to 1 by construction (float64: 0.9999999999999999 here)
    ineq = parse_inequality("sum_weight < 1")
    for target in ("sparsemax", "softmax", "entmax15", "dagpam"):
        ev = evaluate(load_target(target), ineq, _case([1.0, 0.5, -2.0, 0.5]), {})
        assert ev.fails and ev.decided_by == "mpmath", target


def test_an_exact_equality_that_intervals_cannot_show_stays_undecided():
    # entropy = log 3 at a three-way tie: both sides enclose log 3, neither interval is a
    # point: no decision either way, and not a violation
    ev = evaluate(load_target("softmax"), parse_inequality("entropy < log(L)"),
                  _case([3.0, 3.0, 3.0]), {})
    assert not ev.fails and ev.decided_by == "undecided" and "overlap" in ev.undecided_reason


def test_the_input_quantities_are_decided_for_any_target():
    # L, T, a, logit_gap are the input's own numbers: exact for a user's target too
    # (gap 1: both sides are 1.0 in float64 and differ by 1e-300 exactly)
    spec = load_target(USER)
    ev = evaluate(spec, parse_inequality("logit_gap < 1 + 1e-300"), _case([1.0, 0.0]), {})
    assert not ev.fails and ev.decided_by == "mpmath" and ev.precise.verdict == "holds"
    ev = evaluate(spec, parse_inequality("logit_gap + 2e-300 < 1 + 1e-300"), _case([1.0, 0.0]),
                  {})
    assert ev.fails and ev.decided_by == "mpmath"


# -- what cannot be decided stays undecided


def test_a_users_normalizer_is_never_decided_in_higher_precision():
    ineq = parse_inequality("max_weight < 1")
    ev = evaluate(load_target(USER), ineq, _case([0.0]), {})
    assert not ev.fails and ev.decided_by == "undecided"
    assert "float64 only" in ev.undecided_reason


def test_a_spec_named_like_a_builtin_with_another_function_is_not_trusted():
    softmax = load_target("softmax")
    forged = dataclasses.replace(softmax, fn=load_target(USER).fn)
    ev = evaluate(forged, parse_inequality("max_weight < 1"), _case([0.0]), {})
    assert ev.decided_by == "undecided" and not ev.fails
    assert precise.builtin_of(softmax) == "softmax" and precise.builtin_of(forged) is None


def test_every_builtin_has_a_formula():
    from attnverify.registry import builtin_ids

    assert set(builtin_ids()) <= set(precise.FORMULAS)


def test_alpha_entmax_without_closed_form_is_undecided():
    spec = load_target("entmax_alpha", {"alpha": 1.3})
    ev = evaluate(spec, parse_inequality("max_weight < 1"), _case([0.0]), {"alpha": 1.3})
    assert ev.decided_by == "undecided" and "closed form" in ev.undecided_reason


# -- the formulas are the built-ins'


@pytest.mark.parametrize("name", sorted(precise.FORMULAS))
def test_the_formulas_agree_with_the_float64_references(name):
    g = torch.Generator().manual_seed(3)
    ref = reference.REFERENCES.get(name, reference.softmax)  # softmax_fused: softmax
    mpmath.iv.prec = mpmath.mp.prec = 256
    try:
        for length, scale, t in ((1, 1.0, 1.0), (2, 3.0, 0.5), (5, 1.0, 1.0), (7, 20.0, 2.0),
                                 (9, 0.01, 1.0)):
            row = (torch.rand(length, generator=g, dtype=torch.float64) * 2 - 1) * scale
            row[0] = row[-1] if length > 2 else row[0]  # a tie
            if name == "relu_norm" and length > 1:
                row[1] = abs(row[1]) + 0.1  # some positive score
            counter = {}
            for v in row.tolist():
                counter[v] = counter.get(v, 0) + 1
            values = sorted(counter, reverse=True)
            p = {**load_target(name).params, "temperature": t}
            w = precise.FORMULAS[name]((values, [counter[v] for v in values]), p)
            expected = ref(row, temperature=t, **{k: v for k, v in p.items()
                                                  if k != "temperature"})
            for v, wi in zip(values, w):
                got = float((mpmath.mpf(wi.a) + mpmath.mpf(wi.b)) / 2)
                want = float(expected[row.tolist().index(v)])
                assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (name, length, v)
    finally:
        mpmath.iv.prec = mpmath.mp.prec = 53


# -- the search


def test_falsify_finds_the_one_key_witness_and_says_which_precision_decided():
    res = falsify(load_target("softmax"), "max_weight < 1", CTX)
    assert res.falsified
    w = res.witness
    assert int(torch.isfinite(w.case.scores).sum()) == 1 and w.decided_by == "mpmath"
    data = result_json(res, CTX)
    assert data["witness"]["decided_by"] == "mpmath"
    assert data["witness"]["high_precision"]["verdict"] == "fails"
    json.dumps(data, allow_nan=False)
    assert "decided in higher precision" in summary(res, CTX)


def test_a_users_softmax_is_not_falsified_at_the_rounding_edge_and_says_so():
    res = falsify(load_target(USER), "max_weight < 1", dataclasses.replace(CTX,
                                                                          max_examples=60))
    assert not res.falsified
    assert res.search.precise_undecided > 0
    assert any("could not decide" in n and "float64 only" in n for n in notes(res))


def test_a_true_strict_bound_stays_true_where_float64_rounds_to_equality():
    # min_weight > 0 holds for softmax everywhere; its weights reach e^-600 without underflow
    res = falsify(load_target("softmax"), "min_weight > 0", CTX)
    assert not res.falsified
    assert math.isfinite(res.worst.lhs)
