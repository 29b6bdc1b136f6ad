"""glibc's heap in attnverify's own processes (:mod:`attnverify.heap`, issue #27): a large block
freed goes back to the system at once where the mmap threshold is fixed, and only the
command's own process (and the zygote) fixes it, never an interpreter that imports the library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnverify import cli, heap

#: In a fresh interpreter: a 16 MiB tensor made, written and freed three times, then the
#: process's anonymous memory minus what it was before, in MiB.
_AFTER_FREES = """
import sys, torch
from attnverify import heap

def anon():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Anonymous:")) >> 10

if sys.argv[1] == "capped":
    assert heap.cap_mmap()
before = anon()
for _ in range(3):
    t = torch.empty(2 << 20, dtype=torch.float64).fill_(1.0)
    del t
print(anon() - before)
"""


def _kept_mib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _AFTER_FREES, mode], capture_output=True,
                          text=True, timeout=120, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(heap._LIBC is None, reason="not glibc: attnverify leaves the heap as it is")
def test_a_freed_large_block_goes_back_only_with_the_threshold_fixed():
    # glibc's default: the first block is a mapping of its own, but freeing it raises the
    # threshold, so the next comes from the heap and stays resident once freed
    assert _kept_mib("default") >= 15
    assert _kept_mib("capped") <= 4


def test_the_threshold_is_fixed_in_the_commands_own_process_only(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(heap, "cap_mmap", lambda *a: calls.append(a) or True)
    assert cli.main(["list"]) == 0  # a library call (the plugin, a user's script): left as is
    assert calls == []
    monkeypatch.setattr(sys, "argv", ["attnverify", "list"])
    assert cli.main() == 0
    assert calls == [()]
    capsys.readouterr()


def test_no_threshold_at_or_below_zero_is_set():
    assert heap.cap_mmap(0) is False
    assert heap.cap_mmap(-1) is False
