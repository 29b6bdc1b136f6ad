"""falsify decides what the quantities' ranges decide before it searches (issue #28.13): a bound
that holds over the whole range of its quantities holds for every input, with no search; one
that fails everywhere is falsified at the first case. The weights' ranges are known only for the
built-ins (attnverify's own code); a user's normalizer may return anything, NaN included."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from attnverify.certify import make_context
from attnverify.expr import over_ranges, parse_inequality
from attnverify.falsify import decide_by_ranges, falsify, notes, result_json, summary
from attnverify.quantities import QUANTITIES, quantity_ranges
from attnverify.registry import load_target

CTX = dataclasses.replace(make_context("dev", max_examples=40, seed=0), max_length=64)
USER = str(Path(__file__).parent / "fixtures" / "user_normalizers.py") + ":plain"
INF = math.inf


def test_interval_arithmetic_over_ranges_by_hand():
    ineq = parse_inequality("max_weight <= 1e-3**-1")
    verdict, lhs, rhs = over_ranges(ineq, {"max_weight": (0.0, 1.0)})
    assert verdict == "holds" and lhs == (0.0, 1.0) and rhs[0] <= 1000.0 <= rhs[1]
    # 2·[0, 1] ≥ [1, 1]: neither everywhere
    assert over_ranges(parse_inequality("2*max_weight >= 1"), {"max_weight": (0.0, 1.0)})[0] is None
    # L ∈ [1, ∞): L < 1 fails everywhere (strict: 1 < 1 is false), 0.5 < L holds everywhere
    assert over_ranges(parse_inequality("L < 1"), {"L": (1.0, INF)})[0] == "fails"
    assert over_ranges(parse_inequality("0.5 < L"), {"L": (1.0, INF)})[0] == "holds"
    # a side that may have no value decides nothing
    assert over_ranges(parse_inequality("log(max_weight - 0.5) <= 10"),
                       {"max_weight": (0.0, 1.0)}) == (None, None, None)
    # the tolerance is the case's: a non-strict bound fails everywhere only beyond it
    assert over_ranges(parse_inequality("sum_weight <= 1 - 1e-9"), {"sum_weight": (1.0, 1.0)},
                       rtol=1e-7, atol=1e-7)[0] is None
    assert over_ranges(parse_inequality("sum_weight <= 0.5"), {"sum_weight": (1.0, 1.0)},
                       rtol=1e-7, atol=1e-7)[0] == "fails"


def test_every_quantity_has_a_range_for_a_simplex_builtin():
    ranges = quantity_ranges(QUANTITIES, space="simplex", temperature=(1.0, 1.0), lam=0.0)
    assert ranges is not None and set(ranges) == set(QUANTITIES)
    # a user's normalizer: its weights are its own code's (no range), its input's are known
    assert quantity_ranges(["max_weight"], space=None, temperature=(1.0, 1.0), lam=0.0) is None
    assert quantity_ranges(["L", "a", "T"], space=None, temperature=(1.0, 1.0), lam=0.0)


def test_a_constant_no_weight_can_reach_holds_for_every_input_without_a_search():
    res = falsify(load_target("softmax"), "max_weight <= 1e-3**-1", CTX)
    assert not res.falsified and res.examples == 0
    assert res.ranges is not None and res.ranges.verdict == "holds"
    text = summary(res, CTX)
    assert text.startswith("holds for every input (decided by the quantities' ranges)")
    assert "max_weight in [0, 1]" in text and "simplex" in text
    data = result_json(res, CTX)
    assert data["decided_by_ranges"]["verdict"] == "holds"
    assert data["search"]["stopped"] == "ranges"
    json.dumps(data, allow_nan=False)
    assert not any("nothing was checked" in n for n in notes(res))


def test_a_bound_that_fails_everywhere_is_falsified_at_the_first_case():
    res = falsify(load_target("softmax"), "sum_weight < 1", CTX)
    assert res.falsified and res.examples == 1
    assert res.ranges is not None and res.ranges.verdict == "fails"


def test_a_users_normalizer_gets_no_range_for_its_weights():
    # its code may return 5000 or NaN: the bound is searched, not decided
    spec = load_target(USER)
    assert decide_by_ranges(spec, parse_inequality("max_weight <= 1e-3**-1"), CTX, {}) is None
    # a bound on the input alone is decided for any target
    decided = decide_by_ranges(spec, parse_inequality("L >= 1"), CTX, {})
    assert decided is not None and decided.verdict == "holds"


def test_a_builtin_named_by_a_forged_spec_gets_no_range():
    forged = dataclasses.replace(load_target("softmax"), fn=load_target(USER).fn)
    assert decide_by_ranges(forged, parse_inequality("max_weight <= 2"), CTX, {}) is None


@pytest.mark.parametrize("text, params, verdict", [
    ("T > 0", {}, "holds"),  # T ranges over every positive number
    ("T <= 100", {}, None),
    ("T <= 100", {"temperature": 2.0}, "holds"),  # a fixed T
    ("max_weight <= 1", {}, "holds"),
    ("min_weight >= 0", {}, "holds"),
    ("max_weight >= 1/L", {}, None),  # a relation between quantities: intervals cannot see it
    ("lambda <= 0.3", {}, "holds"),  # 0 for a normalizer without λ
    ("lambda >= 0.3", {}, "fails"),
])
def test_what_the_ranges_decide_for_softmax(text, params, verdict):
    ctx = CTX
    if "temperature" in params:
        ctx = dataclasses.replace(CTX, temperature=params["temperature"])
    decided = decide_by_ranges(load_target("softmax"), parse_inequality(text), ctx, params)
    assert (None if decided is None else decided.verdict) == verdict


def test_the_ranges_follow_what_each_builtin_can_return():
    ineq = parse_inequality("sum_weight >= 1")
    assert decide_by_ranges(load_target("dagpam"), ineq, CTX, {}).verdict == "holds"  # affine
    # relu_norm gives zeros on a row with no positive score: its sum is not always 1
    assert decide_by_ranges(load_target("relu_norm"), ineq, CTX, {}) is None
    assert decide_by_ranges(load_target("sigmoid"), parse_inequality("max_weight <= 1"), CTX,
                            {}) is None  # nonnegative: no upper bound declared
    lam = decide_by_ranges(load_target("dagpam"), parse_inequality("lambda <= 0.6"), CTX, {})
    assert lam is not None and lam.verdict == "holds"
