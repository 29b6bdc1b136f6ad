"""Falsify campaigns that share what they find: ``falsify --database`` and ``--workers``.

**The database** (:mod:`attnverify.exampledb`: a directory or a Redis server, Hypothesis's own
example databases) holds, under keys of the target, the normalized expression, the parameters and
the attnverify version (:func:`keys`):

- ``witness``: every case that broke the bound (the first met and the shrunk one), saved the
  moment it is met, so a run that is stopped or interrupted while shrinking keeps it;
- ``near``: the best cases of a search that found none (the worst case overall and the best of
  each stratum, at most :data:`MAX_NEAR` kept, highest margin first), so the next run's polish
  starts where the last one stopped;
- ``strata``: each stratum's Hypothesis corpus, kept and replayed by Hypothesis itself
  (Phase.reuse, its Pareto front of the targeted margin).

A search with a database begins with the **replay** phase: the stored witnesses (at most
:data:`MAX_REPLAY_WITNESSES`, fewest keys first), then the near cases, each re-evaluated on this
run's target. A stored witness that still fails ends the search there: it is shrunk and reported
as replayed from the database, with no battery, strata or polish. Entries are re-checked, never
trusted: one that does not decode, is longer than the run's ``--max-length`` or has a temperature
the run would not use is skipped (counted as unreadable). A database that goes away mid-run
(:class:`~attnverify.exampledb.ResilientDatabase`) costs only the sharing: the search goes on, the
report says that the database was lost and why, and the verdict is the search's.

**Workers** (:func:`run_workers`): ``--workers N`` runs N searches of the same bound, each in a
process of its own (each with its target behind the process boundary of
:func:`attnverify.isolation.falsify_isolated`), worker ``i`` on seed ``seed + i``, all on one
database (a temporary directory without ``--database``). The first worker whose search ends with
a shrunk witness stops the others (they stop before their next evaluation and save what they
found); its report is the run's, with the ``workers`` it ran beside. Ctrl-C, or a parent that
dies, stops every worker; what they found is in the database.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnverify.errors import UsageError
from attnverify.exampledb import ResilientDatabase, database_key, describe
from attnverify.falsify_search import F64, FalsifyCase
from attnverify.runconfig import check_workers  # noqa: F401 - kept as campaign.check_workers

#: Stored witnesses replayed at the start of a search (fewest keys first).
MAX_REPLAY_WITNESSES = 16
#: Near-witnesses kept (and replayed) per bound: the highest LHS/RHS first.
MAX_NEAR = 8
#: Near-witnesses a search saves: its worst case and the best of its strata, highest first.
SAVE_NEAR = 4
#: Seconds the other workers get to stop (and save what they found) once one has a witness, or
#: after Ctrl-C, before they are killed.
STOP_GRACE_S = 15.0
ENTRY_FORMAT = 1


# --------------------------------------------------------------------------------------------
# The run's shared database


@dataclass
class Shared:
    """The database of one search, and what the search did with it (for the report)."""

    database: ResilientDatabase
    #: ``() -> bool``: True stops the search (another worker has a witness).
    stop: Any = None
    replayed: int = 0
    unreadable: int = 0
    saved: int = 0
    witness_replayed: bool = False
    temporary: bool = False
    _witness_key: bytes = b""
    _near_key: bytes = b""
    _saved_values: set = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {"location": None if self.temporary else self.database.where,
                "kind": self.database.kind, "temporary": self.temporary,
                "replayed": self.replayed, "witness_replayed": self.witness_replayed,
                "saved": self.saved, "unreadable": self.unreadable, "lost": self.database.lost}


_CURRENT: contextvars.ContextVar[Shared | None] = contextvars.ContextVar("attnverify_shared",
                                                                        default=None)


@contextlib.contextmanager
def sharing(shared: Shared | None):
    """Searches run inside this block use ``shared`` (``falsify`` reads it: :func:`current`)."""
    token = _CURRENT.set(shared)
    try:
        yield shared
    finally:
        _CURRENT.reset(token)


def current() -> Shared | None:
    return _CURRENT.get()


def bound_parts(label: str, normalized: str, params: dict[str, Any]) -> tuple[str, str, str]:
    """What makes a stored case meaningful: the target as given, the normalized expression and the
    parameters (sorted ``k=v``); :func:`attnverify.exampledb.database_key` adds the version."""
    return (str(label), normalized,
            ",".join(f"{k}={v}" for k, v in sorted(params.items()) if v is not None))


def keys(label: str, normalized: str, params: dict[str, Any]) -> tuple[bytes, bytes]:
    """``(witness key, near key)`` of a bound."""
    parts = bound_parts(label, normalized, params)
    return database_key("witness", *parts), database_key("near", *parts)


# --------------------------------------------------------------------------------------------
# Entries


def encode(ev) -> bytes:
    """A case as stored: exact floats (``float.hex``), temperature, kind, seed, its ratio and its
    margin."""
    case = ev.case
    ratio = ev.ratio if isinstance(ev.ratio, float) and math.isfinite(ev.ratio) else None
    margin = ev.margin if isinstance(ev.margin, float) and math.isfinite(ev.margin) else None
    entry = {"format": ENTRY_FORMAT, "scores": [float(v).hex() for v in case.scores.tolist()],
             "temperature": None if case.temperature is None else float(case.temperature).hex(),
             "kind": str(case.kind), "seed": int(case.seed), "ratio": ratio, "margin": margin}
    return json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes, search) -> tuple[Any, float] | None:
    """``(case, stored margin)`` of an entry this search can replay, else None: a malformed
    entry, a row longer than the search's longest, or a temperature the search would not use.
    (The stored margin orders the near cases; an entry without one comes last.)"""

    try:
        entry = json.loads(value.decode("utf-8")) if len(value) < 4 * 2**20 else None
        if not isinstance(entry, dict) or entry.get("format") != ENTRY_FORMAT:
            return None
        raw = entry["scores"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= search.budget.max_length:
            return None
        scores = [float.fromhex(v) for v in raw]
        t = entry["temperature"]
        t = None if t is None else float.fromhex(t)
        kind, seed = entry["kind"], entry["seed"]
        margin = entry.get("margin")
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError,
            OverflowError, RecursionError):
        return None
    if not all(math.isfinite(v) or v == -math.inf for v in scores):
        return None
    if not any(math.isfinite(v) for v in scores):
        return None
    if not isinstance(kind, str) or len(kind) > 200 or type(seed) is not int \
            or not 0 <= seed < 2**64:
        return None
    if not search.takes_temperature:
        if t is not None:
            return None
    elif t is None or not (math.isfinite(t) and t > 0):
        return None
    elif search.fixed_temperature is not None and t != search.fixed_temperature:
        return None
    margin = float(margin) if isinstance(margin, (int, float)) and not isinstance(margin, bool) \
        else -math.inf
    case = FalsifyCase(torch.tensor(scores, dtype=F64), t, kind, seed)
    return case, margin if math.isfinite(margin) else -math.inf


def _fetch(shared: Shared, key: bytes, search) -> list[tuple[bytes, Any, float]]:
    out = []
    for value in shared.database.fetch(key):
        decoded = decode(value, search)
        if decoded is None:
            shared.unreadable += 1
        else:
            out.append((value, *decoded))
    return out


def replay_cases(shared: Shared, search) -> list:
    """The cases the replay phase evaluates, in order: stored witnesses (fewest unmasked keys,
    then shortest, then by their bytes: the same order in every process), then near cases
    (highest stored margin first)."""

    def live(case) -> int:
        return int(torch.isfinite(case.scores).sum())

    witnesses = sorted(_fetch(shared, shared._witness_key, search),
                       key=lambda e: (live(e[1]), e[1].scores.numel(), e[0]))
    near = sorted(_fetch(shared, shared._near_key, search), key=lambda e: (-e[2], e[0]))
    seen, cases = set(), []
    for key, entries in ((shared._witness_key, witnesses[:MAX_REPLAY_WITNESSES]),
                         (shared._near_key, near[:MAX_NEAR])):
        for value, case, _ in entries:
            shared._saved_values.add((key, value))  # stored already: not saved again
            if value not in seen:
                seen.add(value)
                cases.append(case)
    return cases


def begin(shared: Shared, label: str, normalized: str, params: dict[str, Any]) -> None:
    shared._witness_key, shared._near_key = keys(label, normalized, params)


def replay(shared: Shared, search) -> None:
    """The replay phase: every stored case, re-evaluated (a failing one raises ``_Crossed``)."""
    for case in replay_cases(shared, search):
        shared.replayed += 1
        search.evaluate(case)


def _save(shared: Shared, key: bytes, ev) -> None:
    value = encode(ev)
    if (key, value) not in shared._saved_values:
        shared._saved_values.add((key, value))
        shared.database.save(key, value)
        shared.saved += 1


def save_witness(shared: Shared, ev) -> None:
    """Keep a witness (the first met, then the shrunk one) for every other search of the bound."""
    _save(shared, shared._witness_key, ev)


def save_near(shared: Shared, search) -> None:
    """Keep the best cases of a search without witness (its worst overall and the best of its
    strata, at most :data:`SAVE_NEAR`), then trim the bound's near cases to :data:`MAX_NEAR`."""
    candidates = [search.worst] + [r.best for r in search.records]
    best = [ev for ev in candidates if ev is not None and not ev.fails and not ev.undefined
            and math.isfinite(ev.margin)]
    best.sort(key=lambda ev: -ev.margin)
    done = set()
    for ev in best:
        value = encode(ev)
        if value in done:
            continue
        done.add(value)
        _save(shared, shared._near_key, ev)
        if len(done) >= SAVE_NEAR:
            break
    stored = _fetch(shared, shared._near_key, search)
    stored.sort(key=lambda e: (-e[2], e[0]))
    for value, _case, _ratio in stored[MAX_NEAR:]:
        shared.database.delete(shared._near_key, value)


# --------------------------------------------------------------------------------------------
# The report


def summary_lines(info: dict[str, Any] | None) -> list[str]:
    """The console's account of the database (``info``: :meth:`Shared.to_json`)."""
    if not info:
        return []
    where = "a temporary directory" if info.get("temporary") else info["location"]
    line = (f"  database: {where} ({info['kind']}): replayed {_count(info['replayed'], 'case')}"
            f", saved {_count(info['saved'], 'entry', 'entries')}")
    if info.get("unreadable"):
        line += f", skipped {info['unreadable']} unusable"
    out = [line]
    if info.get("witness_replayed"):
        out.append("  the witness was replayed from the database (no search needed)")
    if info.get("lost"):
        out.append(f"  the database was lost during the run ({info['lost']}); the search went on "
                   "without it and its verdict stands")
    return out


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


# --------------------------------------------------------------------------------------------
# Workers


def worker_seed(seed: int, index: int) -> int:
    return (seed + index) % 2**64


@dataclass
class _Worker:
    index: int
    seed: int
    proc: subprocess.Popen
    result_path: Path
    result: dict | None = None
    done: bool = False
    finished: float = math.inf  # when its result came in (time.monotonic)


def run_workers(args, ctx, params: dict, database_text: str | None) -> tuple[dict, str, int]:
    """Run ``args.workers`` searches (see the module docstring); ``(JSON, console text, exit
    code)`` of the run: the report of the worker that found the witness (else of the one whose
    worst margin is highest), with the ``workers`` it ran beside."""
    n = args.workers
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnverify-w-")))
        temporary = database_text is None
        if temporary:
            database_text = str(scratch / "database")
        workers: list[_Worker] = []
        try:
            for i in range(n):
                workers.append(_start(args, ctx, params, database_text, temporary, i, scratch))
            _wait(workers)
            for w in workers:
                _tell_stop(w)  # done: its stop pipe closed
        except BaseException as exc:
            try:
                _stop_all(workers)
            finally:
                for w in workers:
                    if w.proc.poll() is None:
                        _kill(w)
            if isinstance(exc, KeyboardInterrupt):
                where = ("" if temporary else
                         f"; what they found is kept in the database {describe(database_text)}")
                print(f"attnverify: stopped {len(workers)} workers{where}", file=sys.stderr)
            raise
        return _merge(workers, ctx)


def _start(args, ctx, params, database_text, temporary, index, scratch) -> _Worker:
    seed = worker_seed(ctx.seed, index)
    job = {"target": args.target, "inequality": args.inequality, "params": params,
           "profile": ctx.profile, "max_examples": args.max_examples, "seed": seed,
           "timeout": args.timeout, "no_isolation": bool(args.no_isolation),
           "traceback": bool(getattr(args, "traceback", False)),
           "budget": args.budget, "max_length": args.max_length, "database": database_text,
           "temporary": temporary, "worker": index, "parent": os.getpid(),
           "result": str(scratch / f"worker-{index}.json")}
    proc = _spawn(job)
    return _Worker(index, seed, proc, Path(job["result"]))


def _spawn(job: dict) -> subprocess.Popen:
    """A worker as a fresh interpreter (:mod:`attnverify.falsify_worker`; not a fork: this
    process may run threads, torch's among them), its stdin the stop pipe. A session of its
    own: Ctrl-C reaches the parent alone, which stops the workers between two evaluations (they
    save what they found); they die with the parent (PDEATHSIG) and stop when their stdin
    closes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen([sys.executable, "-m", "attnverify.falsify_worker", json.dumps(job)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                            cwd=os.getcwd(), start_new_session=True)


def _collect(w: _Worker) -> None:
    if w.done or w.proc.poll() is None:
        return
    w.done, w.finished = True, time.monotonic()
    try:
        w.result = json.loads(w.result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        w.result = {"error": f"worker {w.index} stopped without a result "
                    f"(exit status {w.proc.returncode})"}


def _wait(workers: list[_Worker]) -> None:
    """Until every worker is done; the first with a witness stops the others."""
    stopping_since = None
    while not all(w.done for w in workers):
        for w in workers:
            _collect(w)
        found = any(w.result and w.result.get("json", {}).get("falsified") for w in workers)
        if found and stopping_since is None:
            stopping_since = time.monotonic()
            for w in workers:
                _tell_stop(w)
        if stopping_since is not None and time.monotonic() - stopping_since > STOP_GRACE_S:
            for w in workers:
                if not w.done:
                    _kill(w)
                    _collect(w)
                    w.result = {"error": f"worker {w.index} did not stop in time: killed",
                                "killed": True}
        time.sleep(0.05)


def _tell_stop(w: _Worker) -> None:
    """Stop a worker before its next evaluation (it reads its stdin: a closed pipe says stop)."""
    if w.proc.stdin is not None and not w.proc.stdin.closed:
        with contextlib.suppress(OSError):
            w.proc.stdin.close()


def _kill(w: _Worker) -> None:
    with contextlib.suppress(OSError):
        w.proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        w.proc.wait(10)


def _stop_all(workers: list[_Worker]) -> None:
    """Ctrl-C (which reaches this process only: the workers run in sessions of their own) or an
    error here: every worker asked to stop before its next evaluation (it saves what it found),
    waited for up to :data:`STOP_GRACE_S`, then killed."""
    for w in workers:
        _tell_stop(w)
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        try:
            w.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(w)


def _merge(workers: list[_Worker], ctx) -> tuple[dict, str, int]:
    runs, chosen = [], None
    errors = []
    found_by = None
    usage = next((w.result["usage"] for w in workers if (w.result or {}).get("usage")), None)
    if usage is not None:  # an unknown target, say: exit 2, as a single search
        raise UsageError(usage)
    for w in sorted(workers, key=lambda w: w.finished):  # the first to finish with a witness
        res = w.result or {}
        data = res.get("json")
        if res.get("stopped_early"):
            runs.append({"worker": w.index, "seed": w.seed, "evaluations": 0, "seconds": 0.0,
                         "stopped": "stopped", "falsified": False, "worst_ratio": None,
                         "error": None})
            continue
        if data is None:
            errors.append(res.get("error") or res.get("stopped") or
                          f"worker {w.index} stopped without a result")
            runs.append({"worker": w.index, "seed": w.seed, "evaluations": None,
                         "seconds": None,
                         "stopped": "error", "falsified": False, "worst_ratio": None,
                         "error": errors[-1]})
            continue
        search = data.get("search") or {}
        runs.append({"worker": w.index, "seed": w.seed, "evaluations": data["examples"],
                     "seconds": data["elapsed_s"],
                     "stopped": search.get("stopped"), "falsified": data["falsified"],
                     "worst_ratio": data["worst_ratio"], "error": None})
        if data["falsified"] and found_by is None:
            found_by, chosen = w.index, w
    if chosen is None:
        usable = [w for w in workers if (w.result or {}).get("json")]

        def rank(w):
            margin = w.result["json"].get("worst_margin")
            return (-(margin if isinstance(margin, (int, float)) else -math.inf), w.index)

        chosen = min(usable, key=rank) if usable else None
    if found_by is None and errors:
        # as a single search: the code under test stopped a search (exit 1), reported as such
        return {}, "\n".join(e if e.startswith("error: ") else f"error: {e}" for e in errors), 1
    if chosen is None:
        return {}, "error: no worker finished its search", 1
    runs.sort(key=lambda r: r["worker"])
    info = {"count": len(workers), "found_by": found_by,
            "evaluations": sum(r["evaluations"] or 0 for r in runs), "runs": runs}
    data = dict(chosen.result["json"], workers=info)
    lines = [chosen.result["summary"],
             f"  workers: {len(workers)} (seeds {workers[0].seed}…{workers[-1].seed}), "
             f"{info['evaluations']} evaluations in all; "
             + (f"worker {found_by} (seed {chosen.seed}) found the witness" if found_by is not None
                else "none found a witness")]
    return data, "\n".join(lines), 1 if data["falsified"] else 0
