"""The runner of ``attnverify certify --attention`` (the option itself:
:mod:`attnverify.commands`).

``attnverify certify --attention sdpa,flex [--reference REF] [--claims …] [--profile …] …``
certifies attention kernels; every other option means what it means for normalizers. Positional
TARGETs given with ``--attention`` are attention targets too. :mod:`attnverify.commands` imports
this module when the command is dispatched.
"""

from __future__ import annotations

import dataclasses

from attnverify import heap, remote, report
from attnverify.attention.loader import load_attention
from attnverify.attention.run import (
    certify_attention,
    not_started_attention,
    resolve_claims,
    units_of,
)
from attnverify.certify import progress_line
from attnverify.errors import UsageError
from attnverify.isolation import close, load_failed, open_targets, stopped_run
from attnverify.jobs import certify_on_jobs, mark_clean
from attnverify.registry import builtins, parse_params
from attnverify.runconfig import context_from_args
from attnverify.shard import check_options, make_shard
from attnverify.xfails import load_xfails


def split(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def run_certify(args) -> int:
    if getattr(args, "own_process", False):  # the command line's process: nothing ran before
        mark_clean()  # before any tensor operation: what --jobs may fork (attnverify.jobs)
        heap.freeze_imports()  # the modules' objects: no full collection walks them again
    targets = split(args.attention) + list(args.targets or [])
    if not targets:
        raise UsageError("--attention needs at least one target (see 'attnverify list')")
    ctx = context_from_args(args)
    report.check_outputs(json=args.json_path, markdown=args.markdown_path)
    params = parse_params(args.params)
    claims = None if args.claims is None else split(args.claims)
    xfails = load_xfails(args.xfails) if args.xfails else None
    args.shard_spec = check_options(getattr(args, "shard", None), ctx, xfails=args.xfails)
    code = certify_on_jobs(args, targets, ctx, xfails)  # the units on several processes
    if code is not None:
        return code
    try:
        return _certify_opened(args, targets, params, claims, ctx, xfails)
    finally:
        remote.shutdown()


def _certify_opened(args, targets, params, claims, ctx, xfails) -> int:
    opened = open_targets(targets, params, ctx, attention=True)
    specs = [spec for _, spec, _ in opened]
    ref = getattr(args, "reference", None)
    if ref:
        if ref not in builtins():
            try:  # a usage error now, not in the middle of the run
                load_attention(ref)
            except UsageError as exc:
                raise UsageError(f"--reference {ref!r} is neither a built-in normalizer id nor "
                                 f"an attention target ({exc})") from None
        specs = [None if s is None else dataclasses.replace(s, reference=ref, reference_by="option")
                 for s in specs]
    for spec in specs:  # every usage error before any work
        if spec is not None:
            resolve_claims(spec, claims)
    if args.shard_spec is not None:  # certify --shard K/N: this shard's units of every kernel
        units = [u for (label, _, _), spec in zip(opened, specs) if spec is not None
                 for u in units_of(spec, claims, ctx, label)]
        ctx = dataclasses.replace(ctx, shard=make_shard(*args.shard_spec, units))
    progress = None if args.quiet else progress_line
    results = []
    try:
        for (label, _, failure), spec in zip(opened, specs):
            if spec is None:
                results.append(load_failed(label, failure))
                continue
            results.append(certify_attention(spec, claims, ctx, label=label, progress=progress))
            close(spec)
    except KeyboardInterrupt as exc:  # Ctrl-C or a terminating signal: what finished is written
        stopped = stopped_run(exc, results, [(label, spec, failure) for (label, _, failure), spec
                                             in zip(opened, specs)],
                              lambda spec, label, why: not_started_attention(spec, claims, ctx,
                                                                             label, why))
        remote.shutdown()
        return report.finish_interrupted(args, report.certificate(stopped.targets, ctx), xfails,
                                         stopped)
    remote.shutdown()  # no process of the code under test outlives the run's results
    return report.finish_certify(args, report.certificate(results, ctx), xfails)
