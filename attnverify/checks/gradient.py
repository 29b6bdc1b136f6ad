"""``gradient`` and ``double_backward``: the derivatives a normalizer reports are its derivatives.

Every bound on the Jacobian holds for a *wrong* backward that is smaller than the true one (a
halved gradient keeps ‖J‖₂ ≤ 1/(2T)), so the derivatives are compared with the function itself,
in float64, on short rows (masked keys included) at the case's temperature, the rows given in
the case's layout (rank, axis, view, slice, expanded axis, offset: a backward wrong only on a
view is caught):

- **reverse mode** ``⟨Jᵀu, v⟩`` (one ``backward`` with a random cotangent ``u``) against the
  **central difference** ``⟨u, (f(z + hv) − f(z − hv)) / 2h⟩`` along a random direction ``v``
  (zero on masked keys);
- **forward mode** ``⟨u, Jv⟩`` (``torch.func.jvp``) against both, where forward mode exists (a
  classic ``autograd.Function`` without ``jvp`` / ``setup_context`` has none: only reverse
  mode is checked, which is all ``.backward()`` uses).

``double_backward`` (claimable) does the same one order up: the reverse-mode derivative of
``⟨Jᵀu, w⟩`` along ``v`` against central differences of the gradient ``Jᵀu``.

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
differ from the central difference by ``1e-5`` of the derivatives' scale plus ``|d₊ − d₋|`` (the
curvature left in the segment), so an error of more than about 0.1% of ``D`` is caught.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from attnverify.checks import cases as C
from attnverify.checks.base import NoGraph, NormalizerError, Violation, as_float64, call
from attnverify.checks.layout import case_weights

F64 = torch.float64
NEG_INF = float("-inf")

#: Rows are short: the check is about the derivative's formula, not about scale.
GRADIENT_MAX_LENGTH = 16
GRADIENT_KINDS = tuple(k for k in C.S.ALL_KINDS if k != "huge_range")
#: Finite-difference step relative to min(T, max |z|), the scale on which the map bends.
STEP = 1e-5
#: Step multipliers tried in turn while the segment crosses a kink (smaller steps are rounding).
SHRINK = (1.0, 1e-2)
#: One-sided quotients further apart than this fraction of their size (or of the natural size
#: ``‖w‖‖v‖·max|F| / s`` of such a derivative): the segment crosses a kink.
KINK = 1e-3
#: Allowed disagreement of two derivatives, relative to their scale ‖Jᵀu‖‖v‖ + ‖u‖‖Jv‖.
RTOL = 1e-5
#: Rounding of a difference quotient: this many ulps of the largest weight, over h.
NOISE_ULPS = 16
#: Derivatives this small next to the natural scale ‖u‖‖v‖·max|f| / s (s = min(T, max|z|), the
#: scale on which the map bends) are rounding, whichever way they are computed.
FLOOR = 1e-8


def gradient_cases(spec, ctx):
    return C.row_cases(spec, ctx, kinds=GRADIENT_KINDS, dtypes=(F64,),
                       max_length=min(ctx.max_length, GRADIENT_MAX_LENGTH))


def gradient_battery(spec, ctx):
    return C.row_battery(spec, ctx, kinds=GRADIENT_KINDS, dtypes=(F64,), long=False)


def differentiable(spec, ctx) -> str | None:
    """Applies unless the normalizer takes float32 but not float64 scores (the derivatives are
    checked in float64). Whether it is differentiable at all is not decided here, on one input
    the target could recognise, but by every case of the property (:class:`NoGraph`): no graph
    on any of them is "not applicable", a graph on some and not on others a violation."""
    out = _probe(spec, F64)
    if isinstance(out, Exception) and isinstance(_probe(spec, torch.float32), Tensor):
        return f"the normalizer raises on float64 scores ({out}); derivatives are checked " \
               "in float64"
    return None  # it raises on everything: the check reports the error


def _probe(spec, dtype):
    z = torch.tensor([[0.3, -1.2, 0.8, 2.0]], dtype=dtype, requires_grad=True)
    try:
        with torch.enable_grad():
            return call(spec, z, 1.0 if spec.takes_temperature else None)
    except Exception as exc:  # noqa: BLE001 - reported by the caller
        return exc


# --------------------------------------------------------------------------------------------
# Central differences that step over no kink


class Difference(NamedTuple):
    """Per row: the central quotient ``⟨w, ΔF⟩/2h``, ``‖ΔF‖/2h``, the one-sided gap, the
    rounding floor, whether the row is judged (smooth segment found) and the step used."""

    central: Tensor
    norm: Tensor
    gap: Tensor
    noise: Tensor
    judged: Tensor
    step: Tensor


def _one_sided(f0, fp, fm, w, h):
    """``(d₊, d₋, gap, noise)`` of ``⟨w, f⟩`` per row for the step ``h``."""
    dp = (w * (fp - f0)).sum(-1) / h
    dm = (w * (f0 - fm)).sum(-1) / h
    top = torch.stack([f0.abs().amax(-1), fp.abs().amax(-1), fm.abs().amax(-1)]).amax(0)
    noise = NOISE_ULPS * torch.finfo(F64).eps * w.abs().sum(-1) * top / h
    return dp, dm, (dp - dm).abs(), noise


def _smooth(dp, dm, gap, noise, natural) -> Tensor:
    allowed = KINK * (dp.abs() + dm.abs() + natural) + noise
    return torch.isfinite(dp) & torch.isfinite(dm) & (gap <= allowed)


def _natural(f0: Tensor, w: Tensor, v: Tensor, step: Tensor) -> Tensor:
    """``‖w‖‖v‖·max|F(z)| / s`` per row (``s = step / STEP``): the size a derivative of ``⟨w, F⟩``
    along ``v`` has when nothing cancels."""
    norm = torch.linalg.vector_norm
    top = f0.abs().nan_to_num(0.0, 0.0, 0.0).amax(-1)
    return norm(w, dim=-1) * norm(v, dim=-1) * top / (step.squeeze(-1) / STEP)


def smooth_difference(F, z: Tensor, v: Tensor, w: Tensor, step: Tensor, guard=None) -> Difference:
    """Central differences of ``F`` (``x -> (values [B, L], zero pattern [B, L])``) along ``v``,
    paired with ``w``, on the first step of :data:`SHRINK` whose segment is smooth. ``guard``
    ``(g, u)``: the segment must be smooth for ``⟨u, g⟩`` too (the weights themselves, when
    ``F`` is their gradient: a kink of ``f`` at ``z`` is a jump of ``F`` that central
    differences of ``F`` alone can mistake for a large smooth derivative)."""
    f0, p0 = F(z)
    natural = _natural(f0, w, v, step)
    g0 = guard[0](z) if guard else None
    guard_natural = _natural(g0, guard[1], v, step) if guard else None
    rows = z.shape[0]
    out = {k: torch.zeros(rows, dtype=F64) for k in ("central", "norm", "gap", "noise", "step")}
    judged = torch.zeros(rows, dtype=torch.bool)
    for factor in SHRINK:
        h = step * factor  # [B, 1]
        fp, pp = F(z + h * v)
        fm, pm = F(z - h * v)
        hh = h.squeeze(-1)
        dp, dm, gap, noise = _one_sided(f0, fp, fm, w, hh)
        same = ~((pp != p0) | (pm != p0)).any(-1)
        ok = same & _smooth(dp, dm, gap, noise, natural) & ~judged
        # the same quotient at a 10× smaller step: a jump of F would grow it 10×
        fp2, pp2 = F(z + h * v / 10)
        fm2, pm2 = F(z - h * v / 10)
        dp2, dm2, _, noise2 = _one_sided(f0, fp2, fm2, w, hh / 10)
        drift = ((dp + dm) / 2 - (dp2 + dm2) / 2).abs()
        ok &= ~((pp2 != p0) | (pm2 != p0)).any(-1)
        ok &= _smooth((dp + dm) / 2, (dp2 + dm2) / 2, drift, noise2, natural)
        gap = torch.maximum(gap, drift)
        if guard:
            gp, gm = guard[0](z + h * v), guard[0](z - h * v)
            ok &= _smooth(*_one_sided(g0, gp, gm, guard[1], hh), guard_natural)
        norm = torch.linalg.vector_norm(fp - fm, dim=-1) / (2 * hh)
        new = {"central": (dp + dm) / 2, "norm": norm, "gap": gap, "noise": noise, "step": hh}
        for k, value in new.items():
            out[k] = torch.where(ok, value.nan_to_num(), out[k])
        judged |= ok
        if bool(judged.all()):
            break
    return Difference(out["central"], out["norm"], out["gap"], out["noise"], judged, out["step"])


def _step(z: Tensor, temperature: float | None) -> Tensor:
    live = z != NEG_INF
    scale = torch.where(live, z.abs(), 0.0).amax(-1, keepdim=True)
    scale = torch.where(scale > 0, scale, 1.0)
    return STEP * scale.clamp_max(1.0 if temperature is None else float(temperature))


def _directions(z: Tensor, seed: int, count: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(int(seed) + 17)
    live = (z != NEG_INF).to(F64)
    return [torch.randn(z.shape, generator=g, dtype=F64) * live for _ in range(count)]


def _weights_and_pattern(f):
    def F(x):
        y = as_float64(f(x))
        return y, y == 0

    return F


def _grad(out: Tensor, wrt: Tensor, cotangent: Tensor, **kw) -> Tensor:
    (g,) = torch.autograd.grad(out, wrt, cotangent, allow_unused=True, materialize_grads=True,
                               **kw)
    return g


# --------------------------------------------------------------------------------------------
# gradient


def _row_map(spec, case):
    """``[R, L]`` rows ↦ their weights, the rows given in the case's layout (every copy of an
    expanded axis reached: their mean), so that a derivative wrong only on a view is seen."""
    return lambda x: case_weights(spec, case, x, copies="mean")


def check_gradient(spec, case, ctx) -> float:
    """Reverse mode (and forward mode where it exists) against smooth central differences."""
    z = case.scores.detach().to(F64)
    f = _row_map(spec, case)
    u, v = _directions(z, case.seed, 2)
    with torch.enable_grad():
        zz = z.clone().requires_grad_(True)
        out = f(zz)
        if not out.requires_grad:
            raise NoGraph()
        try:
            grad = as_float64(_grad(out, zz, u.to(out.dtype)))
        except Exception as exc:  # noqa: BLE001 - the normalizer's backward failed
            raise NormalizerError(exc) from exc
    bad = ~torch.isfinite(grad)
    if bool(bad.any()):
        r, k = divmod(int(bad.flatten().nonzero()[0]), z.shape[-1])
        raise Violation(f"row {r}: the gradient is {float(grad[r, k])} at key {k} "
                        f"(score {float(z[r, k])})", observed=math.inf, bound=0, ratio=math.inf,
                        row=r)
    rev = (grad * v).sum(-1)
    fwd, jv_norm = _forward(f, z, v, u)
    step = _step(z, case.temperature)
    diff = smooth_difference(_weights_and_pattern(f), z, v, u, step)
    floor = _floor(as_float64(out.detach()), step, 1, u, v)
    return _compare(rev, fwd, diff, scale=_scale(grad, v, u, diff, jv_norm), floor=floor,
                    what="gradient")


def _floor(weights: Tensor, step: Tensor, order: int, *vectors: Tensor) -> Tensor:
    """:data:`FLOOR` times the natural size of an ``order``-th derivative paired with
    ``vectors``: ``Π‖vector‖ · max|f| / s^order`` per row."""
    size = weights.abs().nan_to_num(0.0, 0.0, 0.0).amax(-1)
    for vec in vectors:
        size = size * torch.linalg.vector_norm(vec, dim=-1)
    return FLOOR * size / (step.squeeze(-1) / STEP) ** order


def _forward(f, z, v, u) -> tuple[Tensor | None, Tensor | None]:
    """``⟨u, Jv⟩`` by forward mode and ``‖Jv‖``, or ``(None, None)`` without forward mode."""
    try:
        _, jv = torch.func.jvp(f, (z,), (v,))
    except Exception:  # noqa: BLE001 - no forward mode (classic autograd.Function)
        return None, None
    jv = as_float64(jv)
    return (u * jv).sum(-1), torch.linalg.vector_norm(jv, dim=-1)


def _scale(grad, v, u, diff: Difference, jv_norm) -> Tensor:
    norm = torch.linalg.vector_norm
    scale = norm(grad, dim=-1) * norm(v, dim=-1) + norm(u, dim=-1) * diff.norm
    return scale if jv_norm is None else scale + norm(u, dim=-1) * jv_norm


def _compare(rev: Tensor, fwd: Tensor | None, diff: Difference, *, scale: Tensor,
             floor: Tensor, what: str) -> float:
    """Raise on the worst judged row where two derivatives disagree; return the worst ratio."""
    slack = RTOL * scale + floor + torch.finfo(F64).tiny
    loose = slack + diff.gap + 2 * diff.noise
    pairs = [("reverse mode", rev, "central differences", diff.central, loose)]
    if fwd is not None:
        pairs += [("forward mode", fwd, "central differences", diff.central, loose),
                  ("reverse mode", rev, "forward mode", fwd, slack)]
    worst = 0.0
    for name_a, a, name_b, b, allowed in pairs:
        ratio = torch.where(diff.judged, ((a - b).abs() / allowed).nan_to_num(math.inf), 0.0)
        top = float(ratio.max()) if ratio.numel() else 0.0
        if top > 1:
            r = int(ratio.argmax())
            raise Violation(
                f"row {r}: the {what} by {name_a} is {float(a[r]):.9g} but {name_b} give "
                f"{float(b[r]):.9g} (random directions; step h={float(diff.step[r]):.2g}, "
                f"allowed difference {float(allowed[r]):.2g}; ratio {float(a[r] / b[r]):.4g})",
                observed=float(a[r]), bound=float(b[r]), ratio=top, row=r,
                judged_rows=int(diff.judged.sum()),
            )
        worst = max(worst, top)
    return worst


# --------------------------------------------------------------------------------------------
# double_backward


def check_double_backward(spec, case, ctx) -> float:
    """Grad of grad works and matches central differences of the gradient."""
    z = case.scores.detach().to(F64)
    f = _row_map(spec, case)
    u, v, w = _directions(z, case.seed, 3)
    with torch.enable_grad():
        zz = z.clone().requires_grad_(True)
        out = f(zz)
        if not out.requires_grad:
            raise NoGraph()
        first = _grad(out, zz, u.to(out.dtype), create_graph=True)
        if not first.requires_grad:
            raise Violation("the gradient carries no graph: backward is not differentiable",
                            observed=1, bound=0, ratio=math.inf)
        try:
            second = as_float64(_grad(first, zz, w.to(first.dtype)))
        except Exception as exc:  # noqa: BLE001 - a once-differentiable backward, say
            raise Violation(f"double backward raised {NormalizerError(exc)}", observed=1,
                            bound=0, ratio=math.inf) from exc
    rev = (second * v).sum(-1)

    def gradient_at(x):
        with torch.enable_grad():
            xx = x.clone().requires_grad_(True)
            y = f(xx)
            g = as_float64(_grad(y, xx, u.to(y.dtype)))
        return g.detach(), as_float64(y.detach()) == 0

    step = _step(z, case.temperature)
    weights = lambda x: as_float64(f(x))  # noqa: E731
    diff = smooth_difference(gradient_at, z, v, w, step, guard=(weights, u))
    norm = torch.linalg.vector_norm
    scale = norm(second, dim=-1) * norm(v, dim=-1) + norm(w, dim=-1) * diff.norm
    floor = _floor(as_float64(out.detach()), step, 2, u, v, w)
    return _compare(rev, None, diff, scale=scale, floor=floor,
                    what="derivative of ⟨Jᵀu, w⟩")
