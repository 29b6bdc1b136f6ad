"""Devices: skip what is absent, synchronise what is asynchronous, warm up before timing.

asv runs each parameter combination in a freshly spawned process (``launch_method: spawn`` in
asv.conf.json): CUDA cannot be used in a process forked after CUDA was initialised, and a fresh
process also gives every ``peakmem_*`` the same baseline. ``require`` decides about CUDA from the
driver's device files before importing torch, so a skipped CUDA combination on a machine
without a GPU costs no torch import.
"""

from __future__ import annotations

import os

#: Files whose presence means a GPU driver is loaded (NVIDIA, ROCm, WSL).
_DRIVER_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia/version", "/dev/kfd", "/dev/dxg")

#: ``ATTNVERIFY_BENCH_THREADS=N``: torch's intra-op CPU threads in every benchmark (default:
#: torch's own choice). ``1`` is far steadier on a shared or loaded machine, where a parallel
#: region waits for its slowest thread.
THREADS_ENV = "ATTNVERIFY_BENCH_THREADS"

#: Calls made in ``setup`` before timing: the first call allocates, compiles kernels, etc.
WARMUP_CALLS = 3
#: A first call slower than this (seconds) is warm-up enough on its own.
WARMUP_SLOW_S = 0.1


def require(device: str) -> None:
    """Raise ``NotImplementedError`` (asv's skip) when ``device`` cannot run here."""
    if device == "cpu":
        return
    if device != "cuda":
        raise ValueError(f"unknown device {device!r}: expected 'cpu' or 'cuda'")
    if not any(os.path.exists(path) for path in _DRIVER_FILES):
        raise NotImplementedError("no GPU driver on this machine")
    import torch

    if not torch.cuda.is_available():
        raise NotImplementedError(f"torch {torch.__version__} sees no CUDA device")


def configure_threads() -> None:
    """Apply ``ATTNVERIFY_BENCH_THREADS`` (a positive integer) to torch, if set."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{THREADS_ENV}={text!r}: expected a positive integer")
    import torch

    if torch.get_num_threads() != int(text):
        torch.set_num_threads(int(text))


def sync(device: str) -> None:
    """Wait for queued work, so a timed body measures the kernels and not their launch."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def warm_up(fn, device: str, calls: int = WARMUP_CALLS) -> None:
    """Call ``fn`` a few times and synchronise (allocator, kernel caches, lazy init).

    A slow first call (over ``WARMUP_SLOW_S``) is not repeated: a setup should not cost
    seconds for a function whose one-off costs are negligible next to a call.
    """
    import time

    start = time.perf_counter()
    fn()
    sync(device)
    if time.perf_counter() - start < WARMUP_SLOW_S:
        for _ in range(calls - 1):
            fn()
        sync(device)


def device_label(device: str) -> str:
    """A human name for the device, for reports (asv itself cannot record it)."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return _cpu_model()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
