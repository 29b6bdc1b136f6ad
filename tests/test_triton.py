"""Triton kernels certified through Triton's interpreter, in the worker (issue #26).

The examples users copy (examples/triton/) hold, and each planted defect of
tests/fixtures/planted_triton.py fails with a violation (never an error of the harness) whose
shrunk counterexample's repro finds it again. Every target runs in a worker forked from the
zygote, whose ``torch._dynamo`` has imported triton before any target: the worker must set the
interpreter up itself. Each check runs a few properties on few examples (the interpreter pays
per program instance); the examples' ci-profile certification is timed by
benchmarks/triton_certify.py.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
import torch

from attnverify import cli, triton_runtime
from attnverify.attention import cases as AC
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.certify import certify_target, fix_reference, make_context
from attnverify.checks import PROPERTIES
from attnverify.checks import cases as C
from attnverify.errors import TargetError
from attnverify.registry import _missing_extra, normalizer_spec
from attnverify.report import markdown, terminal_table

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "triton"
PLANTED = Path(__file__).resolve().parent / "fixtures" / "planted_triton.py"
ALL = set(PROPERTIES) | set(ATTENTION_PROPERTIES)

needs_triton = pytest.mark.skipif(
    not triton_runtime.installed(),
    reason="triton is not installed (pip install -c constraints.txt -e '.[triton]')")


def _certify(target: str, props, *, attention=False, reference=None, examples=4):
    """``target`` in a worker of its own, only ``props`` checked, on ``examples`` examples."""
    from attnverify.attention.run import certify_attention
    from attnverify.isolation import close, open_targets

    ctx = make_context("dev", seed=0, max_examples=examples)
    if reference:
        ctx = fix_reference(ctx, reference)
    [(_, spec, failure)] = open_targets([target], {}, ctx, attention=attention)
    assert failure is None, failure
    try:
        run = certify_attention if attention else certify_target
        return run(spec, None, ctx, label=target, skip=ALL - set(props))
    finally:
        close(spec)


def _statuses(result) -> dict[str, str]:
    return {r.property: r.status for r in result.results}


# ---- the pieces, without a worker ---------------------------------------------------------


def test_triton_reads_its_mode_and_directories_from_what_the_worker_sets(tmp_path):
    on = triton_runtime.variables(True, str(tmp_path))
    assert on["TRITON_INTERPRET"] == "1"
    assert triton_runtime.variables(False, str(tmp_path))["TRITON_INTERPRET"] is None
    for name in ("TRITON_HOME", "TRITON_CACHE_DIR", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR"):
        assert on[name].startswith(str(tmp_path)), name
    assert triton_runtime.wants_interpreter({triton_runtime.ENV: "1"})
    assert not triton_runtime.wants_interpreter({})
    with pytest.raises(ValueError):
        triton_runtime.wants_interpreter({triton_runtime.ENV: "maybe"})


def test_what_ran_is_said():
    runtime = {"triton": "interpreter", "triton_kernels": "m.k"}
    assert triton_runtime.execution("cpu", runtime) == "cpu, Triton interpreter"
    assert triton_runtime.execution("cuda", {"triton": "compiled"}) == "cuda, Triton compiled"
    assert triton_runtime.execution("cpu", {}) == "cpu"


def test_interpreted_rows_keep_lengths_layouts_and_kinds_with_few_rows_per_call():
    spec = normalizer_spec(lambda scores, dim=-1: scores, id="x")
    full = C.row_battery(spec, make_context("ci"), joint="all")
    capped = C.row_battery(spec, dataclasses.replace(make_context("ci"), max_rows=8),
                           joint="all")
    assert max(c.scores.shape[0] for c in full) > 1000
    assert max(c.scores.shape[0] for c in capped) <= 8
    # the value domain's rows (one per decade and sign) are split into blocks of the cap: every
    # row is kept, in more cases
    far = [torch.cat([c.scores for c in cases if c.kind == "far_rows"]) for cases in (full, capped)]
    assert torch.equal(far[0], far[1])
    full = [c for c in full if c.kind != "far_rows"]
    capped = [c for c in capped if c.kind != "far_rows"]
    assert len(capped) == len(full)
    assert [c.scores.shape[-1] for c in capped] == [c.scores.shape[-1] for c in full]
    assert [c.kind for c in capped] == [c.kind for c in full]
    assert [getattr(c.layout, "kinds", None) for c in capped] == \
        [getattr(c.layout, "kinds", None) for c in full]


def test_interpreted_attention_recipes_keep_their_group_and_keys():
    big = AC.recipe(b=1, h=32, h_kv=8, l_q=129, l_k=1000, d=64, mask="bool")
    r = AC.capped(big, 4, 17)
    assert r["b"] * r["h"] <= 4 and r["l_q"] == 17 and r["h"] // r["h_kv"] == 4
    assert (r["l_k"], r["d"], r["mask"]) == (1000, 64, "bool")
    r = AC.capped(AC.recipe(b=4, h=3, h_kv=3, l_q=6), 4, 17)
    assert r["b"] * r["h"] <= 4 and r["l_q"] == 6 and r["h"] == r["h_kv"]


def test_a_target_importing_triton_where_it_is_missing_is_told_the_extra():
    missing = ModuleNotFoundError("No module named 'triton'", name="triton")
    with pytest.raises(TargetError, match=r"pip install 'attnverify\[triton\]'"):
        _missing_extra(missing, "file 'k.py'")
    _missing_extra(ModuleNotFoundError("x", name="numpyy"), "file 'k.py'")  # not an extra's


def test_triton_interpret_without_triton_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(triton_runtime, "installed", lambda: False)
    assert cli.main(["certify", "softmax", "--triton-interpret", "--profile", "dev"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attnverify[triton]" in err


def test_the_interpreter_is_asked_for_by_one_command_for_its_own_workers(monkeypatch):
    import argparse
    import os

    from attnverify.commands import triton_mode

    monkeypatch.setattr(triton_runtime, "installed", lambda: True)
    monkeypatch.delenv(triton_runtime.ENV, raising=False)
    for given, wanted in (({"triton_interpret": True, "device": "cuda"}, "1"),
                          ({"device": "cpu"}, "1"), ({"device": "cuda"}, None), ({}, None)):
        with triton_mode(argparse.Namespace(**given)):
            assert os.environ.get(triton_runtime.ENV) == wanted, given
        assert triton_runtime.ENV not in os.environ


def test_a_target_whose_import_misses_triton_exits_2(tmp_path, capsys):
    target = tmp_path / "needs_triton.py"
    target.write_text("raise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n"
                      "def f(scores, dim=-1):\n    return scores\n")
    assert cli.main(["certify", f"{target}:f", "--profile", "dev", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attnverify[triton]" in err


# ---- the examples, through the interpreter in the worker ----------------------------------


@pytest.mark.slow  # a certification through the Triton interpreter
@needs_triton
def test_one_block_row_softmax_holds_under_the_interpreter():
    res = _certify(f"{EXAMPLES / 'softmax_rows.py'}:softmax",
                   ("matches_reference", "gradient"), reference="softmax")
    got = _statuses(res)
    assert got["matches_reference"] == "holds", got
    # a forward-only kernel: no backward, said as such (not an error, not a violation)
    (grad,) = [r for r in res.results if r.property == "gradient"]
    assert grad.status == "not_applicable" and "no autograd graph" in grad.message
    assert res.execution == "cpu, Triton interpreter"
    data = res.to_json()
    assert data["execution"] == "cpu, Triton interpreter"
    assert data["coverage"]["per_call"]["rows"] == triton_runtime.MAX_ROWS
    shown = terminal_table({"targets": [data]})
    assert "device: cpu, Triton interpreter" in shown and "at most 8 rows per call" in shown
    assert "Device: cpu, Triton interpreter." in markdown({
        "targets": [data], "attnverify_version": "-", "torch_version": "-", "device": "cpu",
        "profile": "dev", "seed": 0})


@pytest.mark.slow  # a certification through the Triton interpreter
@needs_triton
def test_online_softmax_holds_under_the_interpreter():
    res = _certify(f"{EXAMPLES / 'softmax_online.py'}:softmax", ("matches_reference",),
                   reference="softmax", examples=3)
    assert _statuses(res) == {"matches_reference": "holds"}


@pytest.mark.slow  # a certification through the Triton interpreter
@needs_triton
def test_flash_attention_holds_under_the_interpreter():
    res = _certify(f"{EXAMPLES / 'flash_attention.py'}:spec", ("attn_causal", "attn_gradients"),
                   attention=True, examples=3)
    got = _statuses(res)
    assert got["attn_causal"] == "holds", got
    assert got["attn_gradients"] == "not_applicable"  # declared differentiable=False
    assert res.execution == "cpu, Triton interpreter"
    assert res.call_cap["batch_heads"] == triton_runtime.MAX_PROGRAMS


# ---- planted defects: a violation, shrunk, that its repro finds again ----------------------


@needs_triton
@pytest.mark.parametrize("attr, prop, reference", [
    ("zero_fill_softmax", "simplex", None),
    ("no_max_softmax", "finite", None),
    ("narrow_block_softmax", "matches_reference", "softmax"),
    ("unrescaled_softmax", "simplex", None),
    ("row_stride_softmax", "layout_invariant", None),
    ("causal_off_by_one", "attn_causal", None),
    ("half_accumulator", "attn_causal", None),
])
@pytest.mark.slow  # a search through the Triton interpreter and a repro
def test_planted_triton_defect_is_a_violation_its_repro_finds_again(attr, prop, reference,
                                                                    capsys):
    attention = attr in ("causal_off_by_one", "half_accumulator")
    res = _certify(f"{PLANTED}:{attr}", (prop,), attention=attention, reference=reference,
                   examples=3)
    (r,) = [r for r in res.results if r.property == prop]
    assert r.status == "violated", (r.status, r.message)
    assert not [x for x in res.results if x.status == "error"]
    repro = shlex.split(r.counterexample["repro"])
    capsys.readouterr()
    if attention:  # python -m attnverify.attention.repro TARGET PROPERTY RECIPE
        from attnverify.attention import repro as attention_repro

        assert repro[:3] == ["python", "-m", "attnverify.attention.repro"], repro
        assert attention_repro.main(repro[3:]) == 1, repro
    else:
        assert repro[:2] == ["attnverify", "repro"], repro
        assert cli.main(repro[1:]) == 1, repro
    assert "violat" in capsys.readouterr().out.lower()


@needs_triton
def test_a_kernel_triton_refuses_to_run_fails_with_triton_s_message():
    res = _certify(f"{PLANTED}:half_exp_softmax", ("simplex",), examples=1)
    (r,) = res.results
    assert r.status == "error" and res.verdict == "failed"  # certify exits 1
    assert "Expected dtype" in r.message and "fp16" in r.message, r.message


@needs_triton
def test_falsify_runs_an_interpreted_kernel_in_a_worker_forked_before_torch_dynamo(tmp_path):
    """``falsify`` of an inequality without a Jacobian forks its worker before the zygote
    imports ``torch._dynamo`` (and with it triton): the target's ``import triton`` is then the
    worker's first, in the interpreter's mode, and its kernel computes the weights."""
    import json
    import subprocess
    import sys

    out = tmp_path / "f.json"
    done = subprocess.run(
        [sys.executable, "-m", "attnverify", "falsify", f"{EXAMPLES / 'softmax_rows.py'}:softmax",
         "max_weight <= exp(a/T)/L", "--profile", "dev", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    witness = json.loads(out.read_text())["witness"]
    scores = torch.tensor(witness["scores"], dtype=torch.float64)
    assert witness["quantities"]["max_weight"] == pytest.approx(
        float(torch.softmax(scores, -1).max()), rel=1e-6)
