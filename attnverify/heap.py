"""glibc's heap in attnverify's own processes: large blocks given back when freed, and free
memory given back after each unit.

By default glibc serves a block of 128 KiB or more by a mapping of its own, returned to the
system on ``free``; but each time such a block is freed it raises that threshold to the block's
size (up to 32 MiB), so that afterwards blocks of that size come from the heap, whose freed
pages stay counted in the process. A certification allocates and frees large tensors of every
size, and the checker and the worker each kept the largest they had seen. :func:`cap_mmap`
fixes the threshold (which turns the raising off), in the command's own process before it forks
its jobs and in the workers' zygote before it forks them; never in a process attnverify does
not own (a user's interpreter that imports the library). :func:`trim` gives back what the heap
holds free (after every unit). Nothing happens off glibc.
"""

from __future__ import annotations

import ctypes
import sys

#: ``mallopt``'s parameter numbers (glibc's ``malloc.h``).
_M_MMAP_THRESHOLD = -3
#: Blocks at least this large get a mapping of their own: below it, the small and medium
#: tensors of most examples reuse the heap without a page fault.
MMAP_THRESHOLD = 4 << 20


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim, libc.mallopt  # noqa: B018 - both present: glibc (musl has neither)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def cap_mmap(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; True when it was set."""
    if threshold <= 0:
        return False
    return _LIBC is not None and bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, threshold))


def trim() -> None:
    """Give the heap's free memory back to the system (``malloc_trim``)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
