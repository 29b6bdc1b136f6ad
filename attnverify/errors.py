"""Errors that the command line turns into a one-line message and exit code 2."""

import sys


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
