"""Forward and backward cost of every normalizer: built-ins, the user's target and the peers.

Parameters: normalizer × rows (batch·heads) × L × dtype × device (grid.py). Scores are made in
``setup``, never in the timed body; CUDA bodies synchronise; everything is warmed up first.
``peakmem_*`` is the benchmark process's peak resident memory (asv's definition): on CUDA it
measures host memory only: device memory is ``bench_bandwidth.CudaMemory``.
"""

from __future__ import annotations

from .grid import PARAM_NAMES, PARAMS
from .subjects import Case


class Forward:
    """``f(scores)`` on ``[rows, L]`` scores along the last dimension."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 180

    def setup(self, normalizer, rows, L, dtype, device):
        self.case = Case(normalizer, rows, L, dtype, device)

    def time_forward(self, normalizer, rows, L, dtype, device):
        self.case.forward()

    def peakmem_forward(self, normalizer, rows, L, dtype, device):
        self.case.forward()


class Backward:
    """``∂⟨g, f(z)⟩/∂z`` for a fixed random ``g``: the backward pass alone (graph built once)."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 180

    def setup(self, normalizer, rows, L, dtype, device):
        self.case = Case(normalizer, rows, L, dtype, device, backward=True)

    def time_backward(self, normalizer, rows, L, dtype, device):
        self.case.backward()

    def peakmem_backward(self, normalizer, rows, L, dtype, device):
        self.case.backward()
