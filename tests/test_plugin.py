"""The pytest plugin: a user's CI runs the property suite against their normalizer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON_WITH_CTRL_C

pytest_plugins = ["pytester"]

FIXTURES = Path(__file__).parent / "fixtures"


def test_plugin_runs_suite_against_a_file_target(pytester):
    target = f"{FIXTURES / 'user_normalizers.py'}:plain"
    cert = pytester.path / "cert.json"
    result = pytester.runpytest_subprocess(
        f"--attnverify-target={target}", "--attnverify-profile=dev",
        f"--attnverify-json={cert}", "-q", "-p", "no:cacheprovider")
    data = json.loads(cert.read_text())
    (t,) = data["targets"]
    result.assert_outcomes(passed=len(t["results"]))  # one test per property, all hold
    assert t["verdict"] == "certified" and t["claims"] == ["simplex"]
    assert {r["property"] for r in t["results"]} >= {"shape", "mask_zero", "simplex"}


def test_plugin_reports_violation_and_honours_xfails(pytester):
    target = f"{FIXTURES / 'planted.py'}:row_sum_off_softmax"
    cert = pytester.path / "cert.json"
    result = pytester.runpytest_subprocess(
        f"--attnverify-target={target}", "--attnverify-profile=dev", f"--attnverify-json={cert}",
        "-q", "-p", "no:cacheprovider")
    n = len(json.loads(cert.read_text())["targets"][0]["results"])
    result.assert_outcomes(passed=n - 1, failed=1)
    result.stdout.fnmatch_lines(["*row_sum_off_softmax::simplex violated*",
                                 "*repro: attnverify repro *"])
    xf = pytester.path / "xfails.txt"
    xf.write_text("row_sum_off_softmax::simplex\n")
    result = pytester.runpytest_subprocess(
        f"--attnverify-target={target}", "--attnverify-profile=dev", f"--attnverify-xfails={xf}",
        "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=n - 1, xfailed=1)


def test_a_session_that_ran_part_of_the_suite_certifies_nothing_it_did_not_run(pytester):
    """``-k`` (or ``-x``, Ctrl-C) leaves tests unrun: the certificate still lists every
    property planned, the unrun ones ``not_checked``, so the target is ``not_checked``, never
    ``certified`` on the one property that ran."""
    target = f"{FIXTURES / 'user_normalizers.py'}:plain"
    cert = pytester.path / "cert.json"
    result = pytester.runpytest_subprocess(
        f"--attnverify-target={target}", "--attnverify-profile=dev", "-k", "simplex",
        f"--attnverify-json={cert}", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=result.parseoutcomes()["deselected"])
    (t,) = json.loads(cert.read_text())["targets"]
    status = {r["property"]: r["status"] for r in t["results"]}
    assert status.pop("simplex") == "holds" and t["claims"] == ["simplex"]
    assert status and set(status.values()) == {"not_checked"}, status
    assert t["verdict"] == "not_checked"
    unrun = next(r for r in t["results"] if r["property"] == "shape")
    assert "were not run in this pytest session" in unrun["message"]


def test_the_attention_suite_under_xdist_writes_one_certificate_of_every_worker(pytester):
    """Under pytest-xdist the attention suite's results reach the controller, which writes the
    certificate once (each worker wrote its own, holding only its own tests)."""
    cert = pytester.path / "cert.json"
    chosen = ("shape", "finite", "attn_causal", "attn_bool_mask")
    result = pytester.runpytest_subprocess(
        "-n", "2", "--attnverify-attention=sdpa", "--attnverify-profile=dev",
        "--attnverify-max-examples=3", f"--attnverify-json={cert}", "-k", " or ".join(chosen),
        "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=len(chosen))
    (t,) = json.loads(cert.read_text())["targets"]
    status = {r["property"]: r["status"] for r in t["results"]}
    assert {p: status.pop(p) for p in chosen} == dict.fromkeys(chosen, "holds")
    assert status and set(status.values()) == {"not_checked"} and t["verdict"] == "not_checked"


def test_plugin_bad_target_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--attnverify-target=nosuch", "-q")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*unknown target 'nosuch'*"])


def test_plugin_loads_from_a_source_checkout_that_shadows_the_install():
    """``python -m pytest`` in the repository imports the checkout's ``attnverify/``, which has
    no ``properties`` subpackage (only the install maps ``properties/`` into the package): the
    plugin finds the suite in the checkout's ``properties/`` instead of failing to load."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "import attnverify.pytest_plugin as p, attnverify.properties as s\n"
        "print(p.SUITE, p.SUITE.is_file(), s.__file__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    folder = root / "properties"
    assert out.stdout.split() == [str(folder / "test_properties.py"), "True",
                                  str(folder / "__init__.py")]


def test_plugin_runs_the_target_behind_the_process_boundary(pytester, monkeypatch):
    """A target that segfaults or hangs fails the tests it ran in; pytest itself goes on, and
    the certificate names the worker processes (never pytest's own)."""
    cert = pytester.path / "cert.json"
    for name, fragment in (("segfaults", "crashed the worker process (SIGSEGV)"),
                           ("hangs", "exceeded the per-example time limit")):
        target = f"{FIXTURES / 'hostile.py'}:{name}"
        result = pytester.runpytest_subprocess(
            f"--attnverify-target={target}", "--attnverify-profile=dev",
            "--attnverify-max-examples=3", f"--attnverify-json={cert}", "-q",
            "--attnverify-timeout=3", "-p", "no:cacheprovider", "-k",
            "shape or finite or simplex")
        data = json.loads(cert.read_text())
        (t,) = data["targets"]
        messages = [r["message"] for r in t["results"] if r["status"] == "error"]
        assert any(fragment in m for m in messages), (name, messages)
        assert result.ret == 1 and data["isolation_mode"] == "process"
        assert t["worker_pids"] and data["checker_pid"] not in t["worker_pids"]
        # the plugin's certificate says what its workers ran under, as certify's does
        assert data["sandbox"] == t["sandbox"]
        assert data["sandbox"].startswith(("landlock ABI", "none: this kernel has no Landlock"))


def test_plugin_shards_merge_into_what_certify_writes(pytester, monkeypatch, capsys):
    """``--attnverify-shard K/N`` (and ``ATTNVERIFY_SHARD``) runs the partition certify --shard
    makes; the parts merge into the certificate an unsharded ``attnverify certify`` writes."""
    from attnverify.cli import main

    target = f"{FIXTURES / 'planted.py'}:row_sum_off_softmax"
    options = ["--profile", "dev", "--max-examples", "6"]
    parts = [pytester.path / f"part-{k}.json" for k in (1, 2)]
    outcomes = []
    for k, part in zip((1, 2), parts):
        if k == 2:
            monkeypatch.setenv("ATTNVERIFY_SHARD", "2/2")
        shard = [f"--attnverify-shard={k}/2"] if k == 1 else []
        result = pytester.runpytest_subprocess(
            f"--attnverify-target={target}", "--attnverify-profile=dev",
            "--attnverify-max-examples=6", f"--attnverify-json={part}", *shard, "-q",
            "-p", "no:cacheprovider")
        outcomes.append(result.parseoutcomes())
    # simplex fails in each shard that holds a unit of it (float32, float64), and only there
    holds_simplex = [any("::simplex::" in u for u in json.loads(part.read_text())["shard"]["units"])
                     for part in parts]
    assert [o.get("failed", 0) for o in outcomes] == [int(h) for h in holds_simplex]
    assert any(holds_simplex)
    assert all(o.get("skipped", 0) for o in outcomes)  # the other shard's tests are skipped
    merged, whole = pytester.path / "merged.json", pytester.path / "whole.json"
    assert main(["merge", *map(str, parts), "--json", str(merged), "--quiet"]) == 1
    assert main(["certify", target, *options, "--json", str(whole), "--quiet"]) == 1
    capsys.readouterr()

    def results(path):
        return [{**{k: v for k, v in r.items() if k != "elapsed_s"},
                 "units": [{k: v for k, v in u.items() if k != "elapsed_s"}
                           for u in r["units"]]}
                for r in json.loads(path.read_text())["targets"][0]["results"]]

    assert results(merged) == results(whole)


SLOW = '''import time

import torch


def slow(scores, dim=-1):
    time.sleep(0.01)
    return torch.softmax(scores, dim)
'''


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_a_session_stopped_by_a_signal_writes_the_certificate_of_what_ran(tmp_path, stop):
    """A cancelled CI job (SIGTERM) or Ctrl-C ends the session as an interrupt: the certificate
    is written, each property that ran as it ended, the others not_checked, and it says which
    signal stopped it (SIGTERM used to kill pytest before it wrote anything)."""
    (tmp_path / "slow.py").write_text(SLOW)
    cert = tmp_path / "cert.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*PYTHON_WITH_CTRL_C, "-m", "pytest", f"--attnverify-target={tmp_path / 'slow.py'}:slow",
         "--attnverify-profile=dev", f"--attnverify-json={cert}", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if " PASSED" in line:
                proc.send_signal(getattr(signal, stop))
                break
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    # pytest's INTERRUPTED; 1 where pytest's own reporter fails on the interrupt's traceback
    # (a frame without a line number), which the certificate does not depend on
    assert proc.returncode in (2, 1), "".join(seen) + rest
    (t,) = json.loads(cert.read_text())["targets"]
    data = json.loads(cert.read_text())
    assert data["interrupted"] == stop
    status = [r["status"] for r in t["results"]]
    assert "holds" in status and "not_checked" in status, status
    assert t["verdict"] == "not_checked"
