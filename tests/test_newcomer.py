"""What a new user hit in their first hour (issue #28), each fixed at its root: a signature that
cannot take the contract fails ``load`` once, the user's own traceback is kept, ratios only where
they mean something, NaN derivatives said in words, an undeclared kernel says what was assumed,
a folder shadowing the package is named, a closed pipe is no error, unknown options get a
suggestion, the plugin's test ids name the suite."""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnverify import normalizer_spec, worker
from attnverify.attention.spec import attention_spec
from attnverify.certify import PropertyResult, combine, make_context
from attnverify.checks import gradient as G
from attnverify.checks.cases import RowCase
from attnverify.cli import main
from attnverify.remote import RemoteFunction
from attnverify.report import kernel_lines, ratio_cell

ATTNVERIFY = [sys.executable, "-m", "attnverify"]
CLI = str(Path(sys.executable).with_name("attnverify"))

USER_CODE = '''
import torch

def nodim(scores):
    return torch.softmax(scores, -1)

def star_params(scores, dim=-1, **params):
    return torch.softmax(scores, dim=dim)

def boom(scores, dim=-1):
    return helper(scores)

def helper(x):
    raise ValueError("boom")
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "mynorms.py"
    path.write_text(USER_CODE)
    return path


def _certify(target: str, tmp_path, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / "cert.json"
    proc = subprocess.run([CLI, "certify", target, "--profile", "dev", "--max-examples", "1",
                           "--json", str(out), *extra], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    return proc.returncode, json.loads(out.read_text()), proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------------
# 6: the signature is checked at load


def _plain(scores, dim=-1, **params):
    return scores


def _kwargs_only(scores, **kw):
    return scores


def _positional_dim(scores, dim, /):
    return scores


def _needs_alpha(scores, dim=-1, *, alpha):
    return scores


def test_the_signature_is_judged_against_the_call_the_checker_makes():
    assert worker._signature(_plain)["contract"] == ""
    assert worker._signature(_kwargs_only)["contract"] == ""  # dim lands in **kw
    assert worker._signature(torch.softmax)["contract"] == ""  # C: no signature, not judged
    assert worker._signature(torch.nn.functional.softmax)["contract"] == ""
    no_dim = worker._signature(lambda scores: scores)["contract"]
    assert "fn(scores, dim=-1, **params)" in no_dim and "'dim'" in no_dim
    assert "dim" in worker._signature(_positional_dim)["contract"]
    assert "alpha" in worker._signature(_needs_alpha)["contract"]
    assert worker._signature(_needs_alpha, {"alpha": 2})["contract"] == ""
    # the name of a **params is no keyword the function takes
    assert worker._signature(_plain)["accepts"] == []


def test_a_var_keyword_named_params_makes_a_valid_proxy_signature():
    fn = RemoteFunction(None, "target", "x", {}, {"accepts": ["params", "scale"],
                                                  "var_keywords": True})
    assert list(inspect.signature(fn).parameters) == ["scores", "dim", "scale", "params"]


def test_a_function_without_dim_fails_load_once_naming_the_contract(user_file, tmp_path):
    code, data, text = _certify(f"{user_file}:nodim", tmp_path)
    (load,) = data["targets"][0]["results"]
    assert code == 1 and load["property"] == "load" and load["status"] == "error"
    assert "fn(scores, dim=-1, **params)" in load["message"]
    assert "unexpected keyword argument 'dim'" in load["message"]
    assert text.count("TypeError") <= 1 and "Traceback" not in text


# --------------------------------------------------------------------------------------------
# 7: the user's traceback


def _raises_here():
    raise ValueError("boom")


def test_the_users_traceback_keeps_their_frames_and_drops_attnverifys():
    try:
        _raises_here()
    except ValueError as exc:
        lines = worker.user_traceback(exc)
    assert any(__file__ in line and "_raises_here" in line for line in lines)
    assert lines[-1] == "ValueError: boom"
    assert not any(os.sep + "attnverify" + os.sep + "worker.py" in line for line in lines)


@pytest.mark.slow  # certify runs on the command line
def test_a_raising_target_keeps_its_traceback_in_the_json_and_shows_it_on_request(user_file,
                                                                                   tmp_path):
    code, data, text = _certify(f"{user_file}:boom", tmp_path, "--traceback")
    shape = data["targets"][0]["results"][0]
    assert code == 1 and shape["status"] == "error"
    trace = shape["traceback"]
    assert any("mynorms.py" in line and "in helper" in line for line in trace)
    assert trace[-1] == "ValueError: boom"
    assert not any("attnverify" + os.sep in line for line in trace)
    assert "in helper" in text and "raise ValueError(\"boom\")" in text


# --------------------------------------------------------------------------------------------
# 2: a ratio only where it means something


def _result(status, worst, ce_ratio=None):
    ce = None if ce_ratio is None else {"ratio": ce_ratio}
    return {"status": status, "worst_ratio": worst, "counterexample": ce}


def test_a_ratio_is_shown_only_where_it_means_something():
    assert ratio_cell(_result("holds", 0.25)) == "0.25"
    assert ratio_cell(_result("violated", 0.00683, "nan")) == "nan"
    assert ratio_cell(_result("violated", 0.5, "inf")) == "inf"
    assert ratio_cell(_result("violated", 0.5, 0.3)) == "—"  # never "holds" next to VIOLATED
    assert ratio_cell(_result("violated", 3.0, 2.0)) == "3"
    assert ratio_cell(_result("error", 0.0)) == "—"
    assert ratio_cell(_result("not_applicable", None)) == "—"


def test_a_nan_ratio_survives_the_combination_of_units():
    ok = PropertyResult("simplex", True, "holds", worst_ratio=0.5)
    bad = PropertyResult("simplex", True, "violated", worst_ratio=math.nan)
    assert math.isnan(combine("simplex", True, [("float32", ok), ("float64", bad)]).worst_ratio)
    assert math.isnan(combine("simplex", True, [("float32", bad), ("float64", ok)]).worst_ratio)


# --------------------------------------------------------------------------------------------
# 3: a NaN derivative in words


def _relu_norm(scores, dim=-1):
    r = torch.relu(scores)
    return r / r.sum(dim=dim, keepdim=True)


def test_a_nan_derivative_names_its_key_its_score_and_why():
    spec = normalizer_spec(_relu_norm, id="relu_norm")
    case = RowCase(torch.tensor([[0.0]], dtype=torch.float32), None, "single", 7)
    with pytest.raises(G.Violation) as info:
        G.check_gradient(spec, case, make_context("ci", seed=0))
    text = str(info.value)
    assert "nan at key 0 (score 0)" in text and "must be a finite number" in text
    assert "weights of this row are [nan]" in text and "ratio nan" not in text


# --------------------------------------------------------------------------------------------
# 4: an undeclared kernel


def _sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_a_kernel_that_declared_nothing_says_what_was_assumed():
    assert attention_spec(_sdpa).normalizer_declared is False
    assert attention_spec(_sdpa, normalizer="softmax").normalizer_declared is True
    rec = {"normalizer": "softmax", "score_mod": None, "reference": "softmax",
           "reference_by": "normalizer", "normalizer_declared": False}
    lines = kernel_lines({"attention": rec, "reference_owner": "checker"})
    assert lines[0].startswith("kernel: declares nothing; checked as normalizer softmax")
    assert "assumed" in lines[1] and "declared" not in lines[1]
    rec["normalizer_declared"] = True
    assert kernel_lines({"attention": rec})[0] == "kernel: declares normalizer softmax"


# --------------------------------------------------------------------------------------------
# 9: a folder named attnverify shadowing the package


def test_a_folder_shadowing_the_package_is_named_in_one_line(tmp_path):
    (tmp_path / "attnverify" / "attnverify").mkdir(parents=True)  # a clone, from its parent
    proc = subprocess.run([*ATTNVERIFY, "list"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "shadows the attnverify package" in lines[0]
    assert str(tmp_path / "attnverify") in lines[0]


def test_the_worker_imports_the_checkers_attnverify_wherever_it_runs(tmp_path):
    """Run from the clone's parent, a spec file importing attnverify loads in its worker."""
    (tmp_path / "attnverify" / "attnverify").mkdir(parents=True)
    (tmp_path / "spec.py").write_text(
        "import torch\nfrom attnverify import Kernel, normalizer_spec\n"
        "norm = normalizer_spec(lambda scores, dim=-1: torch.softmax(scores, dim=dim), "
        "id='norm')\n")
    code, data, text = _certify("spec.py:norm", tmp_path, "--quiet")
    assert "cannot import name" not in text
    assert data["targets"][0]["results"][0]["property"] != "load", text


# --------------------------------------------------------------------------------------------
# 10, 11: pipes and options


@pytest.mark.parametrize("command", ["list", "properties", "quantities"])
def test_a_closed_pipe_is_no_error(command):
    proc = subprocess.Popen([CLI, command], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader went away (| head) before anything was written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == ""


def test_an_unknown_option_suggests_the_closest_and_the_subcommands_help(capsys):
    assert main(["certify", "--profle", "dev", "softmax"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--profle" in err and "did you mean --profile?" in err
    assert "attnverify certify --help" in err and len(err.splitlines()) == 1
    assert main(["falsify", "--max-exmples=3", "softmax", "x <= 1"]) == 2
    assert "did you mean --max-examples?" in capsys.readouterr().err
    assert main(["certfy"]) == 2
    assert "did you mean certify?" in capsys.readouterr().err


def test_an_option_before_the_command_is_named_with_where_it_goes(capsys):
    # once read as "unknown command 'ci'": the option's value was taken for the command
    assert main(["--profle", "ci", "certify", "softmax"]) == 2
    err = capsys.readouterr().err.strip()
    assert "before the command 'certify'" in err and "did you mean --profile?" in err
    assert "'attnverify certify --profile ...'" in err and len(err.splitlines()) == 1
    assert main(["--jobs=2", "list"]) == 2
    assert "unrecognized option --jobs before the command 'list'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# 15: the plugin's test ids


def test_the_plugins_test_ids_name_the_suite_outside_the_root(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--attnverify-target=softmax",
                           "--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    ids = [line for line in proc.stdout.splitlines() if "test_property[" in line]
    assert ids, proc.stdout + proc.stderr
    assert all(line.startswith("attnverify/properties/test_properties.py::") for line in ids)


# --------------------------------------------------------------------------------------------
# 12: what --max-examples bounds


def test_the_help_of_max_examples_says_what_it_bounds(capsys):
    with pytest.raises(SystemExit):
        main(["certify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "examples Hypothesis draws per property" in text
    assert "fixed battery of edge cases" in text and "does not bound" in text


# --------------------------------------------------------------------------------------------
# 14: --no-progress and the model's loading bars


def test_no_progress_silences_every_tqdm_bar_made_while_a_model_loads():
    pytest.importorskip("transformers")
    import io

    from tqdm.auto import tqdm  # imported first, as transformers imports it before any load

    from attnverify.empirical.pipeline import _quiet_loading

    quiet, loud = io.StringIO(), io.StringIO()
    with _quiet_loading(True):
        for _ in tqdm(range(3), file=quiet, desc="Converting and de-quantizing GGUF tensors"):
            pass
    for _ in tqdm(range(3), file=loud, desc="after the load"):
        pass
    assert quiet.getvalue() == "" and "after the load" in loud.getvalue()


# --------------------------------------------------------------------------------------------
# 8: a time-limit counterexample is shrunk, within a budget


class _HangsFrom4:
    """A property whose re-check "hangs" (runs past the limit) on any row of 4 keys or more,
    each hang advancing a fake clock by the whole limit."""

    def __init__(self, clock, limit):
        self.clock, self.limit, self.hangs = clock, limit, 0

    def recheck(self, spec, case, ctx):
        from attnverify.errors import WorkerFailed

        if case.scores.shape[-1] >= 4:
            self.hangs += 1
            self.clock[0] += self.limit
            raise WorkerFailed("exceeded the per-example time limit", timed_out=True)
        return 0.0


def _hang_case():
    scores = torch.randn(3, 9, generator=torch.Generator().manual_seed(0))
    return RowCase(scores.to(torch.float32), None, "gaussian", 0)


def test_a_time_limit_counterexample_is_shrunk_within_a_bounded_number_of_limits(monkeypatch):
    import attnverify.certify as C

    clock = [0.0]
    monkeypatch.setattr(C.time, "monotonic", lambda: clock[0])
    ctx = make_context("dev", timeout=5)
    prop = _HangsFrom4(clock, ctx.timeout_s)
    small, note = C.shrink_hang(prop, None, ctx, _hang_case())
    assert prop.hangs <= C.HANG_SHRINK_LIMITS  # each hang costs a whole limit: bounded
    assert small.scores.shape[-1] < 9 and "shrunk" in note
    # with room for it, the shrink reaches the smallest hang: one row of four zeros
    monkeypatch.setattr(C, "HANG_SHRINK_LIMITS", 100)
    monkeypatch.setattr(C, "HANG_SHRINK_S", 1e9)
    small, _ = C.shrink_hang(_HangsFrom4(clock, ctx.timeout_s), None, ctx, _hang_case())
    assert small.scores.tolist() == [[0.0, 0.0, 0.0, 0.0]]


def test_a_target_that_hangs_is_reported_on_its_shrunk_case(user_file):
    from attnverify import isolation, remote
    from attnverify.certify import run_property
    from attnverify.checks import PROPERTIES

    user_file.write_text(USER_CODE + "\n\ndef hang(scores, dim=-1):\n    import time\n"
                         "    while scores.shape[dim] >= 4:\n        time.sleep(0.01)\n"
                         "    return torch.softmax(scores, dim=dim)\n")
    ctx = make_context("dev", timeout=1, isolation=True, max_examples=5)
    spec = remote.open_normalizer(f"{user_file}:hang", {}, ctx)
    try:
        res = run_property(PROPERTIES["shape"], spec, ctx)
    finally:
        isolation.close(spec)
        remote.shutdown()
    assert res.status == "error" and "time limit" in res.message and "shrunk" in res.message
    assert res.counterexample["scores"] == [[0.0, 0.0, 0.0, 0.0]]
