"""What an attention kernel declares is code-under-test input (issue #16): every field of its
description is checked in the checker (a malformed one fails the target, never the run); a
declared reference may not contradict the declared normalizer; the certificate records what the
kernel was compared with; unknown score modifications are refused; a score modification never
switches off the properties that do not depend on the lifting.

Fixtures: ``fixtures/attention_declarations.py`` and ``fixtures/attention_bad_mod.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnverify import attention_spec
from attnverify.attention.loader import reference_problem
from attnverify.attention.spec import FIELDS, description_problem
from attnverify.cli import main
from attnverify.errors import TargetError

HERE = Path(__file__).parent / "fixtures"
DECL = str(HERE / "attention_declarations.py")


def _sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                            is_causal=is_causal, scale=scale)


def _certify(tmp_path, targets: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "cert.json"
    code = main(["certify", "--attention", targets, "--profile", "dev", "--max-examples", "3",
                 "--quiet", "--json", str(out), *extra])
    return code, json.loads(out.read_text())


# --------------------------------------------------------------------------------------------
# The reference: declared, contradicted, recorded


def test_a_declared_reference_contradicting_the_normalizer_fails_the_target(tmp_path, capsys):
    """A3: declares softmax, names sparsemax as its reference, computes sparsemax."""
    code, data = _certify(tmp_path, f"{DECL}:softmax_claims_sparsemax_ref")
    target = data["targets"][0]
    assert code == 1 and target["verdict"] == "failed"
    (load,) = target["results"]
    assert load["property"] == "load" and load["status"] == "error"
    assert "reference='sparsemax' contradicts normalizer='softmax'" in load["message"]
    assert "Traceback" not in capsys.readouterr().err


def test_a_declared_reference_that_agrees_is_honoured_and_recorded(tmp_path, capsys):
    code, data = _certify(tmp_path, f"{DECL}:softmax_with_sdpa_math_ref")
    target = data["targets"][0]
    assert code == 0 and target["verdict"] == "certified"
    assert target["reference"] == "sdpa_math" and target["reference_owner"] == "checker"
    assert target["attention"] == {"normalizer": "softmax", "score_mod": None,
                                   "reference": "sdpa_math", "reference_by": "target",
                                   "normalizer_declared": True}


def test_a_reference_of_the_targets_own_is_refused(tmp_path):
    code, data = _certify(tmp_path, f"{DECL}:own_reference")
    assert code == 1
    assert "not a built-in normalizer or attention id" in data["targets"][0]["results"][0][
        "message"]


def test_the_certificate_and_console_say_what_the_kernel_was_compared_with(tmp_path, capsys):
    out = tmp_path / "cert.json"
    main(["certify", "--attention", "sdpa", "--profile", "dev", "--max-examples", "2",
          "--json", str(out)])
    text = capsys.readouterr().out
    target = json.loads(out.read_text())["targets"][0]
    assert target["reference"] == "softmax" and target["reference_owner"] == "checker"
    assert target["attention"]["reference_by"] == "normalizer"
    assert "kernel: declares normalizer softmax" in text
    assert "reference (float64): eager attention with softmax, named by its declared " \
           "normalizer, evaluated in attnverify's process" in text


def test_a_reference_option_is_recorded_as_such_and_noted_when_it_differs(tmp_path, capsys):
    out = tmp_path / "cert.json"
    code = main(["certify", "--attention", "sdpa", "--reference", "sparsemax", "--profile",
                 "dev", "--max-examples", "2", "--json", str(out)])
    text = capsys.readouterr().out
    target = json.loads(out.read_text())["targets"][0]
    assert code == 1  # softmax attention is not sparsemax attention
    assert target["attention"]["reference_by"] == "option" and target["reference"] == "sparsemax"
    assert "note: the reference sparsemax is not the normalizer the kernel declares" in text


@pytest.mark.parametrize("normalizer, mod, reference, ok", [
    ("softmax", None, "", True),
    ("softmax", None, "softmax", True),
    ("softmax", None, "sdpa_math", True),
    ("sparsemax", None, "eager_sparsemax", True),
    ("softmax", "causal", "flex_causal", True),
    ("softmax", None, "sparsemax", False),
    ("softmax", None, "eager_sparsemax", False),
    ("softmax", None, "flex_causal", False),
    ("softmax", None, "mymodule:ref", False),
])
def test_the_reference_rule(normalizer, mod, reference, ok):
    assert (reference_problem(normalizer, mod, reference) == "") is ok


# --------------------------------------------------------------------------------------------
# Score modifications


def test_attention_spec_refuses_an_unknown_score_mod():
    with pytest.raises(TargetError, match="score_mod='softcapp' is not a score modification"):
        attention_spec(_sdpa, score_mod="softcapp")


@pytest.mark.parametrize("target", [f"{HERE / 'attention_bad_mod.py'}:kernel",
                                    f"{DECL}:unknown_mod_direct"])
def test_an_unknown_score_mod_is_a_one_line_usage_error(target, capsys):
    """A7: in attention_spec() at import, or in a description built without it."""
    assert main(["certify", "--attention", target, "--profile", "dev"]) == 2
    err = capsys.readouterr().err
    assert "is not a score modification" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_score_mod_keeps_the_properties_that_do_not_depend_on_the_lifting(tmp_path):
    code, data = _certify(tmp_path, f"{DECL}:softcap_ok")
    status = {r["property"]: r["status"] for r in data["targets"][0]["results"]}
    assert code == 0, status
    for prop in ("shape", "finite", "deterministic", "no_mutation", "gradient",
                 "no_side_effects", "attn_reference"):
        assert status[prop] == "holds", (prop, status[prop])
    assert status["permutation_equivariant"] == "not_applicable"
    assert data["targets"][0]["attention"]["score_mod"] == "softcap"


def test_lifted_rows_stay_within_a_declared_head_dimension(tmp_path):
    """The lifting needs d = L: every lifted case, the batteries' rows one key past the
    longest included, fits the kernel's max_head_dim (it raised on L = max_head_dim + 1)."""
    code, data = _certify(tmp_path, f"{DECL}:head_dim_16")
    status = {r["property"]: (r["status"], r.get("message")) for r in
              data["targets"][0]["results"]}
    assert code == 0, status
    for prop in ("shape", "deterministic", "simplex", "batch_independent", "mask_zero"):
        assert status[prop][0] == "holds", (prop, status[prop])


def test_a_side_effect_is_caught_whatever_the_score_mod(tmp_path):
    code, data = _certify(tmp_path, f"{DECL}:softcap_side_effect")
    res = {r["property"]: r for r in data["targets"][0]["results"]}
    assert code == 1
    assert res["no_side_effects"]["status"] == "violated", res["no_side_effects"]
    assert "grad" in res["no_side_effects"]["message"]


# --------------------------------------------------------------------------------------------
# Malformed descriptions


@pytest.mark.parametrize("attr, needle", [
    ("big_head_dim", "max_head_dim='big'"),
    ("no_dtypes", "dtypes=[]"),
    ("negative_compile", "compile_s=-5.0"),
    ("gqa_text", "gqa='yes'"),
    ("odd_space", "space='banana'"),
])
@pytest.mark.slow  # a certification per malformed description
def test_a_malformed_description_fails_the_target_not_the_run(attr, needle, tmp_path, capsys):
    code, data = _certify(tmp_path, f"{DECL}:{attr},sdpa")
    bad, good = data["targets"]
    assert code == 1 and bad["verdict"] == "failed" and good["verdict"] == "certified"
    (load,) = bad["results"]
    assert load["property"] == "load" and needle in load["message"], load["message"]
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("kw, needle", [
    ({"dtypes": ()}, "dtypes=[]"),
    ({"dtypes": ("float32",)}, "must be torch dtypes"),
    ({"max_head_dim": "big"}, "max_head_dim='big'"),
    ({"max_head_dim": 0}, "max_head_dim=0"),
    ({"compile_s": float("nan")}, "compile_s=nan"),
    ({"gqa": "yes"}, "gqa='yes'"),
    ({"claims": [1]}, "claims=[1]"),
])
def test_attention_spec_refuses_bad_fields_in_the_users_process(kw, needle):
    with pytest.raises(TargetError, match=None) as info:
        attention_spec(_sdpa, **kw)
    assert needle in str(info.value)


def _description() -> dict:
    from attnverify import remote

    channel = remote.Channel("attention", "sdpa", {}, timeout_s=60, device="cpu",
                             isolated=False)
    return dict(channel.open())


@pytest.mark.parametrize("field, value", [
    ("id", ""), ("id", 3), ("params", []), ("params", {1: 2}), ("normalizer", None),
    ("space", "banana"), ("claims", "simplex"), ("claims", [None]), ("score_mod", 7),
    ("gqa", 1), ("dtypes", []), ("dtypes", ["float8"]), ("dtypes", ["float32", "float32"]),
    ("max_head_dim", "big"), ("max_head_dim", -1), ("max_head_dim", True),
    ("differentiable", "no"), ("unavailable", None), ("compile_s", "inf"), ("compile_s", -1),
    ("compile_s", 1e9), ("reference", 5), ("description", ["x"]), ("source", None),
    ("target", {}),
])
def test_every_description_field_is_checked(field, value):
    d = _description()
    assert description_problem(d) == ""
    d[field] = value
    assert description_problem(d).startswith(f"{field}="), (field, value)
    del d[field]
    assert description_problem(d) == f"no {field!r} in its description"
    assert field in FIELDS
