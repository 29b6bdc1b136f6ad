"""The benchmark grid lists every built-in, so asv cannot silently skip a new normalizer."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnverify.registry import builtin_ids  # noqa: E402
from benchmarks.grid import BUILTIN_IDS  # noqa: E402


def test_bench_grid_lists_every_builtin():
    assert list(BUILTIN_IDS) == builtin_ids()


def test_certify_benchmark_lists_every_property():
    from attnverify.checks import PROPERTIES
    from benchmarks.bench_certify import PROPERTIES as BENCHED

    # dtype_agreement runs only when half precision is asked for; the benchmark uses the defaults
    assert set(BENCHED) == set(PROPERTIES) - {"dtype_agreement"}
