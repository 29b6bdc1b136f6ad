"""``gradient`` as a verdict the code under test cannot forge (issue #16): the values under grad,
float32 derivatives checked per unit, decisions over every case of a unit (no fixed probe), a
floor on the rows judged, and rows past a block of keys. Each mechanism is shown failing a
planted normalizer (tests/fixtures/planted_gradient.py) that every other property passes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from attnverify.certify import make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.checks import gradient as G
from attnverify.checks.base import JUDGED_FLOOR, Unjudged, Violation
from attnverify.checks.cases import RowCase
from attnverify.cli import main
from attnverify.registry import builtin_ids, load_target

FIXTURES = Path(__file__).parent / "fixtures"
FILE = str(FIXTURES / "planted_gradient.py")
DEV = make_context("dev", seed=0)
F64, F32 = torch.float64, torch.float32
ROWS = [[0.3, -1.0, 2.0, 0.5], [1.5, 0.25, -0.75, float("-inf")]]


def planted(attr: str, file: str = FILE):
    return load_target(f"{file}:{attr}")


def gradient(attr: str):
    return run_property(PROPERTIES["gradient"], planted(attr), DEV)


def case(rows, dtype=F64, temperature=None, seed=0) -> RowCase:
    return RowCase(torch.tensor(rows, dtype=dtype), temperature, "gaussian", seed)


# --------------------------------------------------------------------------------------------
# (a) the weights with grad enabled are those without


@pytest.mark.slow  # certify from the command line
def test_weights_under_grad_are_checked_through_the_cli(tmp_path, capsys):
    """Across the process boundary: a target whose forward with grad enabled returns other
    weights fails gradient (and nothing else), with or without the right gradient for them."""
    out = tmp_path / "cert.json"
    code = main(["certify", f"{FILE}:grad_mode_softmax", f"{FILE}:grad_values_softmax",
                 "--profile", "dev", "--claims", "", "--quiet", "--json", str(out)])
    capsys.readouterr()
    assert code == 1
    results = {t["target"].rsplit(":", 1)[1]: {r["property"]: r for r in t["results"]}
               for t in json.loads(out.read_text())["targets"]}
    for name in ("grad_mode_softmax", "grad_values_softmax"):
        bad = {p for p, r in results[name].items() if r["status"] != "holds"}
        assert bad == {"gradient"}, (name, bad)
    # its gradient is softmax's, right: only the values give it away
    message = results["grad_values_softmax"]["gradient"]["message"]
    assert "weights it returns with grad enabled differ from those of the same call " \
           "without grad" in message


def test_weights_under_grad_are_checked_in_process():
    """In this process too: the call "without grad" runs with grad disabled."""
    with pytest.raises(Violation, match="with grad enabled differ"):
        G.check_gradient(planted("grad_values_softmax"), case(ROWS), DEV)
    G.check_gradient(planted("classic_softmax", str(FIXTURES / "planted_trust.py")),
                     case(ROWS, temperature=1.0), DEV)


# --------------------------------------------------------------------------------------------
# (b) a float32 kernel's backward is checked on its float32 unit


@pytest.mark.parametrize("attr, source", [
    ("float32_halved_softmax", "central differences of its own float32 weights"),
    ("float32_halved_with_reference", "central differences of the reference"),
])
def test_a_wrong_float32_backward_fails_on_the_float32_unit(attr, source):
    res = gradient(attr)
    units = dict(res.units)
    assert res.status == "violated"
    assert units["float32"].status == "violated"
    message = units["float32"].message
    assert "by reverse mode" in message and source in message and "(float32;" in message
    # its float64 unit: every case refused float64 scores, decided over all of them
    assert units["float64"].status == "not_applicable"
    assert "float64 not checked" in units["float64"].message


def test_coarse_differences_of_a_float32_map_judge_a_plain_row():
    """Without float64 or a reference, the float32 map's own differences (COARSE): a right
    float32 backward passes, a halved one fails."""
    right = planted("float32_only_softmax", str(FIXTURES / "planted_trust.py"))
    assert G.check_gradient(right, case(ROWS, F32), DEV) <= 1
    with pytest.raises(Violation, match="its own float32 weights"):
        G.check_gradient(planted("float32_halved_softmax"), case(ROWS, F32), DEV)


def test_no_decision_on_the_old_fixed_probe():
    """Refusing float64 on the one input the property used to probe no longer skips anything:
    the float64 unit decides over all its cases, and the halved backward is caught."""
    res = gradient("probe_dodger_softmax")
    assert res.status == "violated"
    assert all(u.status == "violated" for _, u in res.units), res.units


def test_float64_refused_on_some_inputs_only_is_a_violation():
    res = gradient("long_rows_no_float64_softmax")
    units = dict(res.units)
    assert units["float32"].status == "holds"
    assert units["float64"].status == "violated"
    assert "takes float64 scores on" in units["float64"].message
    assert len(res.counterexample["scores"][0]) > 8


def test_no_graph_on_some_inputs_only_is_a_violation():
    res = gradient("long_rows_no_graph_softmax")
    assert res.status == "violated"
    assert "though it carries one on" in res.message


# --------------------------------------------------------------------------------------------
# (c) a floor on the rows judged


@pytest.mark.parametrize("attr", ["noisy_softmax", "probe_noisy_softmax"])
def test_noisy_values_fail_for_too_few_rows_judged(attr):
    """Noise (always, or only near an earlier input: on finite-difference probes) makes every
    segment look like a kink: the property fails instead of judging nothing."""
    res = gradient(attr)
    assert res.status == "violated"
    for _, unit in res.units:
        assert unit.status == "violated"
        assert "could not be judged on" in unit.message, unit.message


def test_an_unjudged_input_is_deferred_to_the_unit():
    with pytest.raises(Unjudged) as info:
        G.check_gradient(planted("noisy_softmax"), case(ROWS), DEV)
    assert info.value.judged == 0 and info.value.rows == 2
    hit = (object(), info.value)
    # half the unit's inputs unjudged stands, more fails; other deferred kinds do not count
    assert Unjudged.decide([hit] * 5, examples=10, elsewhere=0) is None
    assert Unjudged.decide([hit] * 5, examples=12, elsewhere=3)[0] == "failed"
    assert JUDGED_FLOOR == 0.5


# --------------------------------------------------------------------------------------------
# (d) rows past a block of keys


def test_a_backward_wrong_past_32_keys_is_caught():
    spec = planted("block_backward_softmax")
    short = torch.randn(3, 32, generator=torch.Generator().manual_seed(1), dtype=F64)
    G.check_gradient(spec, case(short.tolist()), DEV)  # right on a block of 32 keys
    res = gradient("block_backward_softmax")
    assert res.status == "violated" and "by reverse mode" in res.message
    assert len(res.counterexample["scores"][0]) > 32


def test_the_battery_has_rows_across_blocks_of_keys():
    spec = load_target("softmax")
    ci = make_context("ci", seed=0)
    lengths = {c.scores.shape[-1] for c in G.gradient_battery(spec, ci)}
    assert {33, 129, 1025, 4096} <= lengths
    dev_lengths = {c.scores.shape[-1] for c in G.gradient_battery(spec, DEV)}
    assert {33, 129, 256} <= dev_lengths and max(dev_lengths) <= DEV.max_length + 1


# --------------------------------------------------------------------------------------------
# (e) every built-in still holds


@pytest.mark.parametrize("name", builtin_ids())
def test_every_builtin_gradient_holds_per_dtype(name):
    res = run_property(PROPERTIES["gradient"], load_target(name), DEV)
    assert res.status == "holds", res.message
    assert [d for d, u in res.units if u.status == "holds"] == ["float32", "float64"]


# --------------------------------------------------------------------------------------------
# (f) every entry of the gradient: exactly 0 (and finite) at masked keys (issue #25)

MASKED = str(FIXTURES / "planted_masked_gradient.py")
CI = make_context("ci", seed=0)


def test_the_gradient_at_a_masked_key_must_be_exactly_zero():
    """A backward that passes the cotangent through to masked scores is wrong only where the
    central differences cannot look (a -inf score cannot move) and only for a cotangent that is
    not zero there: the cotangent is nonzero on masked keys, and those entries must be 0."""
    with pytest.raises(Violation, match="at masked key 3 .*not exactly 0"):
        G.check_gradient(planted("straight_through_mask_softmax", MASKED), case(ROWS), DEV)
    with pytest.raises(Violation, match="at masked key 3"):
        G.check_double_backward(planted("straight_through_mask_softmax", MASKED), case(ROWS),
                                DEV)
    for control in ("masked_autograd_softmax", "float32_accumulating_softmax"):
        spec = planted(control, MASKED)
        for dtype in (F64, F32):
            assert G.check_gradient(spec, case(ROWS, dtype), DEV) <= 1
            assert G.check_double_backward(spec, case(ROWS, dtype), DEV) <= 1


def test_cotangents_reach_masked_keys_and_directions_do_not():
    z = torch.tensor(ROWS, dtype=F64)
    u, v, w = G._directions(z, 0, 3, every=(0, 2))
    masked = z == float("-inf")
    assert bool((u[masked] != 0).all()) and bool((w[masked] != 0).all())
    assert bool((v[masked] == 0).all())
    live_before = G._directions(z, 0, 3)  # the live entries are the same draws as before
    assert torch.equal(u[~masked], live_before[0][~masked])


@pytest.mark.parametrize("attr, prop_id, claims, needle", [
    ("straight_through_mask_softmax", "gradient", (), "at masked key"),
    ("straight_through_mask_softmax", "double_backward", ("double_backward",), "at masked key"),
    ("lse_backward_softmax", "gradient", ("fully_masked_row",), "is nan at key"),
])
def test_a_backward_wrong_at_masked_keys_fails_on_ci_and_reproduces(attr, prop_id, claims,
                                                                    needle, capsys):
    spec = planted(attr, MASKED)
    spec = spec.with_claims(tuple(spec.claims) + claims)
    res = run_property(PROPERTIES[prop_id], spec, CI)
    assert res.status == "violated", res.message
    assert needle in res.message
    ce = res.counterexample
    assert ce["shape"][0] == 1 and ce["shape"][1] <= 2, ce["shape"]  # shrunk
    assert "-inf" in ce["scores"][0]
    capsys.readouterr()
    assert main(shlex.split(ce["repro"])[1:]) == 1
    assert needle in capsys.readouterr().out


def test_correct_custom_backwards_with_masks_hold_on_ci():
    for control in ("masked_autograd_softmax", "float32_accumulating_softmax"):
        spec = planted(control, MASKED)
        spec = spec.with_claims(tuple(spec.claims) + ("fully_masked_row", "double_backward"))
        for prop_id in ("gradient", "double_backward"):
            res = run_property(PROPERTIES[prop_id], spec, CI)
            assert res.status == "holds", (control, prop_id, res.message)
