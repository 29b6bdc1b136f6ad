"""glibc's heap given back while a run goes on (:mod:`attnverify.heap`, issue #27): the holes
freed tensors leave in the middle of the heap go back at a trim, and a trim is due at most once
an interval; and Python's collector kept off the objects of the modules a command imported,
during its run and at its exit (:func:`attnverify.heap.freeze_imports`,
:func:`attnverify.cli.entry`)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from attnverify import cli, heap
from attnverify.cli import main

#: In a fresh interpreter: a block of 2 MiB freed (which raises glibc's mmap threshold, as any
#: freed tensor does), then 64 blocks of 1 MiB written, each followed by a block of 100 KiB that
#: stays (so the freed ones are holes in the heap, not its top), the large ones freed; then the
#: anonymous memory in MiB before and after :func:`attnverify.heap.trim` (argument ``trim``;
#: ``none``: no trim).
#: The start of :data:`_HOLES` and :data:`_FREED`: the process's anonymous memory in MiB, and
#: glibc's ``malloc`` and ``free``.
_LIBC = """
import ctypes, os, sys
from attnverify import heap

def anon():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Anonymous:")) >> 10

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
"""
_HOLES = _LIBC + """
libc.free(libc.malloc(2 << 20))
big, pins = [], []
for _ in range(64):
    p = libc.malloc(1 << 20)
    ctypes.memset(p, 1, 1 << 20)
    big.append(p)
    pins.append(libc.malloc(100 << 10))
for p in big:
    libc.free(p)
before = anon()
if sys.argv[1] == "trim":
    heap.trim()
print(before, anon())
"""


def _holes(mode: str) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", _HOLES, mode], capture_output=True, text=True,
                          timeout=120, check=True)
    before, after = map(int, done.stdout.split()[-2:])
    return before, after


@pytest.mark.skipif(heap._MALLOC_TRIM is None, reason="not glibc: nothing to trim")
def test_a_trim_gives_back_the_holes_in_the_middle_of_the_heap():
    before, after = _holes("none")
    assert before - after < 8 and before >= 64, (before, after)  # glibc alone keeps them
    before, after = _holes("trim")
    assert before - after >= 48, (before, after)


def test_a_trim_is_due_once_an_interval_has_passed(monkeypatch):
    now, trims = [1000.0], []
    monkeypatch.setattr(heap.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(heap, "trim", lambda: trims.append(now[0]))
    monkeypatch.setattr(heap, "_last_trim", 0.0)
    monkeypatch.setattr(heap, "TRIM_INTERVAL_S", 1.0)
    for step in range(10):  # every quarter of the interval
        now[0] = 1000.0 + 0.25 * step
        heap.trim_due()
    assert trims == [1000.0, 1001.0, 1002.0]


def test_the_checker_trims_while_a_unit_runs(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(heap, "trim_due", lambda: calls.append(1))
    assert main(["certify", "softmax", "--profile", "dev", "--max-examples", "3", "--claims",
                 "", "--quiet", "--jobs", "1", "--dtypes", "float64"]) == 0
    capsys.readouterr()
    assert len(calls) >= 3  # at its requests, not only after the unit


def test_the_command_freezes_what_is_alive_before_the_interpreter_exits(monkeypatch):
    order = []
    monkeypatch.setattr(cli, "main", lambda: order.append("main") or 3)
    monkeypatch.setattr(cli.gc, "freeze", lambda: order.append("freeze"))
    with pytest.raises(SystemExit) as ended:
        cli.entry()
    assert ended.value.code == 3 and order == ["main", "freeze"]


def test_the_installed_command_and_python_m_are_the_entry_that_freezes():
    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["attnverify"] == "attnverify.cli:entry"
    assert "entry()" in (root / "attnverify" / "__main__.py").read_text()


#: In a fresh interpreter: a command on the process's own command line (``main()``, as the
#: installed command calls it) stopped by a usage error found after its imports (an output in a
#: folder that does not exist), then how many objects Python's collector no longer walks.
_OWN_RUN = """
import gc, sys
from attnverify.cli import main
sys.argv = ["attnverify", *sys.argv[1:]]
code = main()
print(code, gc.get_freeze_count())
"""


@pytest.mark.parametrize("command", [
    ["certify", "softmax", "--profile", "dev", "--jobs", "1"],
    ["certify", "--attention", "sdpa", "--profile", "dev", "--jobs", "1"],
    ["falsify", "softmax", "max_weight <= 1", "--profile", "dev"],
], ids=["certify", "attention", "falsify"])
def test_a_command_in_its_own_process_freezes_its_imports_before_its_run(command, tmp_path):
    out = str(tmp_path / "missing" / "out.json")
    env = {**os.environ, "ATTNVERIFY_JOBS": "1"}
    done = subprocess.run([sys.executable, "-c", _OWN_RUN, *command, "--json", out],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    code, frozen = map(int, done.stdout.split()[-2:])
    assert code == 2 and "attnverify: error:" in done.stderr, done.stderr[-400:]
    assert frozen > 10_000, frozen  # torch's, Hypothesis's objects: not walked by the run
    assert gc.get_freeze_count() == 0  # a command run in-process (tests) freezes nothing


#: In a fresh interpreter: glibc's threshold fixed (argument ``fixed``) or left dynamic
#: (``dynamic``); a block of 8 MiB written and freed (a dynamic threshold rises to its size),
#: then another: the anonymous memory in MiB its free left behind, and the environment a new
#: process would get.
_FREED = _LIBC + """
fixed = heap.map_large_blocks() if sys.argv[1] == "fixed" else None

def block():
    p = libc.malloc(8 << 20)
    ctypes.memset(p, 1, 8 << 20)
    libc.free(p)

block()
before = anon()
block()
print(fixed, anon() - before, os.environ.get("MALLOC_MMAP_THRESHOLD_"))
"""


def _without_malloc_settings() -> dict:
    """This environment without a setting of glibc's allocator."""
    return {k: v for k, v in os.environ.items()
            if k not in heap.MALLOC_ENV and k != "GLIBC_TUNABLES"}


def _freed(mode: str, **env) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _FREED, mode], capture_output=True, text=True,
                          timeout=120, check=True, env={**_without_malloc_settings(), **env})
    return done.stdout.split()


@pytest.mark.skipif(heap._libc_function("mallopt") is None, reason="not glibc: no mallopt")
def test_a_fixed_threshold_gives_a_large_freed_block_back_at_once():
    fixed, kept, exported = _freed("dynamic")
    assert fixed == "None" and int(kept) >= 6 and exported == "None"  # glibc alone keeps it
    fixed, kept, exported = _freed("fixed")
    assert fixed == "True" and int(kept) < 2, kept
    assert exported == str(heap.ATTENTION_MMAP_THRESHOLD)  # what a spawned process reads


@pytest.mark.parametrize("env", [{"MALLOC_MMAP_THRESHOLD_": "65536"}, {"MALLOC_TOP_PAD_": "0"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}],
                         ids=["threshold", "top-pad", "tunables"])
def test_a_users_own_malloc_setting_is_left_as_it_is(env):
    fixed, _kept, exported = _freed("fixed", **env)
    assert fixed == "False"
    assert exported == env.get("MALLOC_MMAP_THRESHOLD_", "None")


_THRESHOLD_OF_RUN = """
import os, sys
from attnverify.cli import main
sys.argv = ["attnverify", *sys.argv[1:]]
code = main()
print(code, os.environ.get("MALLOC_MMAP_THRESHOLD_"))
"""


@pytest.mark.skipif(heap._libc_function("mallopt") is None, reason="not glibc: no mallopt")
@pytest.mark.parametrize("command, fixed", [
    (["certify", "--attention", "sdpa", "--profile", "dev"], True),
    (["certify", "softmax", "--profile", "dev"], False),
], ids=["attention", "normalizer"])
def test_an_attention_run_from_the_command_line_fixes_the_threshold(command, fixed, tmp_path):
    out = str(tmp_path / "missing" / "out.json")
    done = subprocess.run([sys.executable, "-c", _THRESHOLD_OF_RUN, *command, "--json", out],
                          capture_output=True, text=True, timeout=300,
                          env={**_without_malloc_settings(), "ATTNVERIFY_JOBS": "1"},
                          cwd=tmp_path)
    code, exported = done.stdout.split()[-2:]
    assert code == "2", done.stderr[-400:]
    assert exported == (str(heap.ATTENTION_MMAP_THRESHOLD) if fixed else "None")


def test_an_attention_run_in_a_callers_process_leaves_its_allocator_alone(monkeypatch, tmp_path,
                                                                           capsys):
    calls = []
    monkeypatch.setattr(heap, "map_large_blocks", lambda *a: calls.append(a) or True)
    out = str(tmp_path / "missing" / "out.json")
    assert main(["certify", "--attention", "sdpa", "--profile", "dev", "--jobs", "1",
                 "--json", out]) == 2
    capsys.readouterr()
    assert calls == []
