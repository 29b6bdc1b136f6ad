"""The value domain (issue #25) by hand: its ranges per dtype, exact shifts, and the tolerance's
same-precision baseline (docs/THEORY.md, "How close is close"), one test per dtype."""

from __future__ import annotations

import math

import pytest
import torch

from attnverify.checks import PROPERTIES
from attnverify.checks import universal as U
from attnverify.checks.base import Violation
from attnverify.checks.cases import RowCase, far_offsets
from attnverify.checks.reference import BASELINE_FACTOR, baseline_slack, check_matches_reference
from attnverify.coverage import Coverage, expand, runs
from attnverify.normalizers import reference as R
from attnverify.registry import load_target
from attnverify.spec import normalizer_spec
from attnverify.strategies import domain as D
from attnverify.tolerances import tol_for

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
CTX = None  # the checks below take no context


def test_limits_keep_a_row_sum_finite_and_half_types_summed_in_float32():
    assert D.limit(F32) == pytest.approx(torch.finfo(F32).max / 2**16)
    assert D.limit(F64) == pytest.approx(torch.finfo(F64).max / 2**16)
    assert D.limit(BF16) == D.limit(F32)  # computed in float32: float32's headroom
    assert D.limit(F16) == torch.finfo(F16).max / 2  # far below float32's overflow
    assert D.temperature_range(F32) == (1e-6, 1e6)
    lo, hi = D.temperature_range(F16)
    assert lo == pytest.approx(1 / hi) and 30 < hi < 33  # 1/T and T stay inside float16
    assert D.temperature_floor(1e30, F32) == pytest.approx(1e30 / D.limit(F32))
    assert D.decades(F32) == tuple(range(-6, 34))
    assert far_offsets(F32)[:2] == (-6e4, -524288.0) and far_offsets(F16)[0] == -D.limit(F16)


def test_row_offsets_reach_many_decades_and_the_drawn_one_exactly():
    out = D.row_offsets(-1e30, 400, seed=3)
    assert out.shape == (400, 1) and float(out[0, 0]) == -1e30
    assert float(out.abs().max()) <= 1e30 and float(out.abs().min()) >= 1.0
    decades = {math.floor(math.log10(abs(float(v)))) for v in out.flatten()}
    assert len(decades) >= 28 and (out > 0).any() and (out < 0).any()
    assert torch.equal(D.row_offsets(-1e30, 400, 3), out)  # seeded


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64])
def test_exact_shift_is_exact_in_the_dtype(dtype):
    z = torch.tensor([[0.3, -1.7, 2.5, float("-inf")], [1.25, -3.0, 5.0, 1.0]]).to(dtype)
    c = torch.tensor([[-1000.0], [20000.0]], dtype=F64)
    a, b, c2 = D.exact_shift(z, c)
    assert a.dtype == b.dtype == dtype and torch.isneginf(a[0, 3]) and torch.isneginf(b[0, 3])
    live = torch.isfinite(a)
    assert torch.equal((b.double() - a.double())[live], (c2.expand_as(a))[live])
    assert torch.allclose(c2, c, rtol=1e-2)


def test_shift_of_ranges_over_the_dtype_and_keeps_a_row_prefix():
    case = RowCase(torch.zeros(500, 3), None, "gaussian", 7)
    c = U.shift_of(case)
    assert float(c.abs().min()) >= 1e-3 and float(c.abs().max()) <= D.limit(F32)
    decades = {math.floor(math.log10(abs(float(v)))) for v in c.flatten()}
    assert decades >= set(range(-3, 33)), sorted(set(range(-3, 34)) - decades)
    fewer = U.shift_of(case._replace(scores=torch.zeros(2, 3)))
    assert torch.equal(fewer, c[:2])  # dropping rows (shrinking) keeps the others' shifts
    assert torch.equal(U.shift_of(case._replace(shift_scale=0.1)), c * 0.1)


def test_coverage_states_values_decades_rows_far_below_and_shifts():
    cov = Coverage()
    rows = torch.tensor([[-6e4, -6.1e4], [2.0, -0.5], [0.0, 0.0]], dtype=F32)
    cov.add(RowCase(rows, 1e-5, "far_rows", 0))
    block = cov.to_json()
    assert block["values"] == [pytest.approx(-6.1e4), 2.0]
    assert block["far_below"] == 1 and block["magnitudes"] == [2.0, pytest.approx(6.1e4)]
    assert block["decades"] == {"float32": {"+": [[0, 0]], "-": [[4, 4]]}}
    assert block["temperature"] == [1e-5, 1e-5] and block["shifts"] is None
    assert runs({1, 2, 3, 7}) == [[1, 3], [7, 7]] and expand([[1, 3], [7, 7]]) == {1, 2, 3, 7}


# --------------------------------------------------------------------------------------------
# The same-precision baseline, one test per dtype


def _ssmax():
    return load_target("ssmax")


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64])
def test_baseline_is_twice_the_plain_formula_error_in_the_dtype(dtype):
    """ssmax multiplies the scores by s·log n before the softmax: in the dtype that product
    rounds to ``u·|z|``, a plain implementation's error, which the rule allows twice over. The
    allowance is computed by hand here: the reference formula run in the dtype (float32 for
    half types, rounded to the dtype), minus the float64 reference."""
    spec = _ssmax()
    top = min(3000.0, D.limit(dtype) / 4)
    z = (torch.linspace(-1, 1, 7, dtype=F64) + top).to(dtype)[None]
    want = R.ssmax(z)
    slack = baseline_slack(spec, z, None, want)
    if dtype == F64:
        assert torch.equal(slack, torch.zeros_like(want))
        return
    work = F32 if dtype in (F16, BF16) else dtype
    with R.precision(work):
        base = R.ssmax(z.to(work)).to(dtype).double()
    assert base.dtype == F64 and float((base - want).abs().max()) > 0
    assert torch.allclose(slack, BASELINE_FACTOR * (base - want).abs(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64])
def test_a_kernel_within_the_baseline_holds_and_one_past_it_fails(dtype):
    """On rows far from zero, a kernel computing the formula plainly in its dtype (float32 for
    half types) matches the float64 reference; a kernel whose error is three times the
    allowance (tolerance plus baseline) fails, in every dtype."""
    spec = _ssmax()
    top = min(3000.0, D.limit(dtype) / 4)
    z = (torch.linspace(-1, 1, 7, dtype=F64) + top).to(dtype)[None]
    work = F32 if dtype in (F16, BF16) else dtype

    def plain(scores, dim=-1, s=0.43, temperature=1.0):
        with R.precision(work):
            return R.ssmax(scores.to(work), dim, s, temperature).to(scores.dtype)

    honest = normalizer_spec(plain, id="plain_ssmax", params={"s": 0.43, "temperature": 1.0},
                             reference="ssmax")
    case = RowCase(z, None, "gaussian", 0)
    check_matches_reference(honest, case, CTX)
    want = R.ssmax(z)
    allowed = baseline_slack(spec, z, None, want)
    t = tol_for(dtype)
    push = 3 * (allowed + t.atol + t.rtol * want.abs())

    def off(scores, dim=-1, s=0.43, temperature=1.0):
        return (R.ssmax(scores, dim, s, temperature) + push).to(scores.dtype)

    wrong = normalizer_spec(off, id="off_ssmax", params={"s": 0.43, "temperature": 1.0},
                            reference="ssmax")
    with pytest.raises(Violation, match="differ from the reference"):
        check_matches_reference(wrong, case, CTX)


class _OwnReference:
    """A reference the target's own module declared (its worker's proxy has a ``channel``):
    a sloppy one, which a baseline taken from it would turn into a wide tolerance."""

    channel = "worker"

    def __call__(self, scores, dim=-1):
        return torch.softmax(scores.double().half().double(), dim)


def test_the_baseline_never_comes_from_the_target():
    from attnverify.checks.reference import reference_owner

    own = normalizer_spec(lambda s, dim=-1: torch.softmax(s, dim), id="own",
                          reference=_OwnReference())
    assert reference_owner(own) == "target"
    z = torch.tensor([[1000.0, 1000.5, 999.0]])
    assert float(baseline_slack(own, z, None).abs().max()) == 0.0


def test_shift_invariance_is_exact_far_from_zero_for_softmax():
    """softmax in float32 on rows moved by up to 1e30: every pair is exact, so the plain
    tolerance holds (no allowance needed) on the built-in."""
    spec = load_target("softmax")
    rows = torch.randn(6, 9, generator=torch.Generator().manual_seed(1)).to(F32)
    case = RowCase(rows, None, "gaussian", 11)
    assert PROPERTIES["shift_invariant"].check(spec, case, CTX) <= 1.0
