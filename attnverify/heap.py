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
(``docs/attention/cpu-report.md``). Nothing happens off glibc.

Python's own collector is kept off the objects of the modules a command imported
(:func:`freeze_imports`): its full collections would walk every one of torch's, sympy's and
Hypothesis's objects again, only to find them alive.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import time


def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_MALLOC_TRIM = _malloc_trim()
#: At most one :func:`trim_due` trim in this long, in seconds.
TRIM_INTERVAL_S = 0.2
_last_trim = 0.0


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
