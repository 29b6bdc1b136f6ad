"""The case in flight and the per-example clock, in the checker's process.

:mod:`attnverify.certify` and :mod:`attnverify.falsify` call :func:`example_started` before every
example (and every shrinking step) and :func:`example_finished` after it. :mod:`attnverify.remote`
reads them: a request to the worker may run until :func:`deadline`, and what the worker reports
(a side effect, a refused output) is recorded with :func:`current_case`. The per-example time
limit is the **target's** time: :mod:`attnverify.remote` charges every request's round trip to
the example (:func:`charge`), and a request may run only as long as the example's limit has left
after the requests before it. attnverify's own work between requests (a reference, a Lanczos run
over a long row) is not charged: it never makes the target "exceed the time limit", and
:func:`last_example` says how the time of the last example divided between the two. Kept apart
from :mod:`attnverify.remote` so that the checks import nothing that imports them back.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, NamedTuple

_STATE: dict[str, Any] = {"case": None, "since": None, "running": False, "target_s": 0.0,
                          "last": None, "step": None, "serial": 0, "budgeted": False}


@contextlib.contextmanager
def budgeted_retries():
    """Requests whose failures a budget of their own bounds (the shrink of a case that ran past
    the time limit: :func:`attnverify.certify.shrink_hang`): they do not count among the
    failures in a row that fail a target in full (:mod:`attnverify.remote`)."""
    before = _STATE["budgeted"]
    _STATE["budgeted"] = True
    try:
        yield
    finally:
        _STATE["budgeted"] = before


def budgeted() -> bool:
    """Whether the requests now running are :func:`budgeted_retries`."""
    return bool(_STATE["budgeted"])


class ExampleTime(NamedTuple):
    """How long one example took: in all, and in the target's requests (the rest is attnverify's
    own work)."""

    total_s: float
    target_s: float

    @property
    def checker_s(self) -> float:
        return max(0.0, self.total_s - self.target_s)


def example_started(case: Any, step: Any = None) -> None:
    """Before every call of the code under test on a new example. ``step``: what is run on it
    (a property and how it is checked, :mod:`attnverify.sequence`), recorded with the calls a
    worker answers so that a defect that needs earlier calls can be replayed."""
    _STATE.update(case=case, since=time.monotonic(), running=True, target_s=0.0, step=step,
                  serial=_STATE["serial"] + 1)


def example_finished() -> None:
    now = time.monotonic()
    if _STATE["running"] and _STATE["since"] is not None:
        _STATE["last"] = ExampleTime(now - _STATE["since"], _STATE["target_s"])
    _STATE.update(since=now, running=False, target_s=0.0)


def current_case() -> Any:
    """The case of the example running now (the last one started)."""
    return _STATE["case"]


def current_step() -> tuple[int, Any, Any]:
    """``(serial, step, case)`` of the example running now: ``serial`` counts the examples
    started in this process (one per :func:`example_started`), ``step`` is ``None`` outside an
    example or where its starter named none."""
    return _STATE["serial"], _STATE["step"] if _STATE["running"] else None, _STATE["case"]


def charge(seconds: float) -> None:
    """A request to the target took ``seconds`` (charged to the running example, if any)."""
    if _STATE["running"]:
        _STATE["target_s"] += seconds


def deadline(timeout_s: float) -> float:
    """When a request must be answered: within an example, when the target's requests on it
    would reach ``timeout_s`` in all; outside any example, ``timeout_s`` from now."""
    left = timeout_s - _STATE["target_s"] if _STATE["running"] else timeout_s
    return time.monotonic() + max(left, 0.0)


def last_example() -> ExampleTime | None:
    """The time of the last finished example (None before the first)."""
    return _STATE["last"]
