"""One ``falsify --workers`` worker: ``python -m attnverify.falsify_worker JOB``.

Started by :func:`attnverify.campaign.run_workers` with its job as JSON: the search of the bound on
the worker's seed, with the target behind the process boundary
(:func:`attnverify.isolation.falsify_isolated`), on the shared database; the result (the JSON and
the console report of :mod:`attnverify.falsify`) is written atomically to the job's result file.
The worker stops before its next evaluation when its stdin closes (the parent's stop, or the
parent's death), and dies with its parent (PDEATHSIG). Nothing imports this module: it is the
worker's entry point only, so that :mod:`attnverify.campaign` stays below :mod:`attnverify.falsify`.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from attnverify.atomic import write_text_atomic
from attnverify.errors import UsageError


def _watch_stdin(stop: threading.Event) -> None:
    """The parent closes this worker's stdin (or dies): stop."""
    try:
        while os.read(0, 4096):  # the file descriptor: no lock that interpreter exit needs
            pass
    except OSError:
        pass
    stop.set()


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker when its parent dies (Linux; elsewhere the closed stdin stops it),
    and exit now if it died already."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent and os.getppid() != parent:
        os._exit(1)


def worker_main(job: dict) -> int:
    """One worker: the search of :func:`attnverify.campaign.run_workers`'s job on the shared
    database, its result written atomically to ``job["result"]``; it stops before its next
    evaluation when its stdin closes."""
    _die_with_parent(int(job.get("parent", 0)))
    stop = threading.Event()
    threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
    out: dict[str, Any] = {"worker": job["worker"]}
    try:
        # torch, Hypothesis and the search load after the stop pipe is watched
        from attnverify.campaign import Shared  # worker: see above
        from attnverify.certify import fix_temperature  # worker: see above
        from attnverify.exampledb import open_database  # worker: see above
        from attnverify.falsify import result_json, run_search, summary  # worker: see above
        from attnverify.isolation import falsify_isolated  # worker: see above
        from attnverify.runconfig import make_context  # worker: see above

        ctx = make_context(job["profile"], max_examples=job["max_examples"], seed=job["seed"],
                           timeout=job["timeout"], isolation=False if job["no_isolation"] else None,
                           budget=job["budget"], max_length=job["max_length"])
        ctx = fix_temperature(ctx, job["params"])
        if stop.is_set():  # stopped (a witness elsewhere, Ctrl-C) before its search began
            out["stopped_early"] = True
            write_text_atomic(Path(job["result"]), json.dumps(out))
            return 0
        shared = Shared(open_database(job["database"]), stop=stop.is_set,
                        temporary=job["temporary"])
        try:
            res = run_search(job["target"], job["params"], job["inequality"], ctx, shared,
                             isolated=falsify_isolated, tracebacks=bool(job.get("traceback")))
        finally:
            shared.database.close()
        if isinstance(res, str):
            out["error"] = res
        else:
            out["json"], out["summary"] = result_json(res, ctx), summary(res, ctx)
    except UsageError as exc:
        out["usage"] = str(exc)
    except KeyboardInterrupt:
        out["error"] = f"worker {job['worker']} was interrupted"
    except Exception as exc:  # noqa: BLE001 - reported by the parent, as a single search would
        out["error"] = f"worker {job['worker']}: {type(exc).__name__}: {exc}".splitlines()[0]
    write_text_atomic(Path(job["result"]), json.dumps(out))
    return 0


if __name__ == "__main__":  # pragma: no cover - started by campaign.run_workers
    sys.exit(worker_main(json.loads(sys.argv[1])))
