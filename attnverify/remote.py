"""The checker's side of the process boundary: the target as an object the checks can call.

:func:`open_normalizer` and :func:`open_attention` start a worker process for one target
(:mod:`attnverify.worker`, forked by a zygote that imported torch once), load the target there
and return a :class:`~attnverify.spec.NormalizerSpec` (or an
:class:`~attnverify.attention.spec.AttentionSpec`) whose function is a proxy: calling it sends
the inputs through shared memory (:mod:`attnverify.wire`) and returns the outputs as plain
tensors in storage of the checker's own. Autograd works through the proxy (:class:`_Call`):
``backward`` asks the worker for vector–Jacobian products, ``torch.func.jvp`` for
Jacobian–vector products, a gradient of a gradient for the double backward, so every check of
:mod:`attnverify.checks` runs unchanged in this process, which never imports the target.

What the worker sends back is parsed strictly: one answer per request, with the request's id and
only the keys that request allows; an output is read from the slot this process allocated, with
the shape and dtype it expects. A worker that dies, hangs past the per-example time limit
(:mod:`attnverify.heartbeat`) or breaks the protocol raises :class:`~attnverify.errors.WorkerFailed`
(a ``BaseException``: no search retries it), and the next call starts a fresh worker. An output the
worker's border check refused raises :class:`Refused` (a violation of the running property). Side
effects the worker reports are kept by the target's :class:`Monitor` for the universal property
``no_side_effects``.

Under ``--no-isolation`` the same proxies call an in-process :class:`~attnverify.worker.Server`
(same border and state checks, no process): for debugging only.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import dataclasses
import inspect
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple

import torch
from torch.autograd import forward_ad

# jacobian: imported for its side effect of loading torch's forward-mode decompositions quietly
from attnverify import heap, heartbeat, jacobian, prestart, settings, triton_runtime, wire, worker  # noqa: F401
from attnverify.attention import cases as attention_cases
from attnverify.attention.loader import reference_problem
from attnverify.attention.spec import FIELDS, AttentionSpec, description_problem, unknown_name
from attnverify.checks.base import Violation, monitor_of
from attnverify.errors import TargetFailedInFull, TargetImportFailed, UsageError, WorkerFailed
from attnverify.normalizers.reference import REFERENCES
from attnverify.registry import builtin_ids
from attnverify.spec import Kernel, NormalizerSpec, normalizer_spec
from attnverify.worker import Server, user_traceback

#: Seconds the zygote may take to start (importing torch on a loaded machine).
ZYGOTE_START_S = 300.0
#: Worker failures in a row (no well-formed answer to a request between them) after which a
#: target is failed in full (:class:`~attnverify.errors.TargetFailedInFull`) ...
STRIKES = 3
#: ... or time-outs in a row (each cost a whole per-example limit): a target that hangs on every
#: call costs two limits, whatever the number of properties.
TIMEOUT_STRIKES = 2
#: Seconds to wait for a dead worker's exit status.
STATUS_WAIT_S = 2.0
#: Arena size (bytes) kept resident across a wrap of its cursor; a larger arena gives its pages
#: back at each wrap, and one far larger than the request that wraps it is replaced by a fresh
#: one (a single large case would otherwise keep the memory of both processes for the run).
KEEP_ARENA = 1 << 26


class Refused(Violation):
    """An output the border check refused (not a plain tensor, wrong shape, aliasing, …)."""

    def __init__(self, message: str):
        text = message if message.startswith(MUTATED) else \
            f"the output was refused at the process boundary: {message}"
        super().__init__(text, observed=1, bound=0, ratio=math.inf)
        self.refusal = message


#: How a call that wrote into its inputs is reported (read back from the arena, not a report of
#: the worker's).
MUTATED = "the target wrote into its input"


class TargetRaised(Exception):
    """The code under test raised in the worker; ``remote_type`` is its exception's type."""

    def __init__(self, remote_type: str, message: str):
        super().__init__(message)
        self.remote_type = remote_type or "Exception"


class ContractBroken(TargetRaised):
    """The target (or its own reference) cannot be called as ``fn(scores, dim=-1, **params)``:
    found from its signature when it is loaded, so it fails ``load`` once instead of every
    property raising the same ``TypeError``."""

    def __init__(self, message: str):
        super().__init__("TypeError", message)
        self.reason = f"failed: {message}"


# --------------------------------------------------------------------------------------------
# The zygote



class Zygote:
    """A process that imported torch once and forks one worker per target
    (``python -m attnverify.worker zygote FD``, in a session of its own)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.pid = 0
        self.lock = threading.Lock()
        self.owner = os.getpid()
        #: The directory that holds every worker's private one (``TMPDIR``), its clones' and
        #: their workers' too (a job's fork requests name its parent's): made by the process
        #: that starts the zygote and removed by it when the zygote stops (and by the zygote
        #: when this process's channel ends: :func:`attnverify.worker._drop_run_dir`), so that
        #: nothing of a run is left in the temporary directory however its processes end (a job
        #: killed at Ctrl-C, this process killed), short of the zygote being killed.
        self.root = ""
        self.root_owner = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.owner == os.getpid()

    def start(self) -> None:
        # the zygote a command started before its own imports (attnverify.prestart), or a new one
        self.proc, parent = prestart.take() or prestart.spawn()
        self.sock, self.owner = parent, os.getpid()
        self._drop_root()
        try:
            self.root = tempfile.mkdtemp(prefix="attnverify-run-")
        except OSError:
            self.root = ""  # each worker's directory is then made in the temporary directory
        self.root_owner = os.getpid()
        try:
            reply = _receive(parent, time.monotonic() + ZYGOTE_START_S)
        except (OSError, EOFError, wire.ProtocolError, TimeoutError) as exc:
            self.close()
            raise WorkerFailed(f"could not start the worker processes ({exc})") from None
        self.pid = int(reply.get("pid", 0))

    def request(self, message: dict, fds=(), wait: float = 60.0) -> dict:
        with self.lock:
            if not self.alive():
                self.start()
            if message.get("op") == "fork":  # its directory beneath the run's (started now)
                message = {**message, "scratch": self.root}
            try:
                wire.send(self.sock, message, tuple(fds))
                return _receive(self.sock, time.monotonic() + wait)
            except (OSError, EOFError, wire.ProtocolError, TimeoutError) as exc:
                self._stop()
                raise WorkerFailed(f"the worker processes' zygote failed ({exc})") from None

    def fork(self, memory_limit: bool) -> tuple[int, socket.socket, str]:
        """A new worker: ``(pid, its channel, what its sandbox is)`` (:mod:`attnverify.sandbox`,
        applied by the worker before it loads anything, reported through the zygote)."""

        reply, pid, mine = self._forked({"op": "fork", "cwd": os.getcwd(),
                                         "env": dict(os.environ),
                                         "path": [str(p) for p in sys.path],
                                         "memory_limit": bool(memory_limit),
                                         "sandbox": settings.sandbox_enabled()}, "worker")
        sandbox = reply.get("sandbox")
        return pid, mine, sandbox if isinstance(sandbox, str) else "none: not reported"

    def clone(self) -> tuple[int, socket.socket]:
        """A copy of this zygote for another checker process (``certify --jobs``): ``(pid,
        the checker's end of its channel)``, its hello's answer still to read (:meth:`adopt`).
        It is forked, torch already imported, so a job's workers start without importing it
        again."""
        _reply, pid, mine = self._forked({"op": "clone"}, "process")
        return pid, mine

    def _forked(self, message: dict, what: str) -> tuple[dict, int, socket.socket]:
        """Send ``message`` (a request that forks) with one end of a new socket pair: ``(the
        answer, the new process's pid, this process's end)``."""
        mine, theirs = socket.socketpair()
        try:
            reply = self.request(message, (theirs.fileno(),))
        finally:
            theirs.close()
        pid = reply.get("pid")
        if type(pid) is not int or pid <= 1 or pid in (os.getpid(), self.pid):
            mine.close()
            raise WorkerFailed(f"the zygote answered a {message['op']} with no {what}")
        return reply, pid, mine

    def adopt(self, pid: int, sock: socket.socket) -> None:
        """In a forked checker (a job): take the clone ``(pid, sock)`` (:meth:`clone`) as this
        process's zygote, in place of the one inherited from the parent (its channel closed
        here, the parent's to keep)."""
        if self.sock is not None:
            self.sock.close()
        self.proc, self.sock, self.pid, self.owner = _Foreign(pid), sock, pid, os.getpid()
        self.lock = threading.Lock()
        try:
            reply = _receive(sock, time.monotonic() + ZYGOTE_START_S)
        except (OSError, EOFError, wire.ProtocolError, TimeoutError) as exc:
            self.close()
            raise WorkerFailed(f"could not start the worker processes ({exc})") from None
        if reply.get("pid") != pid:
            self.close()
            raise WorkerFailed("the zygote's clone answered with another process")

    def status(self, pid: int, wait: float = STATUS_WAIT_S) -> int | None:
        try:
            reply = self.request({"op": "status", "pid": pid, "wait": wait}, wait=wait + 10)
        except WorkerFailed:
            return None
        status = reply.get("status")
        return status if type(status) is int else None

    def kill(self, pid: int, *, reap: bool = True) -> None:
        """``SIGKILL`` to the worker ``pid`` and its process group from here, at once; then
        (``reap``) the zygote kills it too and waits until it has reaped it (:meth:`reap`)."""
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, 9)
            except OSError:
                pass
        if reap:
            self.reap(pid)

    def reap(self, pid: int) -> None:
        """The zygote kills the worker ``pid`` and waits until it has reaped it."""
        try:
            self.request({"op": "kill", "pid": pid})
        except WorkerFailed:
            pass

    def close(self) -> None:
        """Every worker and whatever they left behind killed and reaped, then the zygote."""
        with self.lock:
            self._stop()

    def _stop(self) -> None:
        if self.sock is not None and self.proc is not None and self.owner == os.getpid():
            try:
                wire.send(self.sock, {"op": "exit"})
                _receive(self.sock, time.monotonic() + 15)
            except (OSError, EOFError, wire.ProtocolError, TimeoutError):
                pass
        if self.proc is not None and self.owner == os.getpid():
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.sock is not None:
            self.sock.close()
        self.proc, self.sock = None, None
        self._drop_root()

    def _drop_root(self) -> None:
        """Remove :attr:`root` where this process made it (its zygote and workers gone)."""
        if self.root and self.root_owner == os.getpid():
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = ""


class _Foreign(prestart.ProcessHandle):
    """A :class:`~attnverify.prestart.ProcessHandle` for a zygote this process did not start (a
    clone: the child of the first zygote, which reaps it)."""

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                with open(f"/proc/{self.pid}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[-1].split()[0]
            except (OSError, IndexError):
                state = b"X"
            if state in (b"Z", b"X"):  # exited (a zombie until its parent reaps it) or gone
                self.returncode = -1
        return self.returncode


_ZYGOTE = Zygote()


def zygote() -> Zygote:
    return _ZYGOTE


def shutdown() -> None:
    """Kill everything that is not a worker still in use — a closed or failed worker, and
    anything any worker left behind — and wait until none is left; called before a command
    writes its results (after closing its targets), so that no process of the code under test
    outlives the run. The zygote (attnverify's own code: torch imported, no target) stays for
    the next run of this process, and goes at exit with every worker."""
    if not _ZYGOTE.alive():
        return
    try:
        reply = _ZYGOTE.request({"op": "sweep"}, wait=30.0)
    except WorkerFailed:
        _ZYGOTE.close()
        return
    if reply.get("left"):
        _ZYGOTE.close()


atexit.register(_ZYGOTE.close)


def _receive(sock: socket.socket, deadline: float) -> dict:
    """One whole message by ``deadline`` (``TimeoutError`` after it, however slowly its bytes
    come); a frame longer than any answer (:data:`wire.MAX_ANSWER`) or holding a byte no answer
    holds is a :class:`wire.ProtocolError` at once (nothing waits for the rest of a frame a
    target forged by writing onto its channel)."""
    return wire.receive(sock, deadline=deadline, limit=wire.MAX_ANSWER, strict=True)


# --------------------------------------------------------------------------------------------
# One target's worker


@dataclasses.dataclass
class Event:
    """Something the worker reported: a side effect or a refused output, with the call and the
    case (``heartbeat.current_case()``) it happened on."""

    what: str
    op: str
    case: Any
    call: int
    input: torch.Tensor | None = None


@dataclasses.dataclass
class _Written:
    """One request's inputs in the arena, to read back again (:meth:`Channel._check_late`)."""

    slots: list
    expected: list
    op: str
    case: Any
    call: int
    fn: Any
    tensors: list
    seen: bool = False


class Monitor:
    """What one target's worker reported over the run: side effects, refused outputs, the
    worker processes it ran in and their sandboxes."""

    def __init__(self) -> None:
        self.effects: list[Event] = []
        self.refused: list[Event] = []
        self.pids: list[int] = []
        #: What each worker process ran under (:mod:`attnverify.sandbox`), in order.
        self.sandboxes: list[str] = []
        #: Calls that wrote into their inputs (also in :attr:`refused`).
        self.mutated: list[Event] = []
        #: Warnings the target's calls raised (the worker's word, made printable), once each.
        self.warnings: list[str] = []
        #: Seconds spent shrinking cases that ran past the time limit (one budget per target:
        #: :func:`attnverify.certify.shrink_hang`).
        self.hang_shrink_s = 0.0
        self.calls = 0
        #: Reads every earlier input still in the shared memory back again (the channel's
        #: :meth:`Channel._check_late`), so that a late write is among :attr:`effects`.
        self.settle: Any = lambda: None
        #: What the current worker process was given, in order (:class:`History`).
        self.history = History()
        #: Replaces the worker by a fresh one (the target loaded again): :meth:`Channel.restart`.
        self.restart: Any = None
        #: Makes a fresh worker ready ahead of the next restart: :meth:`Channel.prepare`.
        self.prepare: Any = None

    def mark(self) -> tuple[int, int]:
        return len(self.effects), len(self.refused)


class History:
    """The examples one worker process was called on, in order: ``(step, case, calls)`` per
    example (:func:`attnverify.heartbeat.current_step`), so that a defect that needs earlier calls
    (a state the target keeps between calls) can be replayed (:mod:`attnverify.sequence`). Cleared
    when a fresh worker starts; the oldest entries are dropped past :data:`HISTORY_ENTRIES`
    entries or :data:`HISTORY_BYTES` bytes of cases (:attr:`dropped` counts them).

    An attention case is kept by its recipe alone (:class:`ByRecipe`), which builds the same
    tensors (:func:`attnverify.attention.cases.build` is deterministic, and every attention case
    is made by it), and is built again only by :meth:`snapshot`, when a failure's earlier calls
    are searched; it still counts its tensors' bytes, so the entries kept are the same. Kept
    whole, the cases of an attention run held the cap (64 MB) in every checker all run long."""

    def __init__(self) -> None:
        self.entries: collections.deque = collections.deque()
        self.serial = -1
        self.bytes = 0
        self.dropped = 0

    def clear(self) -> None:
        self.entries.clear()
        self.serial, self.bytes, self.dropped = -1, 0, 0

    def note(self) -> None:
        """One request of the example running now."""
        serial, step, case = heartbeat.current_step()
        serial = serial if step is not None else ("outside", serial)
        if serial == self.serial and self.entries:
            self.entries[-1][2] += 1
            return
        self.serial = serial
        size = case_bytes(case) if step is not None else 0
        if step is None:
            case = None
        elif isinstance(case, attention_cases.AttnCase):
            case = ByRecipe(case.recipe)
        self.entries.append([step, case, 1, size])
        self.bytes += size
        while len(self.entries) > HISTORY_ENTRIES or (self.bytes > HISTORY_BYTES and
                                                      len(self.entries) > 1):
            self.bytes -= self.entries.popleft()[3]
            self.dropped += 1

    def snapshot(self) -> list[tuple[Any, Any, int]]:
        """``[(step, case, requests)]``, oldest first (``step`` ``None``: calls outside any
        example, which cannot be replayed); an attention case built again from its recipe,
        holding the very recipe object the case it stands for held (so ``case.recipe is
        given.recipe`` tells the case that was given)."""
        return [(step, case.build() if isinstance(case, ByRecipe) else case, calls)
                for step, case, calls, _ in self.entries]


class ByRecipe(NamedTuple):
    """An attention case kept by its recipe (:class:`History`)."""

    recipe: dict

    def build(self):
        return attention_cases.build(self.recipe)._replace(recipe=self.recipe)


#: The most examples, and bytes of their tensors, a worker's :class:`History` keeps.
HISTORY_ENTRIES = 512
HISTORY_BYTES = 64 << 20


def case_bytes(case) -> int:
    """The bytes of a case's tensors."""
    fields = case._asdict().values() if hasattr(case, "_asdict") else ()
    return sum(t.numel() * t.element_size() for t in fields if isinstance(t, torch.Tensor))


_REPLY_KEYS = {
    "load": {"id", "ok", "describe"},
    "map": {"id", "ok"},
    "bye": {"id", "ok"},
    "call": {"id", "ok", "requires_grad", "side_effects", "warnings"},
    "calls": {"id", "ok", "side_effects", "warnings"},
    "vjps": {"id", "ok", "graph", "side_effects", "warnings"},
    "vjp": {"id", "ok", "differentiable", "side_effects", "warnings"},
    "vjp2": {"id", "ok", "side_effects", "warnings"},
    "jvp": {"id", "ok", "side_effects", "warnings"},
    "normal": {"id", "ok", "side_effects", "warnings"},
}
_ERROR_KEYS = {"id", "ok", "kind", "type", "message", "side_effects", "index",
               "traceback"}
#: Distinct warnings of a target kept for its report.
MAX_WARNINGS = 20


class _Spare:
    """A fresh worker made ready on a thread of its own while the checker goes on
    (:meth:`Channel.prepare`): the zygote first reaps the workers handed over (``reap``: killed
    already, their exit waited for here instead of on the checker's path), then forks the new
    one, and the target's ``load`` request is sent to it. The load runs in that worker at once,
    on the other core; its answer is read, strictly like any load's, when the channel takes the
    worker (:meth:`Channel._start`), and its time limit runs from when it was sent."""

    def __init__(self, load_message: dict, memory_limit: bool, reap: tuple[int, ...]):
        self.load_message, self.memory_limit, self.reap = load_message, memory_limit, reap
        self.pid, self.sock, self.sandbox = 0, None, ""
        self.sent: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="attnverify-spare", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for pid in self.reap:
                zygote().reap(pid)
            self.pid, self.sock, self.sandbox = zygote().fork(self.memory_limit)
            self.sent = time.monotonic()
            wire.send(self.sock, {**self.load_message, "id": 1})
        except BaseException as exc:  # noqa: BLE001 - the channel starts a worker itself then
            self.error = exc

    def take(self):
        """``(pid, channel, sandbox, when the load was sent)`` once the thread is done, or
        ``None`` where it failed (the spare discarded: the channel starts a worker as it always
        did, and meets whatever failure is there itself)."""
        self.thread.join()
        if self.error is not None or self.sent is None:
            self.discard()
            return None
        return self.pid, self.sock, self.sandbox, self.sent

    def discard(self) -> None:
        self.thread.join()
        if self.sock is not None:
            self.sock.close()
        if self.pid:
            zygote().kill(self.pid)
        self.pid, self.sock = 0, None


class Channel:
    """The connection to one target's worker, restarted (and the target reloaded) on demand."""

    def __init__(self, kind: str, target: str, params: dict, *, timeout_s: float, device: str,
                 isolated: bool = True):
        self.kind = kind
        self.load_message = {"op": "load", "kind": kind, "target": target,
                             "params": wire.plain(dict(params or {}))}
        self.timeout_s = float(timeout_s)
        self.device = device
        self.isolated = isolated
        self.monitor = Monitor()
        self.monitor.settle = lambda: self._check_late(everything=True)
        self.monitor.restart = self.restart
        self.description: dict | None = None
        self.pid = 0
        self.sock: socket.socket | None = None
        self.arena: wire.Arena | None = None
        self.cursor = 0
        self.next_id = 0
        self.local = None
        #: Inputs of earlier requests still in the arena, read back again later
        #: (:meth:`_check_late`): a write after the answer (a thread left running) is seen too.
        self.written: list[_Written] = []
        #: The worker failures since the last well-formed answer (``True``: a time-out), and
        #: why the target is failed in full once they are too many (:meth:`_strike`).
        self.strikes: list[bool] = []
        self.condemned: str | None = None
        #: A fresh worker made ready ahead of the next start (:meth:`prepare`), or ``None``.
        self.spare: _Spare | None = None
        #: Workers a restart killed whose exit the zygote has not been asked to wait for yet
        #: (by the next spare's thread, else when the channel closes).
        self.unreaped: list[int] = []
        self.monitor.prepare = self.prepare

    # ---- lifetime -----------------------------------------------------------------------------

    def open(self) -> dict:
        if self.description is None:
            self._start()
        return self.description

    def restart(self) -> None:
        """A fresh worker (the target loaded again), with nothing of the calls before: the
        replay of a call sequence starts here (:mod:`attnverify.sequence`). In-process
        (``--no-isolation``) a fresh server loads the target again; a module already imported
        keeps its state there. Behind the boundary the old worker is killed at once (the zygote
        waits for its exit later, off the checker's path) and the fresh one is the one made
        ready ahead (:meth:`prepare`) when there is one."""
        old = self._close_worker(reap=False)
        if old:
            self.unreaped.append(old)
        self._start()

    def prepare(self) -> None:
        """Make a fresh worker ready for the next start (:meth:`restart`, or a start after a
        worker failed), on a thread while the checker goes on: forked, the target's load
        request sent (:class:`_Spare`); the workers restarts killed are reaped on that thread
        first. Called where a fresh worker will soon be needed (a failure found, before it is
        shrunk: :func:`attnverify.sequence.prepare`); a no-op in-process, for a target failed in
        full, or when one is ready already. It is a worker like any other: it is given nothing
        but the load before it is taken, and it is recorded among the target's workers only
        then."""
        if not self.isolated or self.condemned is not None or self.spare is not None:
            return
        reap, self.unreaped = tuple(self.unreaped), []
        self.spare = _Spare(self.load_message, self.device == "cpu", reap)

    def _start(self) -> None:
        self.monitor.history.clear()
        spare, self.spare = self.spare, None
        if not self.isolated:
            if spare is not None:
                spare.discard()
            self.local = Server()
            try:
                describe = self.local.load(dict(self.load_message))
            except TargetImportFailed as exc:  # as behind the boundary: the target's failure
                raised = TargetRaised(type(exc).__name__, str(exc))
                raised.traceback = user_traceback(exc.__cause__ or exc.__context__ or exc)
                raise raised from None
        else:
            # the worker made ready ahead (:meth:`prepare`), its load sent, else a new one
            taken = spare.take() if spare is not None else None
            if taken is not None:
                self.pid, self.sock, sandbox, sent = taken
            else:
                self.pid, self.sock, sandbox = zygote().fork(memory_limit=self.device == "cpu")
                sent = None
            self.monitor.pids.append(self.pid)
            self.monitor.sandboxes.append(sandbox)
            self.arena, self.next_id, self.cursor = None, 0, 0
            if sent is None:
                reply = self._exchange(self.load_message, (), deadline=time.monotonic() +
                                       self.timeout_s)
            else:  # the load request the spare was sent (id 1), answered within its limit
                self.next_id = 1
                reply = self._reply("load", self.sock, sent + self.timeout_s)
            if not reply["ok"]:
                self._discard()
                self._raise(reply, "load", [], None)
            describe = reply.get("describe")
            if not isinstance(describe, dict):
                self._fail("answered a load without a description")
        if self.description is None:
            self.description = describe
        elif describe != self.description:
            self._fail("described the target differently when it was loaded again")

    def close(self) -> None:
        """Stop the worker, and the one made ready ahead (:meth:`prepare`) if any; wait until
        every worker a restart killed has exited."""
        self._close_worker()
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.discard()
        unreaped, self.unreaped = self.unreaped, []
        for pid in unreaped:
            zygote().reap(pid)

    def _close_worker(self, reap: bool = True) -> int:
        """Stop the current worker: its late writes read back, then killed at once; ``reap``:
        wait until the zygote has reaped it (else the caller keeps its pid, returned, in
        :attr:`unreaped`). ``0`` when there was no worker process."""
        pid = 0
        if self.sock is not None and self.arena is not None:
            try:
                self._check_late(everything=True)
            except Exception:  # noqa: BLE001 - closing goes on whatever the arena holds
                pass
        if self.sock is not None:
            try:
                wire.send(self.sock, {"op": "bye", "id": -1})
            except OSError:
                pass
            self.sock.close()
            pid = self.pid
            zygote().kill(pid, reap=reap)
        if self.arena is not None:
            self.arena.close()
        self.sock, self.arena, self.local = None, None, None
        return pid

    def _dead(self, why: str = "") -> WorkerFailed:
        pid = self.pid
        self._discard()
        status = zygote().status(pid) if pid else None
        if why:
            reason = why
        elif status is None:
            reason = "stopped answering"
        elif status < 0:

            try:
                name = signal.Signals(-status).name
            except ValueError:
                name = f"signal {-status}"
            extra = " (out of memory?)" if -status == signal.SIGKILL else ""
            reason = f"crashed the worker process ({name}{extra})"
        else:
            reason = f"exited the worker process (exit code {status})"
        return WorkerFailed(reason, signal=-status if status is not None and status < 0 else 0)

    def _discard(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.pid:
            zygote().kill(self.pid)
        if self.arena is not None:
            self.arena.close()
        self.written = []
        self.sock, self.arena, self.pid = None, None, 0

    @staticmethod
    def _peek(sock: socket.socket) -> bytes:
        """The first byte waiting on ``sock``, left there (``b""``: the channel's end)."""
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return b"?"  # readable a moment ago: the first byte of a message nobody asked for
        except OSError:
            return b""  # reset: the worker is gone

    def _fail(self, what: str):
        self._discard()
        raise WorkerFailed(f"broke the worker protocol: the worker {what}")

    # ---- requests -----------------------------------------------------------------------------

    def _exchange(self, message: dict, fds, deadline: float) -> dict:
        """Send one request, read its one answer, strictly."""
        sock = self.sock
        ready, _, _ = select.select([sock], [], [], 0)
        if ready:  # nothing may arrive unasked: a second answer, or a forged one
            if not self._peek(sock):  # or the end of the channel: the worker ended since
                raise self._dead()
            self._fail("sent a message nobody asked for")
        self.next_id += 1
        message = {**message, "id": self.next_id}
        try:
            # a worker that stops reading cannot hold the send past the deadline either
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            wire.send(sock, message, tuple(fds))
        except TimeoutError:
            self._discard()
            raise WorkerFailed(f"exceeded the per-example time limit of {self.timeout_s:g} s "
                               "(--timeout)", timed_out=True) from None
        except OSError:
            raise self._dead() from None
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)
        return self._reply(message["op"], sock, deadline)

    def _reply(self, op: str, sock: socket.socket, deadline: float) -> dict:
        """The one answer to the ``op`` request sent last (id :attr:`next_id`), strictly."""
        try:
            reply = _receive(sock, deadline)
        except TimeoutError:
            self._discard()
            raise WorkerFailed(f"exceeded the per-example time limit of {self.timeout_s:g} s "
                               "(--timeout; the time of its own calls on this example)",
                               timed_out=True) from None
        except (EOFError, OSError):
            raise self._dead() from None
        except wire.ProtocolError as exc:
            self._fail(f"sent {exc}")
        if reply.get("id") != self.next_id or not isinstance(reply.get("ok"), bool):
            self._fail("answered with the wrong request id")
        allowed = _REPLY_KEYS[op] if reply["ok"] else _ERROR_KEYS
        if not set(reply) <= allowed:
            self._fail(f"answered a {op} request with unknown keys "
                       f"{sorted(set(reply) - allowed)[:3]}")
        return reply

    def request(self, message: dict, tensors: list, outputs: list) -> tuple[dict, list]:
        """One request on ``tensors``; ``outputs`` are ``(shape, dtype or None, device)`` of the
        results (``None``: any floating dtype, read as float64). Returns ``(reply, results)``.
        A target failed in full (:meth:`_strike`) raises at once, starting no worker."""
        if self.condemned is not None:
            raise TargetFailedInFull(self.condemned)
        try:
            answer = self._request(message, tensors, outputs)
        except WorkerFailed as exc:
            self._strike(exc)
            raise
        except (Refused, TargetRaised):
            self.strikes = []  # a well-formed answer: the worker works
            raise
        self.strikes = []
        return answer

    def _strike(self, exc: WorkerFailed) -> None:
        """One more worker failure in a row; after :data:`STRIKES` of them (or
        :data:`TIMEOUT_STRIKES` time-outs) the target is failed in full."""
        if isinstance(exc, TargetFailedInFull) or heartbeat.budgeted():
            return  # failed in full already, or a shrink's retry that a budget bounds
        self.strikes.append(bool(getattr(exc, "timed_out", False)))
        if len(self.strikes) >= STRIKES or sum(self.strikes) >= TIMEOUT_STRIKES:
            self.condemned = (f"was not run: its worker failed {len(self.strikes)} times in a "
                              f"row (the last: {exc.reason}), so the target is failed in full")

    def _request(self, message: dict, tensors: list, outputs: list, *,
                 built: bool = True) -> tuple[dict, list]:
        """One request. ``built``: constants with a recipe (:func:`wire.recipe_of`) are built
        by the worker, read-only; a worker that a memory fault ends on such a request may have
        written into one, so the request is made once more (in the fresh worker the next
        request starts anyway) with them in the arena, where a write is read back and refused
        as the write it is, and a crash is a crash."""
        try:
            return self._request_once(message, tensors, outputs, built)
        except WorkerFailed as exc:
            if not built or exc.signal not in (signal.SIGSEGV, signal.SIGBUS) or \
                    not any(wire.recipe_of(t) is not None for t in tensors):
                raise
        return self._request_once(message, tensors, outputs, False)

    def _request_once(self, message: dict, tensors: list, outputs: list,
                      built: bool) -> tuple[dict, list]:
        self.open()
        heap.trim_due()
        self.monitor.calls += 1
        self.monitor.history.note()
        if not self.isolated:
            return self._local(message, tensors, outputs)
        if self.sock is None:
            self._start()
        # a tensor given twice to one call (the lifting's K = V = I) is written once, and both
        # arguments are views of those bytes, as they are views of one storage here; never
        # across the calls of a request, whose inputs the worker writes into (``reuse``)
        first = list(range(len(tensors))) if "calls" in message else _first_positions(tensors)
        # a constant with a recipe (the lifting's identity) is built by the worker, read-only:
        # none of its bytes cross, none are read back
        recipes = [wire.recipe_of(t) if built else None for t in tensors]
        _no_reuse_of(recipes, message)
        need = sum(_span_bytes(t) + wire.ALIGN for i, t in enumerate(tensors)
                   if first[i] == i and recipes[i] is None)
        need += sum(math.prod(s) * _itemsize(d) + wire.ALIGN for s, d, _ in outputs)
        self._ensure_arena(need)
        # each request's tensors further along the arena than the last one's (from the start
        # again where they do not fit): a call's inputs are not where the previous call's were
        if self.cursor + need > self.arena.size:
            self._check_late(everything=True)  # before their bytes are overwritten
            self.cursor = 0
            if self.arena.size > KEEP_ARENA:  # its pages go back; a far larger one than this
                if self.arena.size > 4 * max(need, KEEP_ARENA):  # request needs is replaced
                    self._ensure_arena(need, replace=True)
                else:  # those this request does not write over go back
                    self.arena.drop_pages(need)
        else:
            self._check_late(everything=False)
        layout = wire.Layout(self.cursor)
        slots, written = [], []
        for i, t in enumerate(tensors):
            if first[i] != i:
                slots.append(slots[first[i]])
                written.append(written[first[i]])
                continue
            if recipes[i] is not None:
                slots.append(recipes[i])
                written.append(None)
                continue
            # what the slot must hold, to read back after the answer (and at later requests):
            # the bytes of this process's own tensors, never read back from the arena; on the
            # CPU the arena's bytes are written from that copy
            want = _expected_bytes(t)
            span = want if isinstance(want, bytes) else None  # the CPU span, as bytes
            slots.append(wire.write_tensor(self.arena, layout, t, device=str(t.device),
                                           span=span))
            written.append(want)
        expected = self._expected(written, message)
        outs = [wire.output_slot(layout, shape, dtype or torch.float64, "cpu")
                for shape, dtype, _ in outputs]
        self.cursor = layout.used
        expect = [{"size": list(shape), "dtype": None if dtype is None else wire.dtype_name(dtype),
                   "device": device} for shape, dtype, device in outputs]
        body = {**message, "tensors": [s.to_json() for s in slots],
                "out": [s.to_json() for s in outs], "expect": expect}
        sent = time.monotonic()
        try:
            reply = self._exchange(body, (), heartbeat.deadline(self.timeout_s))
        finally:
            heartbeat.charge(time.monotonic() - sent)  # the target's time, not attnverify's
        self._record(reply, message["op"], tensors, message.get("fn"))
        self._check_inputs(slots, expected, tensors, message)
        self.written.append(_Written(slots, expected, message["op"],
                                     heartbeat.current_case(), self.monitor.calls,
                                     message.get("fn"), self._reported(tensors)))
        if not reply["ok"]:
            self._raise(reply, message["op"], tensors, message.get("fn"))
        results = []
        for slot, (_, _, device) in zip(outs, outputs):
            t = wire.read_tensor(self.arena, slot)
            results.append(t if device in (None, "cpu") else t.to(device))
        return reply, results

    def _check_inputs(self, slots, expected: list, tensors: list, message: dict) -> None:
        """Every input's bytes in the arena after the answer, against what was written there
        (``expected``: :meth:`_expected`): a difference is the target writing into its
        arguments (the worker gives a CPU target the arena's bytes themselves, so this is read
        here, not reported by the worker). Refused (a violation of the running property), and
        kept for ``no_mutation``."""
        read = set()
        for i, (slot, t) in enumerate(zip(slots, tensors)):
            if id(slot) in read:
                continue  # a tensor given twice: its bytes are read back once
            read.add(id(slot))
            if slot.elements and not _same_bytes(self.arena, slot, expected[i]):
                call = next((k for k, c in enumerate(message.get("calls") or ())
                             if c.get("args") and c["args"][0] == {"$tensor": i}), None)
                where = "" if call is None else f" (call {call + 1} of the request)"
                what = (f"{MUTATED}{where}: a normalizer must leave its argument unchanged "
                        "(compute into new storage)")
                self.monitor.refused.append(Event(what, message["op"], heartbeat.current_case(),
                                                  self.monitor.calls,
                                                  self._scores([t], message.get("fn"))))
                self.monitor.mutated.append(self.monitor.refused[-1])
                raise Refused(what)

    @staticmethod
    def _expected(written: list, message: dict) -> list:
        """What each input slot must hold after the answer, from ``written`` (each slot's bytes
        as written): its own bytes, or those of the call that reused its storage (given call
        i's values after it returned)."""
        expected = list(range(len(written)))
        for earlier, mine in _reuses(message):
            expected[earlier] = mine
        return [written[j] for j in expected]

    def _check_late(self, everything: bool) -> None:
        """The inputs of earlier requests read back again: the last request's (``everything``
        false: at each request) or all still in the arena (before the arena is written over
        from its start, replaced or closed). A change since the answer is the target writing
        into its input after the call returned (a thread, a stream left running): a side
        effect on the request it was given to (``no_side_effects``)."""
        if not self.written or self.arena is None:
            return
        pending = self.written if everything else self.written[-1:]
        for entry in pending:
            if entry.seen:
                continue
            read = set()
            for slot, want in zip(entry.slots, entry.expected):
                if id(slot) in read:
                    continue
                read.add(id(slot))
                if slot.elements and not _same_bytes(self.arena, slot, want):
                    entry.seen = True
                    self.monitor.effects.append(Event(
                        f"{MUTATED} after the call returned (seen {self.monitor.calls - entry.call}"
                        " requests later): a thread or stream of the target's kept writing into "
                        "its argument", entry.op, entry.case, entry.call,
                        self._scores(entry.tensors, entry.fn)))
                    break
        if everything:
            self.written = []

    def _check_local_inputs(self, fresh, given, tensors, message) -> None:
        """:meth:`_check_inputs` in this process (``--no-isolation``): the inputs after the
        call against copies taken before it (a reused storage holds the later call's values)."""
        expected = list(range(len(tensors)))
        for earlier, mine in _reuses(message):
            expected[earlier] = mine
        for i, t in enumerate(fresh):
            want = given[expected[i]]
            if t.numel() and not torch.equal(_raw(t), _raw(want)):
                what = (f"{MUTATED}: a normalizer must leave its argument unchanged (compute "
                        "into new storage)")
                self.monitor.refused.append(Event(what, message["op"], heartbeat.current_case(),
                                                  self.monitor.calls,
                                                  self._scores([tensors[i]], message.get("fn"))))
                self.monitor.mutated.append(self.monitor.refused[-1])
                raise Refused(what)

    def _local(self, message: dict, tensors: list, outputs: list) -> tuple[dict, list]:

        fresh = [_fresh(t) for t in tensors]
        given = [_fresh(t) for t in fresh]  # what the target is given, to compare after
        expect = [{"size": list(shape), "dtype": None if dtype is None else wire.dtype_name(dtype),
                   "device": device} for shape, dtype, device in outputs]
        try:
            reply, results = self.local.handle({**message, "expect": expect}, fresh)
        except (worker.Raised, worker.Border) as exc:
            if isinstance(exc, worker.Raised):
                name, text = worker.describe_exception(exc.cause)
                reply = {"ok": False, "kind": "raised", "type": name, "message": text,
                         "traceback": worker.user_traceback(exc.cause)}
            else:
                reply = {"ok": False, "kind": "border", "type": "", "message": str(exc)}
            reply["side_effects"] = list(getattr(exc, "side_effects", []))
            if getattr(exc, "index", None) is not None:
                reply["index"] = exc.index
        self._record(reply, message["op"], tensors, message.get("fn"))
        self._check_local_inputs(fresh, given, tensors, message)
        if not reply["ok"]:
            self._raise(reply, message["op"], tensors, message.get("fn"))
        out = []
        for t, (_, dtype, _device) in zip(results, outputs):
            t = t.detach().clone(memory_format=torch.contiguous_format)
            out.append(t if dtype is not None else t.to(torch.float64))
        return reply, out

    def _ensure_arena(self, need: int, replace: bool = False) -> None:
        """An arena ``need`` bytes fit in: the current one, or a larger one (twice the need, at
        least twice the old size, up to :data:`KEEP_ARENA`; beyond it, the need: each such
        request wraps the arena, which gives its pages back); ``replace``: a fresh one sized by
        the need alone. A replaced arena's pages are given back at once (the worker keeps it
        mapped)."""
        if self.arena is not None and self.arena.size >= need and not replace:
            return
        grown = 2 * max(need, 0 if replace or self.arena is None else self.arena.size)
        size = max(wire.MIN_ARENA, grown if grown <= KEEP_ARENA else need)
        arena = wire.Arena.create(size)
        try:
            reply = self._exchange({"op": "map", "size": arena.size}, (arena.fd,),
                                   time.monotonic() + self.timeout_s)
        finally:
            arena.release_fd()
        if not reply["ok"]:
            arena.close()
            self._fail("could not map the shared memory")
        if self.arena is not None:
            self._check_late(everything=True)
            self.arena.drop_pages()
            self.arena.close()
        self.written = []
        self.arena, self.cursor = arena, 0

    def _record(self, reply: dict, op: str, tensors: list, fn) -> None:
        effects = reply.get("side_effects", [])
        if not isinstance(effects, list) or not all(isinstance(e, str) for e in effects):
            self._fail("reported side effects that are not a list of text")
        told = reply.get("warnings", [])
        if not isinstance(told, list) or not all(isinstance(w, str) for w in told):
            self._fail("reported warnings that are not a list of text")
        for text in told[:MAX_WARNINGS]:
            text = printable(text, 300)
            if text not in self.monitor.warnings and len(self.monitor.warnings) < MAX_WARNINGS:
                self.monitor.warnings.append(text)
        scores = self._scores(tensors, fn) if effects else None
        for what in effects:
            self.monitor.effects.append(Event(printable(what, 300), op, heartbeat.current_case(),
                                              self.monitor.calls, scores))

    def _reported(self, tensors: list) -> list:
        """What of a request's inputs :meth:`_scores` may report later (the scores a normalizer
        was called on; nothing of an attention kernel's: the others are not kept alive)."""
        return tensors[:1] if self.kind == "normalizer" else []

    def _scores(self, tensors: list, fn) -> torch.Tensor | None:
        """The scores a normalizer was called on (for the report), else ``None``."""
        if self.kind != "normalizer" or not tensors or fn not in (None, "target"):
            return None
        return tensors[0].detach().clone()

    def _raise(self, reply: dict, op: str, tensors: list, fn):
        kind = reply.get("kind")
        text, name = printable(reply.get("message", "")), printable(reply.get("type", ""), 80)
        index = reply.get("index")
        if index is not None and (type(index) is not int or not 0 <= index < len(tensors)):
            self._fail("answered with a call index out of range")
        if kind == "border":
            scores = self._scores(tensors[index:] if index is not None else tensors, fn)
            self.monitor.refused.append(Event(text, op, heartbeat.current_case(),
                                              self.monitor.calls, scores))
            raise Refused(text)
        if kind == "usage":
            raise UsageError(text)
        raised = TargetRaised(name, text)
        raised.index = index
        raised.traceback = _traceback(reply)
        if raised.traceback is None:
            self._fail("answered with a malformed traceback")
        try:
            raise raised
        finally:
            # no cycle exception -> traceback -> this frame -> exception: the frames of the
            # request (its tensors, up to an L×L identity and torch.func's tangents) go when
            # the exception is handled, not at the next cyclic collection
            del raised


def _traceback(reply: dict) -> list[str] | None:
    """The target's traceback in an answer (lines of text, made printable: the code under
    test's word, shown with ``--traceback``), ``[]`` without one, ``None`` when malformed."""
    lines = reply.get("traceback", [])
    if not isinstance(lines, list) or len(lines) > 100 or \
            not all(isinstance(line, str) for line in lines):
        return None
    return [printable(line, 300) for line in lines]


def _same_bytes(arena, slot, want) -> bool:
    """Whether the arena still holds ``want`` (the storage span's bytes, :func:`_expected_bytes`)
    at ``slot``, byte for byte, compared in place (no copy of the arena's bytes)."""
    n = len(want) if isinstance(want, (bytes, bytearray)) else want.numel()
    return n == slot.nbytes and arena.same_bytes(slot.offset, want)


def _expected_bytes(t: torch.Tensor) -> torch.Tensor | bytes:
    """What ``t``'s slot must hold after a call: its storage span's bytes (:func:`_raw`) in
    memory of this process's own, one copy (bytes, on the CPU; a tensor marked constant,
    :func:`wire.constant`: its own bytes, no copy)."""
    if wire.is_constant(t):
        return _raw(t)
    if t.device.type == "cpu" and not (t.is_neg() or t.is_conj()):
        # the span's bytes, from the start of a storage that holds them, copied once
        n = _span_bytes(t)
        if n == 0:
            return b""
        try:
            storage = t.untyped_storage()
        except (NotImplementedError, RuntimeError):  # no storage of its own to read
            storage = None
        if storage is not None and storage.data_ptr() and storage.nbytes() >= n:
            return ctypes.string_at(storage.data_ptr(), n)
    raw = _raw(t)
    return raw.clone() if t.device.type == "cpu" else raw  # off the CPU: .cpu() copied


def _reuses(message: dict) -> list[tuple[int, int]]:
    """``(earlier, mine)`` of each call of a ``calls`` request that reuses an earlier input's
    storage: the slot it reuses, and the slot of its own input (its argument ``arg``, 0 unless
    said) whose values it writes there."""
    pairs = []
    for call in message.get("calls") or ():
        if isinstance(call, dict) and type(call.get("reuse")) is int:
            pairs.append((call["reuse"], call["args"][call.get("arg", 0)]["$tensor"]))
    return pairs


def _no_reuse_of(recipes: list, message: dict) -> None:
    """A call of a ``calls`` request may be given an earlier call's input storage (``reuse``)
    only where that input crossed in the arena: a built constant is read-only."""
    for call in message.get("calls") or ():
        if isinstance(call, dict) and type(call.get("reuse")) is int and \
                0 <= call["reuse"] < len(recipes) and recipes[call["reuse"]] is not None:
            raise ValueError("reuse of a constant the worker builds")


def _first_positions(tensors: list) -> list[int]:
    """For each of ``tensors``, the index of its first occurrence: the same object, or the same
    view (sizes, strides, offset, dtype) of the storage of a constant (:func:`wire.constant`:
    torch.func hands an autograd Function other objects over the same storage)."""
    seen: dict = {}
    out = []
    for i, t in enumerate(tensors):
        key = id(t)
        if wire.is_constant(t):
            key = ("constant", t.untyped_storage().data_ptr(), t.storage_offset(),
                   tuple(t.shape), tuple(t.stride()), t.dtype)
        out.append(seen.setdefault(key, i))
    return out


def _raw(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage span as bytes (NaN equals NaN, -0.0 differs from 0.0)."""
    t = t.detach()
    flat = torch.as_strided(t, (wire.span_elements(t),), (1,), 0).contiguous()
    return flat.cpu().view(torch.uint8)


def _span_bytes(t: torch.Tensor) -> int:
    return wire.span_elements(t) * t.element_size()


def _itemsize(dtype) -> int:
    return (dtype or torch.float64).itemsize


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in new storage with the same sizes, strides and storage offset."""
    t = t.detach()
    n = wire.span_elements(t)
    storage = torch.empty(n, dtype=t.dtype, device=t.device)
    if n:
        storage.copy_(torch.as_strided(t, (n,), (1,), 0))
    return torch.as_strided(storage, t.shape, t.stride(), t.storage_offset() if n else 0)


# --------------------------------------------------------------------------------------------
# Autograd through the boundary


class _Site:
    """One call of a remote function: which function, its arguments, what it returns."""

    def __init__(self, channel: Channel, fn: str, args: list, kwargs: dict, expect, grad_mode):
        self.channel, self.fn, self.args, self.kwargs = channel, fn, args, kwargs
        self.expect, self.grad_mode = expect, grad_mode
        self.no_graph = False
        self.differentiable: list[bool] = []
        #: Arguments held here instead of being inputs of the autograd node (:meth:`hold`), by
        #: their position among the call's tensors; ``moving``: the position of each input.
        self.fixed: dict[int, torch.Tensor] = {}
        self.moving: list[int] = []

    def hold(self, tensors: list) -> list:
        """The tensors of the call the autograd node takes as inputs: all but the constants
        (:func:`attnverify.wire.is_constant`, such as the lifting's ``K = V = I``) that nothing
        differentiates, which this site holds. A transform's forward mode gives every input of
        a Function a tangent, dense zeros where it differentiates none (two ``L×L`` tensors at
        each call of a lifted kernel, ``L`` up to 4097); a constant held here gets none."""
        self.fixed = {i: t for i, t in enumerate(tensors)  # is_constant first: cheapest
                      if wire.is_constant(t) and not t.requires_grad and not _wrapped(t)}
        self.moving = [i for i in range(len(tensors)) if i not in self.fixed]
        return [tensors[i] for i in self.moving]

    def _full(self, tensors, wrt=()) -> tuple[list, list]:
        """``(every tensor of the call, the positions of wrt there)`` from the node's inputs
        and positions among them (:meth:`hold`)."""
        if not self.fixed:
            return list(tensors), list(wrt)
        given = iter(tensors)
        full = [self.fixed[i] if i in self.fixed else next(given)
                for i in range(len(self.fixed) + len(self.moving))]
        return full, [self.moving[i] for i in wrt]

    def _message(self, op: str, **extra) -> dict:
        return {"op": op, "fn": self.fn, "args": self.args, "kwargs": self.kwargs, **extra}

    def forward(self, tensors) -> torch.Tensor:
        tensors, _ = self._full(tensors)
        grad = [bool(t.requires_grad) for t in tensors]
        reply, (out,) = self.channel.request(
            self._message("call", grad=grad, grad_mode=self.grad_mode), list(tensors),
            [self.expect(tensors)])
        requires_grad = reply.get("requires_grad", False)
        if not isinstance(requires_grad, bool):
            self.channel._fail("answered a call with a requires_grad that is not true or false")
        # the worker ran with grad only where this process asked for it; there, an output
        # without a graph means the target is not differentiable (reverse mode)
        self.no_graph = self.grad_mode and any(grad) and not requires_grad
        return out

    def _forward_expect(self, tensors) -> list:
        shape, dtype, device = self.expect(tensors)
        return [{"size": list(shape), "dtype": None if dtype is None else wire.dtype_name(dtype),
                 "device": device}]

    def vjp(self, tensors, grad, wrt, create_graph: bool):
        tensors, wrt = self._full(tensors, wrt)
        n = len(tensors)
        outputs = [(tuple(tensors[i].shape), tensors[i].dtype, str(tensors[i].device))
                   for i in wrt]
        grad = grad.to(self.expect(tensors)[1] or grad.dtype)
        reply, grads = self.channel.request(
            self._message("vjp", wrt=list(wrt), cotangent=n, create_graph=create_graph,
                          expect_forward=self._forward_expect(tensors)),
            [*tensors, grad], outputs)
        differentiable = reply.get("differentiable", [])
        if not isinstance(differentiable, list) or len(differentiable) != len(wrt):
            self.channel._fail("answered a vjp without one flag per gradient")
        return grads, [bool(d) for d in differentiable]

    def vjp2(self, tensors, grad, wrt, outer):
        tensors, wrt = self._full(tensors, wrt)
        n = len(tensors)
        outputs = [(tuple(tensors[i].shape), tensors[i].dtype, str(tensors[i].device))
                   for i in wrt] + [(tuple(grad.shape), grad.dtype, str(grad.device))]
        extra = [o.to(tensors[i].dtype) for i, o in zip(wrt, outer)]
        _, grads = self.channel.request(
            self._message("vjp2", wrt=list(wrt), cotangent=n,
                          outer=list(range(n + 1, n + 1 + len(extra))),
                          expect_forward=self._forward_expect(tensors)),
            [*tensors, grad, *extra], outputs)
        return grads[:-1], grads[-1]

    def jvp(self, tensors, wrt, tangents):
        tensors, wrt = self._full(tensors, wrt)
        n = len(tensors)
        used = [t.to(tensors[i].dtype) for i, t in zip(wrt, tangents)]
        _, (out,) = self.channel.request(
            self._message("jvp", wrt=list(wrt), tangents=list(range(n, n + len(used))),
                          expect_forward=self._forward_expect(tensors)),
            [*tensors, *used], [self.expect(tensors)])
        return out

    def normal(self, tensors, wrt: int, tangent, keep=None):
        """``(J·v, Jᵀu)`` in one request (the worker's ``normal``): ``u`` the unit direction of
        ``J·v`` per row (zero where it is), over the outputs ``keep`` marks (a 0/1 tensor of
        the output's shape) where given."""
        n = len(tensors)
        extra = [tangent.to(tensors[wrt].dtype)] + ([] if keep is None else [keep])
        out = self.expect(tensors)
        _, (jv, g) = self.channel.request(
            self._message("normal", wrt=[wrt], tangents=[n], keep=None if keep is None else n + 1,
                          expect_forward=self._forward_expect(tensors)),
            [*tensors, *extra],
            [out, (tuple(tensors[wrt].shape), tensors[wrt].dtype, str(tensors[wrt].device))])
        return jv, g


class _Call(torch.autograd.Function):
    """A remote call as an autograd node: backward, forward mode and double backward are
    requests to the worker. The requests are made in the ``forward`` of a Function
    (:class:`_VJP`, :class:`_JVP`), which torch's transforms call on plain tensors."""

    @staticmethod
    def forward(site, *tensors):
        return site.forward(tensors)

    @staticmethod
    def setup_context(ctx, inputs, output):
        site, *tensors = inputs
        ctx.site = site
        if site.no_graph:
            ctx.mark_non_differentiable(output)
        ctx.save_for_backward(*tensors)
        ctx.save_for_forward(*tensors)

    @staticmethod
    def backward(ctx, grad):
        tensors = ctx.saved_tensors
        wrt = tuple(i for i, need in enumerate(ctx.needs_input_grad[1:]) if need)
        if not wrt:
            return (None, *([None] * len(tensors)))
        grads = _VJP.apply(ctx.site, wrt, torch.is_grad_enabled(), grad, *tensors)
        full: list = [None] * len(tensors)
        for i, g in zip(wrt, grads):
            full[i] = g
        return (None, *full)

    @staticmethod
    def jvp(ctx, _site, *tangents):
        tensors = ctx.saved_tensors
        wrt = tuple(i for i, t in enumerate(tangents) if t is not None)
        # torch.func gives the inputs it does not differentiate (the lifting's K = V = I) a
        # tangent of zeros: J·t is linear in t, so those are not sent (two L×L tensors at
        # L = 4097 each, in this process, the arena and the target's forward mode); the target
        # differentiates with respect to the others, as it would be in one process
        moving = tuple(i for i in wrt if bool(tangents[i].any()))
        wrt = moving or wrt[:1]
        return _JVP.apply(ctx.site, wrt, len(tensors), *tensors,
                          *(tangents[i] for i in wrt))


class _VJP(torch.autograd.Function):
    """The gradient ``Jᵀg`` as an autograd node of its own, for a gradient of a gradient."""

    @staticmethod
    def forward(site, wrt, create_graph, grad, *tensors):
        grads, differentiable = site.vjp(tensors, grad, wrt, create_graph=create_graph)
        site.differentiable = differentiable
        return tuple(grads)

    @staticmethod
    def setup_context(ctx, inputs, output):
        site, wrt, _create, grad, *tensors = inputs
        ctx.site, ctx.wrt = site, wrt
        dead = [g for g, d in zip(output, site.differentiable) if not d]
        if dead:
            ctx.mark_non_differentiable(*dead)
        ctx.save_for_backward(grad, *tensors)

    @staticmethod
    def backward(ctx, *outer):
        grad, *tensors = ctx.saved_tensors
        outer = [torch.zeros_like(tensors[i]) if o is None else o for i, o in zip(ctx.wrt, outer)]
        grads, d_grad = ctx.site.vjp2(tensors, grad, ctx.wrt, outer)
        full: list = [None] * len(tensors)
        for i, g in zip(ctx.wrt, grads):
            full[i] = g
        return (None, None, None, d_grad, *full)


class _JVP(torch.autograd.Function):
    """A Jacobian–vector product ``J·t`` (forward mode) asked of the worker."""

    @staticmethod
    def forward(site, wrt, n, *tensors_and_tangents):
        tensors, tangents = tensors_and_tangents[:n], tensors_and_tangents[n:]
        return site.jvp(tensors, wrt, tangents)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("attnverify: a forward-mode product is not differentiated further")


def _tensor_positions(values: list) -> tuple[list, list, list]:
    """``(tensors, args)``: tensors pulled out of ``values`` as ``{"$tensor": i}``."""
    tensors, out = [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append({"$tensor": len(tensors)})
            tensors.append(v)
        else:
            out.append(wire.plain(v))
    return tensors, out


def _apply(channel: Channel, fn: str, args: list, kwargs: dict, expect) -> torch.Tensor:
    tensors, plain_args = _tensor_positions(args)
    plain_kwargs = _plain_kwargs(kwargs, tensors)
    grad_mode = torch.is_grad_enabled()
    site = _Site(channel, fn, plain_args, plain_kwargs, expect, grad_mode)
    if not _autograd_involved(tensors, grad_mode):
        # nothing to differentiate: the request itself, without the autograd node (whose
        # ``apply`` binds the signature and builds a context at every call); the same request,
        # checked the same way
        return site.forward(tensors)
    return _Call.apply(site, *site.hold(tensors))


def _plain_kwargs(kwargs: dict, tensors: list) -> dict:
    """``kwargs`` as a message carries them: each tensor appended to ``tensors`` and named by
    its position there (``{"$tensor": i}``), every other value plain."""
    plain = {}
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            plain[k] = {"$tensor": len(tensors)}
            tensors.append(v)
        else:
            plain[k] = wire.plain(v)
    return plain


def _autograd_involved(tensors: list, grad_mode: bool) -> bool:
    """Whether a call on ``tensors`` needs the autograd node :class:`_Call`: a tensor that
    requires grad under grad mode, a dual tensor of forward mode (``forward_ad``), or a
    ``torch.func`` transform running (``vmap``, ``grad``, ``jvp``: their tensors are wrapped)."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return True
    for t in tensors:
        if (grad_mode and t.requires_grad) or _dual(t):
            return True
    return False


def _dual(t) -> bool:
    """Whether ``t`` is a dual tensor of forward mode (``forward_ad``)."""
    return forward_ad.unpack_dual(t).tangent is not None


def _wrapped(t) -> bool:
    """Whether ``t`` is a tensor of a running ``torch.func`` transform or a dual tensor."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t) or _dual(t)


def _same_as_first(tensors):
    t = tensors[0]
    return tuple(t.shape), t.dtype, str(t.device)


def _any_float_like_first(tensors):
    t = tensors[0]
    return tuple(t.shape), None, str(t.device)


# --------------------------------------------------------------------------------------------
# Proxies


class RemoteFunction:
    """``fn(scores, dim=-1, **params)`` of a target (or of its own reference) in a worker."""

    def __init__(self, channel: Channel, fn: str, name: str, defaults: dict, signature: dict,
                 same_dtype: bool = True):
        self.channel, self.fn, self.defaults = channel, fn, dict(defaults)
        self.same_dtype = same_dtype
        self.__name__ = self.__qualname__ = name
        self.__doc__ = f"{name}, called in its worker process"
        names = [n for n in dict.fromkeys(signature.get("accepts", [])) if isinstance(n, str)
                 and n.isidentifier() and n not in ("scores", "dim", "params")]
        params = [inspect.Parameter("scores", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                  inspect.Parameter("dim", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=-1)]
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
                   for n in names]
        if signature.get("var_keywords"):
            params.append(inspect.Parameter("params", inspect.Parameter.VAR_KEYWORD))
        self.__signature__ = inspect.Signature(params)

    @property
    def monitor(self) -> Monitor:
        return self.channel.monitor

    def _overrides(self, params: dict) -> dict:
        return {k: wire.plain(v) for k, v in params.items()
                if k not in self.defaults or wire.plain(v) != self.defaults[k]}

    def __call__(self, scores, dim=-1, **params):
        if not isinstance(scores, torch.Tensor):
            scores = torch.as_tensor(scores)
        expect = _same_as_first if self.same_dtype else _any_float_like_first
        return _apply(self.channel, self.fn, [scores], {"dim": dim, **self._overrides(params)},
                      expect)

    def products(self, dim=-1, **params):
        """``(jvp(z, v), vjp(z, u), normal(z, v, keep=None))`` of the function at rows ``z`` (no
        graph kept): one request each, where ``torch.func`` through the proxy makes two for
        ``J·v`` (the forward, then the product). ``normal`` gives ``(J·v, Jᵀu)``, ``u`` the unit
        direction of ``J·v`` per row (over the outputs the 0/1 tensor ``keep`` marks, where
        given): a step of Lanczos on ``JᵀJ`` in one request. For searches that need many
        products of one small input (:class:`attnverify.jacobian.Linearization`)."""
        kwargs = {"dim": dim, **self._overrides(params)}
        expect = _same_as_first if self.same_dtype else _any_float_like_first

        def site(z):
            return _Site(self.channel, self.fn, [{"$tensor": 0}], kwargs, expect, False)

        def jvp(z, v):
            return site(z).jvp([z.detach()], (0,), [v.detach()])

        def vjp(z, u):
            return site(z).vjp([z.detach()], u.detach(), (0,), create_graph=False)[0][0]

        def normal(z, v, keep=None):
            return site(z).normal([z.detach()], 0, v.detach(), keep)

        return jvp, vjp, normal

    def many(self, inputs: list, dim=-1, *, reuse: dict | None = None,
             per_call: list[dict] | None = None, **params) -> list:
        """The function on each of ``inputs`` (no grad), in order, in one request; a call that
        raises raises :class:`TargetRaised` with its ``index``. ``reuse`` ``{i: j}``: call ``i``
        gets its values in the very tensor (storage, address) call ``j`` was given, after call
        ``j`` returned. ``per_call``: the parameters of each call (over ``params``), as a call
        ``fn(inputs[i], dim, **params, **per_call[i])`` would pass them."""
        kwargs = {"dim": dim, **self._overrides(params)}
        if per_call is not None and len(per_call) != len(inputs):
            raise ValueError("one set of parameters per input")
        calls, outputs = [], []
        for i, t in enumerate(inputs):
            own = kwargs if per_call is None else \
                {"dim": dim, **self._overrides({**params, **per_call[i]})}
            calls.append({"args": [{"$tensor": i}], "kwargs": own})
            if reuse and i in reuse:
                calls[-1]["reuse"] = int(reuse[i])
            dtype = t.dtype if self.same_dtype else None
            outputs.append((tuple(t.shape), dtype, str(t.device)))
        _, results = self.channel.request({"op": "calls", "fn": self.fn, "calls": calls},
                                          list(inputs), outputs)
        return results


    def many_vjp(self, inputs: list, cotangents: list, dim=-1, **params) -> list:
        """``[(output, gradient, graph)]``: for each of ``inputs`` (with grad), in order, in
        one request, the function's output, the gradient ``Jᵀc`` with respect to the input for
        its cotangent ``c`` (of the output's shape; cast to the output's dtype as a backward
        pass through the proxy casts it) and whether the output carried a graph (without one
        the gradient is zero). The products a one-point-at-a-time loop of forward and
        ``backward`` through :class:`_Call` would ask for in two requests per point; a call
        that raises raises :class:`TargetRaised` with its ``index``."""
        if len(inputs) != len(cotangents):
            raise ValueError("one cotangent per input")
        kwargs = {"dim": dim, **self._overrides(params)}
        n = len(inputs)
        calls, outputs, sent = [], [], []
        for i, (t, c) in enumerate(zip(inputs, cotangents)):
            calls.append({"args": [{"$tensor": i}], "kwargs": kwargs, "cotangent": n + i})
            dtype = t.dtype if self.same_dtype else None
            outputs.append((tuple(t.shape), dtype, str(t.device)))
            outputs.append((tuple(t.shape), t.dtype, str(t.device)))
            sent.append(c.detach().to(dtype or c.dtype))
        reply, results = self.channel.request({"op": "vjps", "fn": self.fn, "calls": calls},
                                              [t.detach() for t in inputs] + sent, outputs)
        graph = reply.get("graph")
        if not isinstance(graph, list) or len(graph) != n or \
                not all(isinstance(g, bool) for g in graph):
            self.channel._fail("answered a vjps request without one graph flag per call")
        return [(results[2 * i], results[2 * i + 1], graph[i]) for i in range(n)]


class RemoteKernelFunction:
    """``F(l, T)`` or ``F'(l, T)`` of a target's own kernel, evaluated in its worker."""

    def __init__(self, channel: Channel, fn: str):
        self.channel, self.fn = channel, fn

    def __call__(self, l, t):
        l = torch.as_tensor(l)
        return _apply(self.channel, self.fn, [l, float(t)], {}, _any_float_like_first)


class RemoteAttentionFunction:
    """An attention kernel ``f(q, k, v, attn_mask, is_causal, scale, **kw)`` in a worker."""

    #: The target is given copies of the arguments (the arena's bytes, or in-process fresh
    #: storage), never the caller's tensors: a tensor the caller keeps may be passed again.
    copies_inputs = True

    def __init__(self, channel: Channel, name: str):
        self.channel = channel
        self.__name__ = self.__qualname__ = name

    @property
    def monitor(self) -> Monitor:
        return self.channel.monitor

    def __call__(self, q, k, v, attn_mask=None, is_causal=False, scale=None, **kw):
        def expect(tensors):
            q_, v_ = tensors[0], tensors[2]
            return (*q_.shape[:-1], v_.shape[-1]), q_.dtype, str(q_.device)

        kwargs = {"attn_mask": attn_mask, "is_causal": bool(is_causal), "scale": scale, **kw}
        return _apply(self.channel, "target", [q, k, v], kwargs, expect)

    def many(self, calls: list, *, reuse: dict | None = None) -> list:
        """The kernel on each of ``calls`` (``(q, k, v, kwargs)``; no grad), in order, in one
        request; a call that raises raises :class:`TargetRaised` with its ``index``. ``reuse``
        ``{i: j}``: call ``i`` gets its first input that is no built constant (the lifting's
        moving ``Q`` or ``K``) in the very tensor call ``j`` was given there."""
        tensors, sent, outputs, firsts = [], [], [], []
        for q, k, v, kw in calls:
            firsts.append(len(tensors))
            args = [{"$tensor": len(tensors) + i} for i in range(3)]
            tensors += [q, k, v]
            sent.append({"args": args, "kwargs": _plain_kwargs(kw, tensors)})
            outputs.append(((*q.shape[:-1], v.shape[-1]), q.dtype, str(q.device)))
        for i, j in (reuse or {}).items():
            arg = next((a for a, t in enumerate(calls[i][:3]) if wire.recipe_of(t) is None), 0)
            sent[i]["reuse"] = firsts[j] + arg
            if arg:
                sent[i]["arg"] = arg
        _, results = self.channel.request({"op": "calls", "fn": "target", "calls": sent},
                                          [t.detach() for t in tensors], outputs)
        return results


def channel_of(spec) -> Channel | None:
    monitor = monitor_of(spec)
    fn = getattr(spec, "fn", None)
    attention = getattr(fn, "attention", None)
    fn = getattr(attention, "fn", fn)
    return getattr(fn, "channel", None) if monitor is not None else None


# --------------------------------------------------------------------------------------------
# Opening targets


def open_normalizer(target: str, params: dict | None, ctx):
    """The normalizer ``target`` loaded in a worker of its own (in this process under
    ``--no-isolation``), as a :class:`~attnverify.spec.NormalizerSpec` whose function, kernel and
    own reference are proxies. Usage errors of the load raise :class:`UsageError`; a worker that
    dies or hangs while loading raises :class:`WorkerFailed`."""
    channel = Channel("normalizer", target, dict(params or {}), timeout_s=ctx.timeout_s,
                      device=ctx.device, isolated=bool(getattr(ctx, "isolation", True)))
    with _keeps_sandbox(channel):
        return _open_normalizer(channel, target)


@contextlib.contextmanager
def _keeps_sandbox(channel: Channel):
    """A load that fails re-raises with what its worker ran under (``exc.sandboxes``), for the
    certificate of a target that never loaded."""
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 - re-raised
        exc.sandboxes = list(channel.monitor.sandboxes)
        raise


def _open_normalizer(channel: Channel, target: str):

    d = _described(channel)
    _check_normalizer_description(channel, d)
    _check_contract(d)
    fn = RemoteFunction(channel, "target", d["id"], d["params"], d["signature"])
    kernel = None
    if d["kernel"] is not None:
        kernel = Kernel(F=RemoteKernelFunction(channel, "kernel_F"),
                        dF=RemoteKernelFunction(channel, "kernel_dF"),
                        formula=d["kernel"]["formula"])
    extra = {k: _tuple(d[k]) for k in _NORMALIZER_FIELDS if k in d}
    fn.runtime = dict(d["runtime"])
    channel.timeout_s *= triton_runtime.time_factor(fn.runtime)  # interpreted Triton kernels
    # the target string is the checker's own (a repro line re-checks what was asked for,
    # whatever the worker says it is)
    spec = NormalizerSpec(id=d["id"], fn=fn, kernel=kernel, params=dict(d["params"]),
                          claims=tuple(d["claims"]), reference=None, **extra, target=target)
    return dataclasses.replace(spec, reference=_reference(channel, d["reference"]))


def _check_contract(d: dict) -> None:
    """Raise :class:`ContractBroken` when the description says the target, or the reference it
    brings, cannot take the call ``fn(scores, dim=-1, **params)`` (a signature without ``dim``,
    say): one ``load`` failure naming the contract, not one ``TypeError`` per property."""
    problem = d["signature"].get("contract", "")
    ref = d["reference"]
    if not problem and isinstance(ref, dict) and ref.get("kind") == "own" and ref.get("contract"):
        problem = f"its reference {ref['contract']}"
    if problem:
        raise ContractBroken(printable(problem))


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value


def _described(channel: Channel) -> dict:
    d = channel.open()
    if not isinstance(d.get("id"), str) or not isinstance(d.get("params", {}), dict):
        channel._fail("described the target without an id or parameters")
    return d


# --------------------------------------------------------------------------------------------
# What a worker says of its target, checked here


#: Fields of a normalizer's description taken as they are (after their types are checked).
_NORMALIZER_FIELDS = ("space", "citation", "source", "length_aware", "description", "layouts",
                      "dims")


def _is_text(v) -> bool:
    return isinstance(v, str) and len(v) <= 4000


def _is_texts(v) -> bool:
    return isinstance(v, list) and len(v) <= 1000 and all(_is_text(x) for x in v)


def _is_plain(v, depth: int = 0) -> bool:
    """A JSON value a parameter may hold: numbers, text, booleans, null, short lists of them."""
    if v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float)):
        return not isinstance(v, str) or _is_text(v)
    if isinstance(v, list) and depth < 4 and len(v) <= 1000:
        return all(_is_plain(x, depth + 1) for x in v)
    return False


def _is_params(v) -> bool:
    return isinstance(v, dict) and len(v) <= 200 and all(
        isinstance(k, str) and k.isidentifier() and _is_plain(x) for k, x in v.items())


def _is_signature(v) -> bool:
    return isinstance(v, dict) and _is_texts(v.get("accepts")) and \
        isinstance(v.get("var_keywords"), bool) and _is_text(v.get("contract", ""))


def _check_normalizer_description(channel: Channel, d: dict) -> None:
    """Every field the worker's description of a normalizer holds, checked for type and range;
    a bad one fails the target (``broke the worker protocol: …``). The description is written
    in the target's own process, after its code ran: it is the code under test's word, used only
    as data (nothing in it is imported or run here, and no target string in it is loaded)."""

    d.setdefault("claims", [])
    d.setdefault("kernel", None)
    d.setdefault("reference", None)
    d.setdefault("runtime", {})
    d.setdefault("signature", {"accepts": list(d.get("params") or {}), "var_keywords": False})
    checks = {
        "id": _is_text(d["id"]) and bool(d["id"].strip()),
        "params": _is_params(d.get("params", {})),
        "claims": _is_texts(d["claims"]),
        "signature": _is_signature(d["signature"]),
        "kernel": d["kernel"] is None or (isinstance(d["kernel"], dict)
                                          and _is_text(d["kernel"].get("formula", ""))),
        "runtime": isinstance(d["runtime"], dict) and len(d["runtime"]) <= 20 and all(
            _is_text(k) and _is_text(v) for k, v in d["runtime"].items()),
        "space": _is_text(d.get("space", "simplex")),
        "citation": _is_text(d.get("citation", "")),
        "source": _is_text(d.get("source", "")),
        "description": _is_text(d.get("description", "")),
        "length_aware": isinstance(d.get("length_aware", False), bool),
        "layouts": d.get("layouts") is None or _is_texts(d.get("layouts")),
        "dims": d.get("dims") is None or (isinstance(d.get("dims"), list) and all(
            type(x) is int for x in d["dims"])),
    }
    ref = d["reference"]
    if ref is None:
        checks["reference"] = True
    elif not isinstance(ref, dict):
        checks["reference"] = False
    else:
        kind = ref.get("kind")
        checks["reference"] = (
            (kind == "kernel" and d["kernel"] is not None)
            or (kind == "formula" and ref.get("name") in REFERENCES)
            or (kind == "builtin" and isinstance(ref.get("name"), str)
                and ref["name"] in builtin_ids())
            or (kind == "own" and _is_text(ref.get("label", "")) and _is_params(
                ref.get("params", {})) and _is_signature(ref)))
    bad = [name for name, ok in checks.items() if not ok]
    if bad:
        channel._fail(f"described the target with a malformed {bad[0]} "
                      f"({_short(d.get(bad[0]))})")
    if d["kernel"] is not None:
        d["kernel"] = {"formula": d["kernel"].get("formula", "")}
    for key in ("id", "citation", "source", "description"):
        if isinstance(d.get(key), str):
            d[key] = printable(d[key])
    if d["kernel"] is not None:
        d["kernel"]["formula"] = printable(d["kernel"]["formula"])
    d["runtime"] = {printable(k): printable(v) for k, v in d["runtime"].items()}
    if isinstance(d["reference"], dict) and isinstance(d["reference"].get("label"), str):
        d["reference"]["label"] = printable(d["reference"]["label"])
    # parameters crossed as JSON: a non-finite default (cap=inf) arrived as "inf", and means
    # the number here as in the worker (which reads call arguments the same way)
    d["params"] = {k: _number(v) for k, v in d["params"].items()}
    if isinstance(d["reference"], dict) and isinstance(d["reference"].get("params"), dict):
        d["reference"]["params"] = {k: _number(v) for k, v in d["reference"]["params"].items()}


def printable(text: str, limit: int = 600) -> str:
    """Text the worker sent, safe to print and to write: every character that is not printable
    (newlines, escape sequences, direction overrides) becomes a space, so that nothing the code
    under test writes can forge a line of the report (``verdict: … CERTIFIED``)."""
    text = "".join(c if c.isprintable() else " " for c in str(text)[: limit * 2])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value):
    """A parameter value as the worker meant it: ``"inf"``, ``"-inf"``, ``"nan"`` are numbers."""
    return float(value) if isinstance(value, str) and value in ("inf", "-inf", "nan") else value


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class OwnReference(RemoteFunction):
    """A reference the target's own module declares: code under test, evaluated in its worker."""

    def __init__(self, channel: Channel, label: str, params: dict, signature: dict):
        super().__init__(channel, "reference", label, params, signature, same_dtype=False)
        self.label = label


def _reference(channel: Channel, d):
    """The spec's ``reference`` in this process: an attnverify formula or built-in (evaluated
    here), or an :class:`OwnReference` (in the worker); ``None`` for none or the kernel's
    general form (built here from the kernel's remote ``F``)."""
    if d is None or not isinstance(d, dict):
        return None
    kind = d.get("kind")
    if kind == "formula":  # attnverify's formula of a built-in, evaluated here

        return REFERENCES[d["name"]]
    if kind == "builtin":  # a built-in id (checked against builtin_ids(), never loaded as a path)
        return d["name"]
    if kind == "own":

        label = str(d.get("label", "reference"))
        own = OwnReference(channel, label, d.get("params") or {}, d)
        return normalizer_spec(own, id=f"{label} (the target's own, in its worker)",
                               params=dict(d.get("params") or {}), claims=(), space="any")
    return None


def open_attention(target: str, params: dict | None, ctx):
    """The attention kernel ``target`` loaded in a worker of its own, as an
    :class:`~attnverify.attention.spec.AttentionSpec` whose function is a proxy. Its description
    is code-under-test input, checked by :func:`_attention_values`."""

    channel = Channel("attention", target, dict(params or {}), timeout_s=ctx.timeout_s,
                      device=ctx.device, isolated=bool(getattr(ctx, "isolation", True)))
    with _keeps_sandbox(channel):
        values = _attention_values(channel, _described(channel), target)
    channel.timeout_s += values["compile_s"]  # it compiles on first use
    fn = RemoteAttentionFunction(channel, values["id"])
    d = channel.description
    runtime = d.get("runtime") if isinstance(d.get("runtime"), dict) else {}
    fn.runtime = {printable(k, 80): printable(v) for k, v in list(runtime.items())[:20]
                  if isinstance(k, str) and isinstance(v, str)}
    channel.timeout_s *= triton_runtime.time_factor(fn.runtime)  # interpreted Triton kernels
    return AttentionSpec(fn=fn, **values)


def _attention_values(channel: Channel, d: dict, target: str) -> dict:
    """The :class:`~attnverify.attention.spec.AttentionSpec` fields of a worker's description,
    checked: a field of the wrong type or range, or a declared reference that contradicts the
    declared normalizer (:func:`attnverify.attention.loader.reference_problem`), fails the
    target like a load failure (:class:`WorkerFailed` saying what was wrong; the worker is
    stopped); an unknown normalizer or score modification is a usage error (exit 2)."""

    problem = description_problem(d)
    unknown = "" if problem else unknown_name(d)
    if unknown:
        channel._discard()
        raise UsageError(f"attention target {target!r}: {unknown}")
    problem = problem or reference_problem(d["normalizer"], d["score_mod"], d["reference"])
    if problem:
        channel._discard()
        raise WorkerFailed(f"gave a description attnverify cannot use: {problem}")
    values = {name: printable(d[name]) if isinstance(d[name], str) and name in
              ("id", "description", "source", "unavailable") else d[name] for name in FIELDS}
    values.update(params=dict(d["params"]), dtypes=tuple(getattr(torch, n) for n in d["dtypes"]),
                  claims=None if d["claims"] is None else tuple(d["claims"]),
                  compile_s=float(d["compile_s"]),
                  reference_by="target" if d["reference"] else "")
    return values
