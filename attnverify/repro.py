"""``attnverify repro``: re-check one property (or one falsify inequality) on one exact case.

The repro lines that certify, falsify, claims and the pytest suite print are this command
(:func:`attnverify.serialize.repro_command`)::

    attnverify repro TARGET --property ID --case '{"case": "RowCase", "scores": [[0.0, "-inf"]], …}'
    attnverify repro TARGET --inequality "LHS <= RHS" --case '{"scores": [...], "temperature": 1.0}'

``--case`` is the JSON object (or the path of a file holding it) written by
:func:`attnverify.serialize.encode_case`: the scores with their masks (``"-inf"``), the batch,
the temperature, the dtype, and the normalizer's parameters (``--params`` overrides them). The
property is re-checked exactly as certify checked the reported input. Exit 1 with the violation
message while the normalizer fails there (or raises), 0 once it holds, 2 for bad input.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from attnverify import remote, sequence
from attnverify.attention.run import lifted_spec
from attnverify.certify import refusal_text
from attnverify.checks import PROPERTIES
from attnverify.checks.base import NormalizerError, Violation, monitor_of, positive_temperature
from attnverify.checks.cases import CASE_TYPES
from attnverify.errors import UsageError, WorkerFailed
from attnverify.expr import parse_inequality
from attnverify.falsify import FalsifyCase, evaluate
from attnverify.quantities import QUANTITIES
from attnverify.registry import load_target, parse_params
from attnverify.runconfig import PROFILES, make_context
from attnverify.sequence import attention_case, property_of
from attnverify.serialize import NON_FINITE, decode_case, decode_tensor, read_case


def _params(data: dict[str, Any], text: str | None) -> dict[str, Any]:
    raw = data.get("params") or {}
    if not isinstance(raw, dict):
        raise UsageError("--case: \"params\" must be a JSON object")
    params = {k: NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in raw.items()}
    params.update(parse_params(text))
    return params


def run_repro_command(args) -> int:
    if (args.property is None) == (args.inequality is None):
        raise UsageError("repro needs exactly one of --property ID or --inequality \"LHS <= RHS\"")
    attention = bool(getattr(args, "attention", False))
    if attention and args.inequality is not None:
        raise UsageError("--attention re-checks a property (--property ID), not an inequality")
    data = read_case(args.case)
    params = _params(data, args.params)
    if "temperature" in params and not attention:
        positive_temperature(params["temperature"])
    steps = []
    if args.property is not None:
        _property_id(args.property, attention)
        steps = _sequence(data)
        case = _case(data, args.property, attention)
    timeout = getattr(args, "timeout", None) or PROFILES["ci"]["timeout_s"]
    ctx = make_context("dev", seed=getattr(args, "seed", 0), timeout=timeout,
                       isolation=False if getattr(args, "no_isolation", False) else None)
    if getattr(args, "reference", None):
        load_target(args.reference)  # a bad reference is a usage error (the user's own: here)
    try:
        if attention:
            spec = attention_spec(args.target, params, ctx, getattr(args, "reference", None))
        else:
            spec = remote.open_normalizer(args.target, params, ctx)
            if getattr(args, "reference", None):
                spec = spec.with_reference(args.reference.strip())
        if args.property is not None:
            return _property(args.target, spec, args.property, case, ctx, steps)
        return _inequality(args.target, spec, args.inequality, data, params)
    except (WorkerFailed, remote.TargetRaised) as exc:
        what = getattr(exc, "reason", None) or f"raised {getattr(exc, 'remote_type', '')}: {exc}"
        print(f"ERROR: {args.target}: the {'kernel' if attention else 'normalizer'} {what}")
        return 1
    finally:
        remote.shutdown()


def _property_id(prop_id: str, attention: bool = False) -> None:
    if (property_of(prop_id) if attention else PROPERTIES.get(prop_id)) is None:
        raise UsageError(f"unknown property id {prop_id!r}: run 'attnverify properties' for "
                         "the list")


def _case(data: dict[str, Any], prop_id: str, attention: bool):
    """The case to re-check, decoded before any worker starts: an attention case
    (``"case": "AttnCase"``) from its recipe, any other from its fields."""

    if attention and data.get("case") == "AttnCase":
        if not isinstance(data.get("recipe"), dict):
            raise UsageError("--case: an attention case needs its \"recipe\" (a JSON object)")
        return attention_case(data["recipe"])
    return decode_case(data, CASE_TYPES)


def attention_spec(target: str, params: dict[str, Any], ctx, reference: str | None):
    """The attention kernel ``target`` in a worker of its own, lifted to a normalizer as
    certify --attention checks it (both kinds of property take it)."""

    a = remote.open_attention(target, params or None, ctx)
    if reference:
        a = dataclasses.replace(a, reference=reference.strip(), reference_by="option")
    return lifted_spec(a)


def _sequence(data: dict[str, Any]) -> list:
    """The earlier calls the case needs (``"sequence"``, :mod:`attnverify.sequence`), checked
    before any worker starts."""

    return sequence.decode(data.get("sequence"), CASE_TYPES)


def _property(target: str, spec, prop_id: str, case, ctx, steps=()) -> int:
    label = f"{target}::{prop_id}"
    if steps:  # in this one worker, started for this repro: the state the case needs
        names = ", ".join(dict.fromkeys(s.property for s in steps))
        print(f"replaying {len(steps)} earlier call{'s' if len(steps) > 1 else ''} first, in "
              f"order, in one fresh worker ({names})")
        sequence.replay(spec, ctx, steps)
    monitor = monitor_of(spec)
    mark = len(monitor.refused) if monitor is not None else 0
    try:
        ratio = sequence.run_step(spec, ctx, sequence.Step(prop_id, "recheck", case))
    except Violation as exc:
        print(f"VIOLATED: {label}: {exc.message}")
        return 1
    except NormalizerError as exc:
        print(f"ERROR: {label}: the normalizer raised {exc}")
        return 1
    if monitor is not None and len(monitor.refused) > mark:  # refused where the check went on
        print(f"VIOLATED: {label}: {refusal_text(monitor.refused[mark].what)}")
        return 1
    print(f"holds: {label} on this case (ratio {float(ratio):.4g})")
    return 0


def _inequality(target: str, spec, text: str, data: dict[str, Any], params) -> int:
    ineq = parse_inequality(text, QUANTITIES)
    if "scores" not in data:
        raise UsageError("--case: no \"scores\"")
    scores = decode_tensor(data["scores"], torch.float64).reshape(-1)
    t = data.get("temperature")
    t = None if t is None else float(NON_FINITE.get(t, t)) if isinstance(t, str) else float(t)
    case = FalsifyCase(scores, t, str(data.get("kind", "")), int(data.get("seed", 0)))
    ev = evaluate(spec, ineq, case, params)
    values = ", ".join(f"{k}={v:.6g}" for k, v in ev.values.items())
    where = f"{target}: {text.strip()} at {values}: LHS={ev.lhs:.6g} RHS={ev.rhs:.6g}"
    if ev.decided_by == "mpmath":  # float64 could not decide: higher precision did
        where += (f" (decided in higher precision, mpmath {ev.precise.bits}-bit intervals: "
                  f"{ev.precise.text()})")
    elif ev.decided_by == "undecided":
        where += f" (within the rounding of the quantities, undecided: {ev.undecided_reason})"
    if ev.fails:
        print(f"FALSIFIED: {where}")
        return 1
    if ev.undefined:
        print(f"undefined: {where} (the expression has no value here)")
        return 0
    ratio = "" if not math.isfinite(ev.ratio) else f" (ratio {ev.ratio:.4g})"
    print(f"holds: {where}{ratio}")
    return 0
