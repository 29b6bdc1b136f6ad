"""Each normalizer against the physical limit: the memory bandwidth of the same device.

A normalizer that reads its input and writes its output once cannot beat a copy of the same
size. ``track_*_fraction`` is the achieved bandwidth as a fraction of the copy bandwidth,
both measured in the same process, interleaved:

    fraction = (k · N · s / t_normalizer) / (2 · N · s / t_copy)

with N elements of s bytes, k = 2 for forward (read z, write p) and k = 3 for backward (read p
and dp, write dz). 1.0 is copy speed; a fused memory-bound kernel gets close to it. Normalizers
that are not memory-bound by design (a sort, a bisection) are listed in
``grid.NOT_MEMORY_BOUND``; ``NotMemoryBound`` reports how many times the memory-bound time
they take (1 / fraction).

Every number here is measured once, in ``setup_cache`` (one process, one torch import, all
normalizers against the same copy), and each ``track_*`` combination reads its value: a
process per combination would spend its time importing torch.
"""

from __future__ import annotations

from . import measure
from .grid import DEVICES, DTYPES, LENGTHS, NORMALIZERS, NOT_MEMORY_BOUND, PARAM_NAMES, PARAMS, ROWS

#: Seconds of interleaved sampling per (combination, direction).
BUDGET_S = 0.25


def measure_fraction(case, direction: str, **sampling) -> dict:
    """``{"fraction", "seconds", "copy_seconds"}`` of one case and direction; ``sampling`` goes
    to :func:`measure.interleaved` (default: 15 repeats within ``BUDGET_S``)."""
    body = case.forward if direction == "forward" else case.backward
    sampling = sampling or {"repeats": 15, "budget": BUDGET_S}
    samples = measure.interleaved({"n": body, "copy": case.copy}, **sampling)
    t_norm, t_copy = measure.median(samples["n"]), measure.median(samples["copy"])
    fraction = (case.bytes_moved(direction) / t_norm) / (case.bytes_moved("copy") / t_copy)
    return {"fraction": fraction, "seconds": t_norm, "copy_seconds": t_copy}


def _cuda_peak_mib(call) -> float:
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure_all() -> dict:
    """``{(normalizer, rows, L, dtype, device): {direction: {...}} or "skip reason"}``."""
    from .subjects import Case

    out: dict = {}
    for device in DEVICES:
        for dtype in DTYPES:
            for rows in ROWS:
                for length in LENGTHS:
                    for name in NORMALIZERS:
                        key = (name, rows, length, dtype, device)
                        try:
                            case = Case(name, rows, length, dtype, device, backward=True)
                        except NotImplementedError as exc:
                            out[key] = str(exc) or type(exc).__name__
                            continue
                        entry = {d: measure_fraction(case, d) for d in ("forward", "backward")}
                        if device == "cuda":
                            entry["cuda_peak_mib"] = {
                                "forward": _cuda_peak_mib(case.forward),
                                "backward": _cuda_peak_mib(case.backward),
                            }
                        out[key] = entry
                        del case
    return out


class _Measured:
    """Shares one ``setup_cache`` (same function, same cache key) across the classes below."""

    timeout = 900

    def setup_cache(self):
        return measure_all()

    def setup(self, cache, normalizer, rows, L, dtype, device):
        self.entry = _entry(cache, (normalizer, rows, L, dtype, device))


def _entry(cache, key) -> dict:
    entry = cache.get(key, "not measured")
    if isinstance(entry, str):
        raise NotImplementedError(entry)
    return entry


class Bandwidth(_Measured):
    """Achieved bytes per second as a fraction of the device's copy bandwidth (1.0 = copy)."""

    params = PARAMS
    param_names = PARAM_NAMES
    unit = "fraction of copy bandwidth"

    def track_forward_fraction(self, cache, normalizer, rows, L, dtype, device):
        return self.entry["forward"]["fraction"]

    def track_backward_fraction(self, cache, normalizer, rows, L, dtype, device):
        return self.entry["backward"]["fraction"]


class NotMemoryBound(_Measured):
    """Normalizers not memory-bound by design: time as a multiple of the memory-bound time."""

    params = [list(NOT_MEMORY_BOUND), ROWS, LENGTHS, DTYPES, list(DEVICES)]
    param_names = PARAM_NAMES
    unit = "× memory-bound time"

    def track_forward_multiple_of_bound(self, cache, normalizer, rows, L, dtype, device):
        return 1.0 / self.entry["forward"]["fraction"]

    def track_backward_multiple_of_bound(self, cache, normalizer, rows, L, dtype, device):
        return 1.0 / self.entry["backward"]["fraction"]


class CudaMemory(_Measured):
    """Peak CUDA memory allocated by one call, in MiB (``peakmem_*`` sees host memory only)."""

    params = [list(NORMALIZERS), ROWS, LENGTHS, DTYPES, ["cuda"]]
    param_names = PARAM_NAMES
    unit = "MiB"

    def track_cuda_peak_mib_forward(self, cache, normalizer, rows, L, dtype, device):
        return self.entry["cuda_peak_mib"]["forward"]

    def track_cuda_peak_mib_backward(self, cache, normalizer, rows, L, dtype, device):
        return self.entry["cuda_peak_mib"]["backward"]


class CopyBandwidth(_Measured):
    """The yardstick: same-size ``copy_`` bandwidth in GB/s (read + write), float32 rows."""

    params = [ROWS, LENGTHS, DTYPES, list(DEVICES)]
    param_names = ["rows", "L", "dtype", "device"]
    unit = "GB/s"

    def setup(self, cache, rows, L, dtype, device):
        self.entry = _entry(cache, ("torch.softmax", rows, L, dtype, device))
        elements = rows * L
        self.itemsize = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}[dtype]
        self.bytes = 2 * elements * self.itemsize

    def track_copy_gb_per_s(self, cache, rows, L, dtype, device):
        return self.bytes / self.entry["forward"]["copy_seconds"] / 1e9


class Copy:
    """``time_copy``: the same-size copy timed by asv, as a reference for ``time_forward``."""

    params = [ROWS, LENGTHS, DTYPES, list(DEVICES)]
    param_names = ["rows", "L", "dtype", "device"]

    def setup(self, rows, L, dtype, device):
        from .subjects import Case

        self.case = Case("torch.softmax", rows, L, dtype, device)

    def time_copy(self, rows, L, dtype, device):
        self.case.copy()
