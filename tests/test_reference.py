"""``matches_reference``: a different function with the same output space is found; the float64
references of the built-ins are right; ``--reference`` / ``normalizer_spec(reference=)`` / a
declared kernel supply the reference, and the certificate names it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnverify import normalizer_spec
from attnverify.certify import certify_target, make_context, run_property, with_reference
from attnverify.checks import PROPERTIES
from attnverify.checks.base import Context
from attnverify.checks.reference import reference_label
from attnverify.normalizers import reference as R
from attnverify.registry import builtin_ids, load_target, parse_params

FILE = str(Path(__file__).parent / "fixtures" / "planted_trust.py")
CTX = make_context("ci", seed=0)
F64 = torch.float64
MATCHES = PROPERTIES["matches_reference"]


def check(target: str, reference: str | None = None, params: str = "", ctx=CTX):
    spec = load_target(target, parse_params(params))
    if reference:
        spec = spec.with_reference(reference)
    return run_property(MATCHES, spec, ctx)


@pytest.mark.parametrize(
    "attr, reference, params",
    [
        ("misscaled_temperature", "softmax", ""),  # z·T instead of z/T
        ("sink_unshifted", "softmax1", ""),  # the +1 not shifted with the row max
        ("ignored_alpha", "entmax_alpha", "alpha=1.25"),  # α silently ignored
        ("misscaled_spec", None, ""),  # normalizer_spec(reference=callable)
        ("misscaled_kernel_spec", None, ""),  # the reference derived from the declared kernel
    ],
)
def test_same_output_space_different_function_is_found(attr, reference, params):
    res = check(f"{FILE}:{attr}", reference, params)
    assert res.status == "violated", res
    assert "differ from the reference" in res.message
    assert len(res.counterexample["scores"]) == 1  # shrunk to one row


def test_the_same_planted_maps_keep_their_output_space():
    """Why a reference is needed: the output-space properties all hold for them."""
    for attr, prop in (("sink_unshifted", "sub_simplex"), ("ignored_alpha", "simplex")):
        spec = load_target(f"{FILE}:{attr}", {"alpha": 1.25} if "alpha" in attr else None)
        assert run_property(PROPERTIES[prop], spec, CTX).status == "holds"


def test_right_function_with_a_reference_holds():
    assert check(f"{FILE}:classic_softmax", "softmax").status == "holds"
    assert check(f"{FILE}:kernel_softmax_spec").status == "holds"  # F overflows: rows skipped
    assert check("entmax_alpha", params="alpha=1.25").status == "holds"
    assert check("ssmax", params="s=0.7").status == "holds"


def test_builtins_match_their_reference_at_half_precision():
    ctx = make_context("dev", dtypes="float32,bfloat16,float16", seed=0)
    for name in ("softpick", "sparsemax", "dagpam"):
        assert check(name, ctx=ctx).status == "holds", name


def test_softpick_tiny_bfloat16_scores_use_expm1():
    """e^z − 1 cancelled for scores near 0: every digit of a bfloat16 row was lost."""
    z = torch.tensor([[1e-4, 2e-4, -1e-4, 3e-5]], dtype=torch.bfloat16)
    got = load_target("softpick")(z).double()
    want = R.softpick(z.double())
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-5)


# --------------------------------------------------------------------------------------------
# The references themselves


ROWS = st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=8)


@settings(derandomize=True, database=None, max_examples=40, deadline=None)
@given(ROWS)
def test_sparsemax_reference_is_the_euclidean_projection(row):
    """``p`` is the projection onto the simplex: for every vertex-free check, ``z − p`` is a
    constant τ on the support and ≤ τ off it (the KKT conditions)."""
    z = torch.tensor([row], dtype=F64)
    p = R.sparsemax(z)[0]
    assert math.isclose(float(p.sum()), 1.0, abs_tol=1e-12) and bool((p >= 0).all())
    tau = (z[0] - p)[p > 0]
    assert float(tau.max() - tau.min()) < 1e-12
    assert bool((z[0][p == 0] <= tau[0] + 1e-12).all())


@settings(derandomize=True, database=None, max_examples=40, deadline=None)
@given(ROWS, st.sampled_from([1.2, 1.5, 1.8]))
def test_entmax_reference_satisfies_its_fixed_point(row, alpha):
    """``p_i = [(α−1)z_i − τ]₊^{1/(α−1)}`` with one τ, rows summing to 1."""
    z = torch.tensor([row], dtype=F64)
    p = R.entmax_alpha(z, alpha=alpha)[0]
    assert math.isclose(float(p.sum()), 1.0, abs_tol=1e-12)
    support = p > 1e-12
    tau = ((alpha - 1) * z[0] - p.clamp_min(0) ** (alpha - 1))[support]
    assert float(tau.max() - tau.min()) < 1e-9


def test_entmax_alpha_reference_limits():
    z = torch.tensor([[0.3, -1.0, 2.0, 2.0, float("-inf")]], dtype=F64)
    torch.testing.assert_close(R.entmax_alpha(z, alpha=1.0), R.softmax(z))
    torch.testing.assert_close(R.entmax_alpha(z, alpha=2.0), R.sparsemax(z))
    torch.testing.assert_close(R.entmax_alpha(z, alpha=1.5 + 1e-9), R.entmax15(z), atol=1e-7,
                               rtol=0)


def test_references_against_the_entmax_package():
    entmax = pytest.importorskip("entmax")
    z = torch.randn(5, 9, generator=torch.Generator().manual_seed(0), dtype=F64)
    torch.testing.assert_close(R.sparsemax(z), entmax.sparsemax(z, dim=-1))
    torch.testing.assert_close(R.entmax15(z), entmax.entmax15(z, dim=-1))


def test_references_keep_the_masking_contract():
    z = torch.tensor([[0.5, float("-inf"), -0.5], [float("-inf")] * 3], dtype=F64)
    for name, ref in R.REFERENCES.items():
        out = ref(z)
        assert out.dtype == F64 and bool(torch.isfinite(out).all()), name
        assert float(out[0, 1]) == 0 and bool((out[1] == 0).all()), name


def test_every_builtin_has_an_independent_reference():
    assert set(R.REFERENCES) <= set(builtin_ids())
    for name in R.REFERENCES:
        spec = load_target(name)
        assert "matches_reference" in spec.claims
        assert spec.reference.__module__ == "attnverify.normalizers.reference"


# --------------------------------------------------------------------------------------------
# Where the reference comes from, and the report


def test_normalizer_spec_reference_and_kernel_claim_it_by_default():
    assert "matches_reference" in normalizer_spec(R.softmax, reference=R.softmax).claims
    assert "matches_reference" not in normalizer_spec(R.softmax).claims
    spec, claims = with_reference(load_target(f"{FILE}:classic_softmax"), ["simplex"],
                                  Context(reference="softmax"))
    assert claims == ["simplex", "matches_reference"] and spec.reference == "softmax"
    assert reference_label(spec) == "softmax"
    assert reference_label(load_target(f"{FILE}:misscaled_kernel_spec")).startswith("kernel")


def test_certificate_states_the_reference():
    res = certify_target(load_target(f"{FILE}:misscaled_spec"), None,
                         make_context("dev", seed=0, max_examples=10), label="misscaled_spec")
    data = res.to_json()
    assert data["claims"] == ["simplex", "matches_reference"]
    assert data["reference"] == "attnverify.normalizers.reference:softmax"
    assert data["verdict"] == "failed"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "attnverify", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_reference_option(tmp_path):
    out = tmp_path / "cert.json"
    proc = run_cli("certify", f"{FILE}:misscaled_temperature", "--reference", "softmax",
                   "--claims", "", "--profile", "dev", "--max-examples", "5", "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "reference (float64): softmax" in proc.stdout
    target = json.loads(out.read_text())["targets"][0]
    assert target["reference"] == "softmax"
    status = {r["property"]: r["status"] for r in target["results"]}
    assert status["matches_reference"] == "violated"
    bad = run_cli("certify", "softmax", "--reference", "no_such_normalizer")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


# --------------------------------------------------------------------------------------------
# Rounding the scaled logits: a kernel in float16 rounds z/T once before it normalizes

LOW = str(Path(__file__).parent / "fixtures" / "low_precision.py")


def test_rounded_scalings_by_hand():
    from attnverify.checks.base import rounded_scalings

    scores = torch.tensor([2.900390625, 0.0], dtype=torch.float16)  # exact in float16
    # z/T = 9.66796875 exactly in float64; float16 has steps of 2**-7 between 8 and 16, so the
    # kernel's z/T is 9.671875; times 1/T, with 1/0.3 rounded to 3.333984375, it is 9.671875
    div, mul = rounded_scalings(scores, 0.3)
    assert div.dtype == F64 and float(div[0]) / 0.3 == pytest.approx(9.671875, abs=1e-12)
    assert float(mul[0]) / 0.3 == pytest.approx(9.671875, abs=1e-12)
    assert float(div[1]) == 0.0
    assert rounded_scalings(scores, 1.0) == [] and rounded_scalings(scores.double(), 0.3) == []
    masked = torch.tensor([1.0, float("-inf")], dtype=torch.float16)
    assert all(float(m[1]) == float("-inf") for m in rounded_scalings(masked, 3.0))
    # an overflow of the dtype is not excused: no scaled scores where z/T is not finite
    assert rounded_scalings(torch.tensor([60000.0], dtype=torch.float16), 0.5) == []


LOW_CTX = make_context("ci", seed=0, dtypes="float16,bfloat16,float32")


@pytest.mark.parametrize("attr", ["divides", "multiplies"])
def test_a_half_precision_kernel_rounding_z_over_t_matches(attr):
    """At T = 3 every logit of a float16 kernel is z/T rounded: without the slack for that
    rounding both properties failed on rows of two keys (a false alarm)."""
    spec = load_target(f"{LOW}:{attr}", {"temperature": 3.0}).with_reference("softmax")
    for prop in ("matches_reference", "dtype_agreement"):
        res = run_property(PROPERTIES[prop], spec, LOW_CTX)
        assert res.status == "holds", (prop, res.message)


def test_a_temperature_half_a_percent_off_still_fails():
    spec = load_target(f"{LOW}:temperature_off", {"temperature": 3.0}).with_reference("softmax")
    res = run_property(MATCHES, spec, LOW_CTX)
    assert res.status == "violated" and "differ from the reference" in res.message
