"""The worker processes' zygote, started before the checker's own imports are done.

A command that will run targets behind the process boundary spends its first seconds importing
torch (and Hypothesis, and the checks) in this process; the zygote (:mod:`attnverify.worker`)
needs torch too before it can fork the first worker. Two ways to start it, both before the
checks are imported, adopted by :class:`attnverify.remote.Zygote` (:func:`take`) when it
first needs one; a zygote never adopted is killed at exit:

* :func:`forked`, the command line's (:func:`attnverify.commands._early_zygote`): this process
  imports torch and forks the zygote at once, before it imports Hypothesis, the checks or any
  target. The zygote and every worker it forks share torch's pages with the checker (the heap
  its import leaves: each process copies only the pages it writes) instead of holding a copy
  of their own, and one import's CPU is saved; the zygote then imports what it preloads while
  this process imports the checks. What a worker finds of the checker in its memory is what
  the command held then: its parsed command line, no object of a check.
* :func:`spawn` (:func:`early`), for any other caller (the library, a test that runs the
  command in its own process, whose objects a fork would carry into every worker): a new
  Python process, sent the import path at once, so that its import of torch and this
  process's run side by side.

This module imports nothing of torch but in :func:`forked`, so a command can call it before
its own heavy imports.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time

from attnverify import wire

#: The folder of this attnverify package, from which the zygote imports it.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: OpenMP's wait policy the zygote and the workers start with, unless the environment sets one.
PASSIVE = ("OMP_WAIT_POLICY", "PASSIVE")
#: The zygote started early and not yet adopted: ``(process, channel, pid of the process that
#: started it)``.
_EARLY: list = []


def spawn(defer: bool = False) -> tuple[subprocess.Popen, socket.socket]:
    """A new zygote process (``python -c … zygote FD``, in a session of its own) and the
    checker's end of its channel; its hello (the import path, what to preload) already sent, so
    it is importing torch when this returns. The caller reads its answer. ``defer``: the
    zygote answers before it imports :data:`attnverify.worker.DEFERRED` (``torch._dynamo``),
    which it (or a clone of it) imports before its second worker (a command whose one worker a
    process may have no use for it: ``falsify``, ``certify`` of one normalizer); else it
    imports them first, for every worker."""
    parent, child = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # the checker and the worker take turns: OpenMP threads that spin after a parallel
    # region would take the CPU from the other process (unless the user chose a policy)
    env.setdefault(*PASSIVE)
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
        wire.send(parent, _hello(defer))
    except OSError:
        pass  # the caller's read of the answer says what happened
    return proc, parent


def _hello(defer: bool) -> dict:
    """What the zygote imports before it answers, and what it defers (:func:`spawn`)."""
    # torch-free: the names the zygote imports
    from attnverify.worker import DEFERRED, PRELOAD

    return {"path": [str(p) for p in sys.path],
            "preload": [*PRELOAD, *(() if defer else DEFERRED)],
            "deferred": list(DEFERRED if defer else ())}


def forked(defer: bool = False) -> None:
    """The command line's zygote (module docstring): torch imported here, then the zygote
    forked from this process (:func:`_fork_zygote`), its hello (``defer``: as
    :func:`spawn`'s) handed over in memory; unless one is running or waiting in this process
    already. Where this process maps memory shared and writable, or the fork fails, it starts
    one with :func:`spawn` instead. Only for a process that holds nothing yet but its command
    line: the zygote and its workers keep a copy of everything it holds."""
    if _started():
        return
    # the checker and the worker take turns (:func:`spawn`); OpenMP reads the policy once, when
    # torch loads it, and the workers share this process's load: this process's too
    os.environ.setdefault(*PASSIVE)
    try:
        import torch  # noqa: F401  dispatch: the zygote shares this import's pages
    except Exception:  # noqa: BLE001 - the command's own import of torch reports it, as before
        return
    # shared writable memory: a worker could write into this process through it
    if _writable_shared_memory() or not _fork_zygote(_hello(defer)):
        early(defer)


def _fork_zygote(hello: dict) -> bool:
    """Fork the zygote, in a session of its own, nothing of this process open in it but its
    channel, serving ``hello``; kept for :func:`take`. Whether the fork succeeded."""
    from attnverify.worker import serve_zygote  # torch-free; a fork of this process runs it

    for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    parent, child = socket.socketpair()
    try:
        pid = os.fork()
    except OSError:
        parent.close()
        child.close()
        return False
    if pid == 0:
        try:
            _become_zygote(parent, child)
            serve_zygote(child, hello)
        finally:
            os._exit(0)  # never back into the command's code
    child.close()
    _EARLY.append((ProcessHandle(pid), parent, os.getpid()))
    return True


def _writable_shared_memory() -> bool:
    """Whether this process maps memory shared and writable (``/proc/self/maps``; true where it
    cannot be read): a fork would share it with the zygote and every worker."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return any(len(f) > 1 and f[1][1:2] == "w" and f[1][3:4] == "s"
                       for f in (line.split(maxsplit=2) for line in fh))
    except OSError:
        return True


def _become_zygote(parent: socket.socket, child: socket.socket) -> None:
    """In the forked child of :func:`forked`: what a spawned zygote starts with (a session of
    its own, the default signal dispositions, ``/dev/null`` for the standard streams, no other
    file of the command's open, a spawned zygote's ``sys.argv``)."""
    os.setsid()
    sys.argv[:] = ["-c", "zygote", str(child.fileno())]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = child.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, max(os.sysconf("SC_OPEN_MAX"), keep + 1))
    parent.detach()  # closed above


class ProcessHandle:
    """The part of :class:`subprocess.Popen` a :class:`attnverify.remote.Zygote` uses, for a
    process known by its pid: here a child of this process (the zygote :func:`forked` made),
    polled by ``waitpid``; :class:`attnverify.remote._Foreign` polls another's."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already
                pid, status = self.pid, -1
            if pid == self.pid:
                self.returncode = -1 if status < 0 else os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


def early(defer: bool = False) -> None:
    """Start the zygote now unless one is running or waiting in this process already
    (``defer``: as :func:`spawn`'s)."""
    if _started():
        return
    try:
        proc, sock = spawn(defer)
    except OSError:
        return  # started later, where its failure is reported
    _EARLY.append((proc, sock, os.getpid()))


def _started() -> bool:
    """Whether a zygote is running (adopted) or waiting in this process already."""
    remote = sys.modules.get("attnverify.remote")
    return bool(_EARLY) or (remote is not None and remote.zygote().alive())


def take() -> tuple[subprocess.Popen, socket.socket] | None:
    """The zygote :func:`early` or :func:`forked` started in this process, if any (the caller
    owns it now)."""
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
