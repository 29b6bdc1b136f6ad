"""Run the code under test in a worker process, so that a target that misbehaves fails a property
instead of ending, hanging or corrupting the run.

``certify`` and ``falsify`` load and run their targets in one worker process (``forkserver``
start method: the server imports torch once and every worker is a cheap fork of it; the parent
never imports a user's target). The worker streams each finished property back. It marks the
start and end of every example in a small shared array, and before every property it names the
property (:mod:`attnverify.heartbeat`), so the parent always knows what was running. When the worker

- exits (``sys.exit``/``os._exit`` at import or in a call), crashes (a segfault in a C or Triton
  kernel), or is killed (out of memory),
- shows no progress (no example started or finished) for longer than the per-example time limit
  (``--timeout``; the default is the profile's, see :data:`attnverify.runconfig.PROFILES`), or
- lets a ``BaseException`` escape the run,

the running property gets status ``error`` with what happened and on which example; the input is
recovered by replaying the property in a fresh worker up to that example (the search is seeded,
so the replay meets the same inputs) and stopping just before it runs. The run then goes on in a
fresh worker with the next property, so every other result is kept. The worker's address space is
limited (``RLIMIT_AS``, CPU runs only) to its size at start plus half the physical memory, so a
runaway allocation is an ``error`` result rather than the machine's out-of-memory killer.

``--no-isolation`` (or ``ATTNVERIFY_ISOLATION=0``) runs everything in the calling process: no time
limit, and a target that exits ends the run; the pytest plugin runs in-process as well (a
``SystemExit`` raised by a normalizer is an ``error`` result there too).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from attnverify import heartbeat

# --------------------------------------------------------------------------------------------
# Parent side


#: Imported once by the fork server, so that every worker starts with them loaded.
PRELOAD = ["attnverify.isolation", "attnverify.heartbeat", "attnverify.certify",
           "attnverify.falsify", "attnverify.report", "attnverify.normalizers", "attnverify.checks",
           "attnverify.strategies", "attnverify.quantities",
           # the gradient check's forward mode imports these on first use: seconds, once
           "torch._dynamo", "torch._decomp.decompositions_for_jvp"]


class WorkerFailed(Exception):
    """The worker died, hung or let a ``BaseException`` out; ``example`` is 1-based (0: none)."""

    def __init__(self, reason: str, example: int):
        super().__init__(reason)
        self.reason, self.example = reason, example


class Worker:
    """One worker process, restarted on demand; ``call(job)`` runs a job and returns its value."""

    def __init__(self, timeout_s: float, memory_limit: bool = True) -> None:
        self.timeout_s = float(timeout_s)
        self.memory_limit = memory_limit
        self.proc = None

    def _start(self) -> None:
        import multiprocessing
        from multiprocessing import sharedctypes

        try:
            mp = multiprocessing.get_context("forkserver")
            mp.set_forkserver_preload(PRELOAD)
        except ValueError:  # no fork server on this platform: a fresh interpreter per worker
            mp = multiprocessing.get_context("spawn")
        self.slot = sharedctypes.RawArray("d", 2)
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(
            target=_worker_main, name="attnverify-worker", daemon=True,
            args=(child, self.slot, os.getcwd(), list(sys.path), dict(os.environ),
                  self.memory_limit),
        )
        with _main_module_hidden():
            self.proc.start()
        child.close()

    def call(self, kind: str, *args, on_message=None):
        """Run ``kind(*args)`` in the worker. Streams ``start``/``result`` messages to
        ``on_message``; raises :class:`UsageError` for the job's usage errors and
        :class:`WorkerFailed` when the worker dies, hangs or lets a ``BaseException`` out."""
        from attnverify.errors import UsageError

        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.slot[0] = self.slot[1] = 0.0
        try:
            data = pickle.dumps((kind, args))
        except Exception as exc:  # noqa: BLE001 - e.g. a parameter value that cannot be pickled
            raise UsageError(f"the run's settings cannot be sent to a worker process "
                             f"({describe_exception(exc)}); run with --no-isolation") from None
        try:
            self.conn.send_bytes(data)
        except (BrokenPipeError, EOFError, OSError):
            raise self._dead() from None
        while True:
            message = self._receive()
            tag = message[0]
            if tag in ("start", "result"):
                if on_message is not None:
                    on_message(message)
            elif tag == "done":
                return message[1]
            elif tag == "usage":
                raise UsageError(message[1])
            elif tag == "reached":
                return message[1]
            else:  # "raised": a BaseException escaped the job; the worker lives on
                raise WorkerFailed(message[1], int(self.slot[1]))

    def _receive(self):
        from multiprocessing.connection import wait

        while True:
            ready = wait([self.conn, self.proc.sentinel], timeout=0.2)
            if self.conn in ready:
                try:
                    return pickle.loads(self.conn.recv_bytes())
                except (EOFError, OSError):
                    raise self._dead() from None
            if ready:  # the process ended and nothing more is buffered
                raise self._dead()
            start = self.slot[0]
            if start and time.monotonic() - start > self.timeout_s:
                example = int(self.slot[1])
                self.stop()
                raise WorkerFailed(f"exceeded the per-example time limit of {self.timeout_s:g} s "
                                   "(--timeout)", example)

    def _dead(self) -> WorkerFailed:
        example = int(self.slot[1])
        self.proc.join(5)
        code = self.proc.exitcode
        self.stop()
        if code is None:
            reason = "the worker process stopped answering"
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            extra = " (out of memory?)" if -code == signal.SIGKILL else ""
            reason = f"crashed the worker process ({name}{extra})"
        else:
            reason = f"exited the worker process (exit code {code})"
        return WorkerFailed(reason, example)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.is_alive():
            try:
                self.conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass
            self.proc.join(0.5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()
        self.proc = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def _main_module_hidden():
    """Keep multiprocessing from re-running the caller's ``__main__`` script in the worker (it
    would, for a script path: a user's script without a ``__main__`` guard would run again)."""
    main = sys.modules.get("__main__")
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__")
             if main is not None and name in main.__dict__}
    try:
        for name in saved:
            if name == "__spec__":
                main.__spec__ = None
            else:
                del main.__dict__[name]
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


# --------------------------------------------------------------------------------------------
# Worker side


def _worker_main(conn, slot, cwd, path, environ, memory_limit) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    sys.path[:] = path
    from attnverify import settings

    settings.reload()
    if memory_limit:
        _limit_memory()
    heartbeat.SLOT, heartbeat.CONN = slot, conn
    while True:
        try:
            job = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if job is None:
            return
        kind, args = job
        heartbeat.STOP_AT = 0
        slot[0] = time.monotonic()
        try:
            reply = ("done", _JOBS[kind](*args))
        except heartbeat.Reached as hit:
            reply = ("reached", hit.case)
        except BaseException as exc:  # noqa: BLE001 - whatever the code under test raised
            from attnverify.errors import UsageError

            if isinstance(exc, UsageError):
                reply = ("usage", str(exc))
            else:
                reply = ("raised", f"raised {describe_exception(exc)}")
        finally:
            slot[0] = 0.0
        try:
            data = pickle.dumps(reply)
        except Exception as exc:  # noqa: BLE001 - an unpicklable value from the code under test
            data = pickle.dumps(("raised", f"returned a value that cannot be sent back "
                                 f"({describe_exception(exc)})"))
        conn.send_bytes(data)


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as fh:
            size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, ImportError):
        return
    limit = size + physical // 2
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def describe_exception(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}({first})" if first else type(exc).__name__


_SPECS: dict = {}


def _spec(target: str, params: dict):
    from attnverify.registry import load_target

    key = (target, repr(sorted(params.items())))
    if key not in _SPECS:
        heartbeat.example_started(None)  # the time limit covers the import of the target
        try:
            _SPECS[key] = load_target(target, params)
        finally:
            heartbeat.example_finished()
    return _SPECS[key]


def _job_plan(target: str, params: dict, claims, ctx) -> dict:
    from attnverify.certify import jsonable, plan
    from attnverify.checks.reference import reference_label

    spec, props = plan(_spec(target, params), claims, ctx)
    return {"id": spec.id, "claims": list(spec.claims), "params": jsonable(dict(spec.params)),
            "properties": [p.id for p in props], "reference": reference_label(spec)}


def _job_certify(target: str, params: dict, claims, ctx, label: str, skip) -> None:
    from attnverify.certify import certify_target

    certify_target(_spec(target, params), claims, ctx, label=label, skip=set(skip),
                   progress=lambda _target, result: heartbeat.send(("result", result)))


def _job_certify_case(target: str, params: dict, claims, ctx, prop_id: str, example: int):
    """Replay one property up to ``example`` and describe that example's case."""
    from attnverify import certify

    spec, props = certify.plan(_spec(target, params), claims, ctx)
    heartbeat.STOP_AT = example
    try:
        certify.certify_target(spec, claims, ctx, skip={p.id for p in props if p.id != prop_id})
    except heartbeat.Reached as hit:
        if hit.case is None:
            return {}
        out = certify.describe_case(hit.case, spec)
        try:
            out["repro"] = certify.repro_for(spec, dict(out), prop_id)
        except Exception:  # noqa: BLE001 - the description stands without a repro line
            pass
        return out
    finally:
        heartbeat.STOP_AT = 0
    return None


def _job_falsify(target: str, params: dict, text: str, ctx, label: str, stop_at: int = 0):
    from attnverify.falsify import falsify

    spec = _spec(target, params)
    heartbeat.SLOT[1] = 0  # count the search's cases only, loaded or not
    heartbeat.STOP_AT = stop_at
    try:
        res = falsify(spec, text, ctx, label=label, params=dict(params))
    except heartbeat.Reached as hit:
        case = hit.case
        return {"L": int(case.scores.shape[-1]), "scores": case.scores.tolist(),
                "temperature": case.temperature, "kind": case.kind}
    finally:
        heartbeat.STOP_AT = 0
    res.params = dict(params)
    return res


def _job_load(target: str, params: dict) -> str:
    return _spec(target, params).id


_JOBS = {"load": _job_load, "plan": _job_plan, "certify": _job_certify,
         "certify_case": _job_certify_case, "falsify": _job_falsify}


# --------------------------------------------------------------------------------------------
# certify, isolated


@dataclass
class TargetPlan:
    """One target of a certify run: what will run, or why it could not even load."""

    label: str
    target: str
    properties: list[str] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    load_failure: str = ""
    reference: str | None = None


def plan_targets(worker: Worker, targets: list[str], params: dict, claims, ctx) -> list[TargetPlan]:
    """Load every target in the worker (usage errors raise before any property runs)."""
    plans = []
    for target in targets:
        entry = TargetPlan(label=target, target=target)
        try:
            info = worker.call("plan", target, params, claims, ctx)
        except WorkerFailed as exc:
            entry.load_failure = f"loading the target {exc.reason}"
        else:
            entry.properties, entry.claims = info["properties"], info["claims"]
            entry.params = info["params"]
            entry.reference = info.get("reference")
        plans.append(entry)
    return plans


def certify_plans(worker: Worker, plans: list[TargetPlan], params: dict, claims, ctx,
                  progress=None) -> list:
    """Run every planned target in the worker; a failure of the worker fails the running
    property (with the input that did it) and the run goes on with the next one."""
    from attnverify.certify import PropertyResult, TargetResult

    results = []
    for entry in plans:
        result = TargetResult(target=entry.label, claims=list(entry.claims),
                              params=dict(entry.params), reference=entry.reference)
        results.append(result)
        if entry.load_failure:
            result.results.append(PropertyResult("load", True, "error",
                                                 message=entry.load_failure))
            if progress is not None:
                progress(result.target, result.results[-1])
            continue
        while True:
            done = {r.property for r in result.results}
            if len(done) >= len(entry.properties):
                break
            running: dict[str, Any] = {"prop": None, "since": time.perf_counter()}

            def on_message(message, running=running, result=result):
                if message[0] == "start":
                    running["prop"], running["since"] = message[1], time.perf_counter()
                else:
                    running["prop"] = None
                    result.results.append(message[1])
                    if progress is not None:
                        progress(result.target, message[1])

            try:
                worker.call("certify", entry.target, params, claims, ctx, entry.label,
                            sorted(done), on_message=on_message)
                break
            except WorkerFailed as exc:
                done = {r.property for r in result.results}
                prop = running["prop"] or next(p for p in entry.properties if p not in done)
                failed = _failed_property(worker, entry, params, claims, ctx, prop, exc,
                                          time.perf_counter() - running["since"])
                result.results.append(failed)
                if progress is not None:
                    progress(result.target, failed)
        order = {p: i for i, p in enumerate(entry.properties)}
        result.results.sort(key=lambda r: order.get(r.property, len(order)))
    return results


def _failed_property(worker, entry, params, claims, ctx, prop, exc: WorkerFailed, elapsed):
    from attnverify.certify import PropertyResult

    where = f" on example {exc.example}" if exc.example else ""
    message = f"the normalizer {exc.reason}{where}"
    case = None
    if exc.example:
        try:
            case = worker.call("certify_case", entry.target, params, claims, ctx, prop,
                               exc.example)
        except WorkerFailed:
            case = None
        if case is None:
            message += " (the input could not be recovered by a replay)"
    return PropertyResult(prop, True, "error", examples=exc.example, counterexample=case,
                          message=message, elapsed_s=elapsed)


def falsify_isolated(worker: Worker, target: str, params: dict, text: str, ctx):
    """``falsify`` in the worker: its result, or ``(message, case or None)`` when the worker
    failed (the case replayed as in :func:`certify_plans`). Usage errors raise as usual."""
    try:
        worker.call("load", target, params)
    except WorkerFailed as exc:
        return f"loading the target {exc.reason}", None
    try:
        return worker.call("falsify", target, params, text, ctx, target)
    except WorkerFailed as exc:
        where = f" on case {exc.example}" if exc.example else ""
        case = None
        if exc.example:
            try:
                case = worker.call("falsify", target, params, text, ctx, target, exc.example)
            except WorkerFailed:
                case = None
        return f"the normalizer {exc.reason}{where}", case if isinstance(case, dict) else None


def falsify_in_worker(target: str, params: dict, text: str, ctx):
    """:func:`falsify_isolated` in a worker of its own (``ctx``'s time limit)."""
    with Worker(ctx.timeout_s, memory_limit=ctx.device == "cpu") as worker:
        return falsify_isolated(worker, target, params, text, ctx)


def certify_all(targets: list[str], params: dict, claims, ctx, *, progress=None,
                before_run=None) -> list:
    """Certify ``targets`` (target strings), in a worker when ``ctx.isolation`` (else in this
    process). Every target is loaded and its claims checked first (usage errors before any
    work); ``before_run(ids)`` then sees every ``target::property`` id that will run."""
    from attnverify.certify import certify_target, plan
    from attnverify.registry import load_target

    if not getattr(ctx, "isolation", False):
        specs = [(t, load_target(t, params)) for t in targets]
        ids = [f"{label}::{p.id}" for label, spec in specs for p in plan(spec, claims, ctx)[1]]
        if before_run is not None:
            before_run(ids)
        return [certify_target(spec, claims, ctx, label=label, progress=progress)
                for label, spec in specs]
    with Worker(ctx.timeout_s, memory_limit=ctx.device == "cpu") as worker:
        plans = plan_targets(worker, targets, params, claims, ctx)
        ids = [f"{p.label}::{prop}" for p in plans for prop in (p.properties or ["load"])]
        if before_run is not None:
            before_run(ids)
        return certify_plans(worker, plans, params, claims, ctx, progress)
