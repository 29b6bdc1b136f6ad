"""The case in flight and the per-example clock, in the checker's process.

:mod:`attnverify.certify` and :mod:`attnverify.falsify` call :func:`example_started` before every
example (and every shrinking step) and :func:`example_finished` after it. :mod:`attnverify.remote`
reads them: a request to the worker may run until :func:`deadline` (the last example start or
finish plus the per-example time limit), and what the worker reports (a side effect, a refused
output) is recorded with :func:`current_case`. Kept apart from :mod:`attnverify.remote` so that the
checks import nothing that imports them back.
"""

from __future__ import annotations

import time
from typing import Any

_STATE: dict[str, Any] = {"case": None, "since": None}


def example_started(case: Any) -> None:
    """Before every call of the code under test on a new example."""
    _STATE["case"], _STATE["since"] = case, time.monotonic()


def example_finished() -> None:
    _STATE["since"] = time.monotonic()


def current_case() -> Any:
    """The case of the example running now (the last one started)."""
    return _STATE["case"]


def deadline(timeout_s: float) -> float:
    """When a request must be answered: ``timeout_s`` after the current example started (or the
    last finished); outside any example, ``timeout_s`` from now."""
    since = _STATE["since"]
    now = time.monotonic()
    if since is None or now - since > timeout_s:
        # no example is running (a load, a probe between examples): the clock starts now
        since = now
        _STATE["since"] = now
    return since + timeout_s
