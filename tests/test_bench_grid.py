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


def test_triton_kernels_are_timed_on_a_gpu_only_and_say_so_elsewhere(monkeypatch):
    import pytest

    from benchmarks import subjects
    from benchmarks.grid import NORMALIZERS, TRITON_EXAMPLES

    assert set(TRITON_EXAMPLES) <= set(NORMALIZERS)
    for name in TRITON_EXAMPLES:
        with pytest.raises(NotImplementedError, match="on a GPU only"):
            subjects.resolve(name, "cpu")
    # the user's target, when it is a Triton kernel, is skipped off a GPU too
    pytest.importorskip("triton")
    example = Path(__file__).resolve().parents[1] / "examples" / "triton" / "softmax_rows.py"
    monkeypatch.setenv(subjects.TARGET_ENV, f"{example}:softmax")
    with pytest.raises(NotImplementedError, match="on a GPU only"):
        subjects.resolve("target", "cpu")
