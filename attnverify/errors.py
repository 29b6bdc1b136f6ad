"""Errors that the command line turns into a one-line message and exit code 2, and the
termination signals that it turns into the interrupt Ctrl-C raises."""

import _thread
import contextlib
import os
import signal
import sys
import threading
import time


class UsageError(Exception):
    """Bad input from the user: unknown target, bad parameter, unreadable file.

    The message is a complete sentence shown as is, with no traceback.
    """


class TargetError(UsageError):
    """A normalizer target could not be resolved or is not usable."""


class TargetImportFailed(TargetError):
    """The target's own code raised while it was imported (its module body, or a module it
    imports): the target's fault, not bad input. Behind the process boundary it fails that
    target's ``load`` (exit 1, the other targets still checked), like a target that exits or
    crashes at import; the in-process loader (:func:`attnverify.load_target`) raises it as a
    :class:`TargetError`."""


class WorkerFailed(BaseException):
    """The worker process running the code under test died, hung past the time limit or broke
    the worker protocol (:mod:`attnverify.remote`). A ``BaseException``, so that no search
    (Hypothesis included) retries or shrinks it: the property that was running fails at once
    with the case in flight, and the next call starts a fresh worker."""

    def __init__(self, reason: str, *, timed_out: bool = False, signal: int = 0):
        super().__init__(reason)
        self.reason = reason
        #: It ran past the per-example time limit (a hang, which a shrink may reproduce).
        self.timed_out = timed_out
        #: The signal that ended the worker (0: none, or not known).
        self.signal = signal



class TargetFailedInFull(WorkerFailed):
    """A target whose worker failed several times in a row (:data:`attnverify.remote.STRIKES`)
    is not run again: every later request of the run fails at once with this, no worker is
    started, and each property still to run ends in ``error`` without a case. A target that
    crashes, hangs or breaks the protocol on every call costs its first few failures, not one
    per property."""

def check_not_shadowed() -> None:
    """A :class:`UsageError` when the ``attnverify`` Python imported is not this package but a
    directory of that name without ``__init__.py`` that came first on the import path (a clone's
    folder, when attnverify runs from the clone's parent with ``python -m`` or a script there):
    its submodules still import, but ``from attnverify import Kernel`` fails deep inside a run."""
    package = sys.modules.get("attnverify")
    if package is None or getattr(package, "__file__", None):
        return
    where = next(iter(getattr(package, "__path__", None) or []), "a directory named attnverify")
    raise UsageError(f"the directory {where} shadows the attnverify package (Python found it "
                     "first on its import path, from the current directory or PYTHONPATH): run "
                     "from another directory, or rename that one")


#: Set in the environment of a job of ``certify --jobs`` (:mod:`attnverify.jobs`): its parent
#: prints the run's lines, the stop's included.
IN_JOB_ENV = "ATTNVERIFY_IN_JOB"


def in_job() -> bool:
    """Whether this process is a job of ``certify --jobs``."""
    return os.environ.get(IN_JOB_ENV) == "1"


#: The signals a run stops on as on Ctrl-C: a CI job cancelled or past its time limit
#: (``SIGTERM``, ``timeout``'s and ``docker stop``'s signal), a terminal closed (``SIGHUP``).
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A terminating signal (:data:`TERMINATING`) raised as the ``KeyboardInterrupt`` that
    Ctrl-C raises, so that it unwinds the same way: workers and jobs stopped, what is finished
    kept, one line printed; the exit code is 128 + ``signum`` (143 for ``SIGTERM``)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Interrupted(KeyboardInterrupt):
    """A certify run stopped by Ctrl-C or a terminating signal (``cause``, the original
    interrupt) that kept what it finished: ``result``, the property in progress (its finished
    units, a failure already in hand, the rest not run), ``targets``
    (:class:`~attnverify.certify.TargetResult`, the properties that did not finish
    ``not_checked``), or ``data``, the certificate its jobs' parts merged into."""

    def __init__(self, cause: KeyboardInterrupt, *, result=None, targets=None, data=None):
        cause = getattr(cause, "cause", cause)  # an Interrupted passed on: its own cause
        super().__init__(getattr(cause, "signum", signal.SIGINT))
        self.cause, self.result, self.targets, self.data = cause, result, targets, data
        if hasattr(cause, "signum"):
            self.signum = cause.signum


def interrupt_signal(exc: KeyboardInterrupt) -> int:
    """The signal that stopped the run: ``SIGINT`` for Ctrl-C."""
    return getattr(exc, "signum", signal.SIGINT)


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal that stopped the run: 130 for Ctrl-C, 143 for ``SIGTERM``."""
    return 128 + interrupt_signal(exc)


def interrupt_word(exc: KeyboardInterrupt) -> str:
    """``interrupted`` (Ctrl-C) or ``terminated (SIGTERM)``."""
    return signal_word(signal.Signals(interrupt_signal(exc)).name)


def signal_word(name: str) -> str:
    """What a run stopped by the signal ``name`` was: ``interrupted`` (``SIGINT``: Ctrl-C) or
    ``terminated (SIGTERM)``."""
    return "interrupted" if name == "SIGINT" else f"terminated ({name})"


#: The signals :func:`_raise_once` set to be ignored after raising (re-armed where that raise
#: was lost: :func:`_delivered_again`).
_DISARMED: set = set()


#: The signals this module's handlers raised their interrupt for in this run, in order
#: (:func:`raise_if_swallowed`); emptied where the outermost :func:`terminating_as_interrupt`
#: begins and ends.
_RAISED: list[int] = []

#: Lost interrupts being delivered again (:func:`_delivered_again`), not yet sent.
_RESENDING: list[int] = []


def _raise_once(signum, _frame):
    """The handler of :func:`terminating_as_interrupt` and :func:`interrupt_on_signals`: the
    interrupt raised once; any later one of these signals ignored, so that the unwinding (the
    finished part written, workers stopped) is not cut short (``SIGKILL`` still ends it)."""
    _disarm()
    _RAISED.append(signum)
    raise interrupt_for(signum)


def _raise_interrupt(signum, _frame):
    """Ctrl-C's handler in a command's process (:func:`terminating_as_interrupt`, where Ctrl-C
    had Python's own): ``KeyboardInterrupt``, as Python's own raises it at every Ctrl-C, and
    noted (:func:`raise_if_swallowed`)."""
    _RAISED.append(signum)
    raise KeyboardInterrupt()


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """The interrupt that ``signum`` raises: ``KeyboardInterrupt`` for Ctrl-C, else
    :class:`Terminated`."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _disarm() -> None:
    """Ignore, from now on, each signal whose handler is :func:`_raise_once`."""
    for sig in (signal.SIGINT, *TERMINATING):
        if signal.getsignal(sig) is _raise_once:
            signal.signal(sig, signal.SIG_IGN)
            _DISARMED.add(sig)


def interrupt_in(exc: BaseException | None) -> KeyboardInterrupt | None:
    """The interrupt (Ctrl-C's, a terminating signal's) that ``exc`` was raised while handling,
    anywhere along its chain of causes and contexts; ``None`` where there is none. Code that
    catches ``BaseException`` can raise something else in its handler: Hypothesis, interrupted
    before its engine began, fails its own assertion, and the interrupt would read as an
    internal error of the run (or a failure of the code under test) instead of a stop."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return e
        todo += [e.__cause__, e.__context__]
    return None


def reraise_interrupt(exc: BaseException) -> None:
    """Raise the interrupt in ``exc``'s chain (:func:`interrupt_in`), if any: where a run
    classifies an exception as a verdict, a stop turned into another exception stays a stop."""
    stop = interrupt_in(exc)
    if stop is not None:
        raise stop


def raise_if_swallowed() -> None:
    """Raise once more an interrupt that a signal raised in this run (:func:`_raise_once`,
    :func:`_raise_interrupt`) and that something swallowed on its way up (a library's
    ``except BaseException`` that goes on), so that the run stops at the next point that asks
    instead of finishing as if no signal had come. Called only where a run goes forward (a
    unit of a property begins or ends, a search returns): an interrupt that propagated never
    reaches one. Nothing while a lost interrupt is being delivered again: that delivery raises
    it."""
    if _RAISED and not _RESENDING:
        _disarm()
        raise interrupt_for(_RAISED[-1])


def _delivered_again(unraisable) -> None:
    """``sys.unraisablehook`` while the handlers are installed. Python runs a signal's handler
    at the next instruction of the main thread, which may be inside a garbage collector's
    callback, a ``__del__`` or a weak reference's finaliser, where an exception cannot
    propagate: the interrupt is printed as "Exception ignored" and lost, and the run would go
    on with the signal ignored. Such an interrupt is delivered again instead (the handlers
    re-armed, the signal sent anew from another thread :data:`REDELIVERY_S` later, once this
    hook and the collection have returned), so that it stops the run at the next point where
    it can (where it lands in such a place again, it is delivered again); any other
    unraisable exception goes to the hook that was there before."""
    exc = unraisable.exc_value
    if isinstance(exc, KeyboardInterrupt):
        signum = interrupt_signal(exc)
        for sig in list(_DISARMED):
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, _raise_once)
            _DISARMED.discard(sig)
        # not threading.Thread: its start waits for the thread, and the handler would run in
        # that wait, inside this hook again
        _RESENDING.append(signum)
        _thread.start_new_thread(_send_soon, (signum,))
        return
    _PREVIOUS_HOOK[-1](unraisable)


def _send_soon(signum: int) -> None:
    """Send ``signum`` to this process once the thread that started this one has had time to
    leave the hook and the collection that called it."""
    time.sleep(REDELIVERY_S)
    try:
        os.kill(os.getpid(), signum)
    finally:
        _RESENDING.remove(signum)


#: How long after an interrupt was lost it is delivered again (seconds).
REDELIVERY_S = 0.01


#: The ``sys.unraisablehook`` that :func:`_delivered_again` replaced.
_PREVIOUS_HOOK: list = []


def _deliver_lost_interrupts() -> None:
    """Install :func:`_delivered_again` (once)."""
    if sys.unraisablehook is not _delivered_again:
        _PREVIOUS_HOOK.append(sys.unraisablehook)
        sys.unraisablehook = _delivered_again


def _restore_unraisable_hook() -> None:
    if sys.unraisablehook is _delivered_again and _PREVIOUS_HOOK:
        sys.unraisablehook = _PREVIOUS_HOOK.pop()


def interrupt_on_signals() -> None:
    """For a process another one stops (a job of ``certify --jobs``): Ctrl-C and each of
    :data:`TERMINATING` raise their interrupt once (:func:`_raise_once`), for good; one raised
    where it cannot propagate is delivered again (:func:`_delivered_again`)."""
    for sig in (signal.SIGINT, *TERMINATING):
        signal.signal(sig, _raise_once)
    _deliver_lost_interrupts()


@contextlib.contextmanager
def terminating_as_interrupt():
    """While the block runs, each of :data:`TERMINATING` that is at its default disposition
    (which kills the process with no clean-up: workers left to their death signal, what the run
    finished lost) raises :class:`Terminated` in the main thread instead, once
    (:func:`_raise_once`); Ctrl-C, where Python's own handler has it, raises its
    ``KeyboardInterrupt`` as that handler does, noted (:func:`raise_if_swallowed`). Elsewhere
    than the main thread, or for a signal that the caller ignores or handles itself (``nohup``,
    a job's handler), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    hooked = sys.unraisablehook is not _delivered_again
    if hooked:  # the outermost: a new run
        _RAISED.clear()
    try:
        for sig in TERMINATING:
            if signal.getsignal(sig) == signal.SIG_DFL:
                previous[sig] = signal.signal(sig, _raise_once)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, _raise_interrupt)
        # an interrupt (these, or Ctrl-C's) raised where it cannot propagate is delivered again
        _deliver_lost_interrupts()
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
            _DISARMED.discard(sig)
        if hooked:
            _restore_unraisable_hook()
            _RAISED.clear()
