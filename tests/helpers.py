"""Helpers shared by the test modules (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from attnverify.tolerances import Tol, tol_for

F64 = torch.float64
TOL = tol_for(F64)

#: The interpreter for a Ctrl-C test, started with SIGINT at its default disposition. A process
#: a non-interactive shell starts in the background (``python -m pytest ... &`` in a script)
#: inherits SIGINT and SIGQUIT *ignored* (POSIX), every process it starts inherits that, and
#: Python installs no ``KeyboardInterrupt`` handler for an ignored SIGINT: the command would never
#: see the Ctrl-C the test sends. This launcher resets SIGINT and ``exec``s the interpreter in its
#: own process, so the pid the test signals is the command's. ``SIGTERM`` and ``SIGHUP`` are
#: reset too (``nohup`` ignores the latter), for the tests that stop a run with them.
PYTHON_WITH_CTRL_C = [sys.executable, "-c",
                      "import os, signal, sys\n"
                      "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
                      "    signal.signal(sig, signal.SIG_DFL)\n"
                      "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"]

#: ``(signal, exit code, the word the command's last line ends with)`` for each way a run is
#: stopped from outside and keeps what it finished: Ctrl-C, and a CI job cancelled or timed out.
STOPS = [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")]


def close(actual, expected, what: str, tol: Tol = TOL, rtol: float | None = None) -> None:
    """``actual ≈ expected`` in float64 within ``tol`` (``rtol`` overrides its relative part)."""
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64),
        torch.as_tensor(expected, dtype=F64),
        rtol=tol.rtol if rtol is None else rtol,
        atol=tol.atol,
        msg=lambda m: f"{what}: {m}",
    )


def daemonizing_target(folder: Path) -> tuple[str, Path]:
    """``(target, pid file)``: a user's normalizer in ``folder`` that, at its first call, leaves
    a daemon behind (double fork, new session, sleeping 600 s) and writes its pid to the file.
    One daemon however many workers call it at once (``--jobs``): the first to create the lock
    file forks it, the others wait for its pid. A forked copy never returns into the worker's
    code (``os._exit`` whatever happens): a copy that did would answer the checker's request a
    second time, on the channel it inherited."""
    pidfile = folder / "daemon.pid"
    source = folder / "daemonizes.py"
    source.write_text(f"""
import os, time, torch
def norm(scores, dim=-1):
    try:
        first = os.open({str(pidfile)!r} + ".lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        first = None
    if first is not None:
        os.close(first)
        if os.fork() == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    with open({str(pidfile)!r} + ".tmp", "w") as fh:
                        fh.write(str(os.getpid()))
                    os.replace({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
                    time.sleep(600)
            finally:
                os._exit(0)
    while not os.path.exists({str(pidfile)!r}):
        time.sleep(0.01)
    return torch.softmax(scores, dim)
""")
    return f"{source}:norm", pidfile
