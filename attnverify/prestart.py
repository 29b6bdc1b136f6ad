"""The worker processes' zygote started before the checker imports torch.

A command that will run targets behind the process boundary spends its first seconds importing
torch (and Hypothesis, and the checks) in this process; the zygote (:mod:`attnverify.worker`)
imports torch too, before it can fork the first worker. :func:`spawn` starts it and sends it the
import path at once, so the two imports run side by side on two cores instead of one after the
other; :class:`attnverify.remote.Zygote` adopts the process (:func:`take`) when it first needs
it. This module imports nothing of torch, so a command can call :func:`early` before its own
heavy imports. A zygote never adopted is killed at exit.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys

from attnverify import wire

#: The folder of this attnverify package, from which the zygote imports it.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: The spawned zygote not yet adopted: ``(process, channel, pid of the process that spawned it)``.
_EARLY: list = []


def spawn(defer: bool = False, backward: bool = True) -> tuple[subprocess.Popen, socket.socket]:
    """A new zygote process (``python -c … zygote FD``, in a session of its own) and the
    checker's end of its channel; its hello (the import path, what to preload) already sent, so
    it is importing torch when this returns. The caller reads its answer. ``defer``: the
    zygote answers before it imports :data:`attnverify.worker.DEFERRED` (``torch._dynamo``),
    which it (or a clone of it) imports before its second worker (a command whose one worker a
    process may have no use for it: ``falsify``, ``certify`` of one normalizer); else it
    imports them first, for every worker. ``backward``: :data:`attnverify.worker.BACKWARD` is
    imported first too, else deferred likewise (a worker that takes no backward pass)."""
    # torch-free: the names the zygote imports
    from attnverify.worker import BACKWARD, DEFERRED, PRELOAD

    parent, child = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # the checker and the worker take turns: OpenMP threads that spin after a parallel
    # region would take the CPU from the other process (unless the user chose a policy)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # attnverify imported from the very folder the checker's came from: a folder named
    # attnverify elsewhere on the path (the current directory that `python -c` puts first, a
    # '.' that an import added to the checker's path) is never taken for the package
    boot = ("import importlib.util, sys; sys.path[:] = [p for p in sys.path if p]; "
            "d = sys.argv.pop(); s = importlib.util.spec_from_file_location('attnverify', "
            "d + '/__init__.py', submodule_search_locations=[d]); "
            "m = sys.modules['attnverify'] = importlib.util.module_from_spec(s); "
            "s.loader.exec_module(m); from attnverify.worker import main; main(sys.argv[1:])")
    proc = subprocess.Popen(
        [sys.executable, "-c", boot, "zygote", str(child.fileno()), _PACKAGE_DIR],
        pass_fds=[child.fileno()], start_new_session=True, close_fds=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, cwd=os.getcwd())
    child.close()
    try:
        wire.send(parent, {"path": [str(p) for p in sys.path],
                           "preload": [*PRELOAD, *(BACKWARD if backward else ()),
                                       *(() if defer else DEFERRED)],
                           "deferred": [*(DEFERRED if defer else ()),
                                        *(() if backward else BACKWARD)]})
    except OSError:
        pass  # the caller's read of the answer says what happened
    return proc, parent


def early(defer: bool = False, backward: bool = True) -> None:
    """Start the zygote now unless one is running or waiting in this process already
    (``defer``, ``backward``: as :func:`spawn`'s)."""
    remote = sys.modules.get("attnverify.remote")
    if _EARLY or (remote is not None and remote.zygote().alive()):
        return
    try:
        proc, sock = spawn(defer, backward)
    except OSError:
        return  # started later, where its failure is reported
    _EARLY.append((proc, sock, os.getpid()))


def take() -> tuple[subprocess.Popen, socket.socket] | None:
    """The zygote :func:`early` started in this process, if any (the caller owns it now)."""
    while _EARLY:
        proc, sock, owner = _EARLY.pop()
        if owner == os.getpid() and proc.poll() is None:
            return proc, sock
        _close(proc, sock, owner)
    return None


def _close(proc, sock, owner) -> None:
    sock.close()
    if owner == os.getpid() and proc.poll() is None:
        proc.kill()
        proc.wait()


@atexit.register
def _unadopted() -> None:
    while _EARLY:
        _close(*_EARLY.pop())
