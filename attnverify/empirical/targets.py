"""The normalizers applied to a model's own logits (``--normalizers``).

The first entry is always ``softmax``: the model's own attention, computed with
``torch.softmax`` on the captured logits (identical to the eager weights; a test checks it).
Any other target is resolved through :func:`attnverify.registry.load_target`, so built-ins,
``module:attr``, ``file.py:attr`` and entry points all work.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnverify.errors import UsageError
from attnverify.registry import load_target

MODEL_SOFTMAX = "softmax"


@dataclass(frozen=True)
class Weighting:
    """A normalizer as the experiments use it: ``fn(scores) -> weights`` along the last dim."""

    id: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    space: str
    source: str

    @property
    def simplex(self) -> bool:
        """Theorem 1.1, the Theorem 2 lower bound and ``√2/ε`` assume weights on the simplex."""
        return self.space == "simplex"

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        return self.fn(scores)


def _model_softmax(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores, dim=-1)


def model_weighting() -> Weighting:
    return Weighting(MODEL_SOFTMAX, _model_softmax, "simplex", "the model's own attention")


def parse_normalizers(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    names = [item.strip() for item in text.split(",") if item.strip()]
    return tuple(dict.fromkeys(name for name in names if name != MODEL_SOFTMAX))


def resolve(names: tuple[str, ...], timeout: float = 0) -> list[Weighting]:
    """``softmax`` (the model's attention) first, then each named target, resolved now so an
    unknown name is a usage error before any model is loaded. ``timeout``: seconds per call of
    a target (0: no limit), see :func:`_time_limit`."""

    out = [model_weighting()]
    for name in names:
        try:
            spec = load_target(name)
        except (UsageError, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - sys.exit at import is the target's fault
            raise UsageError(f"--normalizers {name!r}: loading it raised {_what(exc)}") from None
        out.append(Weighting(name, _bind(spec, name, timeout), spec.space, spec.source))
    return out


class NormalizerFailure(Exception):
    """A normalizer raised (``SystemExit`` included) or returned no weights of the scores'
    shape; the run drops it and goes on with the others (see ``pipeline``)."""

    def __init__(self, normalizer: str, reason: str) -> None:
        super().__init__(f"normalizer {normalizer!r} failed: {reason}")
        self.normalizer = normalizer
        self.reason = reason


def _what(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class _TimedOut(BaseException):
    """Raised by the timer of :func:`_time_limit` inside the target's call."""


@contextmanager
def _time_limit(seconds: float):
    """[choice] In-process time limit by ``SIGALRM`` (main thread, POSIX). It stops a target
    looping or sleeping in Python; one stuck inside a single C call, or one that crashes the
    interpreter, is not isolated here. Skipped when another timer is already armed."""
    usable = (seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return

    def expire(signum, frame):
        raise _TimedOut(f"no result within {seconds:g} s (--timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def _bind(spec, name: str, timeout: float = 0) -> Callable[[torch.Tensor], torch.Tensor]:
    """In-process guard: a ``BaseException`` other than Ctrl-C, or a call longer than
    ``timeout`` seconds, becomes a :class:`NormalizerFailure`."""

    def fn(scores: torch.Tensor) -> torch.Tensor:
        try:
            with _time_limit(timeout):
                weights = spec(scores, dim=-1)
        except KeyboardInterrupt:
            raise
        except _TimedOut as exc:
            raise NormalizerFailure(name, str(exc)) from None
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a target is a failure
            raise NormalizerFailure(name, _what(exc)) from None
        if not isinstance(weights, torch.Tensor) or weights.shape != scores.shape:
            raise NormalizerFailure(
                name, f"returned {type(weights).__name__} of shape "
                f"{tuple(getattr(weights, 'shape', ()))} for scores of shape {tuple(scores.shape)}"
            )
        return weights

    return fn
