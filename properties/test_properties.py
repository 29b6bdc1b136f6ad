"""The attnverify property suite: one test per (target, property), id ``target::property``.

Every universal property and every claim of each target. Run it against the built-ins
(``pytest properties``) or any normalizer (``pytest properties --attnverify-target=pkg.mod:fn``);
in an installed attnverify (module ``attnverify.properties.test_properties``) the pytest plugin
brings it in when ``--attnverify-target`` is given. Each test runs the property under Hypothesis
exactly as ``attnverify certify`` does (same seed, same verdicts, serial or under pytest-xdist).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest

from attnverify.checks import PROPERTIES, properties_for
from attnverify.errors import UsageError
from attnverify.properties import NOT_RUN, RESULT_KEY, option


@cache
def _load(config_key: tuple):
    """``(ctx, [(target, spec, property id)])``: every target loaded in a worker process of its
    own (:func:`attnverify.remote.open_normalizer`; in this process with
    ``ATTNVERIFY_ISOLATION=0``), so this process, where the checks run, never imports it."""
    from attnverify import remote
    from attnverify.certify import make_context, resolve_claims
    from attnverify.errors import WorkerFailed
    from attnverify.registry import builtin_ids, parse_params

    (target, claims, params, profile, seed, max_examples, dtypes, device, reference,
     timeout, shard) = config_key
    ctx = make_context(profile, dtypes=dtypes, device=device or "cpu",
                       max_examples=max_examples or None,  # strings checked there (exit 2)
                       seed=seed or 0, timeout=timeout or None)
    from attnverify.certify import fix_temperature

    # --attnverify-params temperature=… fixes T for every property and bound (validated)
    ctx = fix_temperature(ctx, parse_params(params), option="--attnverify-params")
    from attnverify.certify import fix_reference, with_reference

    ctx = fix_reference(ctx, reference)  # --attnverify-reference REF, for every target
    names = [t.strip() for t in target.split(",")] if target else builtin_ids()
    chosen = None if claims is None else [c.strip() for c in claims.split(",") if c.strip()]
    cases = []
    for name in names:
        try:
            loaded = remote.open_normalizer(name, parse_params(params), ctx)
        except (WorkerFailed, remote.TargetRaised) as exc:
            what = getattr(exc, "reason", None) or f"raised {exc.remote_type}: {exc}"
            raise UsageError(f"target {name!r}: loading it {what}") from None
        spec, wanted = with_reference(loaded, chosen, ctx)
        spec = spec.with_claims(resolve_claims(spec, wanted))
        for prop in properties_for(spec.claims, ctx):
            cases.append((name, spec, prop.id))
    return _with_shard(ctx, cases, shard), cases


def _with_shard(ctx, cases, text):
    """``ctx`` with the shard of ``--attnverify-shard K/N`` (the partition ``certify --shard``
    makes of the same targets)."""
    from attnverify.shard import check_options, dtype_name, make_shard, unit_id

    shard = check_options(text, ctx, option="--attnverify-shard")
    if shard is None:
        return ctx
    units = [unit_id(name, prop_id, dtype_name(d), ctx.device)
             for name, spec, prop_id in cases
             for d in PROPERTIES[prop_id].unit_dtypes(spec, ctx)]
    import dataclasses

    return dataclasses.replace(ctx, shard=make_shard(*shard, units))


def _key(config) -> tuple:
    return tuple(option(config, n) for n in ("target", "claims", "params", "profile", "seed",
                                               "max_examples", "dtypes", "device", "reference",
                                               "timeout", "shard"))


def _xfails(config) -> list[str]:
    path = option(config, "xfails")
    if not path:
        return []
    from attnverify.xfails import load_xfails

    return load_xfails(path)


def pytest_generate_tests(metafunc):
    if "attnverify_case" not in metafunc.fixturenames:
        return
    from attnverify.xfails import check_entries, matches

    try:
        _, cases = _load(_key(metafunc.config))
        entries = _xfails(metafunc.config)
        if entries:  # strict: an entry matching nothing, or everything, is a usage error
            check_entries(entries, [f"{target}::{prop_id}" for target, _, prop_id in cases])
    except UsageError as exc:
        raise pytest.UsageError(f"attnverify: {exc}") from None
    params = []
    for target, spec, prop_id in cases:
        tid = f"{target}::{prop_id}"
        marks = [pytest.mark.xfail(reason=f"listed in xfails ({str(e)!r})", strict=False)
                 for e in entries if matches(e, tid)][:1]
        params.append(pytest.param((target, spec, prop_id), id=tid, marks=marks))
    metafunc.parametrize("attnverify_case", params)


def test_property(attnverify_case, request):
    """One property of one normalizer, under Hypothesis with the profile's budget and seed."""
    from attnverify.certify import run_property, triton_execution

    target, spec, prop_id = attnverify_case
    ctx, _ = _load(_key(request.config))
    execution, cap = triton_execution(spec.fn, ctx)  # an interpreted Triton kernel: few rows
    if cap:
        ctx = dataclasses.replace(ctx, max_rows=cap["rows"])
    shard = ctx.shard
    select = None if shard is None else shard.selector(target, prop_id, ctx.device)
    res = run_property(PROPERTIES[prop_id], spec, ctx, select=select)
    from attnverify.checks.base import monitor_of
    from attnverify.checks.reference import reference_label, reference_owner

    monitor = monitor_of(spec)
    record = {"target": target, "claims": list(spec.claims), "params": dict(spec.params),
              "reference": reference_label(spec), "reference_owner": reference_owner(spec),
              "worker_pids": list(monitor.pids) if monitor is not None else [],
              "sandbox": list(dict.fromkeys(monitor.sandboxes)) if monitor is not None else [],
              "result": res.to_json(partial=shard is not None),
              "execution": execution, "call_cap": cap}
    from attnverify.certify import jsonable

    request.node.user_properties.append((RESULT_KEY, json.dumps(jsonable(record))))
    if res.status == "not_applicable":
        pytest.skip(f"{prop_id} not applicable to {target}: {res.message}")
    if res.status == "not_checked":  # --attnverify-shard: its units are another shard's
        pytest.skip(f"{target}::{prop_id} runs in another shard than "
                    f"{shard.index}/{shard.count}")
    if res.status != "holds":
        ce = res.counterexample or {}
        lines = [f"{target}::{prop_id} {res.status}: {res.message}"]
        if "scores" in ce:
            lines.append(f"minimal counterexample ({ce.get('dtype')}, shape {ce.get('shape')}): "
                         f"{json.dumps(ce['scores'])[:600]}")
        if "repro" in ce:
            lines.append(f"repro: {ce['repro']}")
        pytest.fail("\n".join(lines), pytrace=False)


def certificate_from_records(config, records: list[dict]) -> dict:
    """The JSON certificate of docs/INTERFACES.md from the suite's per-test records. Every
    ``target::property`` the suite planned is in it: one the session did not run (deselected
    with ``-k``, or never reached: ``-x``, Ctrl-C) is ``not_checked``, so a target reads
    ``certified`` only when all of its properties ran and held, as under ``attnverify
    certify``."""
    from attnverify.certify import PropertyResult, TargetResult, fill_unfinished
    from attnverify.checks.reference import reference_label, reference_owner
    from attnverify.report import certificate
    from attnverify.shard import dtype_name

    ctx, cases = _load(_key(config))
    targets: dict[str, TargetResult] = {}
    for rec in records:
        t = targets.setdefault(rec["target"], TargetResult(
            rec["target"], [], [], rec["params"], reference=rec.get("reference"),
            reference_owner=rec.get("reference_owner"), execution=rec.get("execution"),
            call_cap=rec.get("call_cap")))
        for pid in rec.get("worker_pids", []):
            if pid not in t.worker_pids:
                t.worker_pids.append(pid)
        for phrase in rec.get("sandbox", []):
            if phrase not in t.sandbox:
                t.sandbox.append(phrase)
        t.results.append(PropertyResult.from_json(rec["result"]))
    planned: dict[str, list] = {}  # per target, in the plan's order
    for name, spec, prop_id in cases:
        targets.setdefault(name, TargetResult(
            name, [], [], dict(spec.params), reference=reference_label(spec),
            reference_owner=reference_owner(spec)))
        planned.setdefault(name, []).append(
            (prop_id, [dtype_name(d) for d in PROPERTIES[prop_id].unit_dtypes(spec, ctx)]))
    for name, units in planned.items():
        fill_unfinished(targets[name], units, NOT_RUN)
    from attnverify.checks import LAST

    order = [p for p in PROPERTIES if p not in LAST] + list(LAST)  # certify's order
    for t in targets.values():
        t.results.sort(key=lambda r: order.index(r.property))
        t.claims = [r.property for r in t.results if not PROPERTIES[r.property].universal]
    ordered = [*planned, *(name for name in targets if name not in planned)]
    return certificate([targets[name] for name in ordered], ctx)

