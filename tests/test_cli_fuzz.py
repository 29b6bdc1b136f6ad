"""A fuzz test of the command line (issue #10): every command with generated bad arguments exits 0,
1 or 2, never with a traceback, and changes no file outside its output paths.

Hypothesis draws command lines from the argument grammar: a command, some of its options with
values drawn from a pool of hostile ones (bad numbers, NaN and infinities, huge values, non-ASCII
digits, unknown ids, odd unicode, system paths, duplicate outputs, deep expressions), and for the
commands that would run a search one value known to be invalid (the "poison"), so that every case
stops at validation and stays cheap; those must exit 2. The search is derandomized. Most cases run
in-process (``attnverify.cli.main``) with targets run in-process (the validation is the same
code); a handful run as subprocesses with the default isolation.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnverify.cli import main

NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e309", "١", "２", "1" * 60, "0x10", "", " ", "1.5",
           "abc", str(2**64), "-0", "1e-400", "+7", "1_000"]
IDS = ["nosuch", "", "softmax,", ",", "::", "💥", "a" * 300, "soft max", "softmax\u200b",
       "../x.py:f", "nosuch.py:f", "os:system", "attnverify.cli:main", "softmax::simplex"]
PATHS = ["/dev/null", "/proc/self/x.json", "/sys/x.json", ".", "fifo", "ro.json", "missing/x.json",
         "out.json", "link.json", "sub/../out.json", ""]
EXPRESSIONS = ["(" * 300 + "L" + ")" * 300 + " <= 1", "-" * 300 + "L <= 1",
               " + ".join(["L"] * 200) + " <= 1", "L <=", "__import__('os') <= 1", "L <= ١",
               "L <= 1 <= 2", "", "L <= " + "9" * 3000, "max(" * 80 + "L" + ",1)" * 80 + " <= 1",
               "L ** L ** L <= nan", "L\x00 <= 1", "L == 1", "exp(L) <= inf"]
PARAMS = ["temperature=nan", "temperature=abc", "temperature=0", "alpha=abc", "lam=abc", "x",
          "=", "a=b=c", "temperature=1e999", "lam=-1", "beta=1", "temperature=١", "s=-1",
          "eps=inf", "bias=nan", ",,,", "temperature=" + "9" * 500]
XFAILS = {"colons.txt": b"::\n", "star.txt": b"*::*\n", "latin1.txt": b"\xe9t\xe9::x\n",
          "nothing.txt": b"nosuch::shape\n", "short.txt": b"so\n"}

ANY = st.sampled_from(NUMBERS + IDS + PATHS + PARAMS)
SEARCH_OPTIONS = {
    "--params": st.sampled_from(PARAMS), "--profile": st.sampled_from(["dev", "x", "", "CI"]),
    "--max-examples": st.sampled_from(NUMBERS + ["1000000000", "100001"]),
    "--seed": st.sampled_from(NUMBERS), "--timeout": st.sampled_from(NUMBERS),
}
CERTIFY_OPTIONS = {
    **SEARCH_OPTIONS, "--claims": st.sampled_from(IDS + ["bogus", "shape", "simplex,bogus"]),
    "--dtypes": st.sampled_from(["float8", "", ",", "float32,,", "half", "float32"]),
    "--device": st.sampled_from(["tpu", "cuda:7", "", "cpu "]),
    "--json": st.sampled_from(PATHS), "--markdown": st.sampled_from(PATHS),
    "--xfails": st.sampled_from(list(XFAILS) + ["missing.txt", "/dev/null", "."]),
}
CLAIMS_OPTIONS = {"--profile": st.sampled_from(["x", "", "dev"]),
                  "--seed": SEARCH_OPTIONS["--seed"],
                  "--json": st.sampled_from(PATHS), "--markdown": st.sampled_from(PATHS)}
#: One certainly-invalid option per heavy command (the run must stop at validation: exit 2).
POISON = {
    "certify": [["--max-examples", "1000000000"], ["--seed", "-1"], ["--timeout", "nan"],
                ["--json", "/dev/null"], ["--json", "same.json", "--markdown", "./same.json"],
                ["--params", "temperature=nan"], ["--dtypes", "float8"], ["--claims", "bogus"],
                ["--xfails", "colons.txt"], ["--profile", "turbo"], ["--bogus-flag"]],
    "falsify": [["--max-examples", "0"], ["--seed", str(2**64)], ["--timeout", "-1"],
                ["--json", "."], ["--params", "alpha=abc"], ["--profile", ""]],
    "claims": [["--seed", "-5"], ["--json", "/proc/self/x"], ["--json", "c", "--markdown", "c"],
               ["--profile", "fast"]],
    "repro": [["--case", "{"], ["--case", "[]"], ["--case", "missing.json"]],
    "empirical": [["--bogus-flag"], ["--model"]],
}


def _options(table: dict):
    keys = sorted(table)
    return st.lists(st.sampled_from(keys), max_size=4).flatmap(
        lambda chosen: st.tuples(*[st.tuples(st.just(k), table[k]) for k in chosen]))


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(["list", "properties", "quantities", "certify", "falsify",
                                    "claims", "repro", "empirical", "help"]))
    if command == "help":
        return draw(st.sampled_from([["--help"], ["--version"], [], ["nosuch"], ["💥"],
                                     ["certify", "--help"], ["falsify", "-h"]])), False
    if command in ("list", "properties", "quantities"):
        return [command, *draw(st.lists(ANY, max_size=2))], False
    argv = [command]
    if command == "certify":
        argv += draw(st.lists(st.sampled_from(IDS + ["softmax", "sparsemax"]), max_size=2))
        table = CERTIFY_OPTIONS
    elif command == "falsify":
        argv += [draw(st.sampled_from(IDS + ["softmax"])), draw(st.sampled_from(EXPRESSIONS))]
        table = SEARCH_OPTIONS | {"--json": st.sampled_from(PATHS)}
    elif command == "repro":
        argv += [draw(st.sampled_from(IDS + ["softmax"])), "--property",
                 draw(st.sampled_from(["shape", "bogus", ""]))]
        table = {"--params": st.sampled_from(PARAMS)}
    elif command == "empirical":
        table = {"--model": st.sampled_from(["", "nosuch-model"])}
    else:
        table = CLAIMS_OPTIONS
    for name, value in draw(_options(table)):
        argv += [name, value]
    poison = draw(st.sampled_from(POISON[command]))
    at = draw(st.integers(1, len(argv)))
    return argv[:at] + poison + argv[at:], True


def _snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st_ = path.lstat()
            out[str(path.relative_to(root))] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return out


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory holding every file the grammar names (FIFO, read-only file, symlink,
    xfails files), with targets run in-process (the validation is the same code)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNVERIFY_ISOLATION", "0")
    os.mkfifo("fifo")
    Path("ro.json").write_text("{}")
    os.chmod("ro.json", 0o444)
    Path("out.json").write_text("keep")
    os.symlink("out.json", "link.json")
    Path("sub").mkdir()
    for name, content in XFAILS.items():
        Path(name).write_bytes(content)
    return tmp_path


def _run_in_process(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help and --version exit through argparse
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue() + err.getvalue()


def test_generated_bad_command_lines(sandbox):
    before = _snapshot(sandbox)

    @settings(derandomize=True, database=None, max_examples=150, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(command_lines())
    def check(case):
        argv, poisoned = case
        code, text = _run_in_process(argv)
        assert "Traceback" not in text, (argv, text)
        assert code in (0, 1, 2), (argv, code, text)
        if poisoned:
            assert code == 2, (argv, text)
        assert _snapshot(sandbox) == before, argv

    check()


@pytest.mark.parametrize("argv", [
    ["certify", "softmax", "--json", "/dev/null", "--max-examples", "1000000000"],
    ["falsify", "softmax", "(" * 900 + "L" + ")" * 900 + " <= 1", "--seed", "١"],
])
def test_subprocess_bad_input_is_one_line_exit_2(tmp_path, argv):
    proc = subprocess.run([sys.executable, "-m", "attnverify", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("attnverify: error:") and proc.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
