"""Progress marks from the code that runs the checks to a parent process watching it.

:mod:`attnverify.certify` and :mod:`attnverify.falsify` call :func:`example_started` and
:func:`example_finished` around every call of the code under test, and :func:`property_started`
before every property. In the calling process these do nothing; in a worker of
:mod:`attnverify.isolation` they write the time of the last sign of progress and the example count
to memory the parent shares (the parent's per-example time limit reads it), name the running
property to the parent, and, when a failing example is replayed, stop just before it
(:class:`Reached`). Kept apart from :mod:`attnverify.isolation` so that the checks import nothing
that imports them back.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

#: Set in a worker only: [time.monotonic() of the last sign of progress (0 between jobs),
#: examples of the running property so far] (a shared ``RawArray('d', 2)``).
SLOT = None
#: Set in a worker only: the connection to the parent.
CONN = None
#: Replay: stop just before this example (1-based) of the running property; 0: never.
STOP_AT = 0


class Reached(BaseException):
    """Raised in a replay just before the example that failed; carries its case."""

    def __init__(self, case: Any):
        super().__init__("replayed up to the failing example")
        self.case = case


def example_started(case: Any) -> None:
    """Before every call of the code under test (no-op outside a worker)."""
    slot = SLOT
    if slot is None:
        return
    n = slot[1] + 1
    slot[1] = n
    if STOP_AT and n >= STOP_AT:
        raise Reached(case)
    slot[0] = time.monotonic()


def example_finished() -> None:
    if SLOT is not None:
        SLOT[0] = time.monotonic()


def property_started(prop_id: str) -> None:
    """Before every property: the parent learns what is running (no-op outside a worker)."""
    if SLOT is None:
        return
    SLOT[0], SLOT[1] = time.monotonic(), 0
    send(("start", prop_id))


def send(message) -> None:
    """One message to the parent (plain pickle: no shared-memory tensors)."""
    CONN.send_bytes(pickle.dumps(message))
