"""``benchmarks/certify_budget.py`` measures what it says: a command's wall time ends when the
command does, not at the next memory sample, and its exit code is the command's."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/, as test_bench_grid

from benchmarks import certify_budget  # noqa: E402


@pytest.mark.parametrize("argv, code", [(["--version"], 0), (["nosuchcommand"], 2)])
def test_the_wall_time_ends_with_the_command_not_at_the_next_memory_sample(tmp_path, argv, code):
    pytest.importorskip("psutil", reason="the sampled memory needs psutil (accelerate's "
                        "dependency, in attnverify[all])")
    # one sample a minute: a loop that slept between samples would report at least 60 s
    wall, cpu, peak_mib, got = certify_budget._measure(argv, str(ROOT), str(tmp_path),
                                                       sample_s=60.0)
    assert got == code
    assert 0 < wall < 30
    assert cpu > 0 and peak_mib > 0
