"""The suite finds planted defects under the ci profile with its fixed seed, and passes correct
third-party implementations. Each defect must show up as a violation of the property it breaks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attnverify.certify import certify_target, make_context
from attnverify.registry import load_target

FILE = str(Path(__file__).parent / "fixtures" / "planted.py")
CTX = make_context("ci", seed=0)


def statuses(attr: str, claims=("simplex",)) -> dict[str, str]:
    res = certify_target(load_target(f"{FILE}:{attr}"), list(claims), CTX)
    return {r.property: r.status for r in res.results}


@pytest.mark.parametrize(
    "attr, broken",
    [
        ("overflow_softmax", "finite"),
        ("wrong_threshold_sparsemax", "simplex"),
        ("inplace_softmax", "no_mutation"),
        ("noisy_softmax", "deterministic"),
        ("positional_softmax", "permutation_equivariant"),
        ("mask_leak_softmax", "mask_zero"),
        ("batch_coupled_softmax", "batch_independent"),
        ("row_sum_off_softmax", "simplex"),
        ("sigmoid_claiming_simplex", "simplex"),
    ],
)
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
def test_correct_third_party_passes(attr, claims):
    pytest.importorskip("entmax")
    got = statuses(attr, claims)
    bad = {k: v for k, v in got.items() if v not in ("holds", "not_applicable")}
    assert not bad, f"{attr} flagged: {bad}"


def test_entmax_package_all_masked_row_bug_is_caught():
    pytest.importorskip("entmax")
    got = statuses("entmax_sparsemax", claims=("fully_masked_row",))
    assert got["fully_masked_row"] in ("violated", "error")
