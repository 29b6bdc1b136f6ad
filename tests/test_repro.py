"""Counterexamples that reproduce: the reported case is the exact input that failed (masks, batch,
temperature, dtype, params), shrunk to the fewest rows, keys and simplest values; its repro line,
run as printed, exits 1 with the violation message, and 0 on a fixed normalizer. One JSON number
encoding, one temperature.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
import torch

from attnverify import cli, serialize
from attnverify.certify import certify_target, fix_temperature, make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.checks.cases import CASE_TYPES, RowCase
from attnverify.errors import UsageError
from attnverify.registry import load_target

PLANTED = str(Path(__file__).parent / "fixtures" / "planted.py")
CTX = make_context("dev", seed=0)


def failing(attr: str, prop: str, claims=("simplex",), ctx=CTX) -> dict:
    """The JSON result of one property that fails on a planted defect, run as certify runs it."""
    spec = load_target(f"{PLANTED}:{attr}").with_claims(claims)
    r = run_property(PROPERTIES[prop], spec, ctx)
    assert r.status in ("violated", "error"), (attr, prop, r.status, r.message)
    return r.to_json()


def run_line(capsys, line: str) -> tuple[int, str]:
    """Run a printed repro line as a shell would split it (in this process, for speed)."""
    argv = shlex.split(line)
    assert argv[:2] == ["attnverify", "repro"], line
    capsys.readouterr()
    code = cli.main(argv[1:])
    return code, capsys.readouterr().out


def test_nan_on_a_masked_key_is_one_row_of_two_keys_and_reproduces(capsys):
    r = failing("nan_on_mask_softmax", "mask_zero")
    ce = r["counterexample"]
    assert ce["shape"] == [1, 2] and len(ce["scores"]) == 1
    assert sorted(map(str, ce["scores"][0])) == ["-inf", "0.0"]  # one live key, one masked
    code, out = run_line(capsys, ce["repro"])
    assert code == 1 and "a masked key got weight nan" in out
    fixed = ce["repro"].replace(f"{PLANTED}:nan_on_mask_softmax", f"{PLANTED}:torch_softmax")
    assert run_line(capsys, fixed)[0] == 0


def test_the_counterexample_is_the_input_fed_not_the_generated_row(capsys):
    # mask_zero masks keys of the generated row itself: the report must show those masks
    ce = failing("mask_leak_softmax", "mask_zero")["counterexample"]
    assert any(v == "-inf" for row in ce["scores"] for v in row), ce["scores"]
    code, out = run_line(capsys, ce["repro"])
    assert code == 1 and "VIOLATED" in out and "mask_zero" in out


def test_fully_masked_row_reports_the_masked_batch(capsys):
    ce = failing("torch_softmax", "fully_masked_row", claims=("fully_masked_row",))[
        "counterexample"]
    assert all(v == "-inf" for v in ce["scores"][0]) and ce["shape"][0] == 1
    code, out = run_line(capsys, ce["repro"])
    assert code == 1 and "fully masked row gave nan" in out


def test_batch_coupling_reports_the_batch_around_the_row(capsys):
    ce = failing("batch_coupled_softmax", "batch_independent")["counterexample"]
    assert ce["shape"][0] == 2  # the row, and the one row that changes it
    assert run_line(capsys, ce["repro"])[0] == 1


def test_battery_failures_are_shrunk(capsys):
    # rows summing to 1.001: any input shows it; the smallest is one key of value 0
    ce = failing("row_sum_off_softmax", "simplex")["counterexample"]
    assert ce["scores"] == [[0.0]] and ce["shape"] == [1, 1]
    code, out = run_line(capsys, ce["repro"])
    assert code == 1 and "row sum 1.001" in out


def test_a_raising_normalizer_reproduces_as_an_error(capsys):
    r = failing("overflow_softmax", "finite")
    code, out = run_line(capsys, r["counterexample"]["repro"])
    assert code == 1 and ("VIOLATED" in out or "ERROR" in out)


def test_infinite_worst_ratio_is_encoded_like_every_other_infinity():
    r = failing("wrong_shape", "shape", claims=())
    assert r["worst_ratio"] == "inf" and r["counterexample"]["ratio"] == "inf"
    json.dumps(r, allow_nan=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(2, 3), (3, 2000)])
def test_tensors_round_trip_exactly(dtype, shape):
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dtype)
    t[0, 0], t[-1, -1] = -math.inf, math.inf
    enc = serialize.encode_tensor(t)
    assert isinstance(enc, list) == (t.numel() <= serialize.MAX_LIST)
    back = serialize.decode_tensor(json.loads(json.dumps(enc)), dtype, list(shape))
    assert back.dtype == dtype and torch.equal(back, t)


def test_cases_round_trip_through_json():
    case = RowCase(torch.tensor([[0.5, -math.inf]], dtype=torch.bfloat16), 0.25, "masked", 3)
    data = json.loads(json.dumps(serialize.encode_case(case, {"temperature": 1.0})))
    back = serialize.decode_case(data, CASE_TYPES)
    assert torch.equal(back.scores, case.scores) and back.scores.dtype == torch.bfloat16
    assert back[1:] == case[1:] and data["params"] == {"temperature": 1.0}


def test_numbers_have_one_encoding():
    assert [serialize.number(v) for v in (1.5, math.inf, -math.inf)] == [1.5, "inf", "-inf"]
    assert serialize.number(math.nan) == "nan" and math.isnan(serialize.read_number("nan"))
    assert serialize.jsonable({"a": (math.inf, 2)}) == {"a": ["inf", 2]}


def test_a_huge_case_goes_to_a_file_named_in_the_line(tmp_path, monkeypatch):
    monkeypatch.setattr(serialize.tempfile, "tempdir", str(tmp_path))
    big = {"case": "RowCase", "scores": {"b64": "x" * (serialize.MAX_INLINE_CHARS + 1)}}
    line = serialize.repro_command("softmax", big, property="simplex")
    path = shlex.split(line)[-1]
    assert len(line) < 1000 and json.loads(Path(path).read_text()) == big
    assert Path(path).parent.parent == tmp_path


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["repro", "softmax", "--case", "{}"], "exactly one of --property"),
        (["repro", "softmax", "--property", "simplex", "--case", "{nope"], "not valid JSON"),
        (["repro", "softmax", "--property", "bogus", "--case",
          '{"case": "RowCase", "scores": [[0.0]], "temperature": null, "kind": "", "seed": 0}'],
         "unknown property id 'bogus'"),
        (["repro", "softmax", "--property", "simplex", "--case", '{"case": "Nope"}'],
         "\"case\" one of"),
        (["repro", "softmax", "--property", "simplex", "--case", "/nonexistent/case.json"],
         "cannot read"),
        (["certify", "softmax", "--params", "temperature=-1"], "--params temperature=-1"),
        (["certify", "softmax", "--params", "temperature=inf"], "positive, finite"),
        (["falsify", "softmax", "L >= 1", "--params", "temperature=0"], "--params temperature=0"),
    ],
)
def test_bad_input_is_exit_2_one_line(capsys, argv, fragment):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_fixed_temperature_reaches_every_check():
    # the normalizer raises at any temperature but 0.5: with --params temperature=0.5 every
    # property (bounds at T included) runs it at 0.5 and holds
    spec = load_target(f"{PLANTED}:only_at_half_temperature", {"temperature": 0.5})
    ctx = fix_temperature(make_context("dev", max_examples=3), {"temperature": 0.5})
    claims = ["simplex", "fd_gradient", "jacobian_spectral_half", "cor3_entrywise",
              "lemma3_l1_uniform", "cor1_softmax_weight_bounds", "shift_invariant"]
    res = certify_target(spec, claims, ctx)
    bad = {r.property: r.message for r in res.results if r.status in ("violated", "error")}
    assert not bad, bad


def test_fd_gradient_holds_at_a_fixed_temperature():
    # was a false violation: the normalizer ran at the --params T and the estimator divided by T
    spec = load_target("softmax", {"temperature": 0.5})
    ctx = fix_temperature(make_context("dev", max_examples=5), {"temperature": 0.5})
    r = run_property(PROPERTIES["fd_gradient"], spec, ctx)
    assert r.status == "holds", r.message


def test_fix_temperature_validates():
    ctx = make_context("dev")
    assert fix_temperature(ctx, {}) is ctx
    assert fix_temperature(ctx, {"temperature": 2}).temperature == 2.0
    with pytest.raises(UsageError, match="--attnverify-params temperature='x'"):
        fix_temperature(ctx, {"temperature": "x"}, option="--attnverify-params")


def test_a_reference_mismatch_reproduces_with_its_reference(capsys):
    spec = load_target("softmax").with_reference(f"{PLANTED}:row_sum_off_softmax")
    r = run_property(PROPERTIES["matches_reference"], spec, CTX).to_json()
    line = r["counterexample"]["repro"]
    assert "--reference" in line and r["counterexample"]["scores"] == [[0.0]]
    code, out = run_line(capsys, line)
    assert code == 1 and "differ from the reference" in out


def test_shrink_keeps_the_mask_the_failure_needs_and_simplifies_the_rest():
    from attnverify.checks.base import Violation
    from attnverify.checks.shrink import shrink

    def fails_with_a_masked_key_beside_a_live_one(case):
        z = case.scores
        if bool(((z == -math.inf).any(-1) & torch.isfinite(z).any(-1)).any()):
            raise Violation("masked key beside a live one", observed=1, bound=0, ratio=math.inf)

    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 9, generator=g) * 7
    z[1, 4] = -math.inf
    case = RowCase(z, 0.3, "masked", 0)
    with pytest.raises(Violation) as first:
        fails_with_a_masked_key_beside_a_live_one(case)
    small, exc = shrink(fails_with_a_masked_key_beside_a_live_one, case, first.value)
    assert sorted(small.scores.flatten().tolist()) == [-math.inf, 0.0]
    assert small.scores.shape == (1, 2) and small.temperature == 1.0
    assert isinstance(exc, Violation)


def test_a_case_file_reproduces_like_the_inline_case(capsys, tmp_path):
    ce = failing("nan_on_mask_softmax", "mask_zero")["counterexample"]
    inline = shlex.split(ce["repro"])
    path = tmp_path / "case.json"
    path.write_text(inline[-1])
    code = cli.main([*inline[1:-1], str(path)])
    assert code == 1 and "a masked key got weight nan" in capsys.readouterr().out


def test_shrink_never_leaves_the_domain_by_masking_a_whole_row():
    """A NaN-on-any-masked-key failure also fails on an all-masked row; the shrunk case must
    still have a live key (a normalizer that does not claim fully_masked_row need not handle
    one), unless the failing case itself had a fully masked row."""
    from attnverify.checks.base import Violation
    from attnverify.checks.shrink import shrink

    def fails_on_any_masked_key(case):
        if bool((case.scores == -math.inf).any()):
            raise Violation("nan", observed=1, bound=0, ratio=math.inf)

    z = torch.tensor([[0.5, -math.inf, 2.0]])
    with pytest.raises(Violation) as first:
        fails_on_any_masked_key(RowCase(z, None, "masked", 0))
    small, _ = shrink(fails_on_any_masked_key, RowCase(z, None, "masked", 0), first.value)
    assert sorted(small.scores.flatten().tolist()) == [-math.inf, 0.0]
    all_masked = torch.full((2, 3), -math.inf)
    small, _ = shrink(fails_on_any_masked_key, RowCase(all_masked, None, "fully_masked", 0),
                      first.value)
    assert small.scores.tolist() == [[-math.inf]]


def test_shrink_moves_a_far_row_to_the_smallest_failing_magnitude_in_a_few_rechecks():
    """A failure above a magnitude (here 1e5), met on a row at 1e300: the shrunk row lies within
    a decade of that threshold, found by bisecting the decades (about ten re-checks), not by
    moving a tenth nearer per re-check (three hundred)."""
    from attnverify.checks.base import Violation
    from attnverify.checks.shrink import shrink

    calls = []

    def fails_far_from_zero(case):
        calls.append(case)
        if float(case.scores.abs().max()) > 1e5:
            raise Violation("too large", observed=1, bound=0, ratio=math.inf)

    z = torch.tensor([[1e300, 3e300]], dtype=torch.float64)
    with pytest.raises(Violation) as first:
        fails_far_from_zero(RowCase(z, None, "far_rows", 0))
    calls.clear()
    small, exc = shrink(fails_far_from_zero, RowCase(z, None, "far_rows", 0), first.value)
    assert isinstance(exc, Violation)
    assert 1e5 < float(small.scores.abs().max()) <= 1e7, small.scores
    assert len(calls) <= 40, len(calls)


def test_hypothesis_shrink_stops_at_its_budget_and_says_so(monkeypatch, capsys):
    """A failing unit's Hypothesis shrink draws at most ``SHRINK_CALLS`` cases (this one needs
    about 28 to finish): stopped there, the smallest failure it reached is shrunk further by
    attnverify's shrinker, reported minimal with a repro that fails, and the counterexample and
    the console say the shrink was stopped."""
    from attnverify import certify, report

    ctx = make_context("dev", seed=0, dtypes="float32")
    monkeypatch.setattr(certify, "SHRINK_CALLS", 2)
    short = failing("wrong_threshold_sparsemax", "simplex", ctx=ctx)
    monkeypatch.setattr(certify, "SHRINK_CALLS", 16)
    longer = failing("wrong_threshold_sparsemax", "simplex", ctx=ctx)
    ce = short["counterexample"]
    # a draw the strategy rejects counts but reaches no check: the shrink stops at the next check
    assert 2 <= ce["shrink_stopped_after"] < longer["counterexample"]["shrink_stopped_after"]
    assert short["examples"] < longer["examples"]
    assert ce["scores"] == [[0.0]] and "reproduces" not in ce
    code, out = run_line(capsys, ce["repro"])
    assert code == 1 and "row sum" in out
    lines = report._violation_lines(short)
    assert any(f"shrink stopped after {ce['shrink_stopped_after']} draws" in line
               for line in lines)


def test_shrink_reports_a_far_failure_at_one_digit_above_its_threshold():
    """exp overflows float32 above 88.7: a row met at 3e30 is reported at 100 (the decade
    search stops at 300; halving and a fifth bring it under 200, one significant digit to
    100)."""
    from attnverify.checks.base import Violation
    from attnverify.checks.shrink import shrink

    def overflows(case):
        if not bool(torch.isfinite(torch.exp(case.scores)).all()):
            raise Violation("inf", observed=math.inf, bound=1, ratio=math.inf)

    z = torch.tensor([[3e30]])
    with pytest.raises(Violation) as first:
        overflows(RowCase(z, None, "far_rows", 0))
    small, _ = shrink(overflows, RowCase(z, None, "far_rows", 0), first.value)
    assert small.scores.tolist() == [[100.0]]


def test_shrink_rechecks_no_rejected_candidate_twice_and_ends_where_rechecking_all_ends(
        monkeypatch):
    """A candidate the search re-checked and rejected is not re-checked again (its passes meet
    some twice); it still counts against the budget, so a deterministic check is shrunk to the
    very case, and the very exception type, of a search that re-checks every candidate."""
    from attnverify.checks import shrink as shrinking
    from attnverify.checks.base import Violation

    calls = []

    def fails_above_five(case):
        calls.append(shrinking.identity(case))
        if float(case.scores.max()) > 5:
            raise Violation("above five", observed=float(case.scores.max()), bound=5,
                            ratio=float(case.scores.max()) / 5)

    g = torch.Generator().manual_seed(3)
    z = torch.randn(4, 6, generator=g, dtype=torch.float64) * 4 + 2
    z[2, 3] = 37.25
    case = RowCase(z, 0.7, "gaussian", 0)
    with pytest.raises(Violation) as first:
        fails_above_five(case)
    calls.clear()
    small, exc = shrinking.shrink(fails_above_five, case, first.value)
    memo = list(calls)
    calls.clear()
    monkeypatch.setattr(shrinking, "identity", lambda c: None)  # every candidate re-checked
    every, every_exc = shrinking.shrink(fails_above_five, case, first.value)
    assert len(set(memo)) == len(memo) < len(calls)
    assert small.scores.dtype == every.scores.dtype
    assert small.scores.tolist() == every.scores.tolist()
    assert small.scores.shape == (1, 1) and float(small.scores) > 5  # one score, still failing
    assert small._replace(scores=None) == every._replace(scores=None)
    assert type(exc) is type(every_exc) is Violation
