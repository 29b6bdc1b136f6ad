"""The suite finds planted defects under the ci profile with its fixed seed, and passes correct
third-party implementations. Each defect must show up as a violation of the property it breaks.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
from zoo import PLANTED

from attnverify import cli
from attnverify.certify import certify_target, make_context
from attnverify.falsify import falsify
from attnverify.registry import load_target

FILE = str(Path(__file__).parent / "fixtures" / "planted.py")
CTX = make_context("ci", seed=0)


def statuses(attr: str, claims=("simplex",)) -> dict[str, str]:
    res = certify_target(load_target(f"{FILE}:{attr}"), list(claims), CTX)
    return {r.property: r.status for r in res.results}


@pytest.mark.slow  # a ci certification per planted defect
@pytest.mark.parametrize("attr, broken", PLANTED)  # the zoo's table (tests/zoo.py)
def test_planted_defect_is_found(attr, broken):
    got = statuses(attr)
    assert got[broken] in ("violated", "error"), f"{attr}: {broken} -> {got[broken]}; {got}"


def test_false_claim_on_a_correct_normalizer_is_found():
    got = statuses("torch_softmax", claims=("simplex", "cor3_spectral_paper"))
    assert got["cor3_spectral_paper"] == "violated"
    assert got["simplex"] == "holds"


@pytest.mark.parametrize(
    "attr, claims",
    [
        ("torch_softmax", ("simplex", "shift_invariant", "order_preserving",
                           "jacobian_spectral_half", "cor3_entrywise")),
        ("entmax_sparsemax", ("simplex", "shift_invariant", "order_preserving")),
    ],
)
@pytest.mark.slow  # a ci certification per control
def test_correct_third_party_passes(attr, claims):
    pytest.importorskip("entmax")
    got = statuses(attr, claims)
    bad = {k: v for k, v in got.items() if v not in ("holds", "not_applicable")}
    assert not bad, f"{attr} flagged: {bad}"


def test_entmax_package_all_masked_row_bug_is_caught():
    pytest.importorskip("entmax")
    got = statuses("entmax_sparsemax", claims=("fully_masked_row",))
    assert got["fully_masked_row"] in ("violated", "error")


def test_nan_on_a_masked_key_is_shown_as_one_row_of_two_keys_that_reproduces(capsys):
    res = certify_target(load_target(f"{FILE}:nan_on_mask_softmax"), ["simplex"], CTX)
    (r,) = [r for r in res.results if r.property == "mask_zero"]
    ce = r.counterexample
    assert r.status == "violated" and ce["shape"] == [1, 2] and "-inf" in ce["scores"][0]
    assert cli.main(shlex.split(ce["repro"])[1:]) == 1
    assert "a masked key got weight nan" in capsys.readouterr().out


def test_a_true_bound_with_masked_key_semantics_is_not_falsified():
    # Lemma 1 on rows with masked keys (the search's explicit cases include masked rows): L, a
    # and the weights all count the unmasked keys, so the true bound raises no false alarm
    # (500 evaluations: the scout and the battery's rows up to L = 16, masked variants included)
    ctx = dataclasses.replace(CTX, falsify_evaluations=500)
    res = falsify(load_target("softmax"), "max_weight <= exp(2*a/T)/L", ctx)
    assert not res.falsified, res.witness.to_json() if res.witness else None
    assert res.examples >= 50
