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
