"""``gradient`` and ``double_backward``: the derivatives a normalizer reports are its derivatives.

Every bound on the Jacobian holds for a *wrong* backward that is smaller than the true one (a
halved gradient keeps ‖J‖₂ ≤ 1/(2T)), so the derivatives are compared with the function itself.
A unit runs per float32 / float64 of ``--dtypes``: the derivatives under test are those of that
dtype (a backward written for a float32 kernel is checked on float32 scores), on rows of masked
keys included, short ones mostly and now and then up to the profile's longest, in every layout
(rank, axis, view, slice, expanded axis, offset: a backward wrong only on a view, or past a block
of keys, is caught), at the case's temperature:

- **the values**: what the call returns with grad enabled (the graph's output) equals, within
  the dtype's tolerance, what the same call returns without grad, and so does the primal output
  of forward mode (a training path that returns other weights is a defect whatever its
  gradient);
- **reverse mode** ``⟨Jᵀu, v⟩`` (one ``backward`` with a random cotangent ``u``, nonzero on
  masked keys too, as in a model) against the **central difference**
  ``⟨u, (f(z + hv) − f(z − hv)) / 2h⟩`` along a random direction ``v`` (zero on masked keys:
  a ``-inf`` score cannot move);
- **every entry** of ``Jᵀu``: finite, and exactly 0 at every masked key (its weight is 0 around
  ``z``; a backward that returns NaN there, or passes the cotangent through, is a defect the
  differences along ``v`` cannot see);
- **forward mode** ``⟨u, Jv⟩`` (``torch.func.jvp``) against both, where forward mode exists (a
  classic ``autograd.Function`` without ``jvp`` / ``setup_context`` has none: only reverse
  mode is checked, which is all ``.backward()`` uses).

``double_backward`` (claimable) does the same one order up: the reverse-mode derivative of
``⟨Jᵀu, w⟩`` along ``v`` against central differences of the gradient ``Jᵀu`` (``u`` and ``w``
nonzero on masked keys; ``Jᵀu`` and that derivative finite and exactly 0 at masked keys).

**What the differences differentiate** (:func:`_source`). On float64 scores, the normalizer's own
float64 map. On float32 scores, the float32 derivatives are compared with central differences in
float64 of, in order: the normalizer's own float64 map where it takes these scores as float64;
else the reference (``matches_reference``'s, evaluated in float64); else its own float32 map, with
a step fit for float32 (:data:`COARSE`: ``h = 1e-2·s`` and a direction on the float32 grid, so
that every point differenced is exactly representable; it catches errors of about 1% of the
derivative and more).

**Kinks.** Sparsemax/entmax at a support boundary, exact ties at a ``max``/``min``, ReLU at 0 are
points where the map is not differentiable, and a difference quotient across such a point is not a
derivative. The step is ``h = 1e-5·min(T, max|z|)``; a row's difference is used only when the
segment ``[z − hv, z + hv]`` is smooth: the set of exact-zero weights is the same at ``z ± hv``,
``z ± hv/10`` and ``z``; the one-sided quotients ``d± = ±⟨u, f(z ± hv) − f(z)⟩/h`` agree to
``|d₊ − d₋| ≤ 1e-3·(|d₊| + |d₋| + D)`` plus rounding, ``D = ‖u‖‖v‖·max|f|/s`` the size such a
derivative has when nothing cancels (``s = min(T, max|z|)``); and the central quotient at
``h/10`` agrees with the one at ``h`` as closely (a jump, e.g. of the gradient at a tie, would
grow it 10×; for ``double_backward`` the weights must pass the one-sided test too). Otherwise
``h`` shrinks by 100× once; a row still on a kink is skipped (not judged). A judged row may
differ from the central difference by ``1e-5`` of the derivatives' scale (float32 derivatives:
:data:`RTOL`, plus their rounding, :data:`FLOOR`) plus ``|d₊ − d₋|`` (the curvature left in the
segment), so an error of more than about 0.1% of ``D`` is caught in float64; a float32 derivative
may also lose what underflows (values below float32's smallest normal number, :func:`_floor`).

**Too few rows judged.** A map whose values are noisy (or that answers the points around an
earlier input with noise, recognising finite-difference probes) makes every segment look like a
kink. An input on which fewer than half the rows that have something to judge (a live key; finite
values of the map at ``z``) are judged is :class:`Unjudged`, its few judged rows not compared
(noise can pass the smoothness tests by chance); decided over the unit, more than half its inputs
unjudged fail the property ("the derivative could not be judged …"). Kinks do not do that: every
built-in judges every row of its inputs but at exact ties of ``sa_softmax`` (at least 3/4 of its
inputs judged on every unit).

**Not applicable.** No decision is made on one fixed input: an output without a graph
(:class:`NoGraph`) or float64 scores refused while float32 ones are taken (:class:`NoFloat64`)
are judged over every case of the unit, not applicable when every case says so, violated when
only some do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from attnverify.checks import cases as C
from attnverify.checks.base import (
    NoFloat64,
    NoGraph,
    NormalizerError,
    Unjudged,
    Violation,
    _diff_allowed,
    as_float64,
    close_mask,
    describe_dtype,
    mismatch_message,
)
from attnverify.checks.layout import case_vjps_many, case_weights, case_weights_many
from attnverify.checks.reference import (
    ReferenceFailure,
    evaluate_reference,
    reference_label,
    reference_spec,
    reference_vjps,
)
from attnverify.coverage import note_judged
from attnverify.jacobian import forward_mode, vjp

F64 = torch.float64
F32 = torch.float32
NEG_INF = float("-inf")
EPS64 = torch.finfo(F64).eps

#: Rows of most Hypothesis cases are short: the check is about the derivative's formula …
GRADIENT_MAX_LENGTH = 16
#: … but one case in this many has rows up to the profile's longest (lengths that cross block
#: sizes, 2^k ± 1), and the battery has a few long rows and many-row cases per unit.
LONG_SHARE = 8
GRADIENT_KINDS = tuple(C.S.ALL_KINDS)
#: Explicit cases of each unit whose rows cross a block of keys (32, 128, 1024), in views (those
#: up to one key past the profile's longest row).
GRADIENT_LENGTHS = (
    C.Explicit(3, 33, False, ("transposed", 3, -1, False, 0), 41),
    C.Explicit(2, 129, True, (("strided", "offset"), 2, -1, False, 1), 42),
    C.Explicit(4, 1025, False, (("permuted", "expanded"), 4, -1, False, 2), 43),
)


class Precision(NamedTuple):
    """How central differences of a map computed in ``dtype`` are taken: the step ``h`` as a
    fraction of ``s = min(T, max|z|)``, the multipliers tried in turn while the segment
    crosses a kink, the ratio of the drift test's smaller step, and the one-sided quotients'
    largest disagreement (relative) on a smooth segment."""

    dtype: torch.dtype
    step: float
    shrink: tuple[float, ...]
    ratio: float
    kink: float


#: A map computed in float64 (the normalizer's own float64 forward, or the reference).
EXACT = Precision(F64, 1e-5, (1.0, 1e-2), 10.0, 1e-3)
#: The normalizer's own float32 forward (it raises on float64 scores and has no reference):
#: a step above float32's rounding, a direction on float32's grid (:func:`_on_grid`).
COARSE = Precision(F32, 1e-2, (1.0, 1 / 16), 16.0, 0.1)

#: Finite-difference step relative to min(T, max |z|), the scale on which the map bends.
STEP = EXACT.step
#: Step multipliers tried in turn while the segment crosses a kink (smaller steps are rounding).
SHRINK = EXACT.shrink
#: One-sided quotients further apart than this fraction of their size (or of the natural size
#: ``‖w‖‖v‖·max|F| / s`` of such a derivative): the segment crosses a kink.
KINK = EXACT.kink
#: Allowed disagreement of two derivatives, relative to their scale ‖Jᵀu‖‖v‖ + ‖u‖‖Jv‖, by the
#: dtype of the derivatives under test.
RTOL = {F64: 1e-5, F32: 1e-4}
#: Rounding of a difference quotient: this many ulps of the largest weight, over h.
NOISE_ULPS = 16
#: Derivatives this small next to the natural scale ‖u‖‖v‖·max|f| / s (s = min(T, max|z|), the
#: scale on which the map bends) are rounding, whichever way they are computed; in float32 this
#: grows with max|z| / s, how far rounding the scores (z/T inside the normalizer) moves the map.
FLOOR = {F64: 1e-8, F32: 1e-5}


def gradient_cases(spec, ctx):
    return C.row_cases(spec, ctx, kinds=GRADIENT_KINDS,
                       max_length=min(ctx.max_length, GRADIENT_MAX_LENGTH), long_share=LONG_SHARE)


def gradient_battery(spec, ctx):
    """Per unit: one case per kind (9 keys, in the next layouts), a low temperature, two long
    rows and three rows one key longer masked (:func:`attnverify.checks.cases.long_battery`),
    rows across blocks of keys (:data:`GRADIENT_LENGTHS`) and its share of the many-row cases
    (all of them when the run has one full dtype)."""
    dtypes = ctx.full_dtypes
    if not dtypes:
        return []
    dtype = dtypes[0]
    out = C.row_battery(spec, ctx, kinds=GRADIENT_KINDS, dtypes=(dtype,), long=False, many=False)
    kinds = C._kinds(spec, GRADIENT_KINDS, True)
    t = C.battery_temperature(spec, ctx)
    position, units = ctx.unit_position(dtype), len(ctx.all_full_dtypes)
    if position and spec.takes_temperature and ctx.temperature is None:
        rows = C.battery_rows("gaussian", length=12, batch=2, dtype=dtype, scale=3.0, seed=11,
                              device=ctx.device)
        out.append(C.RowCase(rows, 1e-3, "gaussian", 11,
                             C.battery_layout(spec, 2, 12, len(out) + position)))
    out += C.long_battery(spec, ctx, kinds=kinds, dtype=dtype, temperature=t, min_batch=1)
    many = C.BATTERY_MANY if units == 1 else C.BATTERY_MANY[position::units]
    lengths = tuple(e for e in GRADIENT_LENGTHS if e.length <= ctx.max_length + 1)
    out += C.explicit_cases(spec, ctx, lengths + tuple(many), kinds=kinds, dtype=dtype,
                            temperature=t)
    return out


# --------------------------------------------------------------------------------------------
# Central differences that step over no kink


class Difference(NamedTuple):
    """Per row: the central quotient ``⟨w, ΔF⟩/2h``, ``‖ΔF‖/2h``, the one-sided gap, the
    rounding floor, whether the row is judged (smooth segment found), the step used, and
    whether it could be judged at all (its points exact in the map's dtype)."""

    central: Tensor
    norm: Tensor
    gap: Tensor
    noise: Tensor
    judged: Tensor
    step: Tensor
    judgeable: Tensor


def _one_sided(f0, fp, fm, w, h, eps=EPS64):
    """``(d₊, d₋, gap, noise)`` of ``⟨w, f⟩`` per row for the step ``h``."""
    dp = (w * (fp - f0)).sum(-1) / h
    dm = (w * (f0 - fm)).sum(-1) / h
    top = torch.stack([f0.abs().amax(-1), fp.abs().amax(-1), fm.abs().amax(-1)]).amax(0)
    noise = NOISE_ULPS * eps * w.abs().sum(-1) * top / h
    return dp, dm, (dp - dm).abs(), noise


def _smooth(dp, dm, gap, noise, natural, kink=KINK) -> Tensor:
    allowed = kink * (dp.abs() + dm.abs() + natural) + noise
    return torch.isfinite(dp) & torch.isfinite(dm) & (gap <= allowed)


def _natural(f0: Tensor, w: Tensor, v: Tensor, step: Tensor, rel: float = STEP) -> Tensor:
    """``‖w‖‖v‖·max|F(z)| / s`` per row (``s = step / rel``): the size a derivative of ``⟨w, F⟩``
    along ``v`` has when nothing cancels."""
    norm = torch.linalg.vector_norm
    top = f0.abs().nan_to_num(0.0, 0.0, 0.0).amax(-1)
    return norm(w, dim=-1) * norm(v, dim=-1) * top / (step.squeeze(-1) / rel)


def smooth_difference(F, z: Tensor, v: Tensor, w: Tensor, step: Tensor, guard=None, *,
                      precision: Precision = EXACT, many=None, f0=None) -> Difference:
    """Central differences of ``F`` (``x -> (values [B, L], zero pattern [B, L])``, float64 in
    and out) along ``v``, paired with ``w``, on the first step of ``precision.shrink`` whose
    segment is smooth. ``many`` (``[x] -> [F(x)]``, one request for all) replaces ``F``;
    ``f0`` is ``F(z)`` when known. ``guard`` ``(g, u)``, ``g`` ``[x] -> [values]``: the segment
    must be smooth for ``⟨u, g⟩`` too (the weights themselves, when ``F`` is their gradient: a
    kink of ``f`` at ``z`` is a jump of ``F`` that central differences of ``F`` alone can
    mistake for a large smooth derivative)."""
    evaluate = many or (lambda xs: [F(x) for x in xs])
    eps, ratio = torch.finfo(precision.dtype).eps, precision.ratio
    # the first step's points are always evaluated: F(z) (and the guard's g(z)) go in the same
    # request as them
    h = step * precision.shrink[0]  # [B, 1]
    first = [z + h * v, z - h * v, z + h * v / ratio, z - h * v / ratio]
    if f0 is None:
        f0, *first = evaluate([z, *first])
    else:
        first = evaluate(first)
    f0, p0 = f0
    natural = _natural(f0, w, v, step, precision.step)
    g0, *guard_first = guard[0]([z, z + h * v, z - h * v]) if guard else [None]
    guard_natural = _natural(g0, guard[1], v, step, precision.step) if guard else None
    rows = z.shape[0]
    out = {k: torch.zeros(rows, dtype=F64) for k in ("central", "norm", "gap", "noise", "step")}
    judged = torch.zeros(rows, dtype=torch.bool)
    judgeable = _judgeable(z, v, step, precision, f0)
    for index, factor in enumerate(precision.shrink):
        h = step * factor  # [B, 1]
        (fp, pp), (fm, pm), (fp2, pp2), (fm2, pm2) = first if index == 0 else evaluate(
            [z + h * v, z - h * v, z + h * v / ratio, z - h * v / ratio])
        hh = h.squeeze(-1)
        dp, dm, gap, noise = _one_sided(f0, fp, fm, w, hh, eps)
        same = ~((pp != p0) | (pm != p0)).any(-1)
        ok = same & _smooth(dp, dm, gap, noise, natural, precision.kink) & ~judged & judgeable
        # the same quotient at a smaller step: a jump of F would grow it `ratio` times
        dp2, dm2, _, noise2 = _one_sided(f0, fp2, fm2, w, hh / ratio, eps)
        drift = ((dp + dm) / 2 - (dp2 + dm2) / 2).abs()
        ok &= ~((pp2 != p0) | (pm2 != p0)).any(-1)
        ok &= _smooth((dp + dm) / 2, (dp2 + dm2) / 2, drift, noise2, natural, precision.kink)
        gap = torch.maximum(gap, drift)
        if guard:
            gp, gm = guard_first if index == 0 else guard[0]([z + h * v, z - h * v])
            ok &= _smooth(*_one_sided(g0, gp, gm, guard[1], hh, eps), guard_natural,
                          precision.kink)
        norm = torch.linalg.vector_norm(fp - fm, dim=-1) / (2 * hh)
        new = {"central": (dp + dm) / 2, "norm": norm, "gap": gap, "noise": noise, "step": hh}
        for k, value in new.items():
            out[k] = torch.where(ok, value.nan_to_num(), out[k])
        judged |= ok
        if bool((judged | ~judgeable).all()):
            break
    return Difference(out["central"], out["norm"], out["gap"], out["noise"], judged,
                      out["step"], judgeable)


def _judgeable(z: Tensor, v: Tensor, step: Tensor, precision: Precision, f0: Tensor) -> Tensor:
    """Rows with something to judge: a direction not zero on every live key (a fully masked
    row has none), finite values of the map at ``z`` (a reference that abstains there) and, in
    float32, every point differenced exact in the map's dtype."""
    live = z != NEG_INF
    rows = ((v != 0) & live).any(-1) & torch.isfinite(f0).all(-1)
    if precision.dtype == F64:
        return rows
    for factor in precision.shrink:
        for m in (factor, factor / precision.ratio):
            for x in (z + step * m * v, z - step * m * v):
                exact = (x.to(precision.dtype).to(F64) == x) | ~live
                rows &= exact.all(-1)
    return rows


def _ulp32(x: Tensor) -> Tensor:
    """The spacing of float32 numbers at magnitude ``x`` (float64 in and out)."""
    _, exponent = torch.frexp(x)
    return torch.ldexp(torch.ones_like(x), (exponent - 24).clamp_min(-149))


def _ulp64(x: Tensor) -> Tensor:
    """The spacing of float64 numbers at magnitude ``x`` (float64 in and out)."""
    _, exponent = torch.frexp(x)
    return torch.ldexp(torch.ones_like(x), (exponent - 53).clamp_min(-1074))


#: A float64 direction's entries are whole multiples of at least this fraction of the smallest
#: step (a power of two): every point differenced is then ``z`` plus a whole number (below
#: ``2**45``) of a power of two, computed exactly (:func:`_on_grid`).
GRID_FLOOR = 2.0**-30
#: The largest relative error of a point's displacement ``(z ± h·m·v) − z`` from ``± h·m·v``
#: an entry of a float64 direction may keep (:func:`_on_grid`): far below :data:`RTOL` (the
#: product ``h·m·v`` itself rounds by about ``1e-16`` where ``z`` is 0).
STEP_ERROR = 1e-10


def _on_grid(z: Tensor, v: Tensor, step: Tensor, precision: Precision) -> Tensor:
    """``v`` moved to a direction whose every multiple the differences take (``h·m·v`` for
    ``m`` in ``precision.shrink`` and each over ``precision.ratio``) lands ``z`` on numbers of
    ``precision.dtype``: each entry a whole number of the dtype's spacing there. Entries too
    small for the grid become 0.

    float64 maps: the points ``z ± h·m·v`` are rounded to float64, and far from zero that
    rounding is no longer small next to ``h`` (``|z| = 1e8``, ``h = 1e-5``: a step error of
    ``eps·|z|/h ≈ 2e-3``, beyond the comparison's ``1e-5``), so the difference quotient
    would differentiate along another direction than ``v``. Here each entry of ``v`` is a
    whole number of the float64 spacing at ``|z| + 2h|v|`` (at least :data:`GRID_FLOOR` of the
    smallest step), and an entry whose points are not all ``z ± h·m·v`` within
    :data:`STEP_ERROR` (a point that crosses a power of two onto a coarser grid) is set to 0:
    every quotient is then along the very direction reverse mode is paired with. Where the
    spacing exceeds the smallest step (``eps·|z| ≳ 1e-3·h``) the entry becomes 0, and a row
    with no entry left has no resolution: it is not judged (:func:`_judgeable`), and counted
    (``judged_rows`` of the coverage)."""
    if precision.dtype == F64:
        return _on_grid64(z, v, step, precision)
    quantum = step * min(precision.shrink) / precision.ratio  # [B, 1]
    live = z != NEG_INF
    size = torch.where(live, z.abs(), 0.0) + 2 * step * v.abs()
    spacing = _ulp32(size)
    return torch.where(live, torch.round(v * quantum / spacing) * spacing / quantum, 0.0)


def _multipliers(precision: Precision) -> tuple[float, ...]:
    """The step multipliers the differences take: each of ``precision.shrink``, and each over
    ``precision.ratio`` (the drift test's smaller step)."""
    return tuple(m for f in precision.shrink for m in (f, f / precision.ratio))


def _on_grid64(z: Tensor, v: Tensor, step: Tensor, precision: Precision) -> Tensor:
    """:func:`_on_grid` for float64 maps."""
    smallest = min(_multipliers(precision))
    quantum = step * smallest  # [B, 1]
    live = z != NEG_INF
    size = torch.where(live, z.abs(), 0.0) + 2 * step * v.abs()
    least = torch.exp2(torch.floor(torch.log2(quantum))) * GRID_FLOOR
    spacing = torch.maximum(_ulp64(size), least)
    count = torch.where(live, torch.round(v * quantum / spacing), 0.0)
    out = count * spacing / quantum
    exact = torch.ones_like(live)
    for factor in precision.shrink:
        h = step * factor
        for m, point in ((1, h * out), (precision.ratio, h * out / precision.ratio)):
            whole = count * spacing * round(factor / m / smallest)  # a power of two times a
            for sign in (1.0, -1.0):                                 # whole number < 2**53
                x = z + point if sign > 0 else z - point
                exact &= ((x - z) - sign * whole).abs() <= STEP_ERROR * whole.abs()
    return torch.where(live & exact, out, 0.0)


def _step(z: Tensor, temperature: float | None, rel: float = STEP) -> Tensor:
    live = z != NEG_INF
    scale = torch.where(live, z.abs(), 0.0).amax(-1, keepdim=True)
    scale = torch.where(scale > 0, scale, 1.0)
    return rel * scale.clamp_max(1.0 if temperature is None else float(temperature))


def _directions(z: Tensor, seed: int, count: int, dtype=F64, *, every=()) -> list[Tensor]:
    """Random vectors, float64 holding values of ``dtype``, so that the products in ``dtype`` and
    the differences in float64 take the very same vectors: zero on masked keys (directions the
    scores move along: a ``-inf`` score cannot move), but those whose index is in ``every``
    (cotangents: in a model the gradient reaching a masked weight is not zero, and the gradient
    with respect to its masked score must be 0 all the same)."""
    g = torch.Generator().manual_seed(int(seed) + 17)
    live = (z != NEG_INF).to(F64)
    return [(torch.randn(z.shape, generator=g, dtype=F64) * (1.0 if i in every else live))
            .to(dtype).to(F64) for i in range(count)]


def _grad(out: Tensor, wrt: Tensor, cotangent: Tensor, **kw) -> Tensor:
    (g,) = vjp(out, wrt, cotangent, allow_unused=True, materialize_grads=True, **kw)
    return g


# --------------------------------------------------------------------------------------------
# What the differences differentiate


class Source(NamedTuple):
    """The map central differences take (:func:`_source`): ``weights`` ``[x] -> [(values,
    zero pattern)]`` (float64 rows in, float64 weights out), ``gradient(u)`` the same for the
    gradient ``Jᵀu``; ``own`` the normalizer's weights of the case without grad (in the
    case's dtype, as float64), ``f0`` ``weights(z)``; ``label`` what a message calls it."""

    precision: Precision
    weights: Callable
    gradient: Callable
    own: Tensor
    f0: tuple
    label: str


def _row_map(spec, case):
    """``[R, L]`` rows ↦ their weights, the rows given in the case's layout (every copy of an
    expanded axis reached: their mean), so that a derivative wrong only on a view is seen."""
    return lambda x: case_weights(spec, case, x, copies="mean")


def _pattern(y: Tensor) -> tuple[Tensor, Tensor]:
    return y, y == 0


def _own_weights(spec, case, dtype):
    """``[x] -> [(weights, zero pattern)]`` of the normalizer on ``x`` in ``dtype`` (no grad),
    in one request."""
    def weights(xs):
        with torch.no_grad():  # in this process too: the call "without grad" is one
            ys = case_weights_many(spec, case, [x.to(dtype) for x in xs], copies="mean")
        return [_pattern(as_float64(y)) for y in ys]

    return weights


def _own_gradient(spec, case, dtype):
    """``gradient(u)``: ``[x] -> [(Jᵀu at x, zero pattern of the weights at x)]`` of the
    normalizer on ``x`` in ``dtype`` (rows in the case's layout, as :func:`_row_map`), float64
    out: behind the process boundary every point in one request (:func:`case_vjps_many`),
    else a forward and a backward pass per point in this process."""
    f = _row_map(spec, case)

    def gradient(u):
        def at(xs):
            batched = case_vjps_many(spec, case, [x.detach().to(dtype) for x in xs], u,
                                     copies="mean")
            if batched is not None:
                for _, _, graph in batched:
                    _has_graph(graph)
                return [(as_float64(g), as_float64(y) == 0) for y, g, _ in batched]
            out = []
            for x in xs:
                with torch.enable_grad():
                    xx = x.detach().to(dtype, copy=True).requires_grad_(True)
                    y = f(xx)
                    _has_graph(y.requires_grad)
                    g = as_float64(_grad(y, xx, u.to(y.dtype)))
                out.append((g.detach(), as_float64(y.detach()) == 0))
            return out

        return at

    return gradient


def _has_graph(graph: bool) -> None:
    """A point near the case (``x ± hv``) whose output carries no graph, where the case's own
    output has one (checked first, :func:`_graph_output`): the derivative is lost there without
    a word, so central differences of the gradient would differentiate a zero map."""
    if not graph:
        raise Violation("the output carries no autograd graph at a point near this input "
                        "(where the input's own output has one): its gradient there is lost",
                        observed=1, bound=0, ratio=math.inf)


def _reference_maps(spec, case, ref):

    def weights(xs):
        return [_pattern(evaluate_reference(spec, ref, x, case.temperature)) for x in xs]

    def gradient(u):
        def at(xs):
            batched = reference_vjps(spec, ref, xs, u, case.temperature)
            if batched is not None:  # the target's own reference: one request
                return [(as_float64(g), y == 0) for y, g in batched]
            out = []
            for x in xs:
                with torch.enable_grad():
                    xx = x.detach().clone().requires_grad_(True)
                    y = evaluate_reference(spec, ref, xx, case.temperature, graph=True)
                    if not y.requires_grad:
                        raise ReferenceFailure("the reference carries no autograd graph")
                    g = as_float64(_grad(y, xx, u))
                out.append((g.detach(), as_float64(y) == 0))
            return out

        return at

    return weights, gradient


def _source(spec, case, dtype, z: Tensor, order: int = 1) -> Source:
    """What the derivatives in ``dtype`` are compared with (see the module docstring): the
    normalizer's own float64 map where it takes the case's scores as float64, else the
    reference (for ``order`` 2, one whose gradient can be taken), else its own float32 map
    (:data:`COARSE`)."""
    own64 = _own_weights(spec, case, F64)
    if dtype == F64:
        (f0,) = own64([z])
        return Source(EXACT, own64, _own_gradient(spec, case, F64), f0[0], f0,
                      "central differences")
    own = _own_weights(spec, case, dtype)
    try:
        (y, _), f0 = _both(spec, case, dtype, z)
    except NormalizerError:
        ((y, _),) = own([z])  # raises when the normalizer raises on the case's own dtype
        source = _reference_source(spec, case, z, y, order)
        if source is not None:
            return source
        return Source(COARSE, own, _own_gradient(spec, case, dtype), y, _pattern(y),
                      f"central differences of its own {describe_dtype(dtype)} weights (it "
                      "raises on these scores as float64 and has no reference to take them)")
    return Source(EXACT, own64, _own_gradient(spec, case, F64), y, f0,
                  "central differences of its float64 weights")


def _reference_source(spec, case, z: Tensor, own: Tensor, order: int) -> Source | None:
    """The reference as :func:`_source`'s map, or ``None`` where there is none, it raises on
    the case's scores or (``order`` 2) it carries no autograd graph."""

    ref = reference_spec(spec)
    if ref is None:
        return None
    weights, gradient = _reference_maps(spec, case, ref)
    try:
        (f0,) = weights([z])
        if order > 1:
            gradient((z != NEG_INF).to(F64))([z])
    except ReferenceFailure:
        return None
    return Source(EXACT, weights, gradient, own, f0,
                  f"central differences of the reference {reference_label(spec)} (the "
                  "normalizer raises on these scores as float64)")


def _both(spec, case, dtype, z):
    """``((weights in dtype, pattern), (float64 weights, pattern))`` of the case, one request."""
    with torch.no_grad():
        y, y64 = case_weights_many(spec, case, [z.to(dtype), z], copies="mean")
    return _pattern(as_float64(y)), _pattern(as_float64(y64))


# --------------------------------------------------------------------------------------------
# The checks' parts


def _graph_output(f, case, zz: Tensor):
    """``f(zz)`` with grad enabled; on float64 scores the normalizer refuses while it takes them
    as float32, :class:`NoFloat64` (decided over the unit); no graph: :class:`NoGraph`."""
    try:
        out = f(zz)
    except NormalizerError as exc:
        _no_float64(f, zz, exc)
        raise
    if not out.requires_grad:
        raise NoGraph()
    return out


def _output_and_gradient(spec, case, f, scores: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """The output with grad enabled (:func:`_graph_output`) and the gradient ``Jᵀu`` (float64)
    at the case's scores: behind the process boundary one request (:func:`case_vjps_many`),
    else (or where that request raised: whether the forward or the backward failed decides
    what the failure is) a forward and a backward pass."""
    try:
        batched = case_vjps_many(spec, case, [scores], u, copies="mean")
    except NormalizerError:
        batched = None
    if batched is not None:
        ((out, grad, graph),) = batched
        if not graph:
            raise NoGraph()
        return out, as_float64(grad)
    with torch.enable_grad():
        zz = scores.clone().requires_grad_(True)
        out = _graph_output(f, case, zz)
        try:
            grad = as_float64(_grad(out, zz, u.to(out.dtype)))
        except Exception as exc:  # noqa: BLE001 - the normalizer's backward failed
            raise NormalizerError(exc) from exc
    return out, grad


def _no_float64(f, zz: Tensor, exc: NormalizerError) -> None:
    """:class:`NoFloat64` when ``zz`` are float64 scores the normalizer refused (``exc``) while
    it takes them as float32 (decided over the unit); else nothing (``exc`` stands)."""
    if zz.dtype != F64:
        return
    with torch.no_grad():
        try:
            f(zz.detach().to(F32))
        except NormalizerError:
            return
    raise NoFloat64(str(exc)) from exc


def _same_values(got: Tensor, want: Tensor, dtype, how: str) -> None:
    """The weights a call returns ``how`` (with grad enabled, in forward mode) equal those of the
    same call without grad, within ``dtype``'s tolerance."""
    got = as_float64(got)
    if got.shape != want.shape:
        raise Violation(f"the weights it returns {how} have shape {tuple(got.shape)}, without "
                        f"grad {tuple(want.shape)}", observed=got.numel(), bound=want.numel(),
                        ratio=math.inf)
    ok, excess = close_mask(got, want, dtype)
    if ok:
        return
    diff, allowed = _diff_allowed(got, want, dtype, 1.0)
    r = int((diff / allowed).nan_to_num(math.inf).amax(-1).argmax())
    raise Violation(
        f"row {r}: the weights it returns {how} differ from those of the same call without "
        f"grad ({describe_dtype(dtype)}): {mismatch_message(got, want, dtype)}; {how}: "
        f"{_short(got[r])}, without grad: {_short(want[r])} (whatever its gradient, training "
        "would use weights the normalizer does not compute)",
        observed=excess, bound=1, ratio=excess, row=r)


def _short(row: Tensor, limit: int = 6) -> str:
    values = ", ".join(f"{float(x):.6g}" for x in row[:limit])
    return f"[{values}{', …' if row.numel() > limit else ''}]"


def _finite(grad: Tensor, z: Tensor, what: str = "the gradient (reverse mode, Jᵀu)",
            weights: Tensor | None = None) -> None:
    """Every entry of ``grad`` (``what``, one value per key) finite, and exactly 0 at every
    masked key: a ``-inf`` score moves no weight (its weight is 0 in a neighbourhood), so the
    derivative with respect to it is 0 whatever reaches the weights, never NaN, never a value the
    central differences (which cannot move a ``-inf`` score) would not see. A violation names
    the first key where it fails, its score and, when they are not finite, the row's weights."""
    bad = ~torch.isfinite(grad)
    if bool(bad.any()):
        r, k = divmod(int(bad.flatten().nonzero()[0]), z.shape[-1])
        note = ""
        if weights is not None and not bool(torch.isfinite(weights[r]).all()):
            note = f"; the weights of this row are {_short(weights[r])}"
        where = ("a masked key (score -inf), where the derivative must be exactly 0"
                 if float(z[r, k]) == NEG_INF else
                 "a key whose score is finite, where a derivative must be a finite number")
        raise Violation(f"row {r}: {what} is {float(grad[r, k])} at key {k} (score "
                        f"{float(z[r, k]):.6g}): {where}{note}",
                        observed=math.inf, bound=0, ratio=math.inf, row=r, key=k)
    bad = (z == NEG_INF) & (grad != 0)
    if bool(bad.any()):
        r, k = divmod(int(bad.flatten().nonzero()[0]), z.shape[-1])
        masked = int((z[r] == NEG_INF).sum())
        raise Violation(f"row {r}: {what} is {float(grad[r, k]):.6g} at masked key {k} (score "
                        f"-inf; {masked} of the row's {z.shape[-1]} keys masked), not exactly 0: "
                        "a masked score moves no weight, whatever gradient reaches its weight",
                        observed=abs(float(grad[r, k])), bound=0, ratio=math.inf, row=r, key=k)


def _require_judged(diff: Difference, what: str) -> None:
    """:class:`Unjudged` when fewer than half the rows that could be judged were."""
    judgeable, judged = int(diff.judgeable.sum()), int(diff.judged.sum())
    if judgeable and 2 * judged < judgeable:
        raise Unjudged(
            f"the {what} could not be judged on {judgeable - judged} of the {judgeable} rows "
            "of this input: the difference quotients disagree at every step tried, so the "
            "map's values are noisy, or not smooth, where a smooth map is expected",
            judged=judged, rows=judgeable)


# --------------------------------------------------------------------------------------------
# gradient


def check_gradient(spec, case, ctx) -> float:
    """The values with grad as without; reverse mode (and forward mode where it exists) against
    smooth central differences."""
    scores = case.scores.detach()
    dtype = scores.dtype
    z = as_float64(scores)
    f = _row_map(spec, case)
    u, v = _directions(z, case.seed, 2, dtype, every=(0,))
    out, grad = _output_and_gradient(spec, case, f, scores, u)
    _finite(grad, z)
    source = _source(spec, case, dtype, z)
    _same_values(out, source.own, dtype, "with grad enabled")
    step = _step(z, case.temperature, source.precision.step)
    v = _on_grid(z, v, step, source.precision)
    rev = (grad * v).sum(-1)
    fwd, jv_norm, primal = _forward(f, scores, v, u, z, source.own)
    if primal is not None:
        _same_values(primal, source.own, dtype, "in forward mode (torch.func.jvp)")
    diff = smooth_difference(None, z, v, u, step, precision=source.precision,
                             many=source.weights, f0=source.f0)
    floor = _floor(source.own, step, 1, dtype, z, source.precision, u, v)
    _note_judged(diff, z, source.f0[0], step, dtype, source.precision)
    # a row judged where most are not may have passed the smoothness tests by chance (noisy
    # values): such an input is decided with the unit's others, not on that row
    _require_judged(diff, "gradient")
    return _compare(rev, fwd, diff, scale=_scale(grad, v, u, diff, jv_norm), floor=floor,
                    what="gradient", dtype=dtype, source=source.label,
                    exact=source.precision is EXACT)


def _floor(weights: Tensor, step: Tensor, order: int, dtype, z: Tensor, precision: Precision,
           *vectors: Tensor) -> Tensor:
    """:data:`FLOOR` of ``dtype`` times the natural size of an ``order``-th derivative paired
    with ``vectors``: ``Π‖vector‖ · max|f| / s^order`` per row (in float32, times
    ``1 + max|z|/s``: rounding the scores moves the point by that many ulps of ``s``), plus
    what underflow loses: ``Π‖vector‖ · tiny / s^order``, ``tiny`` the dtype's smallest normal
    number (a float32 weight of ``e^-200`` is 0, and so is its derivative, where the float64
    differences give ``1e-87``)."""
    norms = torch.ones(z.shape[0], dtype=F64)
    for vec in vectors:
        norms = norms * torch.linalg.vector_norm(vec, dim=-1)
    size = weights.abs().nan_to_num(0.0, 0.0, 0.0).amax(-1) * norms
    s = step.squeeze(-1) / precision.step
    floor = FLOOR[dtype] * size / s ** order
    if dtype != F64:
        top = torch.where(z != NEG_INF, z.abs(), 0.0).amax(-1)
        floor = floor * (1 + top / s)
    return floor + torch.finfo(dtype).tiny * norms / s ** order


def _resolved(z: Tensor, step: Tensor, dtype, precision: Precision) -> Tensor:
    """Rows whose float32 allowance (:func:`_floor`'s ``FLOOR·(1 + max|z|/s)``) stays below
    the derivative's own size: past ``max|z|/s ≈ 1/FLOOR`` rounding the scores moves the map
    as much as the derivative itself, and such a row is compared but not counted as judged."""
    if dtype == F64:
        return torch.ones(z.shape[0], dtype=torch.bool)
    top = torch.where(z != NEG_INF, z.abs(), 0.0).amax(-1)
    s = step.squeeze(-1) / precision.step
    return FLOOR[dtype] * (1 + top / s) < 1


def _note_judged(diff: Difference, z: Tensor, f0: Tensor, step: Tensor, dtype,
                 precision: Precision) -> None:
    """Count in the coverage the rows with something to judge (a live key, finite values of
    the map) and those judged: a smooth segment found, the direction not rounded away (a
    float64 row far from zero whose spacing exceeds the smallest step,
    :func:`_on_grid`) and the allowance below the derivative's size (:func:`_resolved`)."""
    rows = (z != NEG_INF).any(-1) & torch.isfinite(f0).all(-1)
    judged = rows & diff.judged & _resolved(z, step, dtype, precision)
    note_judged(int(judged.sum()), int(rows.sum()))


def _forward(f, z, v, u, z64: Tensor | None = None, weights: Tensor | None = None
             ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """``⟨u, Jv⟩`` by forward mode, ``‖Jv‖`` and the primal output, or ``(None, None, None)``
    without forward mode; a ``Jv`` that is not finite at some key is a :class:`Violation`
    naming the key (given ``z64``, the scores in float64)."""
    try:
        forward_mode()
        primal, jv = torch.func.jvp(f, (z,), (v.to(z.dtype),))
    except Exception:  # noqa: BLE001 - no forward mode (classic autograd.Function)
        return None, None, None
    jv = as_float64(jv)
    if z64 is not None:
        _finite(jv, z64, "the derivative by forward mode (torch.func.jvp, J·v)", weights)
    return (u * jv).sum(-1), torch.linalg.vector_norm(jv, dim=-1), primal


def _scale(grad, v, u, diff: Difference, jv_norm) -> Tensor:
    norm = torch.linalg.vector_norm
    scale = norm(grad, dim=-1) * norm(v, dim=-1) + norm(u, dim=-1) * diff.norm
    return scale if jv_norm is None else scale + norm(u, dim=-1) * jv_norm


def _compare(rev: Tensor, fwd: Tensor | None, diff: Difference, *, scale: Tensor,
             floor: Tensor, what: str, dtype=F64, source: str = "central differences",
             exact: bool = True) -> float:
    """Raise on the worst judged row where two derivatives disagree; return the worst ratio.
    Forward mode is compared with the differences only along an exact direction (a direction
    on float32's grid is paired with reverse mode alone, and forward mode with reverse)."""
    slack = RTOL[dtype] * scale + floor + torch.finfo(F64).tiny
    loose = slack + diff.gap + 2 * diff.noise
    pairs = [("reverse mode", rev, source, diff.central, loose, diff.judged)]
    if fwd is not None:
        if exact:
            pairs.append(("forward mode", fwd, source, diff.central, loose, diff.judged))
        pairs.append(("reverse mode", rev, "forward mode", fwd, slack,
                      torch.ones_like(diff.judged)))
    worst = 0.0
    for name_a, a, name_b, b, allowed, rows in pairs:
        ratio = torch.where(rows, ((a - b).abs() / allowed).nan_to_num(math.inf), 0.0)
        top = float(ratio.max()) if ratio.numel() else 0.0
        if top > 1:
            r = int(ratio.argmax())
            if not (math.isfinite(float(a[r])) and math.isfinite(float(b[r]))):
                nan, other = (name_a, name_b) if not math.isfinite(float(a[r])) else \
                    (name_b, name_a)
                value = float(a[r]) if nan == name_a else float(b[r])
                raise Violation(
                    f"row {r}: the {what} by {nan} is {value}, not a number, where {other} "
                    f"give{'s' if other == 'forward mode' else ''} "
                    f"{float(b[r]) if nan == name_a else float(a[r]):.9g} "
                    f"({describe_dtype(dtype)}; random directions): a derivative must be "
                    "finite where the scores are",
                    observed=math.inf, bound=0, ratio=math.inf, row=r,
                    judged_rows=int(diff.judged.sum()))
            raise Violation(
                f"row {r}: the {what} by {name_a} is {float(a[r]):.9g} but {name_b} give"
                f"{'s' if name_b == 'forward mode' else ''} {float(b[r]):.9g} "
                f"({describe_dtype(dtype)}; random directions; step h={float(diff.step[r]):.2g}"
                f", allowed difference {float(allowed[r]):.2g}; ratio {float(a[r] / b[r]):.4g})",
                observed=float(a[r]), bound=float(b[r]), ratio=top, row=r,
                judged_rows=int(diff.judged.sum()),
            )
        worst = max(worst, top)
    return worst


# --------------------------------------------------------------------------------------------
# double_backward


def check_double_backward(spec, case, ctx) -> float:
    """Grad of grad works and matches central differences of the gradient."""
    scores = case.scores.detach()
    dtype = scores.dtype
    z = as_float64(scores)
    f = _row_map(spec, case)
    u, v, w = _directions(z, case.seed, 3, dtype, every=(0, 2))
    with torch.enable_grad():
        zz = scores.clone().requires_grad_(True)
        out = _graph_output(f, case, zz)
        try:
            first = _grad(out, zz, u.to(out.dtype), create_graph=True)
        except Exception as exc:  # noqa: BLE001 - the normalizer's backward failed
            raise NormalizerError(exc) from exc
        if not first.requires_grad:
            raise Violation("the gradient carries no graph: backward is not differentiable",
                            observed=1, bound=0, ratio=math.inf)
        _finite(as_float64(first.detach()), z)
        try:
            second = as_float64(_grad(first, zz, w.to(first.dtype)))
        except Exception as exc:  # noqa: BLE001 - a once-differentiable backward, say
            raise Violation(f"double backward raised {NormalizerError(exc)}", observed=1,
                            bound=0, ratio=math.inf) from exc
    _finite(second, z, "the derivative of ⟨Jᵀu, w⟩")
    source = _source(spec, case, dtype, z, order=2)
    _same_values(out, source.own, dtype, "with grad enabled")
    step = _step(z, case.temperature, source.precision.step)
    v = _on_grid(z, v, step, source.precision)
    rev = (second * v).sum(-1)

    def weights(xs):
        return [y for y, _ in source.weights(xs)]

    diff = smooth_difference(None, z, v, w, step, guard=(weights, u),
                             precision=source.precision, many=source.gradient(u))
    norm = torch.linalg.vector_norm
    scale = norm(second, dim=-1) * norm(v, dim=-1) + norm(w, dim=-1) * diff.norm
    floor = _floor(source.own, step, 2, dtype, z, source.precision, u, v, w)
    _note_judged(diff, z, source.f0[0], step, dtype, source.precision)
    _require_judged(diff, "derivative of the gradient")
    return _compare(rev, None, diff, scale=scale, floor=floor,
                    what="derivative of ⟨Jᵀu, w⟩", dtype=dtype, source=source.label)
