"""``matches_reference``: the normalizer computes the function it claims to be.

Every output-space and invariance property holds for a different function with the same output
space (a mis-scaled temperature, a constant added in the wrong place, an ignored parameter).
This check compares the weights (of the rows given in the case's layout) with a *reference*
evaluated in float64 on the same scores as one contiguous block (rounded to the case's dtype
first), at the same temperature and parameters, within the
tolerance of the case's dtype. Where the reference comes from, in order:

1. ``spec.reference``: a callable ``ref(scores, dim=-1, **params)``, a :class:`NormalizerSpec`
   or a target string (``certify --reference REF``, ``normalizer_spec(reference=...)``, the
   pytest plugin's ``--attnverify-reference``); every built-in carries its own float64 formula
   from :mod:`attnverify.normalizers.reference`;
2. else a declared kernel's general form ``F(z)/ΣF(z)``
   (:func:`attnverify.normalizers.reference.from_kernel`).

The reference gets the target's parameters that it accepts (its own defaults for the rest) and
the case's temperature; a reference without a ``temperature`` parameter is evaluated on ``z/T``.
Rows where the reference itself is not finite (a kernel that overflows) are not judged.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from functools import lru_cache

import torch
from hypothesis import strategies as st

from attnverify.checks import cases as C
from attnverify.checks.base import (
    NormalizerError,
    Violation,
    _diff_allowed,
    as_float64,
    close_mask,
    describe_dtype,
    mismatch_message,
    moved_by,
    rounded_scalings,
)
from attnverify.checks.layout import case_weights
from attnverify.jacobian import vjp
from attnverify.normalizers import reference as formulas
from attnverify.normalizers.reference import REFERENCES, from_kernel
from attnverify.registry import load_target
from attnverify.spec import NormalizerSpec, normalizer_spec

F64 = torch.float64
#: Adversarial kinds for float16 / bfloat16: every one, huge magnitudes included (the value
#: domain of a half type keeps its values and their sums finite: attnverify/strategies/domain.py).
LOW_KINDS = tuple(C.S.ALL_KINDS)


class ReferenceFailure(Exception):
    """The reference itself raised (a fault of the reference, not of the normalizer)."""


def reference_spec(spec: NormalizerSpec) -> NormalizerSpec | None:
    """The reference of ``spec`` as a spec (see the module docstring), or ``None``."""
    ref = spec.reference
    if ref is None and spec.kernel is not None:
        fn = from_kernel(spec.kernel)
        return normalizer_spec(fn, id=fn.__name__, params={"temperature": 1.0}, claims=(),
                               space="any")
    if ref is None:
        return None
    if isinstance(ref, NormalizerSpec):
        return ref
    if isinstance(ref, str):
        return _load(ref)
    if callable(ref):
        return normalizer_spec(ref, id=getattr(ref, "__name__", "reference"), claims=(),
                               space="any")
    raise TypeError(f"reference of {spec.id!r} is a {type(ref).__name__}: expected a callable, "
                    "a NormalizerSpec or a target string")


@lru_cache(maxsize=32)
def _load(target: str) -> NormalizerSpec:
    """A reference named by a target string, in this (the checker's) process: a built-in id is
    that normalizer's float64 formula (:data:`attnverify.normalizers.reference.REFERENCES`,
    written from its definition); anything else is loaded (a ``--reference`` given by the person
    who runs the check)."""

    name = target.strip()
    if name in REFERENCES:
        fn = REFERENCES[name]
        return normalizer_spec(fn, id=name, claims=(), space="any")

    return load_target(target)


def reference_owner(spec: NormalizerSpec) -> str | None:
    """Where the reference of ``spec`` runs: ``"target"`` when the target's own module declared
    it (a callable or spec of its own, or its kernel's general form: code under test, evaluated
    in the target's worker), ``"checker"`` for attnverify's formulas, a built-in or a
    ``--reference`` (evaluated here); ``None`` without a reference."""
    ref = spec.reference
    if ref is None:
        if spec.kernel is None:
            return None
        return "target" if _remote(spec.kernel.F) else "checker"
    fn = getattr(ref, "fn", ref)
    return "target" if _remote(fn) else "checker"


def _remote(fn) -> bool:
    return hasattr(fn, "channel")


def reference_label(spec: NormalizerSpec) -> str | None:
    """How the report names the reference of ``spec`` (``None``: it has none)."""
    ref = spec.reference
    if ref is None:
        if spec.kernel is None:
            return None
        own = " of the target's own kernel, F evaluated in its worker" if _remote(
            spec.kernel.F) else ""
        return f"kernel general form {spec.kernel.formula or 'F(z)/ΣF(z)'} (float64){own}"
    if isinstance(ref, str):
        return ref
    if isinstance(ref, NormalizerSpec):
        return ref.target or ref.id
    module = getattr(ref, "__module__", "") or ""
    name = getattr(ref, "__qualname__", getattr(ref, "__name__", type(ref).__name__))
    return f"{module}:{name}" if module else name


def needs_reference(spec: NormalizerSpec, ctx) -> str | None:
    if spec.reference is None and spec.kernel is None:
        return ("no reference: give --reference REF (or normalizer_spec(reference=...), "
                "--attnverify-reference)")
    return None


# --------------------------------------------------------------------------------------------
# Cases: every row kind and full dtype, plus float16 / bfloat16 when --dtypes asks


def reference_cases(spec, ctx):
    parts = [C.row_cases(spec, ctx)] if ctx.full_dtypes else []
    if ctx.low_dtypes:  # one unit of a float16 / bfloat16 run has no full dtype
        parts.append(C.row_cases(spec, ctx, kinds=LOW_KINDS, dtypes=ctx.low_dtypes))
    return parts[0] if len(parts) == 1 else st.one_of(*parts)


def reference_battery(spec, ctx):
    out = C.row_battery(spec, ctx) if ctx.full_dtypes else []
    if ctx.low_dtypes:
        out += C.row_battery(spec, ctx, kinds=LOW_KINDS, dtypes=ctx.low_dtypes, long=False)
    return out


# --------------------------------------------------------------------------------------------
# The check


def _accepts(ref: NormalizerSpec, name: str) -> bool:
    if name in ref.params:
        return True
    try:
        sig = inspect.signature(ref.fn)
    except (TypeError, ValueError):
        return False
    return name in sig.parameters or any(
        p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def evaluate_reference(spec: NormalizerSpec, ref: NormalizerSpec, scores: torch.Tensor,
                       temperature: float | None, *, graph: bool = False,
                       work: torch.dtype = F64) -> torch.Tensor:
    """The reference's weights in float64 for ``scores`` at ``spec``'s parameters (``graph``:
    differentiable in ``scores``, for the derivatives of :mod:`attnverify.checks.gradient`).
    ``work``: the precision the reference computes in (:func:`baseline_slack`)."""
    z, params = _reference_arguments(spec, ref, scores, temperature, work)
    try:
        with _precision(ref, work):
            out = ref(z, dim=-1, **params)
    except Exception as exc:  # noqa: BLE001 - the reference's fault, told apart
        raise ReferenceFailure(f"the reference {ref.target or ref.id!r} raised "
                               f"{NormalizerError(exc)}") from exc
    if graph:
        return torch.as_tensor(out).to(device="cpu", dtype=F64)
    return as_float64(torch.as_tensor(out))


def _reference_arguments(spec: NormalizerSpec, ref: NormalizerSpec, scores: torch.Tensor,
                         temperature: float | None, work: torch.dtype = F64):
    """``(scores in work, keyword arguments)`` of the reference's call on ``scores``: the
    target's parameters it accepts and the temperature (as ``z/T`` where it takes none);
    differentiable in ``scores``."""
    z = scores.to(work)
    params = {k: v for k, v in spec.params.items() if k != "temperature" and _accepts(ref, k)}
    t = temperature if temperature is not None else spec.params.get("temperature")
    if t is not None:
        if _accepts(ref, "temperature"):
            params["temperature"] = t
        elif t != 1.0:
            z = z / float(t)
    return z, params


def reference_vjps(spec: NormalizerSpec, ref: NormalizerSpec, xs: list, cotangent: torch.Tensor,
                   temperature: float | None) -> list | None:
    """``[(weights, gradient)]`` of the reference at each of ``xs`` (float64 rows): its
    float64 weights and the gradient of ``⟨cotangent, weights⟩`` with respect to the rows, as
    :func:`evaluate_reference` with ``graph`` and a backward pass give them, in one request
    where the reference is the target's own, evaluated in its worker (``None`` for one
    evaluated in this process). A point whose output carries no graph raises
    :class:`ReferenceFailure`, as one that raises."""
    many = getattr(getattr(ref, "fn", None), "many_vjp", None)
    if many is None:
        return None
    rows = [x.detach().clone().requires_grad_(True) for x in xs]
    with torch.enable_grad():
        args = [_reference_arguments(spec, ref, r, temperature) for r in rows]
    try:
        answers = many([z.detach() for z, _ in args], [cotangent] * len(args), dim=-1,
                       **{**ref.params, **(args[0][1] if args else {})})
    except Exception as exc:  # noqa: BLE001 - the reference's fault, told apart
        raise ReferenceFailure(f"the reference {ref.target or ref.id!r} raised "
                               f"{NormalizerError(exc)}") from exc
    out = []
    for r, (z, _), (y, g, graph) in zip(rows, args, answers):
        if not graph:
            raise ReferenceFailure("the reference carries no autograd graph")
        with torch.enable_grad():
            (grad,) = vjp(z, r, g.to(z.dtype))
        out.append((y.to(device="cpu", dtype=F64), grad))
    return out


def _precision(ref: NormalizerSpec, work: torch.dtype):
    """The built-in formulas (:mod:`attnverify.normalizers.reference`) evaluated in ``work``;
    any other reference gets its scores in ``work`` and computes as it does."""

    if work != F64 and getattr(ref, "fn", None) in formulas.REFERENCES.values():
        return formulas.precision(work)
    return contextlib.nullcontext()


#: A kernel may be this many times as far from the float64 reference as the same formula
#: evaluated plainly in the kernel's dtype (FlashAttention's tests hold a kernel to twice the
#: error of a plain implementation in the same dtype).
BASELINE_FACTOR = 2.0


def baseline_slack(spec, scores: torch.Tensor, temperature, want: torch.Tensor | None = None):
    """The same-precision baseline of the tolerance rule (docs/THEORY.md, "How close is
    close"): :data:`BASELINE_FACTOR` times how far the reference evaluated in the scores' own
    dtype (float32 for half types, rounded to the dtype at the end) lies from the reference in
    float64, elementwise (``want``: the float64 weights, when already computed). Zero in
    float64, where the baseline is not finite, and for a reference the target declared itself
    (code under test must not widen its own tolerance); ``None`` without a reference."""
    ref = reference_spec(spec)
    if ref is None:
        return None
    dtype = scores.dtype
    if want is None:
        want = evaluate_reference(spec, ref, scores, temperature)
    if dtype == F64 or reference_owner(spec) != "checker":
        return torch.zeros_like(want)
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    try:
        base = evaluate_reference(spec, ref, scores, temperature, work=work)
    except ReferenceFailure:
        return torch.zeros_like(want)
    base = as_float64(base.to(dtype)) if base.shape == want.shape else want
    gap = (base - want).abs()
    return BASELINE_FACTOR * torch.where(torch.isfinite(gap), gap, torch.zeros_like(gap))


def check_matches_reference(spec, case, ctx) -> float:
    """Weights within the dtype's tolerance of the float64 reference on the same scores, plus,
    below float64 at a temperature other than 1, what one rounding of the scaled logits to the
    dtype moves the reference (:func:`scaling_slack`)."""
    ref = reference_spec(spec)
    scores, dtype = case.scores, case.scores.dtype
    got = as_float64(case_weights(spec, case))
    want = evaluate_reference(spec, ref, scores, case.temperature)
    if want.shape != got.shape:
        raise Violation(f"the reference returned shape {tuple(want.shape)}, the normalizer "
                        f"{tuple(got.shape)}", observed=got.numel(), bound=want.numel(),
                        ratio=math.inf)
    judged = torch.isfinite(want).all(dim=-1)
    if not bool(judged.any()):
        return 0.0
    slack = scaling_slack(spec, ref, scores, case.temperature, want)
    ok, _ = close_mask(got[judged], want[judged], dtype, slack=slack[judged])
    if not ok:  # the baseline only where the plain rule does not already hold (its cost)
        slack = slack + baseline_slack(spec, scores, case.temperature, want)
    got, want, slack = got[judged], want[judged], slack[judged]
    ok, excess = close_mask(got, want, dtype, slack=slack)
    if not ok:
        worst = _worst_row(got, want, dtype, slack)
        bad = int(judged.nonzero().flatten()[worst])
        raise Violation(
            f"weights differ from the reference {reference_label(spec)} ({describe_dtype(dtype)}"
            f", T={case.temperature}): {mismatch_message(got, want, dtype, slack=slack)}; row "
            f"{bad}: got {_short(got[worst])}, reference {_short(want[worst])}",
            observed=excess, bound=1, ratio=excess, row=bad,
        )
    return excess


def scaling_slack(spec, ref, scores: torch.Tensor, temperature, want: torch.Tensor):
    """How far the reference moves when the scaled logits ``z/T`` are rounded once to the
    scores' dtype, as a kernel computing in that dtype must round them: ``|ref(z') − ref(z)|``
    elementwise over the scores of :func:`~attnverify.checks.base.rounded_scalings` (zero where
    there are none)."""
    t = temperature if temperature is not None else spec.params.get("temperature")
    return moved_by(want, [evaluate_reference(spec, ref, moved, temperature)
                           for moved in rounded_scalings(scores, t)])


def _worst_row(got, want, dtype, slack=None) -> int:
    diff, allowed = _diff_allowed(got, want, dtype, 1.0, slack)
    return int((diff / allowed).nan_to_num(math.inf).amax(-1).argmax())


def _short(row: torch.Tensor, limit: int = 6) -> str:
    values = ", ".join(f"{float(v):.6g}" for v in row[:limit])
    return f"[{values}{', …' if row.numel() > limit else ''}]"
