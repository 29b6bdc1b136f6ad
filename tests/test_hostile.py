"""Hostile input (issue #10): a target that exits, crashes, hangs or raises a BaseException fails
the running property (exit 1) and the other targets' results are kept; output paths never damage
files; every bad value is exit 2 with one line and no traceback."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from attnverify import atomic
from attnverify.cli import main
from attnverify.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = str(FIXTURES / "hostile.py")
FAST = ["--profile", "dev", "--max-examples", "2", "--claims", "", "--quiet"]

pytest_plugins = ["pytester"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def usage(capsys, *argv) -> str:
    code, _, err = run(capsys, *argv)
    assert code == 2, err
    assert err.startswith("attnverify: error:") and err.count("\n") == 1, err
    return err


def certificate(capsys, tmp_path, *targets, extra=()):
    path = tmp_path / "cert.json"
    code, out, err = run(capsys, "certify", *targets, *FAST, "--json", path, *extra)
    data = json.loads(path.read_text())
    return code, {t["target"]: t for t in data["targets"]}, data


def first_error(target: dict) -> dict:
    errors = [r for r in target["results"] if r["status"] == "error"]
    assert errors, target
    return errors[0]


# --------------------------------------------------------------------------------------------
# Isolation: the misbehaving target fails, the others are kept


@pytest.mark.parametrize("name, fragment", [
    ("exits", "raised SystemExit"),
    ("hard_exits", "exited the worker process (exit code 0)"),
    ("segfaults", "crashed the worker process (SIGSEGV)"),
    ("raises_base", "raised Custom: not an Exception"),
])
def test_a_target_that_ends_the_process_fails_and_the_others_are_written(
        capsys, tmp_path, name, fragment):
    code, targets, _ = certificate(capsys, tmp_path, f"{HOSTILE}:{name}", "softmax")
    assert code == 1
    assert targets["softmax"]["verdict"] == "certified"
    bad = targets[f"{HOSTILE}:{name}"]
    assert bad["verdict"] == "failed"
    err = first_error(bad)
    assert fragment in err["message"]
    # the input that did it: three keys or more (the fixture misbehaves from length 3 on)
    assert err["counterexample"]["shape"][-1] >= 3


def test_exit_at_import_fails_the_target_and_keeps_the_others(capsys, tmp_path):
    code, targets, _ = certificate(capsys, tmp_path, f"{FIXTURES / 'exits_on_import.py'}:softmax",
                                   "softmax")
    assert code == 1
    assert targets["softmax"]["verdict"] == "certified"
    (result,) = targets[f"{FIXTURES / 'exits_on_import.py'}:softmax"]["results"]
    assert result["property"] == "load" and result["status"] == "error"
    assert "SystemExit" in result["message"]


def test_a_hang_is_stopped_by_the_time_limit(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOSTILE_MARKER", str(tmp_path / "hung-once"))  # one hang, not eight
    monkeypatch.setenv("ATTNVERIFY_SANDBOX_WRITABLE", str(tmp_path))  # where the marker goes
    code, targets, data = certificate(capsys, tmp_path, f"{HOSTILE}:hangs", "softmax",
                                      extra=["--timeout", "3"])
    assert code == 1 and data["timeout_s"] == 3 and data["isolation"] is True
    err = first_error(targets[f"{HOSTILE}:hangs"])
    assert "exceeded the per-example time limit of 3 s" in err["message"]
    assert err["counterexample"]["shape"][-1] >= 3
    assert targets["softmax"]["verdict"] == "certified"


def test_an_answer_trickled_byte_by_byte_is_stopped_by_the_time_limit(capsys, tmp_path,
                                                                       monkeypatch):
    """The per-example limit holds for the whole answer, not per read: a worker that writes a
    frame header and then one byte a second on its channel is stopped at the limit."""
    monkeypatch.setenv("HOSTILE_MARKER", str(tmp_path / "trickled-once"))
    monkeypatch.setenv("ATTNVERIFY_SANDBOX_WRITABLE", str(tmp_path))
    start = time.monotonic()
    code, targets, _ = certificate(capsys, tmp_path, f"{HOSTILE}:trickles_an_answer",
                                   extra=["--timeout", "3", "--claims", ""])
    assert code == 1
    err = first_error(targets[f"{HOSTILE}:trickles_an_answer"])
    assert "exceeded the per-example time limit of 3 s" in err["message"]
    assert time.monotonic() - start < 120


def test_runaway_allocation_is_an_error_result(capsys, tmp_path):
    code, targets, _ = certificate(capsys, tmp_path, f"{HOSTILE}:hogs_memory")
    assert code == 1
    assert "can't allocate memory" in first_error(targets[f"{HOSTILE}:hogs_memory"])["message"]


def test_the_worker_address_space_is_limited(capsys, tmp_path):
    code, targets, _ = certificate(capsys, tmp_path, f"{HOSTILE}:reports_memory_limit")
    assert code == 1
    assert "RLIMIT_AS=set" in first_error(targets[f"{HOSTILE}:reports_memory_limit"])["message"]


def test_no_isolation_runs_in_process(capsys, tmp_path):
    code, targets, data = certificate(capsys, tmp_path, f"{HOSTILE}:raises_base",
                                      extra=["--no-isolation"])
    assert code == 1 and data["isolation"] is False
    assert "raised Custom" in first_error(targets[f"{HOSTILE}:raises_base"])["message"]


@pytest.mark.parametrize("name, fragment", [
    ("exits", "raised SystemExit"),
    ("segfaults", "crashed the worker process (SIGSEGV)"),
])
def test_falsify_reports_the_target_that_ends_the_process(capsys, name, fragment):
    code, out, _ = run(capsys, "falsify", f"{HOSTILE}:{name}", "max_weight <= 1", "--profile",
                       "dev", "--max-examples", "3")
    assert code == 1
    assert "error: the search stopped" in out and fragment in out
    assert "input: L=" in out


def test_falsify_exit_at_import(capsys):
    code, out, _ = run(capsys, "falsify", f"{FIXTURES / 'exits_on_import.py'}:softmax",
                       "max_weight <= 1", "--profile", "dev", "--max-examples", "2")
    assert code == 1 and "loading the target raised SystemExit" in out


def test_sys_exit_in_a_plugin_test_is_a_failed_test(pytester):
    result = pytester.runpytest_subprocess(
        f"--attnverify-target={HOSTILE}:exits", "--attnverify-profile=dev",
        "--attnverify-max-examples=2", "--attnverify-claims=", "-q", "-p", "no:cacheprovider")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*exits::shape error: the normalizer raised SystemExit*"])


# --------------------------------------------------------------------------------------------
# Output paths


@pytest.mark.parametrize("path, fragment", [
    ("/dev/null", "/dev is not a place for results"),
    ("/proc/self/cert.json", "/proc is not a place for results"),
    ("/sys/cert.json", "/sys is not a place for results"),
])
def test_system_paths_are_refused_before_the_run(capsys, path, fragment):
    assert fragment in usage(capsys, "certify", "softmax", *FAST, "--json", path)


def test_directory_fifo_and_read_only_file_are_refused(capsys, tmp_path):
    assert "it is a directory" in usage(capsys, "certify", "softmax", *FAST, "--json", tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in usage(capsys, "certify", "softmax", *FAST, "--json", fifo)
    locked = tmp_path / "locked.json"
    locked.write_text("keep me")
    locked.chmod(0o444)
    assert "read-only" in usage(capsys, "certify", "softmax", *FAST, "--markdown", locked)
    assert locked.read_text() == "keep me"


def test_same_file_for_two_outputs_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real.json").write_text("")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    for json_path, md_path in (("x", "x"), ("x", "./x"), ("real.json", "link.json"),
                               ("x", str(tmp_path / "sub" / ".." / "x"))):
        (tmp_path / "sub").mkdir(exist_ok=True)
        err = usage(capsys, "certify", "softmax", *FAST, "--json", json_path,
                    "--markdown", md_path)
        assert "--json and --markdown name the same file" in err


def test_a_symlink_is_written_through(capsys, tmp_path):
    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    os.symlink(target, link)
    code, _, _ = run(capsys, "certify", "softmax", *FAST, "--json", link)
    assert code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["targets"][0]["target"] == "softmax"


def test_atomic_write_keeps_the_mode_and_refuses_non_regular_files(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x")
    path.chmod(0o640)
    atomic.write_text_atomic(path, "y")
    assert path.read_text() == "y" and stat.S_IMODE(path.stat().st_mode) == 0o640
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        atomic.write_text_atomic(fifo, "z")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "fifo"]  # no temp file left


# --------------------------------------------------------------------------------------------
# Bad values: exit 2, one line, naming what was wrong


@pytest.mark.parametrize("params, fragment", [
    ("temperature=abc", "temperature"), ("temperature=0", "temperature"),
    ("temperature=-1", "temperature"), ("temperature=nan", "temperature"),
    ("temperature=inf", "temperature"), ("temperature=١", "temperature"),
    ("temperature=true", "temperature"),
])
def test_bad_temperature_is_exit_2(capsys, params, fragment):
    assert fragment in usage(capsys, "certify", "softmax", *FAST, "--params", params)


@pytest.mark.parametrize("target, params, fragment", [
    ("entmax_alpha", "alpha=abc", "alpha must be a finite number >= 1"),
    ("entmax_alpha", "alpha=0.5", "alpha must be a finite number >= 1"),
    ("entmax_alpha", "alpha=inf", "alpha must be a finite number >= 1"),
    ("dagpam", "lam=abc", "lam must be a finite number >= 0"),
    ("dagpam", "lam=-0.5", "lam must be a finite number >= 0"),
    ("ssmax", "s=0", "s must be a positive finite number"),
    ("softpick", "eps=nan", "eps must be a positive finite number"),
    ("sigmoid", "bias=abc", "bias must be a finite number or none"),
    ("sigmoid", "bias=-inf", "bias must be a finite number or none"),
])
def test_bad_params_are_exit_2(capsys, target, params, fragment):
    assert fragment in usage(capsys, "certify", target, *FAST, "--params", params)
    assert fragment in usage(capsys, "falsify", target, "max_weight <= 1", "--params", params)


def test_a_spec_validates_its_own_parameters():
    from attnverify.registry import load_target, normalizer_spec, validate_params

    spec = normalizer_spec(lambda scores, dim=-1, p=0.5: scores, id="f",
                           param_checks={"p": lambda v: None if 0 < v < 1 else "in (0, 1)"})
    validate_params(spec, {"p": 0.25})
    with pytest.raises(UsageError, match=r"--params p=2: p must be in \(0, 1\)"):
        validate_params(spec, {"p": 2})
    assert load_target("sigmoid", {"bias": None}).params["bias"] is None


@pytest.mark.parametrize("argv, fragment", [
    (["--max-examples", "1000000000"], "--max-examples"),
    (["--max-examples", "١٢"], "--max-examples"),
    (["--seed", str(2**64)], "--seed"),
    (["--seed", "-1"], "--seed"),
    (["--seed", "٣"], "--seed"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "-3"], "--timeout"),
    (["--timeout", "soon"], "--timeout"),
])
def test_bad_search_options_are_exit_2(capsys, argv, fragment):
    assert fragment in usage(capsys, "certify", "softmax", "--quiet", *argv)
    assert fragment in usage(capsys, "falsify", "softmax", "max_weight <= 1", *argv)


@pytest.mark.parametrize("expression, fragment", [
    ("(" * 500 + "L" + ")" * 500 + " <= 1", "nested more than 64 levels"),
    ("-" * 500 + "L <= 1", "nested more than 64 levels"),
    ("L" + "**L" * 200 + " <= 1", "nested more than 64 levels"),
    ("max(" * 100 + "L" + ", 1)" * 100 + " <= 1", "nested more than 64 levels"),
    (" + ".join(["L"] * 300) + " <= 1", "more than 64 levels deep"),
    ("L <= " + "1" * 5000, "at most 2000 are allowed"),
    ("L <= ١", "unexpected character"),
    ("L\x00 <= 1", "unexpected character '\\x00'"),
])
def test_hostile_expressions_are_exit_2(capsys, expression, fragment):
    assert fragment in usage(capsys, "falsify", "softmax", expression)


# --------------------------------------------------------------------------------------------
# xfails


@pytest.mark.parametrize("content, fragment", [
    (b"::\n", "expected TARGET::PROPERTY"),
    (b":\n", "expected TARGET::PROPERTY"),
    (b"*\n", "expected TARGET::PROPERTY"),
    (b"so\n", "expected TARGET::PROPERTY"),
    (b"*::*\n", "matches every test id"),
    (b"softmax::shape\nnever::matches\n", "'never::matches' ("),
    (b"\xff\xfe bad\n", "is not UTF-8"),
])
def test_bad_xfails_entries_are_exit_2(capsys, tmp_path, content, fragment):
    xf = tmp_path / "xfails.txt"
    xf.write_bytes(content)
    err = usage(capsys, "certify", "softmax", "sparsemax", *FAST, "--xfails", xf)
    assert fragment in err


def test_an_entry_hiding_every_failure_of_a_run_is_exit_2(capsys, tmp_path):
    xf = tmp_path / "xfails.txt"
    xf.write_text("s*::*  # softmax and sparsemax: everything\n")
    err = usage(capsys, "certify", "softmax", "sparsemax", *FAST, "--xfails", xf)
    assert "matches every test id of this run" in err and "xfails.txt:1" in err


def test_an_entry_hiding_every_failure_of_one_target_is_exit_2(capsys, tmp_path):
    """`TARGET::*` on a run of that target alone hides everything it could report."""
    xf = tmp_path / "xfails.txt"
    xf.write_text("softmax::*\n")
    err = usage(capsys, "certify", "softmax", *FAST, "--xfails", xf)
    assert "matches every test id of this run" in err


def test_xfails_patterns_match_whole_ids():
    from attnverify.xfails import matches

    assert matches("softmax::*", "softmax::simplex")
    assert not matches("softmax::*", "softmax1::simplex")  # no substring matching
    assert matches("norm*::simplex", "norms.py:norm_a::simplex")
    assert matches("norm_a::simplex", "path/norms.py:norm_a::simplex")  # attribute name
    assert not matches("max::simplex", "softmax::simplex")


def test_plugin_rejects_an_xfails_entry_that_matches_nothing(pytester):
    xf = pytester.path / "xfails.txt"
    xf.write_text("softmax::no_such_property\n")
    result = pytester.runpytest_subprocess(
        "--attnverify-target=softmax", "--attnverify-profile=dev", f"--attnverify-xfails={xf}",
        "-q", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert "'softmax::no_such_property'" in str(result.stdout) + str(result.stderr)
    assert "matches no test id" in str(result.stdout) + str(result.stderr)


def test_a_target_raising_at_import_fails_alone(capsys, tmp_path):
    """The target's own code raising while it is imported fails that target's load (exit 1);
    the other targets are checked and the certificate written. A target that cannot be found is
    bad input (exit 2)."""
    broken = f"{FIXTURES / 'broken_import.py'}:fn"
    code, targets, _ = certificate(capsys, tmp_path, "softmax", broken)
    assert code == 1
    assert targets["softmax"]["verdict"] == "certified"
    (load,) = targets[broken]["results"]
    assert load["property"] == "load" and "RuntimeError: boom at import" in load["message"]
    code, out, err = run(capsys, "certify", f"{FIXTURES / 'no_such_file.py'}:fn", *FAST)
    assert code == 2 and "file not found" in err
