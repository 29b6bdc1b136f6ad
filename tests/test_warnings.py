"""No command or plugin run prints a Python warning caused by attnverify's own calls; warnings
raised by the code under test are reported as the target's (issue #28.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from attnverify.falsify_search import FalsifyCase, _Polish, splits

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    # every warning shown, DeprecationWarning included (the plugin's were torch.jit.script's)
    return {**os.environ, "PYTHONWARNINGS": "default"}


def test_the_polish_starts_inside_its_bounds():
    # three keys at 0.1: their mean over the top rounds to 1.0000000000000002, which scipy
    # reported as "Initial guess is not within the specified bounds"
    case = FalsifyCase(torch.full((3,), 0.1, dtype=torch.float64), 1.0, "tie", 0)
    for _, groups, levels in splits(case):
        assert all(-1.0 <= v <= 1.0 for v in levels)
        x0, bounds = _Polish(case, True, groups, levels).start()
        assert all(lo <= v <= hi for v, (lo, hi) in zip(x0, bounds)), (x0, bounds)
    x0, bounds = _Polish(case, True).start()
    assert all(lo <= v <= hi for v, (lo, hi) in zip(x0, bounds))


def test_forward_mode_loads_without_a_deprecation_warning():
    # torch compiles its jvp decompositions with the deprecated torch.jit.script on the first
    # forward-mode product: attnverify loads them before its own first one, with that warning
    # filtered, and not at import (a run without a forward-mode product does not pay for it)
    code = textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter("always")
        import torch, torch.func
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import attnverify.remote, attnverify.falsify
            print("torch._decomp.decompositions_for_jvp" in sys.modules)
            from attnverify import jacobian
            x = torch.randn(3, 6, dtype=torch.float64)
            norm = jacobian.spectral_norm(lambda z: torch.softmax(z, -1), x)
            print("torch._decomp.decompositions_for_jvp" in sys.modules, norm.method)
            torch.func.jvp(lambda z: torch.softmax(z, -1), (x,), (torch.ones_like(x),))
        print(len([w for w in caught if "jit" in str(w.message)]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "False", out.stdout
    assert out.stdout.split("\n")[1].startswith("True"), out.stdout
    assert out.stdout.strip().split("\n")[-1] == "0", out.stdout
    assert "Warning" not in out.stderr, out.stderr


def test_a_falsify_run_prints_no_warning_and_reports_the_targets(tmp_path):
    target = tmp_path / "warns.py"
    target.write_text(textwrap.dedent("""
        import warnings
        import torch

        def warns(scores, dim=-1, temperature=1.0):
            warnings.warn("this normalizer is experimental", UserWarning, stacklevel=1)
            return torch.softmax(scores / temperature, dim)
    """))
    out_json = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "attnverify", "falsify", "entmax15",
           "jacobian_frobenius <= sqrt(1 - 1/L)/T", "--max-examples", "40", "--max-length", "8",
           "--profile", "dev"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(),
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Warning" not in run.stderr, run.stderr
    cmd = [sys.executable, "-m", "attnverify", "falsify", f"{target}:warns", "max_weight <= 1",
           "--max-examples", "12", "--max-length", "8", "--profile", "dev",
           "--json", str(out_json)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(),
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Warning" not in run.stderr, run.stderr  # reported, not printed
    assert "the target warned: UserWarning: this normalizer is experimental" in run.stdout
    data = json.loads(out_json.read_text())
    assert data["target_warnings"] == ["UserWarning: this normalizer is experimental (warns.py:6)"]


def test_the_worker_reports_the_targets_warnings_once_each():
    from attnverify.worker import Server

    server = Server()
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")

        def noisy():
            for _ in range(3):  # the same place and text: once
                warnings.warn("first", UserWarning, stacklevel=1)
            return 1

        assert server._guarded([], False, noisy) == 1
        server._guarded([], False, noisy)
    assert not outside  # nothing escapes to the worker's own output
    assert len(server.warned) == 1 and server.warned[0].startswith("UserWarning: first (")


@pytest.mark.slow  # a whole certify --attention run (every property, a few examples each)
def test_an_attention_kernels_warnings_are_reported_not_printed(tmp_path):
    target = tmp_path / "warns.py"
    target.write_text(textwrap.dedent("""
        import warnings
        import torch

        def warns(query, key, value, attn_mask=None, is_causal=False, scale=None,
                  enable_gqa=False):
            warnings.warn("this kernel is experimental", UserWarning, stacklevel=1)
            return torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                enable_gqa=enable_gqa)
    """))
    out_json = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "attnverify", "certify", "--attention", f"{target}:warns",
           "--profile", "dev", "--max-examples", "2", "--json", str(out_json)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(),
                         timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Warning" not in run.stderr, run.stderr  # reported, not printed
    assert "the target warned: UserWarning: this kernel is experimental" in run.stdout
    data = json.loads(out_json.read_text())
    assert data["targets"][0]["target_warnings"] == [
        "UserWarning: this kernel is experimental (warns.py:7)"]
