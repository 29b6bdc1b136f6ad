"""The runner of ``attnverify certify`` for normalizers (``--attention``:
:mod:`attnverify.attention.command`): every option checked before any work, then the units run
here (serially, or sharded) or on ``--jobs`` checker processes (:mod:`attnverify.jobs`), and the
certificate written (:mod:`attnverify.report`).

:mod:`attnverify.commands` imports this module when ``certify`` is dispatched: it imports torch
and Hypothesis, which the parser and ``--help`` never need.
"""

from __future__ import annotations

import dataclasses
import sys

from attnverify import heap, report
from attnverify.certify import example_database, fix_reference, fix_temperature, progress_line
from attnverify.errors import Interrupted
from attnverify.isolation import certify_all
from attnverify.jacobian import forward_mode
from attnverify.jobs import certify_on_jobs, mark_clean
from attnverify.registry import builtin_ids, parse_params
from attnverify.runconfig import context_from_args
from attnverify.shard import check_options
from attnverify.xfails import check_entries, load_xfails


def run_certify(args) -> int:
    # every option checked here, before any work (loading the targets comes next)
    if getattr(args, "own_process", False):  # the command line's process: nothing ran before
        mark_clean()  # before any tensor operation: what --jobs may fork (attnverify.jobs)
        heap.freeze_imports()  # the modules' objects: no full collection walks them again
    ctx = context_from_args(args)
    report.check_outputs(json=args.json_path, markdown=args.markdown_path)
    params = parse_params(args.params)
    ctx = fix_temperature(ctx, params)  # --params temperature=… fixes T for every check, or exit 2
    ctx = fix_reference(ctx, args.reference)  # --reference REF loads (or exit 2) and applies
    if args.database is not None:  # opened and checked here (or exit 2), before any work
        example_database(args.database)
        ctx = dataclasses.replace(ctx, database=args.database)
    claims = None if args.claims is None else [c.strip() for c in args.claims.split(",")
                                                if c.strip()]
    xfails = load_xfails(args.xfails) if args.xfails else None
    shard = check_shard(args, ctx)
    targets = args.targets or builtin_ids()
    # the universal gradient check takes forward-mode products: torch's decompositions for
    # them loaded here, once, not once in each job that --jobs forks
    forward_mode()
    code = certify_on_jobs(args, targets, ctx, xfails)  # the units on several processes
    if code is not None:
        return code
    planned = []
    stopped = None
    try:
        results = certify_all(targets, params, claims, ctx,
                              progress=None if args.quiet else progress_line,
                              before_run=None if xfails is None else
                              (lambda ids: check_entries(xfails, ids)),
                              shard=shard, on_shard=planned.append)
    except Interrupted as exc:  # Ctrl-C or a terminating signal: what finished is written
        stopped, results = exc, exc.targets
    if planned:
        ctx = dataclasses.replace(ctx, shard=planned[0])
    if stopped is not None:
        return report.finish_interrupted(args, report.certificate(results, ctx), xfails, stopped)
    if args.database is not None:
        _database_lost(args.database)
    return report.finish_certify(args, report.certificate(results, ctx), xfails)


def check_shard(args, ctx) -> tuple[int, int] | None:
    """:func:`attnverify.shard.check_options` for ``--shard`` and ``--xfails``."""
    return check_options(getattr(args, "shard", None), ctx, xfails=getattr(args, "xfails", None))


def _database_lost(text: str) -> None:
    """Say so when ``certify --database``'s database went away during the run (the run went on
    with what it had in memory; its verdicts stand)."""
    database = example_database(text)
    if database.lost:
        print(f"attnverify: the example database {database.where} was lost during the run "
              f"({database.lost}); the run went on without it", file=sys.stderr)
