"""The parameter grid every normalizer benchmark shares.

The grid is a fixed list of names and sizes: it never depends on the machine, on whether a GPU
is present or on which normalizers import in a given commit. A combination that cannot run here
is skipped in ``setup`` (``NotImplementedError``), so results from every environment line up.

``ATTNVERIFY_BENCH_GRID`` picks one of three named grids (default ``standard``):

- ``standard``: rows 96, L 4096, float32: the issue's target point; what CI's smoke runs and
  PRs are gated on. ``asv run --quick`` over it takes 5–7 minutes on 2 cores (spawn).
- ``long``: rows 96; L 1024, 4096, 16384; float32 and bfloat16.
- ``full``: rows 8, 96, 768; L 128, 1024, 4096, 16384; float32, bfloat16, float16, float64.

Keep one grid per results directory: asv compares combinations by their parameter values.
"""

from __future__ import annotations

import os

GRID_ENV = "ATTNVERIFY_BENCH_GRID"

#: Built-in ids in docs/NORMALIZERS.md order. A new built-in is added here by hand, so that the
#: grid of an old commit stays what it was (a commit that lacks an id skips it).
BUILTIN_IDS = (
    "softmax",
    "sparsemax",
    "entmax15",
    "entmax_alpha",
    "ssmax",
    "sa_softmax",
    "sigmoid",
    "softpick",
    "stablemax",
    "softmax1",
    "relu_norm",
    "dagpam",
    "softmax_fused",
)

#: The user's normalizer, named by ``ATTNVERIFY_BENCH_TARGET`` (skipped when unset).
TARGET = "target"

#: Peer implementations measured in the same run (skipped when the package is missing).
PEERS = ("torch.softmax", "entmax.sparsemax", "entmax.entmax15", "entmax.entmax_bisect")

#: Which peer each built-in is compared with (ours / theirs in compare_peers.py). ``softmax``
#: runs on ``torch.softmax`` (its cost is the fully-masked-row policy); ``softmax_fused`` is
#: attnverify's own CPU kernel, measured against the same peer as any user's fast kernel is.
PEER_OF = {
    "softmax": "torch.softmax",
    "softmax_fused": "torch.softmax",
    "sparsemax": "entmax.sparsemax",
    "entmax15": "entmax.entmax15",
    "entmax_alpha": "entmax.entmax_bisect",
}

#: The Triton examples (examples/triton/), timed on a GPU only: elsewhere they would run in
#: Triton's interpreter, whose timings mean nothing (skipped, saying so). Each is compared with
#: ``torch.softmax`` by compare_peers.py.
TRITON_EXAMPLES = ("triton.softmax_rows", "triton.softmax_online")

NORMALIZERS = (*BUILTIN_IDS, TARGET, *PEERS, *TRITON_EXAMPLES)

#: Parameters the benchmarks pass instead of the defaults. α = 1.5 is what ``entmax15`` and
#: ``entmax.entmax15`` already measure, so α-entmax and the bisection peer run at α = 1.25,
#: where attnverify's ``entmax_alpha`` takes its bisection path.
BENCH_ALPHA = 1.25
OVERRIDES = {"entmax_alpha": {"alpha": BENCH_ALPHA}, "entmax.entmax_bisect": {"alpha": BENCH_ALPHA}}

DEVICES = ("cpu", "cuda")

_GRIDS = {
    "standard": {"rows": (96,), "L": (4096,), "dtype": ("float32",)},
    "long": {"rows": (96,), "L": (1024, 4096, 16384), "dtype": ("float32", "bfloat16")},
    "full": {
        "rows": (8, 96, 768),
        "L": (128, 1024, 4096, 16384),
        "dtype": ("float32", "bfloat16", "float16", "float64"),
    },
}


def grid_name() -> str:
    """The grid chosen by ``ATTNVERIFY_BENCH_GRID``; an unknown name is an error."""
    name = os.environ.get(GRID_ENV, "standard").strip() or "standard"
    if name not in _GRIDS:
        raise ValueError(f"{GRID_ENV}={name!r} is not one of {', '.join(_GRIDS)}")
    return name


_GRID = _GRIDS[grid_name()]
ROWS = list(_GRID["rows"])
LENGTHS = list(_GRID["L"])
DTYPES = list(_GRID["dtype"])

#: ``params`` / ``param_names`` of every per-normalizer benchmark.
PARAMS = [list(NORMALIZERS), ROWS, LENGTHS, DTYPES, list(DEVICES)]
PARAM_NAMES = ["normalizer", "rows", "L", "dtype", "device"]

#: Normalizers that are not memory-bound by design: a threshold found by sorting or by an
#: iterative search reads the row several times. Their bandwidth fraction is reported with
#: the multiple of the memory-bound time they take (``bench_bandwidth.NotMemoryBound``).
NOT_MEMORY_BOUND = {
    "sparsemax": "threshold search (fixed point, sort fallback)",
    "entmax15": "threshold search (Newton, sort fallback)",
    "entmax_alpha": "bisection (at α = 1.25)",
    "entmax.sparsemax": "sort",
    "entmax.entmax15": "sort",
    "entmax.entmax_bisect": "bisection (at α = 1.25)",
}
