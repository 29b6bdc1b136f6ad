"""glibc's heap given back to the system while a run goes on.

glibc serves a block of 128 KiB or more by a mapping of its own, returned on ``free``; but each
time such a block is freed it raises that threshold to the block's size (up to 32 MiB), so that
afterwards blocks of that size come from the heap. A certification allocates and frees tensors
of every size, and the freed ones leave holes in the heap, whose pages stay counted in the
process however little it holds. :func:`trim` gives them back (``malloc_trim``, which releases
whole free pages anywhere in the heap, not only at its top): after every unit, and in between
at most every :data:`TRIM_INTERVAL_S` (:func:`trim_due`, at the checker's requests and after
the worker's answers). Fixing the threshold instead (``mallopt``) kept less, but every large
tensor then page-faults in fresh: more time for less memory than the trims
(``docs/attention/cpu-report.md``). An attention run from the command line fixes it at
:data:`ATTENTION_MMAP_THRESHOLD` (:func:`map_large_blocks`): its large blocks are few and
their work per byte high, and its peak is what the memory target bounds. Nothing happens off
glibc.

Python's own collector is kept off the objects of the modules a command imported
(:func:`freeze_imports`): its full collections would walk every one of torch's, sympy's and
Hypothesis's objects again, only to find them alive.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import time


def _libc_function(name: str):
    """glibc's ``name`` (``None`` off Linux or off glibc: musl has neither ``malloc_trim``
    nor ``mallopt``'s parameters)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _libc_function("malloc_trim")
#: ``mallopt``'s parameter for the size from which every block is a mapping of its own.
M_MMAP_THRESHOLD = -3
#: That size for ``certify --attention`` from the command line (:func:`map_large_blocks`).
ATTENTION_MMAP_THRESHOLD = 4 << 20
#: The environment through which a user sets glibc's allocator (then left as set).
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_",
              "MALLOC_MMAP_MAX_")
#: At most one :func:`trim_due` trim in this long, in seconds.
TRIM_INTERVAL_S = 0.2
_last_trim = 0.0


def map_large_blocks(threshold: int = ATTENTION_MMAP_THRESHOLD) -> bool:
    """Fix glibc's threshold for a block of its own at ``threshold`` bytes in this process and
    in every process it forks or starts from now on (``mallopt``, and the environment for a
    new process), unless the environment sets glibc's allocator already (:data:`MALLOC_ENV`,
    ``GLIBC_TUNABLES``' ``glibc.malloc.``). A fixed threshold no longer rises to the largest
    block freed, so a freed tensor of that size or more goes back to the system at once instead
    of staying in the heap until the next :func:`trim`. Each such tensor then faults its pages
    in fresh: more time where large tensors are many and cheap, which is why only attention
    runs from the command line (the caller's process, or a library's, is left alone) take it.
    Whether it was set."""
    if any(name in os.environ for name in MALLOC_ENV) or (
            "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")):
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, int(threshold)):
        return False
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(int(threshold))
    return True


def trim() -> None:
    """Give the heap's free pages back to the system (``malloc_trim``)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def trim_due() -> None:
    """:func:`trim`, where :data:`TRIM_INTERVAL_S` has passed since this process's last one,
    so that what a unit's examples freed goes back while the unit runs, not only after it; one
    trim per interval keeps its cost, and the page faults of memory reused after it, small next
    to the work in between."""
    global _last_trim
    now = time.monotonic()
    if now - _last_trim >= TRIM_INTERVAL_S:
        _last_trim = now
        trim()


def freeze_imports() -> None:
    """Move every object alive now out of reach of Python's collector (``gc.freeze``): called
    once by a command in a process of its own when its imports are done and before its run, so
    that the run's full collections walk what the run made, not the modules (cyclic garbage
    among the objects frozen is never collected; a module's objects make little). A forked job
    or worker inherits the frozen objects, as it does those frozen before its fork."""
    gc.freeze()
