"""The derivative properties over the whole value domain (issue #25, item 6): the rule that
makes central differences honest far from zero, the rows it cannot judge, and a backward wrong
only far below zero that the widened ``gradient`` catches.

Far from zero the points ``z ± h·v`` round to the dtype's grid, by up to ``eps·|z|``: a step
error of ``eps·|z|/h`` that the old rule took as the derivative's own (a false alarm on
``softmax`` at ``|z| ≈ 4e6``, below). The differences now step along a direction on the grid
(:func:`attnverify.checks.gradient._on_grid`), every point exact; a row where no entry of the
direction survives (``eps·|z|`` above the smallest step) is not judged, and counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnverify.certify import make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.checks import gradient as G
from attnverify.checks.cases import RowCase
from attnverify.coverage import Coverage, describe, recording
from attnverify.registry import load_target

FILE = str(Path(__file__).parent / "fixtures" / "planted_far_gradient.py")
CTX = make_context("ci", seed=0)
DEV = make_context("dev", seed=0)
F64, F32 = torch.float64, torch.float32
#: A softmax row at -3.7e6 (T = 0.2889, seed 3): the old rule (points rounded to float64's
#: grid, spacing 4.7e-10 next to a step of 2.9e-6) reported reverse mode -0.956031421 against
#: central differences -0.95597636, an excess of 1.00007 over its allowance.
FAR64 = ([[-3714936.0, -3714936.75], [-3714935.5, -3714936.25]], 0.2889, 3)
#: Rows at -2e4, T = 1 (seed 1): float32 scores whose derivatives float32 still resolves
#: (``|z|/T = 2e4``: rounding the scores moves the map by ``FLOOR·2e4`` = 0.2 of the
#: derivative's size at most).
FAR32 = ([[-20000.0, -20000.25, -20000.5], [-20000.5, -20000.0, -20001.0]], 1.0, 1)


def _check(name, rows, temperature, seed, dtype, check=G.check_gradient):
    coverage = Coverage()
    with recording(coverage):
        ratio = check(load_target(name), RowCase(torch.tensor(rows, dtype=dtype), temperature,
                                                 "gaussian", seed), CTX)
    return ratio, coverage.judged


def test_points_far_from_zero_are_exact_on_the_grid():
    """Every point the differences take is ``z ± h·m·v`` for the direction returned, to
    within :data:`G.STEP_ERROR` (hand check: at ``|z| = 3.7e6`` float64's spacing is 4.7e-10
    and a raw step ``1e-3·h`` = 2.9e-9 is not a whole number of it)."""
    z = torch.tensor(FAR64[0], dtype=F64)
    step = G._step(z, FAR64[1])
    u, v = G._directions(z, FAR64[2], 2, F64, every=(0,))
    raw = (z + step * 1e-3 * v) - z
    assert not torch.equal(raw, step * 1e-3 * v)  # the old points: rounded off the step
    grid = G._on_grid(z, v, step, G.EXACT)
    # whole numbers of 4.7e-10 / 2.9e-9 = 0.16: each entry within 0.08 of the drawn one
    assert bool((grid != 0).any(-1).all()) and float((grid - v).abs().max()) <= 0.085
    for m in (1.0, 0.1, 1e-2, 1e-3):
        for sign in (1.0, -1.0):
            moved = (z + sign * step * m * grid) - z
            assert float((moved - sign * step * m * grid).abs().max()) <= \
                1e-12 * float((step * m * grid).abs().max())


@pytest.mark.parametrize(("case", "dtype"), [(FAR64, F64), (FAR32, F64), (FAR32, F32)],
                         ids=["far64-float64", "far32-float64", "far32-float32"])
def test_far_rows_are_judged_tightly_where_the_old_rule_false_alarmed(case, dtype):
    rows, temperature, seed = case
    ratio, (judged, total) = _check("softmax", rows, temperature, seed, dtype)
    # the old rule: 1.00007 on FAR64 in float64
    assert ratio < 1e-3 and judged == total == 2, (ratio, judged, total)
    ratio, (judged, total) = _check("softmax", rows, temperature, seed, dtype,
                                    G.check_double_backward)
    assert ratio < 1e-2 and judged == total == 2, (ratio, judged, total)


def test_float32_rows_whose_scores_round_by_their_derivative_are_not_judged():
    """FAR64 as float32 scores: ``|z|/T = 1.3e7``, where float32 rounds ``z/T`` by about 1, as
    much as the derivative itself (the allowance ``FLOOR·(1 + |z|/s)`` is 128 times the
    derivative's size): compared, but counted as not judged (the old rule passed it silently,
    ratio 3e-8)."""
    ratio, (judged, total) = _check("softmax", *FAR64, F32)
    assert (judged, total) == (0, 2) and ratio < 1


@pytest.mark.parametrize("dtype", [F64, F32])
def test_rows_beyond_the_resolution_are_counted_not_judged(dtype):
    """At ``|z|/T = 1e10`` the smallest step (``1e-8``) is far below float64's spacing
    (``2e-6``): the differences cannot resolve the derivative, and the row is not judged (the
    old rule called central differences 0 and reverse mode wrong)."""
    rows = [[-1e10, -1e10 - 2.0, -1e10 + 1.0]]
    ratio, (judged, total) = _check("softmax", rows, 1.0, 0, dtype)
    assert (judged, total) == (0, 1) and ratio == 0.0
    line = describe({"cases": 1, "judged_rows": [judged, total]})
    assert "derivatives judged on 0 of 1 rows" in line


def test_backward_wrong_far_below_zero_is_right_near_zero():
    spec = load_target(f"{FILE}:finite_init_backward_softmax")
    near = RowCase(torch.tensor([[0.3, -1.0, 2.0], [5.0, 4.0, -2.0]], dtype=F64), 1.0,
                   "gaussian", 0)
    assert G.check_gradient(spec, near, CTX) < 1e-3
    for dtype, offset in ((F64, -2e4), (F32, -1.05e4)):
        far = RowCase(torch.tensor([[0.3, -1.0, 2.0]], dtype=F64).add(offset).to(dtype), 1.0,
                      "gaussian", 0)
        with pytest.raises(G.Violation, match="reverse mode is 0 but central differences"):
            G.check_gradient(spec, far, CTX)


def test_widened_gradient_catches_the_far_backward_and_certifies_the_control():
    """The ``gradient`` property at dev (seed 0) reaches rows far below zero: the planted
    backward fails it (the narrow domain before issue #25's item 6 certified it), and the
    control that computes by online blocks with a correct backward holds."""
    res = run_property(PROPERTIES["gradient"], load_target(
        f"{FILE}:finite_init_backward_softmax"), DEV)
    assert res.status == "violated", res.message
    ok = load_target(f"{FILE}:online_backward_softmax")
    for prop in ("gradient", "double_backward"):
        res = run_property(PROPERTIES[prop], ok, DEV)
        assert res.status == "holds", (prop, res.message)
        judged, total = res.coverage["judged_rows"]
        assert 0.9 * total <= judged < total  # the rows beyond the resolution are counted


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_far_below_zero_agree_with_float64(dtype):
    """Hand case: a half-precision softmax row at -3e4 (float16's spacing there is 16, so the
    row is [-30000, -30016, -29984] exactly) agrees with the float64 weights of the same scores
    at T = 1 and at T = 3 (z/T rounded once: the rule's ``slack_T``); the weights are those of
    logit gaps of 16 and 32, nearly one-hot."""
    from attnverify.checks import universal as U

    scores = torch.tensor([[-30000.0, -30016.0, -29984.0]], dtype=dtype)
    for temperature in (1.0, 3.0):
        case = RowCase(scores, temperature, "gaussian", 0)
        assert U.check_low_precision(load_target("softmax"), case, CTX) <= 1
