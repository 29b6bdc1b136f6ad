"""falsify's search (issue #18): each mechanism on a hand-computed case.

- the battery's design (lengths, a/T grid, temperatures, masks, two- and three-level rows, ties,
  one-hot-like rows), for any normalizer;
- the loosened Lemma 1 (``max_weight <= exp(a/T)/L``): false from three keys on, found and shrunk
  to three keys; the regression that lost it, at the old budget;
- a bound tight on a whole family of rows is never falsified;
- the strata: one Hypothesis target label each, and on their own they find a witness that needs
  three keys;
- the polish climbs to a violation that lies between the battery's grid points;
- the budget binds, the same seed gives the same search, the time cap stops it.

Every search is seeded (falsify seeds Hypothesis with ``ctx.seed``) and small.
"""

from __future__ import annotations

import dataclasses
import math

import hypothesis
import pytest
import torch

from attnverify import falsify_search as FS
from attnverify.certify import make_context
from attnverify.expr import parse_inequality
from attnverify.falsify import FalsifyCase, evaluate, falsify, make_search
from attnverify.registry import load_target, normalizer_spec

F64 = torch.float64
CI = make_context("ci", seed=0)
LEMMA1_LOOSENED = "max_weight <= exp(a/T)/L"


def budget(ctx, evaluations: int, **changes):
    return dataclasses.replace(ctx, falsify_evaluations=evaluations, **changes)


def softmax_row(values: list[float]) -> list[float]:
    """Softmax by hand (math only)."""
    top = max(values)
    e = [math.exp(v - top) for v in values]
    return [x / sum(e) for x in e]


def live(case: FalsifyCase) -> torch.Tensor:
    return case.scores[torch.isfinite(case.scores)]


# --------------------------------------------------------------------------------------------
# The battery


def test_battery_covers_the_extremal_design():
    search = make_search(load_target("softmax"), parse_inequality("max_weight <= 1"), CI)
    cases = list(FS.battery(search))
    lengths = {int(torch.isfinite(c.scores).sum()) for c in cases}
    assert {1, 2, 3, 4, 5, 8, 16, 64, 256, 1024, 4096} <= lengths
    assert max(c.scores.numel() for c in cases) <= CI.max_length
    ratios = {round(float(live(c).abs().max()) / c.temperature, 9) for c in cases}
    assert min(ratios - {0.0}) <= 1e-3 and max(ratios) >= 1e2  # a/T across 1e-3 … 1e2
    temps = {c.temperature for c in cases}
    assert {1.0} < temps and min(temps) < 1 < max(temps)
    masked = [c for c in cases if not bool(torch.isfinite(c.scores).all())]
    assert {int(torch.isfinite(c.scores).sum()) for c in masked} >= {1, 2, 3, 64, 1024}
    levels = {len(set(live(c).tolist())) for c in cases}
    assert {1, 2, 3} <= levels  # ties, two levels, three levels
    # one-hot-like: one key at +a above L - 1 keys at -a, at a/T = 100 (a margin of 200 T)
    assert any(live(c).tolist() == [100.0] + [-100.0] * 7 for c in cases)
    # three keys, one at +a and two at -a (the loosened Lemma 1's witness), at small a/T
    assert any(live(c).tolist() == [0.001, -0.001, -0.001] for c in cases)


def test_the_battery_is_the_same_for_any_normalizer_and_keeps_a_fixed_temperature():
    spec = normalizer_spec(lambda scores, dim=-1: torch.softmax(scores, dim), id="plain")
    assert not spec.takes_temperature
    ctx = dataclasses.replace(CI, max_length=64)
    plain = list(FS.battery(make_search(spec, parse_inequality("max_weight <= 1"), ctx)))
    assert {c.temperature for c in plain} == {None}
    fixed = dataclasses.replace(ctx, temperature=0.5)
    tempered = list(FS.battery(make_search(load_target("softmax"),
                                           parse_inequality("max_weight <= 1"), fixed)))
    assert {c.temperature for c in tempered} == {0.5}
    # the same rows in units of T: a/T is what the grid fixes
    assert [c.scores.tolist() for c in plain] == [(c.scores / 0.5).tolist() for c in tempered]


def test_entrywise_jacobian_quantities_keep_rows_short():
    search = make_search(load_target("softmax"), parse_inequality("jacobian_entry <= 1"), CI)
    assert search.budget.max_length == FS.JACOBIAN_MAX_L
    assert max(c.scores.numel() for c in FS.battery(search)) <= FS.JACOBIAN_MAX_L
    assert max(s.hi for s in FS.strata(search.budget.max_length)) <= FS.JACOBIAN_MAX_L


# --------------------------------------------------------------------------------------------
# The loosened Lemma 1: a three-key witness


def test_loosened_lemma1_holds_on_two_keys_and_fails_on_three_by_hand():
    spec, ineq = load_target("softmax"), parse_inequality(LEMMA1_LOOSENED)
    for x in (1e-3, 0.1, 0.3, 1.0, 3.0):
        # L = 2: 2·max = 1 + tanh x <= 1 + x <= e^x
        two = evaluate(spec, ineq, FalsifyCase(torch.tensor([x, -x], dtype=F64), 1.0, "", 0), {})
        assert not two.fails and two.lhs == pytest.approx(softmax_row([x, -x])[0], rel=1e-12)
    # L = 3, (x, -x, -x): 3·max = 3/(1 + 2e^{-2x}) > e^x for 0 < x < ln 2
    x = 0.3
    three = evaluate(spec, ineq, FalsifyCase(torch.tensor([x, -x, -x], dtype=F64), 1.0, "", 0), {})
    assert three.fails
    assert three.lhs == pytest.approx(1 / (1 + 2 * math.exp(-2 * x)), rel=1e-12)
    assert three.rhs == pytest.approx(math.exp(x) / 3, rel=1e-12)


def test_loosened_lemma1_is_found_and_shrunk_to_three_keys():
    res = falsify(load_target("softmax"), LEMMA1_LOOSENED, CI)
    assert res.falsified
    w = res.witness
    scores = w.case.scores.tolist()
    assert len(scores) == 3 and all(math.isfinite(v) for v in scores)
    # the witness, re-computed by hand
    t = w.case.temperature
    a = max(abs(v) for v in scores)
    assert w.lhs == pytest.approx(max(softmax_row([v / t for v in scores])), rel=1e-12)
    assert w.rhs == pytest.approx(math.exp(a / t) / 3, rel=1e-12)
    assert w.lhs > w.rhs
    first = res.search.first_witness
    assert int(torch.isfinite(first.case.scores).sum()) >= 3
    assert res.search.stopped == "witness" and res.search.first_witness_phase == "battery"


@pytest.mark.parametrize("target, text, keys", [
    ("softmax", LEMMA1_LOOSENED, 3),  # the report: "not falsified … (L=1)"
    ("sparsemax", "max_weight <= 1/L + a/T", 3),  # the loosened sparsemax bound of the issue
    ("entmax15", "max_weight <= (1/sqrt(L) + a/(2*T))**2", 3),
    ("softmax", "max_weight <= exp(1.5*a/T)/L", 5),  # false only from L = 5 on
    ("ssmax", "max_weight <= exp(2*a/T)/L", 12),  # false only on long rows
])
def test_regression_bounds_false_from_several_keys_are_found_at_the_old_budget(target, text,
                                                                               keys):
    # the search that lost these spent 75 cases (50 examples + 25 explicit rows) and reported
    # "not falsified" with its worst ratio at L = 1; the same budget must now find them
    res = falsify(load_target(target), text, budget(CI, 75))
    assert res.falsified, f"{target}: {text}: worst {res.worst.to_json()}"
    assert res.examples <= 75
    assert int(torch.isfinite(res.witness.case.scores).sum()) >= keys


# --------------------------------------------------------------------------------------------
# A tight true bound


def test_a_bound_tight_on_a_whole_family_is_never_falsified():
    # sparsemax with full support: p_max = 1/L + l_max - mean(l), so on every row (x, -x, …, -x)
    # with full support the bound holds with equality: (0.2, -0.2, -0.2) -> (0.6, 0.2, 0.2)
    text = "max_weight <= 1/L + 2*(a/T)*(1 - 1/L)"
    spec = load_target("sparsemax")
    tight = evaluate(spec, parse_inequality(text),
                     FalsifyCase(torch.tensor([0.2, -0.2, -0.2], dtype=F64), 1.0, "", 0), {})
    assert tight.lhs == pytest.approx(0.6, rel=1e-12) and tight.rhs == pytest.approx(0.6)
    assert not tight.fails
    res = falsify(spec, text, budget(CI, 600))
    assert not res.falsified, res.witness.to_json()
    assert res.worst.ratio == pytest.approx(1.0, abs=1e-12)  # the search sat on equality
    assert res.examples == 600 and res.search.stopped == "budget"


# --------------------------------------------------------------------------------------------
# Strata


def test_each_stratum_is_searched_under_its_own_target_label(monkeypatch):
    labels = []
    real = hypothesis.target

    def spy(observation, *, label=""):
        labels.append(label)
        return real(observation, label=label)

    monkeypatch.setattr(hypothesis, "target", spy)
    search = make_search(load_target("softmax"), parse_inequality("max_weight <= exp(2*a/T)/L"),
                         budget(CI, 14 * 8))
    search.begin("strata")
    FS.run_strata(search, 0, "test")
    names = [r.stratum.name for r in search.records]
    assert len(names) == 14 and set(labels) == set(names)
    for record in search.records:
        assert record.evaluations == 8, record.stratum.name
        assert record.best is not None and record.stratum.holds(
            int(torch.isfinite(record.best.case.scores).sum()),
            not bool(torch.isfinite(record.best.case.scores).all()))


def test_the_strata_alone_find_a_witness_that_needs_three_keys():
    search = make_search(load_target("softmax"), parse_inequality(LEMMA1_LOOSENED),
                         budget(CI, 400))
    search.begin("strata")
    with pytest.raises(FS._Crossed):
        FS.run_strata(search, 0, "test")
    assert int(torch.isfinite(search.witness.case.scores).sum()) >= 3
    assert search.witness.case.kind.startswith("strata:")


# --------------------------------------------------------------------------------------------
# Polish

#: False only at L = 3 and a/T within 0.011 of ln(2)/2: 3/(e^x + 2e^{-x}) peaks at
#: 3/(2√2) = 1.060660 there, above 1.0606; for L != 3 the (L - 3)² term keeps it true.
NARROW = "max_weight*L <= 1.0606*exp(a/T) + (L - 3)**2"


def test_the_polish_climbs_to_a_violation_between_grid_points():
    spec, ineq = load_target("softmax"), parse_inequality(NARROW)
    peak = math.log(2) / 2
    assert 3 / (math.exp(peak) + 2 * math.exp(-peak)) == pytest.approx(3 / (2 * math.sqrt(2)))
    for x in FS.RATIO_GRID:  # every grid point of the battery holds (hand: f(x) < 1.0606)
        assert 3 / (math.exp(x) + 2 * math.exp(-x)) < 1.0606
        row = torch.tensor([x, -x, -x], dtype=F64)
        assert not evaluate(spec, ineq, FalsifyCase(row, 1.0, "", 0), {}).fails
    search = make_search(spec, ineq, budget(CI, 200))
    search.begin("battery")
    search.evaluate(FalsifyCase(torch.tensor([0.3, -0.3, -0.3], dtype=F64), 1.0, "start", 0))
    search.begin("polish")
    with pytest.raises(FS._Crossed):
        FS.run_polish(search)
    w = search.witness
    ratio = float(live(w.case).abs().max()) / w.case.temperature
    # f(x) ≈ f*(1 - (x - x*)²/2) near the peak: f > 1.0606 only for |x - x*| < √(2(1 - 1.0606/f*))
    window = math.sqrt(2 * (1 - 1.0606 * 2 * math.sqrt(2) / 3))
    assert abs(ratio - peak) < window and w.case.scores.numel() == 3
    assert search.by_phase["polish"] < 200


def test_falsify_finds_the_narrow_violation_after_the_battery_misses_it():
    res = falsify(load_target("softmax"), NARROW, CI)
    assert res.falsified and res.search.first_witness_phase in ("strata", "polish")
    assert res.search.by_phase["battery"] > 0 and res.witness.case.scores.numel() == 3


# --------------------------------------------------------------------------------------------
# Budget, determinism, time cap, longest row


def test_the_budget_binds_and_the_same_seed_gives_the_same_search():
    ctx = budget(CI, 300, max_length=64)
    spec = load_target("softmax")
    one = falsify(spec, "max_weight <= exp(2*a/T)/L", ctx)
    two = falsify(spec, "max_weight <= exp(2*a/T)/L", ctx)
    assert one.examples == two.examples == sum(one.search.by_phase.values()) == 300
    assert set(one.search.by_phase) == {"battery", "strata", "polish"}
    assert [r.to_json() for r in one.search.strata] == [r.to_json() for r in two.search.strata]
    assert torch.equal(one.worst.case.scores, two.worst.case.scores)
    assert max(r.stratum.hi for r in one.search.strata) <= 64
    other = falsify(spec, "max_weight <= exp(2*a/T)/L", dataclasses.replace(ctx, seed=1))
    assert other.examples == 300  # another seed: another Hypothesis draw, same budget


def test_the_time_cap_stops_the_search():
    ctx = dataclasses.replace(CI, budget_s=1e-6)
    # (a bound the quantities' ranges cannot decide: "max_weight <= 1" needs no search)
    res = falsify(load_target("softmax"), "max_weight <= exp(2*a/T)/L", ctx)
    assert not res.falsified and res.search.stopped == "time" and res.examples <= 1


def test_a_witness_found_under_a_fixed_temperature_keeps_it():
    res = falsify(load_target("softmax"), LEMMA1_LOOSENED, CI, params={"temperature": 0.25})
    assert res.falsified and res.witness.case.temperature == 0.25
    assert all(ev.case.temperature == 0.25 for ev in (res.worst, res.search.first_witness))


def test_shrinking_keeps_one_digit_values_as_written():
    # 0.3/0.1 is 2.9999999999999996 in floating point: truncating it made 0.3 "shrink" to 0.2
    # and turned the two-level witness (0.3, -0.3, -0.3) into (0.2, -0.3, -0.3)
    from attnverify.checks.shrink import _one_digit, _simpler

    assert _one_digit(0.3) == 0.3 and _simpler(0.3) == [0.0]
    assert _one_digit(0.35) == 0.3 and _one_digit(-0.0999) == -0.09 and _one_digit(123.4) == 100
    res = falsify(load_target("softmax"), LEMMA1_LOOSENED, CI)
    scores = res.witness.case.scores.tolist()
    a = max(abs(v) for v in scores)
    assert sorted(scores) == [-a, -a, a]  # one key at +a, two at -a


# --------------------------------------------------------------------------------------------
# The margin: bounds whose right-hand side is <= 0

#: Softmax at (x, -x): max - min = tanh x, above the line 0.8056 + 0.0707 x only for x in about
#: [1.55, 2.59]. Written with min - max on the left, both sides are negative.
BAND_NEGATIVE = "min_weight - max_weight >= -0.8056 - 0.0707*a/T"


def _band_gap(x: float) -> float:
    """By hand: how far (x, -x) breaks BAND_NEGATIVE (positive: broken)."""
    return math.tanh(x) - (0.8056 + 0.0707 * x)


def test_the_margin_rises_towards_a_violation_whatever_the_signs():
    spec, ineq = load_target("softmax"), parse_inequality(BAND_NEGATIVE)
    margins = []
    for x in (0.5, 0.8, 1.1, 1.4, 2.0):
        ev = evaluate(spec, ineq, FalsifyCase(torch.tensor([x, -x], dtype=F64), 1.0, "", 0), {})
        assert ev.rhs < 0 and ev.lhs < 0 and math.isnan(ev.ratio)  # no meaningful ratio
        assert ev.fails == (_band_gap(x) > 0)
        margins.append(ev.margin)
    assert margins == sorted(margins) and margins[-1] > 0 > margins[-2]  # rises into the band
    # the same bound with positive sides (max - min <= line) has the same sign of margin
    flipped = parse_inequality("max_weight - min_weight <= 0.8056 + 0.0707*a/T")
    ev = evaluate(spec, flipped, FalsifyCase(torch.tensor([2.0, -2.0], dtype=F64), 1.0, "", 0), {})
    assert ev.fails and ev.margin > 0 and ev.ratio > 1


def test_a_bound_with_a_nonpositive_right_side_is_found():
    res = falsify(load_target("softmax"), BAND_NEGATIVE, CI)
    assert res.falsified, res.worst.to_json()
    w = res.witness
    live_row = live(w.case).tolist()
    assert len(live_row) == 2
    x = (max(live_row) - min(live_row)) / 2 / w.case.temperature
    assert _band_gap(x) > 0  # by hand (a two-key row's weights depend on the gap only)
    assert w.margin > 0 and math.isnan(w.ratio) and w.to_json()["ratio"] is None


# --------------------------------------------------------------------------------------------
# The polish splits ties

#: sparsemax at (x, -x): one key in the support once 2x >= 1, so n_support = 1 < 1.02/(2x) for
#: x in [0.5, 0.51); the tie (support 2 = L) holds with equality, and so does every row whose
#: tied keys move together.
SUPPORT_BAND = "n_support >= min(L, 1.02*T/(2*a))"


def test_the_polish_splits_a_tie_and_finds_a_narrow_band():
    spec, ineq = load_target("sparsemax"), parse_inequality(SUPPORT_BAND)
    for x in FS.RATIO_GRID:  # the battery's grid misses the band
        assert not 0.5 <= x < 0.51
    search = make_search(spec, ineq, budget(CI, 300))
    search.begin("battery")
    tie = search.evaluate(FalsifyCase(torch.tensor([1.0, 1.0], dtype=F64), 1.0, "start", 0))
    # n_support = 2 >= min(2, 0.51): holds; every tie holds (its keys move together)
    assert not tie.fails and tie.values["n_support"] == 2 and FS.near_tie(tie.case)
    starts = FS.polish_starts(search)
    # the tie itself is not polished: its split, from the tie's level and from +-a
    assert [s.kind for s in starts] == ["polish:split_1", "polish:spread_1"]
    search.begin("polish")
    with pytest.raises(FS._Crossed):
        FS.run_polish(search)
    w = search.witness
    assert w.case.kind in ("polish:split_1", "polish:spread_1")
    values = sorted(live(w.case).tolist())
    x = (values[1] - values[0]) / 2 / w.case.temperature
    assert 0.5 <= x < 0.51  # by hand: support 1 and 1.02/(2x) > 1
    assert w.values["n_support"] == 1 and search.by_phase["polish"] < 300


def test_splits_cover_k_of_one_half_and_all_but_one():
    row = torch.zeros(8, dtype=F64)
    kinds = [kind for kind, _, _ in FS.splits(FalsifyCase(row, 1.0, "", 0))]
    assert kinds == [f"polish:{how}_{k}" for k in (1, 4, 7, 2) for how in ("split", "spread")]
    groups = FS.splits(FalsifyCase(row, 1.0, "", 0))[2][1]
    assert int((groups == 0).sum()) == 4  # k = L/2 keys up


# --------------------------------------------------------------------------------------------
# Temperatures far from 1, heavy padding, narrow bands

def test_the_battery_reaches_low_and_high_temperatures_and_heavy_padding():
    search = make_search(load_target("softmax"), parse_inequality("max_weight <= 1"), CI)
    cases = list(FS.battery(search))
    temps = {c.temperature for c in cases}
    assert {0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0} <= temps
    pads = {(c.scores.numel() - int(torch.isfinite(c.scores).sum()),
             int(torch.isfinite(c.scores).sum())) for c in cases}
    for length in (1, 2, 3, 16, 64):
        assert {(1, length), (length, length), (3 * length, length),
                (15 * length, length)} <= pads, length
    # the sweeps come first: every (length, a/T) pair, then every (length, T) and (length,
    # padding) pair, within the first few hundred cases
    first = cases[:len(list(FS.sweeps(search)))]
    assert {c.temperature for c in first} >= temps
    assert max(float(live(c).abs().max()) / c.temperature for c in cases) == 300.0


def test_a_low_temperature_witness_is_found():
    # L*max_weight <= exp(7*a/sqrt(T)): (x, -x, ..., -x) at L keys gives L/(1 + (L-1)e^{-2x})
    # ~ 1 + 2x(L-1)/L against ~ 1 + 7 sqrt(T) x: false only for T < (2(L-1)/(7L))^2 < 0.082
    text = "L*max_weight <= exp(7*a/sqrt(T))"
    res = falsify(load_target("softmax"), text, CI)
    assert res.falsified
    w = res.witness
    t, row = w.case.temperature, live(w.case).tolist()
    assert t < 0.082
    lhs = len(row) * max(softmax_row([v / t for v in row]))
    assert lhs > math.exp(7 * max(abs(v) for v in row) / math.sqrt(t))  # by hand
    # at T = 0.1 and 1 (the old battery's) it holds on the same rows
    for other in (0.1, 1.0):
        scaled = [v / t * other for v in row]
        ev = evaluate(load_target("softmax"), parse_inequality(text),
                      FalsifyCase(torch.tensor(scaled, dtype=F64), other, "", 0), {})
        assert not ev.fails


def test_a_heavily_padded_witness_is_found():
    # entropy >= log(L_padded) - 2a/T - 1 holds without padding (H >= log L - 2a/T) and fails
    # only once log(L_padded/L) > 1 + 2a/T + log L - H: more than e·L keys in the row
    text = "entropy >= log(L_padded) - 2*a/T - 1"
    res = falsify(load_target("softmax"), text, CI)
    assert res.falsified
    w = res.witness
    n, padded = int(torch.isfinite(w.case.scores).sum()), w.case.scores.numel()
    assert padded > math.e * n
    p = softmax_row([v / w.case.temperature for v in live(w.case).tolist()])
    entropy = -sum(x * math.log(x) for x in p if x > 0)
    a = float(live(w.case).abs().max())
    assert entropy < math.log(padded) - 2 * a / w.case.temperature - 1  # by hand


def _sparsemax(z):
    srt = sorted(z, reverse=True)
    k, csum = 0, 0.0
    for i, v in enumerate(srt, 1):
        if 1 + i * v > csum + v:
            k, csum = i, csum + v
    tau = (csum - 1) / k
    return [max(v - tau, 0.0) for v in z]


def test_a_narrow_band_on_long_rows_is_found():
    # sparsemax, k = L/2 keys at +x and L/2 at -x with full support (x < 1/L): sum p^2 =
    # 1/L + L x^2, above 1/L + 0.99 L x^2 + 1/L^2 only once 0.01 L x^2 > 1/L^2: x in
    # (10/L^1.5, 1/L), a band that exists only for L > 100 (L = 256: 0.0024 < x < 0.0039)
    text = "sum_sq_weight <= 1/L + 0.99*L*(a/T)**2 + 1/L**2"
    res = falsify(load_target("sparsemax"), text, CI)
    assert res.falsified
    w = res.witness
    row = [v / w.case.temperature for v in live(w.case).tolist()]
    n, x = len(row), max(abs(v) for v in row)
    assert n > 100
    p = _sparsemax(row)
    assert sum(v * v for v in p) > 1 / n + 0.99 * n * x * x + 1 / n**2  # by hand


# --------------------------------------------------------------------------------------------
# The search's bookkeeping (issue #27): each case's signature computed once, in numpy, on one
# torch thread


def _torch_signature(case: FalsifyCase) -> tuple:
    """The signature as the search computed it with torch ops (the reference)."""
    live_ = case.scores[torch.isfinite(case.scores)]
    head = (int(live_.numel()), int(case.scores.numel()))
    top = float(live_.abs().max()) if live_.numel() else 0.0
    if top == 0.0:
        return head + ("zero",)
    head += (round(math.log10(FS.scale_of(case))),)
    levels, counts = torch.unique(torch.round(live_ / top * 10.0), return_counts=True)
    if len(levels) > 6:
        return head + ("many",)
    return head + tuple(zip(levels.tolist(), counts.tolist()))


def _signature_rows() -> list[FalsifyCase]:
    gen = torch.Generator().manual_seed(27)
    inf = math.inf
    rows = [[0.0], [0.0, 0.0, -inf], [-inf, -inf], [3.0], [1.0, -1.0, -1.0], [0.05, -0.05, 0.0],
            [2.5, 2.5, -2.5, -inf, -inf], [-0.35, 0.25, 0.15, 0.05], [1e-300, -1e-300],
            [1e300, 0.0, -1e300], [0.0, -0.0, 1.0]]
    rows += [(torch.randn(n, generator=gen, dtype=F64) * s).tolist()
             for n in (2, 7, 64, 4096) for s in (1e-3, 1.0, 300.0)]
    rows += [[1.0] * k + [-1.0] * (n - k) + [-inf] * p
             for n, k, p in ((16, 1, 0), (256, 128, 3), (4096, 4095, 4096))]
    return [FalsifyCase(torch.tensor(r, dtype=F64), t, "test", 0)
            for r in rows for t in (None, 0.01, 1.0, 30.0)]


def test_signature_is_the_torch_reference_on_every_kind_of_row():
    for case in _signature_rows():
        assert FS.signature(case) == _torch_signature(case), case.scores[:8]


def _consider_by_sorting(top: list, ev) -> None:
    """Keep ``ev`` among the stratum's best distinct cases ``top`` as a full sort of ``top`` did,
    signatures recomputed each time (the reference)."""
    if ev.undefined:
        return
    same = next((i for i, other in enumerate(top)
                 if _torch_signature(other.case) == _torch_signature(ev.case)
                 or FS._level(other) == FS._level(ev)), None)
    if same is not None:
        if FS._key(ev) <= FS._key(top[same]):
            return
        del top[same]
    top.append(ev)
    top.sort(key=lambda e: -FS._key(e))
    del top[FS.TOP_PER_STRATUM:]


def test_a_stratum_keeps_the_same_best_cases_as_a_full_sort():
    gen = torch.Generator().manual_seed(5)
    cases = [c for c in _signature_rows() if c.scores.numel() <= 300]
    record, expected = FS.StratumRecord(FS.Stratum(1, 10**6)), []
    for i in range(300):
        case = cases[int(torch.randint(len(cases), (1,), generator=gen))]
        # margins on a coarse grid: ties of merit between distinct shapes happen often
        m = float(torch.randint(-8, 1, (1,), generator=gen)) / 8.0
        undefined = i % 37 == 0
        ev = FS.Evaluation(case, {}, 0.0, 0.0, math.nan, False, undefined=undefined,
                           margin=math.nan if undefined else m - 1e-3)
        record.consider(ev)
        _consider_by_sorting(expected, ev)
        assert [id(e) for e in record.top] == [id(e) for e in expected], i
        assert record.signatures == [_torch_signature(e.case) for e in record.top]
    assert record.evaluations == 300 and len(expected) == FS.TOP_PER_STRATUM


def test_the_search_runs_on_one_torch_thread_and_restores_the_count(monkeypatch):
    seen = []
    real = FS.evaluate

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(FS, "evaluate", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        falsify(load_target("softmax"), LEMMA1_LOOSENED, budget(CI, 20))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
