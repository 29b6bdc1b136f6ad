"""``certify --attention``: the lifted normalizer properties, then the attention-level ones.

One :class:`~attnverify.certify.TargetResult` per kernel, in the certificate format of
docs/INTERFACES.md. The kernel runs in a worker process of its own
(:func:`attnverify.remote.open_attention`); the lifting, the checks and the float64 reference run
here, in the checker.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time

from attnverify.attention.lift import lift
from attnverify.attention.mods import EMPTIES_ROWS
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.attention.spec import AttentionSpec
from attnverify.certify import (
    TargetResult,
    fill_unfinished,
    keep_finished,
    make_context,
    run_property,
    side_effects,
    triton_execution,
)
from attnverify.checks import LAST, PROPERTIES, properties_for
from attnverify.checks.base import monitor_of
from attnverify.errors import Interrupted, UsageError
from attnverify.registry import builtins
from attnverify.shard import dtype_name, unit_id

#: Normalizer properties that differentiate the lifted kernel.
DIFFERENTIATING = ("gradient", "double_backward", "fd_gradient", "lemma2_jacobian",
                   "cor3_entrywise", "cor3_spectral_paper", "jacobian_spectral_half",
                   "lemma3_l1_uniform", "lemma3_frobenius_uniform")
#: Largest tensor inlined in a counterexample (larger ones: shape and dtype; the recipe rebuilds
#: them exactly).
MAX_INLINE = 256


def default_claims(a: AttentionSpec) -> list[str]:
    """The lifted normalizer's claims, plus the claimable attention properties that follow."""
    if a.claims is not None:
        return list(a.claims)
    own = list(lift(a).claims)
    if a.space == "simplex":
        own.append("attn_convex_hull")
    if "fully_masked_row" in own:
        own.append("attn_fully_masked_row")
    return own


def resolve_claims(a: AttentionSpec, claims: list[str] | None) -> list[str]:
    """Claims checked on ``a``: ``claims`` when given, else its defaults; usage error on ids
    that are unknown or universal."""

    chosen = default_claims(a) if claims is None else list(claims)
    for c in chosen:
        prop = PROPERTIES.get(c) or ATTENTION_PROPERTIES.get(c)
        if prop is None:
            raise UsageError(f"unknown property id {c!r}: run 'attnverify properties' for the "
                             "list")
        if prop.universal:
            raise UsageError(f"{c!r} is universal: it is always checked, not claimed")
    return list(dict.fromkeys(chosen))


def lifted_context(a: AttentionSpec, ctx):
    """``ctx`` for the lifted properties: the dtypes the kernel takes, rows no longer than its
    head dimension allows (the longest one key short of it: the batteries' masked long rows
    and cases of many entries are one key past the longest)."""
    dtypes = tuple(d for d in ctx.dtypes if a.supports(d)) or (a.dtypes[0],)
    longest = ctx.max_length if a.max_head_dim is None else \
        min(ctx.max_length, max(1, a.max_head_dim - 1))
    return dataclasses.replace(ctx, dtypes=dtypes, max_length=longest)


def _is_normalizer(name: str) -> bool:
    return name in builtins()


#: Lifted properties that hold whatever the kernel does to its scores, a score modification
#: included: they compare the kernel with itself or watch its calls, never with a normalizer of
#: the scores given (``finite`` not where the modification can leave a row without a key).
MOD_INDEPENDENT = ("shape", "finite", "deterministic", "no_mutation", "gradient",
                   "no_side_effects")


def _skip_reason(a: AttentionSpec, prop_id: str) -> str:
    if a.score_mod is not None and (prop_id not in MOD_INDEPENDENT or (
            prop_id == "finite" and a.score_mod in EMPTIES_ROWS)):
        return (f"the kernel applies the {a.score_mod} score modification; this property of "
                "the lifting (S ↦ α) needs an unmodified kernel (the attn_* properties check "
                "the modification)")
    if not a.differentiable and prop_id in DIFFERENTIATING:
        return "the kernel has no backward here (declared differentiable=False)"
    return ""


def _prepared(a: AttentionSpec, claims: list[str] | None, ctx, label: str | None):
    """``(ctx, chosen claims, lifted spec, result)`` of certifying ``a`` as ``label``: the
    context capped for an interpreted Triton kernel, and the kernel's result before any
    property ran."""
    execution, cap = triton_execution(a.fn, ctx, attention=True)
    if cap:  # an interpreted Triton kernel: few program instances per call
        ctx = dataclasses.replace(ctx, max_rows=cap["rows"],
                                  max_programs=(cap["batch_heads"], cap["queries"]))
    chosen = resolve_claims(a, claims)
    spec = _lifted(a, chosen)
    result = TargetResult(target=label or a.target or a.id,
                          claims=list(dict.fromkeys([*chosen, *spec.claims])),
                          params=dict(a.params), reference=a.reference or a.normalizer,
                          reference_owner="checker", attention=kernel_record(a),
                          execution=execution, call_cap=cap)
    return ctx, chosen, spec, result


def certify_attention(a: AttentionSpec, claims: list[str] | None = None, ctx=None, *,
                      label: str | None = None, progress=None, skip=()):
    """Every normalizer property of the lifted kernel and every attention property (except
    those in ``skip``, by id). Ctrl-C or a terminating signal raises :class:`Interrupted`
    with the result: the properties that finished, the others ``not_checked``."""

    ctx, chosen, spec, result = _prepared(a, claims, ctx or make_context(), label)
    planned = [(prop_id, pctx) for prop_id, pctx in property_plan(a, spec, chosen, ctx)
               if prop_id not in skip]
    stopped = None
    try:
        for prop_id, pctx in planned:
            res = run_one(a, chosen, prop_id, pctx, label=result.target)
            result.results.append(res)
            if progress is not None:
                progress(result.target, res)
    except KeyboardInterrupt as exc:  # Ctrl-C or a terminating signal: keep what finished
        stopped = exc
        keep_finished(result, _planned_units(spec, planned), exc)

    monitor = monitor_of(spec)
    if monitor is not None:
        result.worker_pids = list(dict.fromkeys(monitor.pids))
        result.sandbox = list(dict.fromkeys(monitor.sandboxes))
        result.target_warnings = list(getattr(monitor, "warnings", []))
        if getattr(ctx, "shard", None) is not None:
            result.side_effects = side_effects(monitor, dict(a.params))
    result.runtime = dict(getattr(a.fn, "runtime", None) or {})
    if stopped is not None:
        raise Interrupted(stopped, targets=[result])
    return result


def _planned_units(spec, planned) -> list[tuple[str, list[str]]]:
    """``[(property id, its unit dtypes)]`` of ``planned`` (``[(property id, context)]``)."""
    return [(prop_id, [dtype_name(d) for d in
                       (PROPERTIES.get(prop_id) or ATTENTION_PROPERTIES[prop_id])
                       .unit_dtypes(spec, pctx)])
            for prop_id, pctx in planned]


def not_started_attention(a: AttentionSpec, claims: list[str] | None, ctx, label: str,
                          why: str):
    """A kernel a stopped run never reached: every planned property ``not_checked``."""
    ctx, chosen, spec, result = _prepared(a, claims, ctx, label)
    fill_unfinished(result, _planned_units(spec, property_plan(a, spec, chosen, ctx)), why)
    return result


def kernel_record(a: AttentionSpec) -> dict:
    """The certificate's ``attention`` record: what the kernel declares it computes and who
    named the reference its outputs were compared with (docs/INTERFACES.md)."""
    by = (a.reference_by or "given") if a.reference else "normalizer"
    return {"normalizer": a.normalizer, "score_mod": a.score_mod,
            "reference": a.reference or a.normalizer, "reference_by": by,
            "normalizer_declared": bool(getattr(a, "normalizer_declared", True))}


def property_plan(a: AttentionSpec, spec, chosen: list[str], ctx) -> list[tuple[str, object]]:
    """``[(property id, context)]`` in the order they run: the lifted normalizer properties,
    the attention-level ones, and last those that report on the whole run
    (``no_side_effects``)."""

    lifted_ctx = lifted_context(a, ctx)
    lifted = [(p.id, lifted_ctx) for p in properties_for(spec.claims, lifted_ctx)]
    plan = [entry for entry in lifted if entry[0] not in LAST]
    plan += [(p.id, ctx) for p in ATTENTION_PROPERTIES.values() if p.universal or p.id in chosen]
    return plan + [entry for entry in lifted if entry[0] in LAST]


def units_of(a: AttentionSpec, claims: list[str] | None, ctx, label: str) -> list[str]:
    """The unit ids (:mod:`attnverify.shard`) of certifying ``a`` as ``label``, in run order."""

    chosen = resolve_claims(a, claims)
    spec = _lifted(a, chosen)
    out = []
    for prop_id, pctx in property_plan(a, spec, chosen, ctx):
        prop = PROPERTIES.get(prop_id) or ATTENTION_PROPERTIES[prop_id]
        out += [unit_id(label, prop_id, dtype_name(d), ctx.device)
                for d in prop.unit_dtypes(spec, pctx)]
    return out


def lifted_spec(a: AttentionSpec, claims: list[str] | None = None):
    """``a`` lifted to a normalizer as certify checks it (its claims, or its defaults; the
    reference it names): the spec both kinds of property take."""
    return _lifted(a, resolve_claims(a, claims))


def _lifted(a: AttentionSpec, chosen: list[str]):
    spec = lift(a).with_claims([c for c in chosen if c in PROPERTIES])
    if a.reference and ":" not in a.reference and _is_normalizer(a.reference):
        spec = spec.with_reference(a.reference)  # the lifted weights vs that normalizer's
    return spec


def run_one(a: AttentionSpec, chosen: list[str], prop_id: str, ctx, *, label: str | None = None):
    """One property (a normalizer id runs on the lifted kernel, ``ctx`` already
    :func:`lifted_context`), or ``not_applicable`` with the reason."""

    prop = PROPERTIES.get(prop_id) or ATTENTION_PROPERTIES[prop_id]
    reason = a.unavailable or (_skip_reason(a, prop_id) if prop_id in PROPERTIES else "")
    shard = getattr(ctx, "shard", None)
    select = None if shard is None else shard.selector(label or a.target or a.id, prop_id,
                                                         ctx.device)
    start = time.perf_counter()
    try:
        res = run_property(prop, _lifted(a, chosen), ctx, claimed=True, select=select,
                           skip_reason=reason)
    except Interrupted as exc:  # the property's result so far, written as any other
        if exc.result is not None:
            _finished(exc.result, a, ctx, start)
        raise
    return _finished(res, a, ctx, start)


def _finished(res, a: AttentionSpec, ctx, start: float):
    """``res`` with its seconds since ``start`` and its counterexample as an attention
    kernel's."""
    res.elapsed_s = time.perf_counter() - start
    _attention_counterexample(res, a, ctx)
    return res


def _attention_counterexample(res, a: AttentionSpec, ctx) -> None:
    """Large tensors by shape only; an attention property's repro rebuilds its recipe."""
    ce = res.counterexample
    if not ce:
        return
    for name in ("q", "k", "v", "attn_mask"):
        value = ce.get(name)
        if isinstance(value, list) and len(json.dumps(value)) > 8 * MAX_INLINE:
            ce[name] = {"inline": False, "note": "rebuilt from the recipe"}
    if (res.property in ATTENTION_PROPERTIES and isinstance(ce.get("recipe"), dict)
            and not ce.get("sequence")):  # with earlier calls: attnverify repro --attention
        ce["repro"] = repro_line(a, res.property, ce["recipe"])


def repro_line(a: AttentionSpec, prop_id: str, recipe: dict) -> str:
    """``python -m attnverify.attention.repro TARGET PROPERTY RECIPE``: exit 1 while it fails."""
    target = a.target or a.id
    ref = f" --reference {shlex.quote(a.reference)}" if a.reference else ""
    params = (f" --params {shlex.quote(json.dumps(a.params, sort_keys=True))}"
              if a.params else "")
    return (f"python -m attnverify.attention.repro {shlex.quote(target)} {prop_id} "
            f"{shlex.quote(json.dumps(recipe, sort_keys=True))}{ref}{params}")


