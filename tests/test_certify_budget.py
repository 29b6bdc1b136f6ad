"""``benchmarks/certify_budget.py`` measures what it says: a command's wall time ends when the
command does, not at the next memory sample, and its exit code is the command's.

``_measure`` makes its process the subreaper of what it starts and then waits for, and at last
kills, every child of that process; so it runs in a process of its own here, never in pytest's
(whose zygote and workers it would take for orphans)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MEASURE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from benchmarks import certify_budget
print(json.dumps(certify_budget._measure(json.loads(sys.argv[2]), sys.argv[1], sys.argv[3],
                                         sample_s=60.0)))
"""


@pytest.mark.parametrize("argv, code", [(["--version"], 0), (["nosuchcommand"], 2)])
def test_the_wall_time_ends_with_the_command_not_at_the_next_memory_sample(tmp_path, argv, code):
    pytest.importorskip("psutil", reason="the sampled memory needs psutil (accelerate's "
                        "dependency, in attnverify[all])")
    # one sample a minute: a loop that slept between samples would report at least 60 s
    done = subprocess.run([sys.executable, "-c", MEASURE, str(ROOT), json.dumps(argv),
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    wall, cpu, peak_mib, got = json.loads(done.stdout)
    assert got == code
    assert 0 < wall < 30
    assert cpu > 0 and peak_mib > 0


def test_timed_rounds_run_with_no_sampler_and_memory_comes_from_rounds_of_its_own(
        tmp_path, monkeypatch, capsys):
    """A sampler reading every process's page tables takes CPU from the run it times, more from a
    tree of many processes than from one: every timed round is unsampled, and the tree's PSS
    comes from one more round per command line and checkout, whose time enters no median."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import certify_budget
    finally:
        sys.path.remove(str(ROOT))
    calls = []

    def measure(argv, tree, cwd, sample_s=1.0):
        calls.append((argv[0], tree, sample_s))
        wall = 10.0 if sample_s == 0 else 99.0  # a memory round's time must not count
        return wall, 5.0, 100.0 if sample_s == 0 else 700.0, 0

    monkeypatch.setattr(certify_budget, "_measure", measure)
    monkeypatch.setattr(certify_budget, "_compile", lambda tree: None)
    monkeypatch.setattr(certify_budget, "_adopt_orphans", lambda: False)
    monkeypatch.setattr(certify_budget, "_psutil", lambda: object())
    out = tmp_path / "side.json"
    assert certify_budget.side_by_side(str(tmp_path), 3, ["builtins-ci", "builtins-ci-jobs1"],
                                       str(out), sample_s=0.2) == 0
    timed = [c for c in calls if c[2] == 0]
    sampled = [c for c in calls if c[2] != 0]
    assert len(timed) == 3 * 3  # builtins-ci here and in the base, builtins-ci-jobs1 here only
    assert len(sampled) == 3 and {c[2] for c in sampled} == {0.2}
    assert calls[:len(timed)] == timed  # the memory rounds come after every timed one
    summary = json.loads(out.read_text())
    here = summary["builtins-ci/this"]
    assert here["median_s"] == 10.0 and here["largest_mib"] == 100.0
    assert here["tree_pss_mib"] == 700.0
    assert summary["builtins-ci/ratio"]["wall"] == 1.0
    capsys.readouterr()
