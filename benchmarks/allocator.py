"""Keep glibc's heap from returning buffers to the OS between timed calls.

By default glibc serves a MiB-sized ``malloc`` from a fresh ``mmap`` or trims the heap top on
``free`` once the freed size passes a moving threshold. A timed call whose output buffer lands
on the wrong side of that threshold page-faults its whole output back in on every call: at
rows = 96, L = 4096 (a 1.5 MiB float32 output) that is ~100 faults and twice the time of the same
kernel, and which of two candidates pays it depends on allocation history, not on their code.
Fixing both thresholds high (as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` would)
makes every candidate reuse heap memory, as under a caching allocator (CUDA's, or a long
training loop's warm heap). ``ATTNVERIFY_BENCH_MALLOC=system`` leaves glibc as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

MALLOC_ENV = "ATTNVERIFY_BENCH_MALLOC"
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: mmap thresholds to try, largest first: older glibc caps it at 32 MiB on 64-bit.
_MMAP_THRESHOLDS = (2**30, 32 * 2**20)
_TRIM = 2**30


def pin_glibc_heap() -> bool:
    """Set glibc's mmap and trim thresholds once; True when they were set."""
    if os.environ.get(MALLOC_ENV, "").strip() == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, …): nothing to pin
        return False
    mmap_set = any(mallopt(_M_MMAP_THRESHOLD, size) for size in _MMAP_THRESHOLDS)
    return mmap_set and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM))
