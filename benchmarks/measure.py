"""Timing shared by the ``track_*`` benchmarks and compare_peers.py.

Candidates are timed interleaved (A B C, B C A, C A B, …) so that noise from other processes
on a shared machine falls on all of them alike; statistics are medians with the interquartile
range.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


def interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    repeats: int = 15,
    min_time: float = 0.02,
    budget: float | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each function, ``repeats`` samples each, taken in rotating order.

    Each sample runs a function ``number`` times, ``number`` chosen so one sample lasts at least
    ``min_time``. With ``budget`` (seconds), sampling stops early once the budget is spent and
    at least 5 samples each have been taken (3 when one sample outlasts the budget).
    Functions must synchronise their device.
    """
    names = list(fns)
    number = {name: _calibrate(fns[name], min_time) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    for rep in range(repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            fn, n = fns[name], number[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t0) / n)
        if budget is not None and time.perf_counter() - start > budget:
            slow = max(samples[n][-1] for n in names) > budget
            if rep >= 4 or (slow and rep >= 2):
                break
    return samples


def _calibrate(fn: Callable[[], object], min_time: float) -> int:
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - t0 >= min_time or number >= 1 << 16:
            return number
        number *= 2


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def iqr(xs: list[float]) -> tuple[float, float]:
    """(25th, 75th) percentiles."""
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]
