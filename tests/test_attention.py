"""Attention kernels: the lifting, the attention-level properties, planted defects, the CLI.

Planted kernels live in ``fixtures/planted_attention.py``; each must fail the property its defect
breaks, with a counterexample whose repro re-checks it and exits 1. Runs on the dev profile with
a fixed seed; FlexAttention (seconds to compile) is exercised once, in the slow-marked test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from zoo import ATTENTION

from attnverify import attention_spec
from attnverify.attention import cases as AC
from attnverify.attention import checks as K
from attnverify.attention.kernels import builtins as attention_builtins
from attnverify.attention.lift import lift
from attnverify.attention.loader import load_attention
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.attention.reference import eager
from attnverify.attention.run import certify_attention
from attnverify.certify import make_context, run_property
from attnverify.cli import main

FILE = str(Path(__file__).parent / "fixtures" / "planted_attention.py")
CTX = make_context("dev", seed=0, max_examples=10)


def _load(attr: str, **kw):
    spec = load_attention(f"{FILE}:{attr}")
    return spec if not kw else spec.__class__(**{**spec.__dict__, **kw})


def _run(attr: str, prop_id: str, **kw):
    a = _load(attr, **kw)
    return run_property(ATTENTION_PROPERTIES[prop_id], lift(a), CTX)


# --------------------------------------------------------------------------------------------
# The lifting and the reference


def test_lifted_sdpa_returns_the_weights_exactly_for_exact_scores():
    z = torch.tensor([[0.0, 1.0, float("-inf"), 2.0], [3.0, 3.0, 3.0, 3.0]])
    got = lift(attention_builtins()["sdpa_math"])(z)
    want = torch.softmax(z.double(), -1)
    assert torch.allclose(got.double(), want, atol=1e-7, rtol=0)
    assert got[0, 2] == 0


def test_lifted_kernel_keeps_dim_and_fully_masked_rows_give_zeros():
    z = torch.randn(3, 5, dtype=torch.float64)
    z[1] = float("-inf")
    got = lift(attention_builtins()["sdpa"])(z.T, dim=0).T
    assert torch.equal(got[1], torch.zeros(5, dtype=torch.float64))
    assert torch.allclose(got[0], torch.softmax(z[0], -1))


def test_reference_is_top_left_causal_for_unequal_lengths():
    q = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
    k = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    v = torch.eye(3, dtype=torch.float64)[None, None]
    w = eager(q, k, v, is_causal=True)[0, 0]
    assert torch.allclose(w, torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0]], dtype=torch.float64))


def test_recipes_build_the_same_tensors_twice():
    r = AC.recipe(mask="padding", l_k=9, qk="aligned")
    a, b = AC.build(r), AC.build(r)
    assert torch.equal(a.q, b.q) and torch.equal(a.k, b.k) and torch.equal(a.attn_mask,
                                                                           b.attn_mask)


# --------------------------------------------------------------------------------------------
# Planted defects: each caught by the property it breaks, with a reproducing counterexample


PLANTED = ATTENTION  # the zoo's table (tests/zoo.py)


@pytest.mark.slow  # a certification and two repro workers per planted kernel
@pytest.mark.parametrize("attr, prop_id", PLANTED)
def test_planted_attention_defect_is_caught_and_reproduces(attr, prop_id):
    res = _run(attr, prop_id)
    assert res.status == "violated", f"{attr}: {prop_id} -> {res.status} {res.message}"
    recipe = res.counterexample["recipe"]
    from attnverify.attention.repro import recheck

    assert recheck(f"{FILE}:{attr}", prop_id, recipe) == 1
    assert recheck("eager", prop_id, recipe) == 0  # the same case passes on a correct kernel


def test_counterexample_is_shrunk():
    res = _run("bottom_right_causal", "attn_causal")
    r = res.counterexample["recipe"]
    assert r["l_q"] != r["l_k"] and r["l_q"] * r["l_k"] <= 18, r


@pytest.mark.slow  # every property on two kernels
def test_correct_kernels_pass_every_attention_property():
    for name in (f"{FILE}:eager_attention", "sdpa"):
        a = load_attention(name)
        for prop in ATTENTION_PROPERTIES.values():
            res = run_property(prop, lift(a), CTX)
            assert res.status in ("holds", "not_applicable"), (name, prop.id, res.message)


@pytest.mark.slow  # a whole certification
def test_sdpa_is_certified_on_the_dev_profile():
    from attnverify import remote

    ctx = make_context("dev", seed=0)
    res = certify_attention(remote.open_attention("sdpa", {}, ctx), None, ctx)
    bad = {r.property: r.message for r in res.results if r.status not in ("holds",)}
    assert res.verdict == "certified" and not bad, bad
    assert res.worker_pids and os.getpid() not in res.worker_pids


@pytest.mark.slow  # a whole certification
def test_attention_spec_public_constructor_and_claims():
    def kernel(q, k, v, attn_mask=None, is_causal=False, scale=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                                is_causal=is_causal,
                                                                scale=scale)

    spec = attention_spec(kernel, normalizer="softmax")
    assert spec.id == "kernel" and spec.space == "simplex" and not spec.gqa
    res = certify_attention(spec, ["simplex", "attn_convex_hull"],
                            make_context("dev", seed=0, max_examples=3))
    status = {r.property: r.status for r in res.results}
    assert status["attn_gqa"] == "not_applicable"
    assert status["attn_convex_hull"] == "holds" and status["simplex"] == "holds"


# --------------------------------------------------------------------------------------------
# The command line


@pytest.mark.slow  # certify and repro from the command line
def test_cli_certify_attention_planted_exits_1_with_repro(tmp_path, capsys):
    out = tmp_path / "cert.json"
    code = main(["certify", "--attention", f"{FILE}:bottom_right_causal", "--profile", "dev",
                 "--max-examples", "2", "--json", str(out), "--quiet"])
    assert code == 1
    data = json.loads(out.read_text())
    res = {r["property"]: r for r in data["targets"][0]["results"]}
    assert res["attn_causal"]["status"] == "violated"
    repro = res["attn_causal"]["counterexample"]["repro"]
    assert repro.startswith("python -m attnverify.attention.repro")
    args = repro.split(" ", 3)[3]
    import shlex

    proc = subprocess.run([sys.executable, "-m", "attnverify.attention.repro", *shlex.split(args)],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr


@pytest.mark.parametrize("argv, needle", [
    (["certify", "--attention", "no_such_kernel"], "unknown attention target"),
    (["certify", "--attention", "sdpa", "--claims", "attn_causal"], "universal"),
    (["certify", "--attention", "sdpa", "--claims", "nope"], "unknown property id"),
    (["certify", "--attention", "sdpa", "--reference", "nope"], "neither a built-in normalizer"),
    (["certify", "--attention", f"{FILE}:NEG_INF"], "not callable"),
])
def test_cli_attention_usage_errors_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_cli_lists_attention_targets_and_properties(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "attention targets" in out and "sdpa_flash" in out and "eager_sparsemax" in out
    assert main(["properties"]) == 0
    out = capsys.readouterr().out
    for prop_id in ATTENTION_PROPERTIES:
        assert prop_id in out


def test_reference_option_accepts_a_normalizer_or_an_attention_target():
    ctx = make_context("dev", seed=0, max_examples=3)
    a = load_attention("sdpa")
    for ref in ("softmax", "sdpa_math"):
        spec = a.__class__(**{**a.__dict__, "reference": ref})
        assert run_property(ATTENTION_PROPERTIES["attn_reference"], lift(spec), ctx).status == \
            "holds"
    spec = a.__class__(**{**a.__dict__, "reference": "sparsemax"})
    assert run_property(ATTENTION_PROPERTIES["attn_reference"], lift(spec), ctx).status == \
        "violated"


def test_unavailable_backend_is_skipped_with_its_reason():
    a = attention_builtins()["sdpa_cudnn"]
    if not a.unavailable:
        pytest.skip("CUDA present: the cuDNN backend is available")
    res = certify_attention(a, None, make_context("dev", seed=0, max_examples=2))
    assert {r.status for r in res.results} == {"not_applicable"}
    assert "CUDA" in res.results[0].message
    assert res.verdict == "not_checked"  # nothing ran: never "certified"


@pytest.mark.slow  # two certifications of eager beside the unavailable backend
def test_cli_run_where_nothing_could_be_checked_is_exit_2(capsys, tmp_path):
    from attnverify.cli import main

    if not attention_builtins()["sdpa_cudnn"].unavailable:
        pytest.skip("CUDA present: the cuDNN backend is available")
    cert = tmp_path / "cert.json"
    code = main(["certify", "--attention", "sdpa_cudnn", "--profile", "dev", "--quiet",
                 "--json", str(cert)])
    out, err = capsys.readouterr()
    assert code == 2 and "nothing could be checked" in err and err.count("\n") == 1
    assert "NOT CHECKED" in out
    assert json.loads(cert.read_text())["targets"][0]["verdict"] == "not_checked"
    code = main(["certify", "--attention", "sdpa_cudnn,eager", "--profile", "dev", "--quiet",
                 "--max-examples", "2"])
    out, _ = capsys.readouterr()
    assert code == 0 and "sdpa_cudnn: NOT CHECKED" in out and "eager: CERTIFIED" in out
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("eager::attn_gradients\n")
    main(["certify", "--attention", "sdpa_cudnn,eager", "--profile", "dev", "--quiet",
          "--max-examples", "2", "--xfails", str(xfails), "--json", str(cert)])
    capsys.readouterr()
    verdicts = {t["target"]: t["verdict_with_xfails"]
                for t in json.loads(cert.read_text())["targets"]}
    assert verdicts == {"sdpa_cudnn": "not_checked", "eager": "certified"}


@pytest.mark.slow
def test_flex_attention_once():
    """FlexAttention, compiled once for the session: the reference and a mask property."""
    a = attention_builtins()["flex"]
    if a.unavailable:
        pytest.skip(a.unavailable)
    ctx = make_context("dev", seed=0, max_examples=3)
    for prop_id in ("attn_reference", "attn_bool_mask"):
        res = run_property(ATTENTION_PROPERTIES[prop_id], lift(a), ctx)
        assert res.status == "holds", (prop_id, res.message)


@pytest.mark.slow  # a pytest run of the suite
def test_pytest_plugin_runs_the_attention_suite(tmp_path):
    out = tmp_path / "cert.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"--attnverify-attention={FILE}:bottom_right_causal", "--attnverify-profile=dev",
           "--attnverify-max-examples=3", f"--attnverify-json={out}", "-k",
           "attn_causal or attn_bool_mask"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "bottom_right_causal::attn_causal" in proc.stdout and "1 failed" in proc.stdout
    data = json.loads(out.read_text())
    status = {r["property"]: r["status"] for r in data["targets"][0]["results"]}
    assert {p: status.pop(p) for p in ("attn_bool_mask", "attn_causal")} == \
        {"attn_bool_mask": "holds", "attn_causal": "violated"}, status
    # the properties -k deselected are in the certificate too, not run (never certified)
    assert status and set(status.values()) == {"not_checked"}, status


def test_tolerance_rule_needs_the_score_rounding_term_and_still_catches_a_scale_error():
    """float32 SDPA at large logits is off by more than the dtype's table allows (so the score
    rounding term is needed), and a 1e-3 relative scale error is caught at ordinary logits."""
    from attnverify.attention import tolerance
    from attnverify.tolerances import tol_for

    def ratios(case, scale=None):
        out = torch.nn.functional.scaled_dot_product_attention(case.q, case.k, case.v,
                                                               scale=scale).double()
        ref = eager(case.q, case.k, case.v)
        t = tol_for(torch.float32)
        plain = float(((out - ref).abs() / (t.atol + t.rtol * ref.abs())).max())
        limit = tolerance.output_allowed(ref, case.q, case.k, case.v, None, torch.float32)
        return plain, float(((out - ref).abs() / limit).max())

    big = AC.build(AC.recipe(mag=10.0, d=64, l_k=512, l_q=16, seed=3))
    plain, rule = ratios(big)
    assert plain > 1 and rule < 0.5, (plain, rule)
    small = AC.build(AC.recipe(mag=1.0, d=64, l_k=512, l_q=16, seed=3))
    assert ratios(small, scale=(1 + 1e-3) / 8)[1] > 1


@pytest.mark.slow  # certify and repro from the command line
def test_lifted_property_counterexample_reproduces_through_attnverify_repro(capsys):
    """A normalizer property failed by the lifted kernel has an ``attnverify repro`` line (the
    lifted kernel loads as ``attnverify.attention.lift:TARGET``) that exits 1."""
    import shlex

    res = certify_attention(load_attention(f"{FILE}:doubled_output"), ["simplex"],
                            make_context("dev", seed=0, max_examples=2))
    simplex = next(r for r in res.results if r.property == "simplex")
    assert simplex.status == "violated"
    argv = shlex.split(simplex.counterexample["repro"])
    assert argv[:2] == ["attnverify", "repro"]
    assert main(argv[1:]) == 1
    assert "row sum 2" in capsys.readouterr().out


def test_attention_repro_line_keeps_the_kernels_parameters(capsys):
    """A repro re-checks the kernel with the parameters it was certified with, not defaults."""
    import dataclasses
    import shlex

    from attnverify.attention import repro
    from attnverify.attention.run import repro_line

    a = dataclasses.replace(attention_builtins()["eager"], params={"window": 4})
    line = repro_line(a, "attn_reference", {"seed": 1})
    assert "--params" in line and json.loads(shlex.split(line)[-1]) == {"window": 4}
    # the params reach the loader: eager has no 'window', so the re-check is a usage error
    code = repro.main(shlex.split(line)[3:])
    err = capsys.readouterr().err
    assert code == 2 and "no parameter 'window'" in err
    assert repro.main(["eager", "attn_reference", "{}", "--params", "[1]"]) == 2


def test_a_kernel_assuming_contiguous_heads_fails_on_the_hugging_face_layout():
    res = _run("assumes_bhld_memory", "attn_reference")
    recipe = res.counterexample["recipe"]
    assert recipe["layout"] != "bhld", recipe  # contiguous [B, H, L, d] input passes
    assert {"contiguous", "transposed", "expanded"} <= set(res.to_json()["coverage"]["layouts"])


# --------------------------------------------------------------------------------------------
# Gradients at keys no query attends (issue #25)

MASKED_GRADIENT = str(Path(__file__).parent / "fixtures" / "planted_masked_gradient.py")


def test_a_backward_wrong_only_at_masked_keys_fails_on_ci_and_reproduces():
    """A FlashAttention-style backward that floors the recomputed weights at 1e-12: dk and dv of
    keys no query attends are about 1e-12, far inside a tolerance relative to the largest
    gradient; they must be exactly 0. The same backward without the floor holds."""
    from attnverify.attention.repro import recheck

    ci = make_context("ci", seed=0)
    prop = ATTENTION_PROPERTIES["attn_gradients"]
    bad = run_property(prop, lift(load_attention(f"{MASKED_GRADIENT}:floored_backward_attention")),
                       ci)
    assert bad.status == "violated", bad.message
    assert "a key no query attends" in bad.message and "not exactly 0" in bad.message
    recipe = bad.counterexample["recipe"]
    assert recipe["l_q"] * recipe["l_k"] <= 4 and recipe["b"] == recipe["h"] == 1, recipe
    assert recheck(f"{MASKED_GRADIENT}:floored_backward_attention", "attn_gradients",
                   recipe) == 1
    assert recheck(f"{MASKED_GRADIENT}:flash_backward_attention", "attn_gradients",
                   recipe) == 0
    good = run_property(prop, lift(load_attention(f"{MASKED_GRADIENT}:flash_backward_attention")),
                        ci)
    assert good.status == "holds", good.message


def test_garbage_in_dq_of_a_query_that_attends_no_key_fails_the_fully_masked_row():
    """A FlashAttention-style backward whose dq pass reads a dead query as attending every key
    uniformly: the forward output is exactly 0 and dk, dv are right, but dq there is garbage.
    Hand case first (one dead query of four, every gradient entry named), then the property at
    dev with the control (the same backward, dq of a dead query 0), which holds; SDPA's math
    backend, which claims dead rows, holds too."""
    from attnverify.attention.repro import recheck

    r = AC.recipe(b=1, h=1, l_q=4, l_k=5, mask="bool", mask_shape="2d", dead=True, seed=3)
    case = AC.build(r)
    bad = load_attention(f"{MASKED_GRADIENT}:uniform_dead_dq_attention")
    dead = ~K.allowed_keys(bad, case).any(-1)
    assert bool(dead.any()) and not bool(dead.all())
    with pytest.raises(K.Violation, match=r"d⟨out, G⟩/dq is .* a query that attends no key"):
        K.check_fully_masked(lift(bad), case, CTX)
    good = load_attention(f"{MASKED_GRADIENT}:flash_backward_attention")
    assert K.check_fully_masked(lift(good), case, CTX) <= 1
    prop = ATTENTION_PROPERTIES["attn_fully_masked_row"]
    res = run_property(prop, lift(bad), CTX)
    assert res.status == "violated" and "a query that attends no key" in res.message
    assert recheck(f"{MASKED_GRADIENT}:uniform_dead_dq_attention", "attn_fully_masked_row",
                   res.counterexample["recipe"]) == 1
    for control in (good, load_attention("sdpa_math")):
        res = run_property(prop, lift(control), CTX)
        assert res.status == "holds", (control.id, res.message)


def test_dead_keys_follow_the_mask_and_the_groups_of_query_heads():
    r = AC.recipe(b=1, h=4, h_kv=2, l_q=3, l_k=5, mask="bool", mask_shape="heads")
    case = AC.build(r)
    a = load_attention("eager")
    mask = torch.ones(1, 4, 3, 5, dtype=torch.bool)
    mask[:, :2, :, 1] = False  # key 1: dead for query heads 0, 1 (key/value head 0) only
    mask[:, :, :, 4] = False  # key 4: dead everywhere
    case = case._replace(attn_mask=mask, is_causal=False)
    dead = K.dead_keys(a, case)
    assert dead.shape == (1, 2, 5)
    assert dead[0, 0].tolist() == [False, True, False, False, True]
    assert dead[0, 1].tolist() == [False, False, False, False, True]


def test_the_convex_hull_check_compares_a_block_of_queries_at_a_time(monkeypatch):
    """The hull's bounds, a block of queries at a time (the whole ``[B, H, L_q, L_k, n]``
    comparison reached gigabytes on the largest cases), equal the whole comparison's, and a
    query that attends no key gets ``-inf``/``inf``."""
    import math

    from attnverify.attention import checks

    monkeypatch.setattr(checks, "HULL_STEP", 50)
    g = torch.Generator().manual_seed(3)
    for b, h, l_q, l_k in ((2, 3, 7, 5), (1, 1, 1, 4), (2, 2, 0, 3), (1, 2, 9, 1)):
        proj_v = torch.randn(b, h, l_k, 6, generator=g, dtype=torch.float64)
        allowed = torch.rand(b, h, l_q, l_k, generator=g) > 0.4
        hi, lo = checks._hull(proj_v, allowed)
        every = proj_v[..., None, :, :]
        big = allowed[..., None]
        assert torch.equal(hi, torch.where(big, every, -math.inf).amax(-2))
        assert torch.equal(lo, torch.where(big, every, math.inf).amin(-2))


def test_gqa_reference_and_tolerance_equal_those_on_repeated_heads():
    """The float64 reference, its scores, the tolerance and the hull read the ``H_kv`` key/value
    heads in place for their query heads (no repeated copy) and give what they give on heads
    repeated by ``repeat_interleave``: exactly where the arithmetic is exact (integer inputs:
    the scores, ``Σ|q||k|``, ``V∞``, the maxima), to float64 rounding where a BLAS may order a
    sum of non-integers differently (``P·V``, the backward's sums over a group)."""
    import math

    from attnverify.attention import tolerance
    from attnverify.attention.reference import expand_heads, scores_of

    # By hand: 2 query heads on 1 key/value head, d = 1 (scale 1), keys 0 and 1, values 1 and 3.
    q = torch.tensor([1.0, 2.0]).reshape(1, 2, 1, 1)
    k = torch.tensor([0.0, 1.0]).reshape(1, 1, 2, 1)
    v = torch.tensor([1.0, 3.0]).reshape(1, 1, 2, 1)
    e = math.e
    want = torch.tensor([(1 + 3 * e) / (1 + e), (1 + 3 * e**2) / (1 + e**2)], dtype=torch.float64)
    got = eager(q, k, v, enable_gqa=True).flatten()
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)
    u = torch.finfo(torch.float32).eps / 2  # δs = scale·(2 + √1)·u·max_j |q||k|: 3u, 6u
    assert torch.equal(tolerance.score_error(q, k, None, torch.float32).flatten(),
                       torch.tensor([3 * u, 6 * u], dtype=torch.float64))

    # Integers: every score and Σ|q||k| is exact in float64, whatever the order of the sums.
    g = torch.Generator().manual_seed(7)
    b, heads, kv, l_q, l_k, d = 2, 6, 2, 3, 5, 4
    q, k, v = (torch.randint(-3, 4, shape, generator=g).float()
               for shape in ((b, heads, l_q, d), (b, kv, l_k, d), (b, kv, l_k, d)))
    k_rep, v_rep = expand_heads(k, heads), expand_heads(v, heads)
    bias = torch.randint(-2, 3, (b, 1, l_q, l_k), generator=g).double()
    bias[..., 0, 1:] = float("-inf")
    allowed = (~torch.isneginf(bias)).expand(b, heads, l_q, l_k)
    scores = scores_of(q, k, None, score_mod="alibi") + bias
    assert torch.equal(scores, scores_of(q, k_rep, None, score_mod="alibi") + bias)
    ref = eager(q, k_rep, v_rep, bias, score_mod="alibi")
    grouped = eager(q, k, v, bias, enable_gqa=True, score_mod="alibi")
    torch.testing.assert_close(grouped, ref, rtol=1e-14, atol=1e-15)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(
            tolerance.output_allowed(ref, q, k, v, None, dtype, allowed, scores),
            tolerance.output_allowed(ref, q, k_rep, v_rep, None, dtype, allowed, scores))
        assert torch.equal(tolerance.grad_allowed(ref, q, k, 0.3, dtype),
                           tolerance.grad_allowed(ref, q, k_rep, 0.3, dtype))

    # The backward: dk and dv of a key/value head sum over its query heads.
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    cot = torch.randn(b, heads, l_q, d, generator=g, dtype=torch.float64)
    dq, dk, dv = torch.autograd.grad((eager(*leaves, bias, enable_gqa=True) * cot).sum(), leaves)
    rep = [leaves[0]] + [expand_heads(t, heads) for t in leaves[1:]]
    want = torch.autograd.grad((eager(*rep, bias) * cot).sum(), leaves)
    for got, ref_grad in zip((dq, dk, dv), want):
        torch.testing.assert_close(got, ref_grad, rtol=1e-13, atol=1e-14)

    # The hull: the values' projections of each key/value head, not repeated per query head.
    proj_v = torch.randn(b, kv, l_k, 6, generator=g, dtype=torch.float64)
    hull = K._hull(proj_v, allowed)
    assert all(torch.equal(x, y) for x, y in zip(hull, K._hull(expand_heads(proj_v, heads),
                                                               allowed)))


def test_gqa_checks_never_repeat_the_key_value_heads(monkeypatch):
    """No float64 ``[B, H, L_k, d]`` copy of the keys or values on the reference, tolerance,
    hull and gradient paths: ``expand_heads`` is called only by the GQA check, once each for
    the keys and values it hands the kernel, and no ``repeat_interleave`` there reaches the size
    of a key/value tensor repeated to the query heads."""
    from attnverify.attention import reference

    case = AC.build(AC.recipe(b=2, h=8, h_kv=2, l_q=5, l_k=9, d=8, dtype="float64",
                              mask="additive", seed=11))
    spec = lift(load_attention("sdpa_math"))
    repeated = case.k.shape[0] * case.q.shape[1] * case.k.shape[-2] * case.k.shape[-1]
    sizes = []
    real = torch.Tensor.repeat_interleave

    def repeat_interleave(self, *args, **kw):
        out = real(self, *args, **kw)
        sizes.append(out.numel())
        return out

    def refused(*args, **kw):
        raise AssertionError("expand_heads on the reference or tolerance path")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", repeat_interleave)
    monkeypatch.setattr(reference, "expand_heads", refused)
    monkeypatch.setattr(K, "expand_heads", refused)
    for check in (K.check_reference, K.check_mask, K.check_convex_hull, K.check_gradients,
                  K.check_batch_head_independent):
        assert check(spec, case, CTX) <= 1, check.__name__
    assert max(sizes, default=0) < repeated, (sizes, repeated)

    calls = []

    def counted(t, heads):
        calls.append(t)
        return real(t, heads // t.shape[-3], dim=-3)

    monkeypatch.setattr(K, "expand_heads", counted)
    assert K.check_gqa(spec, case, CTX) <= 1
    assert len(calls) == 2 and calls[0] is case.k and calls[1] is case.v
