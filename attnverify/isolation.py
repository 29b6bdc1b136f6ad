"""Certify and falsify with every target behind the process boundary.

The checker (this process) never imports a target: each target is loaded in a worker process of
its own (:func:`attnverify.remote.open_normalizer`), and every check, reference, tolerance,
Hypothesis run, shrinking step, bound and report runs here on the proxy it returns. When the
worker

- exits (``sys.exit``/``os._exit`` at import or in a call), crashes (a segfault in a C or Triton
  kernel), or is killed (out of memory),
- runs past the per-example time limit (``--timeout``; the default is the profile's, see
  :data:`attnverify.runconfig.PROFILES`), or
- breaks the worker protocol (an answer nobody asked for, a malformed one),

the property that was running gets status ``error`` with what happened and the case it was
running (known here, where the search runs: nothing is replayed), and the next property starts a
fresh worker, so every other result is kept. Before a command writes its results every worker,
and anything a worker left behind, is killed (:func:`attnverify.remote.shutdown`).

``--no-isolation`` (or ``ATTNVERIFY_ISOLATION=0``) loads the targets in this process: the same
proxies, border checks and state checks, but no protection and no time limit (debugging).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from attnverify import heartbeat, remote
from attnverify.certify import (
    PropertyResult,
    TargetResult,
    certify_target,
    not_started,
    plan,
    unfinished_reason,
)
from attnverify.checks.base import monitor_of
from attnverify.errors import Interrupted, UsageError, WorkerFailed, reraise_interrupt
from attnverify.shard import dtype_name, make_shard, unit_id


def _load_failure(label: str, exc: BaseException):
    if isinstance(exc, WorkerFailed):
        message = f"loading the target {exc.reason}"
    elif getattr(exc, "remote_type", None) == "TargetImportFailed" or \
            isinstance(exc, remote.ContractBroken):
        message = f"loading the target failed: {exc}"
    else:
        message = f"loading the target raised {getattr(exc, 'remote_type', type(exc).__name__)}" \
                  f": {exc}"
    return PropertyResult("load", True, "error", message=message,
                          traceback=getattr(exc, "traceback", None) or None)


def open_targets(targets: list[str], params: dict, ctx, *, attention: bool = False) -> list:
    """``[(label, spec or None, failure or None)]``: every target loaded in a worker of its own
    (usage errors raise before any work; a target that dies, hangs or raises while loading is a
    ``load`` failure of that target alone)."""
    opener = remote.open_attention if attention else remote.open_normalizer
    opened = []
    for target in targets:
        try:
            opened.append((target, opener(target, params, ctx), None))
        except (WorkerFailed, remote.TargetRaised) as exc:
            failure = _load_failure(target, exc)
            failure.sandboxes = list(getattr(exc, "sandboxes", []))  # the worker it failed in
            opened.append((target, None, failure))
    return opened


def close(spec) -> None:
    """Stop the worker behind ``spec`` (a no-op for an in-process spec)."""
    channel = remote.channel_of(spec)
    if channel is not None:
        channel.close()


def certify_all(targets: list[str], params: dict, claims, ctx, *, progress=None,
                before_run=None, shard: tuple[int, int] | None = None, on_shard=None) -> list:
    """Certify ``targets`` (target strings), each in a worker of its own (in this process
    under ``--no-isolation``). Every target is loaded and its claims checked first (usage errors
    before any work); ``before_run(ids)`` then sees every ``target::property`` id that will run.
    ``shard=(K, N)``: only the units of shard K of N run (:mod:`attnverify.shard`).
    ``on_shard(shard)`` receives its :class:`~attnverify.shard.Shard` (the partition of every
    unit of the run) before any unit runs. Every worker is stopped before this returns."""

    opened = []
    try:
        opened = open_targets(targets, params, ctx)
        ids, units = [], []
        for label, spec, _failure in opened:
            if spec is None:
                ids.append(f"{label}::load")
                continue
            for p in plan(spec, claims, ctx)[1]:
                ids.append(f"{label}::{p.id}")
                units += [unit_id(label, p.id, dtype_name(d), ctx.device)
                          for d in p.unit_dtypes(spec, ctx)]
        if before_run is not None:
            before_run(ids)
        if shard is not None:
            ctx = dataclasses.replace(ctx, shard=make_shard(*shard, units))
            if on_shard is not None:
                on_shard(ctx.shard)
        results = []
        try:
            for label, spec, failure in opened:
                if spec is None:
                    results.append(load_failed(label, failure))
                    if progress is not None:
                        progress(label, failure)
                else:
                    results.append(certify_target(spec, claims, ctx, label=label,
                                                  progress=progress))
                    close(spec)
        except KeyboardInterrupt as exc:  # Ctrl-C or a terminating signal: keep what finished
            raise stopped_run(exc, results, opened,
                              lambda spec, label, why: not_started(spec, claims, ctx, label,
                                                                   why)) from None
        return results
    finally:
        for _, spec, _ in opened:
            if spec is not None:
                close(spec)
        remote.shutdown()


def stopped_run(exc: KeyboardInterrupt, results: list, opened: list, not_started) -> Interrupted:
    """The :class:`Interrupted` of a certify run stopped part-way: ``results`` (the targets
    done, then the one in progress with its finished properties), then each target of
    ``opened`` not reached, its every property ``not_checked`` (``not_started(spec, label,
    why)``; a target that failed to load keeps its ``load`` result)."""
    cause = getattr(exc, "cause", exc)
    done = list(results) + (list(exc.targets or []) if isinstance(exc, Interrupted) else [])
    why = unfinished_reason(cause)
    for label, spec, failure in opened[len(done):]:
        done.append(load_failed(label, failure) if spec is None else
                    not_started(spec, label, why))
    return Interrupted(cause, targets=done)


def load_failed(label: str, failure: PropertyResult) -> TargetResult:
    """The result of a target that could not be loaded: its one ``load`` result (``failure``,
    :func:`open_targets`)."""
    return TargetResult(target=label, claims=[], results=[failure],
                        sandbox=list(getattr(failure, "sandboxes", [])))


class Stopped(NamedTuple):
    """A search the code under test stopped: why (one line), the case in flight (or None) and,
    where the target raised, its own traceback (``[]`` where none came back)."""

    message: str
    case: dict[str, Any] | None
    traceback: list[str]


def falsify_isolated(target: str, params: dict, text: str, ctx):
    """``falsify`` on ``target`` behind the boundary: its result, or :class:`Stopped` when the
    code under test stopped the search (it died, hung or raised, loading or in a call)."""
    from attnverify.falsify import falsify  # heavy: the search (mpmath), only falsify

    try:
        spec = remote.open_normalizer(target, params, ctx)
    except (WorkerFailed, remote.TargetRaised) as exc:
        failure = _load_failure(target, exc)
        return Stopped(failure.message, None, list(failure.traceback or []))
    try:
        res = falsify(spec, text, ctx, label=target, params=dict(params))
        monitor = monitor_of(spec)
        if monitor is not None and monitor.sandboxes:
            res.sandbox = " | ".join(dict.fromkeys(monitor.sandboxes))
        if monitor is not None:
            res.target_warnings = list(getattr(monitor, "warnings", []))
        return res
    except UsageError:
        raise
    except (WorkerFailed, Exception) as exc:  # noqa: BLE001 - the code under test stopped it
        reraise_interrupt(exc)  # a stop turned into another error is not the target's doing
        if isinstance(exc, WorkerFailed):
            message = f"the normalizer {exc.reason}"
        else:
            name = getattr(exc, "remote_type", None) or type(exc).__name__
            message = f"the normalizer raised {name}: {exc}".splitlines()[0]
        return Stopped(message, _case_in_flight(), _raised_traceback(exc))
    finally:
        close(spec)
        remote.shutdown()


def _raised_traceback(exc: BaseException) -> list[str]:
    """The target's own traceback carried by ``exc`` (a :class:`remote.TargetRaised`, or the
    error a check wrapped one in), ``[]`` where there is none."""
    for e in (exc, getattr(exc, "cause", None), exc.__cause__, exc.__context__):
        lines = getattr(e, "traceback", None)
        if isinstance(lines, list) and lines:
            return list(lines)
    return []


def _case_in_flight():
    case = heartbeat.current_case()
    if case is None or not hasattr(case, "scores"):
        return None
    return {"L": int(case.scores.shape[-1]), "scores": case.scores.reshape(-1).tolist(),
            "temperature": getattr(case, "temperature", None), "kind": getattr(case, "kind", "")}


def falsify_in_worker(target: str, params: dict, text: str, ctx):
    """:func:`falsify_isolated` (kept under its old name for callers)."""
    return falsify_isolated(target, params, text, ctx)
