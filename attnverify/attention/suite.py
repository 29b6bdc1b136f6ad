"""The attention suite as pytest tests: one test per (kernel, property), id ``kernel::property``.

    pytest --attnverify-attention=my_attention.py:my_attention [--attnverify-json cert.json]

The pytest plugin brings this module in when ``--attnverify-attention`` (env
``ATTNVERIFY_ATTENTION``) is given; every property runs exactly as ``certify --attention`` runs
it (same seed, same verdicts). ``--attnverify-json`` / ``--attnverify-markdown`` are written at
the end of the module when no normalizer target is given (serial runs; under pytest-xdist use
``attnverify certify --attention``).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest

from attnverify import remote, report
from attnverify.attention.command import split
from attnverify.attention.run import (
    _lifted,
    _planned_units,
    kernel_record,
    property_plan,
    resolve_claims,
    run_one,
    units_of,
)
from attnverify.certify import PropertyResult, TargetResult, fill_unfinished, make_context
from attnverify.errors import UsageError, WorkerFailed
from attnverify.properties import ATTENTION_RESULT_KEY, NOT_RUN
from attnverify.registry import parse_params
from attnverify.serialize import jsonable
from attnverify.shard import check_options, make_shard

#: This module's file, as the plugin hands it to pytest.
SUITE = Path(__file__)


def validate(config) -> None:
    """Bad kernels, parameters or claims stop pytest with a one-line usage error."""
    try:
        plan(_key(config))
    except UsageError as exc:
        raise pytest.UsageError(f"attnverify: {exc}") from None


def _option(config, name: str):
    return config.getoption(f"--attnverify-{name}")


def _key(config) -> tuple:
    return tuple(_option(config, n) for n in ("attention", "claims", "params", "profile", "seed",
                                               "max-examples", "dtypes", "device", "reference",
                                               "timeout", "shard"))


@cache
def plan(key: tuple):
    """``(ctx, [(target, AttentionSpec, claims, property id, context)])`` for the options."""

    (targets, claims, params, profile, seed, max_examples, dtypes, device, reference, timeout,
     shard) = key
    ctx = make_context(profile, dtypes=dtypes, device=device or "cpu",
                       max_examples=max_examples or None, seed=seed or 0,
                       timeout=timeout or None)
    chosen = None if claims is None else split(claims)
    out = []
    for name in split(targets):
        try:  # the kernel in a worker process of its own; the checks run here
            a = remote.open_attention(name, parse_params(params), ctx)
        except (WorkerFailed, remote.TargetRaised) as exc:
            what = getattr(exc, "reason", None) or f"raised {exc.remote_type}: {exc}"
            raise UsageError(f"attention target {name!r}: loading it {what}") from None
        if reference:
            a = dataclasses.replace(a, reference=reference, reference_by="option")
        wanted = resolve_claims(a, chosen)
        for prop_id, pctx in property_plan(a, _lifted(a, wanted), wanted, ctx):
            out.append((name, a, wanted, prop_id, pctx))
    return _with_shard(ctx, out, shard, chosen)


def _with_shard(ctx, out, text, chosen):
    """``--attnverify-shard K/N``: the partition ``certify --attention … --shard K/N`` makes."""

    shard = check_options(text, ctx, option="--attnverify-shard")
    if shard is None:
        return ctx, out

    kernels = {name: a for name, a, *_ in out}
    units = [u for name, a in kernels.items() for u in units_of(a, chosen, ctx, name)]
    part = make_shard(*shard, units)
    return (dataclasses.replace(ctx, shard=part),
            [(*case[:4], dataclasses.replace(case[4], shard=part)) for case in out])


def pytest_generate_tests(metafunc):
    if "attnverify_attention_case" not in metafunc.fixturenames:
        return
    try:
        _, cases = plan(_key(metafunc.config))
    except UsageError as exc:
        raise pytest.UsageError(f"attnverify: {exc}") from None
    metafunc.parametrize("attnverify_attention_case", [
        pytest.param(c, id=f"{c[0]}::{c[3]}") for c in cases])


def certificate_from_records(config, records: list[dict]) -> dict:
    """The certificate of the attention suite from its per-test records (gathered by the
    plugin on pytest-xdist's controller, or the only process): every property planned is in
    it, one the session did not run (deselected, or never reached) ``not_checked``, so no
    kernel reads certified on part of its suite."""
    ctx, cases = plan(_key(config))
    targets: dict[str, TargetResult] = {}
    for rec in records:
        record = rec["record"]
        targets.setdefault(rec["target"], TargetResult(
            rec["target"], list(rec["claims"]), reference=record["reference"],
            reference_owner="checker", attention=record)
        ).results.append(PropertyResult.from_json(rec["result"]))
    planned: dict[str, list] = {}  # per kernel, in the plan's order
    for name, a, wanted, prop_id, pctx in cases:
        record = kernel_record(a)
        targets.setdefault(name, TargetResult(name, list(wanted), reference=record["reference"],
                                              reference_owner="checker", attention=record))
        planned.setdefault(name, []).extend(_planned_units(_lifted(a, wanted),
                                                           [(prop_id, pctx)]))
    for name, units in planned.items():  # in the plan's order, as certify --attention writes
        fill_unfinished(targets[name], units, NOT_RUN)
    ordered = [*planned, *(name for name in targets if name not in planned)]
    return report.certificate([targets[name] for name in ordered], ctx)


def test_attention_property(attnverify_attention_case, request):
    """One property of one attention kernel, as ``certify --attention`` runs it; its result
    goes to the plugin in the test's report (the certificate is written once, by the process
    that gathers every report: :func:`certificate_from_records`)."""

    name, a, claims, prop_id, ctx = attnverify_attention_case
    res = run_one(a, claims, prop_id, ctx, label=name)
    record = {"target": name, "claims": list(claims), "record": kernel_record(a),
              "result": res.to_json(partial=getattr(ctx, "shard", None) is not None)}
    request.node.user_properties.append((ATTENTION_RESULT_KEY, json.dumps(jsonable(record))))
    if res.status == "not_applicable":
        pytest.skip(f"{prop_id} not applicable to {name}: {res.message}")
    if res.status == "not_checked":  # --attnverify-shard: its units are another shard's
        pytest.skip(f"{name}::{prop_id} runs in another shard than "
                    f"{ctx.shard.index}/{ctx.shard.count}")
    if res.status != "holds":
        repro = (res.counterexample or {}).get("repro", "")
        pytest.fail(f"{name}::{prop_id} {res.status}: {res.message}"
                    + (f"\nrepro: {repro}" if repro else ""), pytrace=False)
