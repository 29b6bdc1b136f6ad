"""Checks every normalizer must pass (docs/INTERFACES.md, "Universal"), and the claimable ones about
the output space and invariances. Each takes ``(spec, case, ctx)`` where ``case.scores`` is a
``[batch, L]`` tensor of rows (``-inf`` = masked), ``case.layout`` how the normalizer is given them
(:mod:`attnverify.checks.layout`) and ``case.temperature`` a float or ``None``. An input a check
derives from the case (keys masked, a row alone, …) is given in the case's layout too.
"""

from __future__ import annotations

import math

import torch

from attnverify.checks.base import (
    Violation,
    _diff_allowed,
    as_float64,
    close_mask,
    describe_dtype,
    mismatch_message,
    monitor_of,
    moved_by,
    rounded_scalings,
    sum_tolerance,
)
from attnverify.checks.layout import (
    call_view,
    case_weights,
    case_weights_many,
    given,
    given_many,
    layout_of,
    read,
    weights,
    where,
)
from attnverify.checks.reference import (
    baseline_slack,
    evaluate_reference,
    reference_owner,
    reference_spec,
)
from attnverify.coverage import note_shifts
from attnverify.jacobian import forward_mode, vjp
from attnverify.strategies import domain
from attnverify.strategies.layouts import collect, plain, present
from attnverify.tolerances import tol_for

NEG_INF = float("-inf")
#: Rows of a large batch that :func:`verify_batch_independent` computes alone: all of a batch of
#: at most this many, else the first, the last, those around chunk boundaries and a few more.
ALONE_ROWS = 8
#: Chunk sizes whose boundaries (and the rows either side) are among the rows computed alone.
CHUNKS = (32, 64, 128, 1024)
#: Very different rows mixed into a batch (as many as the batch has, up to this many).
MIXED_ROWS = 64
#: A batch of more entries than this (rows × row length) is compared with its rows alone only:
#: its reversed and mixed batches test how rows couple, which smaller batches test at a
#: fraction of the cost, while its rows alone test a kernel whose path depends on its size.
COUPLED_ENTRIES = 1 << 15


def _out(spec, case, scores=None):
    """The ``[R, L]`` weights of ``scores`` (default the case's) in the case's layout."""
    return case_weights(spec, case, scores)


def _live_rows(scores: torch.Tensor) -> torch.Tensor:
    """Rows with at least one unmasked key."""
    return (scores != NEG_INF).any(dim=-1)


def check_shape(spec, case, ctx) -> float:
    layout = layout_of(case)
    x, out = given(spec, case.scores, case.temperature, layout)
    if not isinstance(out, torch.Tensor):
        raise Violation(f"returned {type(out).__name__}, not a tensor{where(layout)}",
                        observed=1, bound=0, ratio=math.inf)
    if out.shape != x.shape or out.dtype != x.dtype:
        raise Violation(
            f"out.shape={tuple(out.shape)} dtype={describe_dtype(out.dtype)}, but should be "
            f"{tuple(x.shape)} {describe_dtype(x.dtype)}{where(layout)}",
            observed=out.numel(), bound=x.numel(), ratio=math.inf,
        )
    if out.device != x.device:
        raise Violation(f"output on {out.device}, input on {x.device}",
                        observed=1, bound=0, ratio=math.inf)
    return 0.0


def check_finite(spec, case, ctx) -> float:
    layout = layout_of(case)
    out = given(spec, case.scores, case.temperature, layout)[1]
    read(out, layout)  # a tensor of the input's shape
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        n = int(bad.sum())
        raise Violation(
            f"{n} / {out.numel()} weights are not finite (e.g. {float(out[bad][0])}) for finite "
            f"scores with max |score| = {float(case.scores.abs().max()):.3g}{where(layout)}",
            observed=n, bound=0, ratio=math.inf,
        )
    return 0.0


#: The calls of ``deterministic``, in order (``B`` is ``A`` with its keys permuted: new values in
#: the same shape, written into the very tensor call 1 was given; the other calls get new
#: storage).
INTERLEAVING = ("A", "B = A with its keys permuted, in A's storage", "A again", "B again")


def check_deterministic(spec, case, ctx) -> float:
    """Equal inputs give bitwise-equal weights whatever was called in between: the calls A, B,
    A, B (:data:`INTERLEAVING`, in the case's layout) give A's weights both times and B's both
    times, and B's weights are not A's weights returned again (an answer remembered from an
    earlier call of the same shape, the same address or the same tensor)."""
    layout = layout_of(case)
    scores = case.scores
    g = torch.Generator().manual_seed(int(case.seed) + 5)
    perm = torch.randperm(scores.shape[-1], generator=g).to(scores.device)
    other = scores[..., perm].contiguous()
    # one request: the worker makes the four calls in this order; call 2 reuses call 1's tensor
    raw = given_many(spec, [scores, other, scores, other], case.temperature, layout,
                     reuse={1: 0})
    first, second, third, fourth = (read(out, layout) for _, out in raw)
    order = list(INTERLEAVING)
    for a, b, i, j in ((first, third, 0, 2), (second, fourth, 1, 3)):
        if not torch.equal(a.nan_to_num(), b.nan_to_num()):
            diff = float((as_float64(a) - as_float64(b)).abs().nan_to_num(math.inf).max())
            raise Violation(
                f"call {j + 1} ({INTERLEAVING[j]}, in new storage) differs from call {i + 1} "
                f"({INTERLEAVING[i]}) by up to {diff:.3g}: the weights depend on what was "
                f"called before (bitwise equality expected; calls: {', '.join(order)})"
                f"{where(layout)}", observed=diff, bound=0, ratio=math.inf,
                interleaving=order, perm=perm.tolist()[:64])
    moved = not torch.equal(scores.nan_to_num(), other.nan_to_num())
    if moved and torch.equal(second.nan_to_num(), first.nan_to_num()):
        ok, _ = close_mask(second, first[..., perm], scores.dtype)
        if not ok:
            raise Violation(
                "call 2 (B: the keys of A permuted) returned exactly the weights of call 1 (A), "
                "which are not A's weights permuted: an answer remembered from an earlier call "
                f"(calls: {', '.join(order)}){where(layout)}", observed=1, bound=0,
                ratio=math.inf, interleaving=order, perm=perm.tolist()[:64])
    return 0.0


def check_no_mutation(spec, case, ctx) -> float:
    """The normalizer leaves its input unchanged: the entries of the view and those of the
    buffer around it (a slice's gaps, an offset's lead)."""
    layout = layout_of(case)
    x = present(case.scores.clone(), layout)
    memory = torch.as_strided(x, (layout.span,), (1,), 0)
    before = memory.clone()
    call_view(spec, x, case.temperature, layout)
    if not torch.equal(memory.nan_to_num(), before.nan_to_num()):
        changed = int((memory != before).sum())
        raise Violation(f"the input tensor was modified in place ({changed} entries of its "
                        f"storage changed){where(layout)}",
                        observed=changed, bound=0, ratio=math.inf)
    return 0.0


def check_permutation_equivariant(spec, case, ctx) -> float:
    scores = case.scores
    g = torch.Generator().manual_seed(int(case.seed) + 1)
    perm = torch.randperm(scores.shape[-1], generator=g).to(scores.device)
    base, got = case_weights_many(spec, case, [scores, scores[..., perm].contiguous()])
    want = base[..., perm]
    ok, excess = close_mask(got, want, scores.dtype)
    if not ok:
        raise Violation(
            f"f(z[perm]) != f(z)[perm]: {mismatch_message(got, want, scores.dtype)}",
            observed=excess, bound=1, ratio=excess, perm=perm.tolist()[:64],
        )
    return excess


def check_mask_zero(spec, case, ctx) -> float:
    """Mask some live keys of the case (at least one stays live per row), then
    :func:`verify_mask_zero` on that input."""
    scores = case.scores
    g = torch.Generator().manual_seed(int(case.seed) + 2)
    live = scores != NEG_INF
    pick = torch.rand(scores.shape, generator=g).to(scores.device) < 0.3
    pick &= live
    # keep at least one live key per row
    first_live = live.float().argmax(dim=-1, keepdim=True)
    pick.scatter_(-1, first_live, False)
    return verify_mask_zero(spec, case._replace(scores=scores.masked_fill(pick, NEG_INF)), ctx)


def verify_mask_zero(spec, case, ctx) -> float:
    """Every masked key of a row with a live key gets weight exactly 0, and the live keys get the
    weights of the row without the masked keys (rows with as many live keys go together, in the
    case's layout; of a batch of more than :data:`COUPLED_ENTRIES` entries, the rows
    :func:`alone_rows` picks)."""
    scores = case.scores
    masked = (scores == NEG_INF) & _live_rows(scores).unsqueeze(-1)
    out = _out(spec, case)
    leaked = out[masked]
    if leaked.numel() and bool((leaked != 0).any()):
        worst = float(leaked.abs().nan_to_num(math.inf).max())
        shown = float(leaked[leaked != 0][0])
        raise Violation(f"a masked key got weight {shown:.3g}, not exactly 0",
                        observed=worst, bound=0, ratio=math.inf, input=scores)
    excess = 0.0
    keep = ~masked
    kept = keep.sum(-1)
    judged = keep.any(-1) & ~keep.all(-1)
    if scores.numel() > COUPLED_ENTRIES:
        picked = torch.zeros_like(judged)
        picked[alone_rows(scores.shape[0], case.seed)] = True
        judged &= picked
    groups = []
    for count in sorted(set(kept[judged].tolist())):
        rows = (judged & (kept == count)).nonzero().flatten()
        pick = keep[rows]
        groups.append((count, rows, pick, scores[rows][pick].reshape(len(rows), count)))
    wanted = case_weights_many(spec, case, [g[3] for g in groups])  # one request
    for (count, rows, pick, _), want in zip(groups, wanted):
        got = out[rows][pick].reshape(len(rows), count)
        ok, ex = close_mask(got, want, scores.dtype)
        excess = max(excess, ex)
        if not ok:
            bad = _first_bad_row(got, want, scores.dtype)
            r = int(rows[bad])
            raise Violation(
                f"row {r}: weights with keys masked differ from the row without those keys: "
                f"{mismatch_message(got[bad:bad + 1], want[bad:bad + 1], scores.dtype)}",
                observed=ex, bound=1, ratio=ex, row=r,
                masked=masked[r].nonzero().flatten().tolist(), input=scores,
            )
    return excess


def check_batch_independent(spec, case, ctx) -> float:
    """:func:`verify_batch_independent` on the case's batch, then on a batch that mixes its rows
    with as many very different ones (scale 1e3; at most :data:`MIXED_ROWS`) at seeded
    positions: each row's weights there equal its weights in its own batch. Every input of the
    property goes to the worker in one request. A batch of more than :data:`COUPLED_ENTRIES`
    entries is compared with its rows alone only."""
    scores = case.scores
    if scores.numel() > COUPLED_ENTRIES:
        outs = _batch_outputs(spec, case, reverse=False)
        return _batch_verdict(outs, scores, case.seed)
    count = scores.shape[0]
    total = count + min(count, MIXED_ROWS)
    g = torch.Generator().manual_seed(int(case.seed) + 3)
    other = (torch.randn(total, scores.shape[-1], generator=g, dtype=torch.float64) * 1e3)
    mixed = other.to(scores.dtype).to(scores.device)
    at = torch.randperm(total, generator=g)[:count].sort().values.to(scores.device)
    mixed[at] = scores
    outs = _batch_outputs(spec, case, extra=[mixed])
    excess = _batch_verdict(outs, scores, case.seed)
    got = outs["extra"][0][at]
    out = outs["out"]
    ok, ex = close_mask(got, out, scores.dtype)
    if not ok:
        r = _first_bad_row(got, out, scores.dtype)
        raise Violation(
            f"row {r} inside a batch of {total} rows that mixes the case's rows with very "
            f"different ones (at row {int(at[r])}) differs from the same row in its own batch of "
            f"{count}: {mismatch_message(got[r:r + 1], out[r:r + 1], scores.dtype)}",
            observed=ex, bound=1, ratio=ex, row=r, input=mixed)
    return max(excess, ex)


def verify_batch_independent(spec, case, ctx, rows=None, out=None) -> float:
    """Rows computed alone (each of ``rows``; default all of a batch of up to
    :data:`ALONE_ROWS`, else :func:`alone_rows`), and the batch in reverse row order, give the
    weights of the same rows in the batch (``out``: those weights, when already computed)."""
    return _batch_verdict(_batch_outputs(spec, case, rows=rows, out=out), case.scores,
                          case.seed)


def _batch_outputs(spec, case, *, rows=None, out=None, extra=(), reverse=True) -> dict:
    """The weights :func:`verify_batch_independent` compares (and ``extra`` inputs), from one
    request: the batch, each row of ``rows`` alone, the batch in reverse row order (unless
    ``reverse`` is false)."""
    scores = case.scores
    count = scores.shape[0]
    picked = list(alone_rows(count, case.seed) if rows is None else rows)
    flip = count > 1 and rows is None and reverse
    inputs = ([] if out is not None else [scores]) + [scores[r : r + 1] for r in picked]
    inputs += ([scores.flip(0)] if flip else []) + list(extra)
    outs = case_weights_many(spec, case, inputs)
    if out is None:
        out, outs = outs[0], outs[1:]
    alone, outs = outs[:len(picked)], outs[len(picked):]
    flipped = outs.pop(0).flip(0) if flip else None
    return {"out": out, "rows": picked, "alone": alone, "flipped": flipped, "extra": outs}


def _batch_verdict(outs: dict, scores, seed) -> float:
    count, out = scores.shape[0], outs["out"]
    excess = 0.0
    for r, alone in zip(outs["rows"], outs["alone"]):
        ok, ex = close_mask(alone, out[r : r + 1], scores.dtype)
        excess = max(excess, ex)
        if not ok:
            raise Violation(
                f"row {r} computed alone differs from the same row in its batch of "
                f"{count}: {mismatch_message(alone, out[r:r + 1], scores.dtype)}",
                observed=ex, bound=1, ratio=ex, row=r, input=scores,
            )
    flipped = outs["flipped"]
    if flipped is not None:
        ok, ex = close_mask(flipped, out, scores.dtype)
        excess = max(excess, ex)
        if not ok:
            r = _first_bad_row(flipped, out, scores.dtype)
            raise Violation(
                f"row {r} of a batch of {count} differs when the batch is given in reverse row "
                f"order (it is then row {count - 1 - r}): "
                f"{mismatch_message(flipped[r:r + 1], out[r:r + 1], scores.dtype)}",
                observed=ex, bound=1, ratio=ex, row=r, input=scores)
    return excess


def alone_rows(count: int, seed: int = 0) -> list[int]:
    """The rows of a batch of ``count`` computed alone: every row up to :data:`ALONE_ROWS`;
    beyond, the first and the last row, the rows either side of the last boundary of each of
    :data:`CHUNKS` inside the batch (where a tail chunk starts) and a seeded one. (The batch in
    reverse row order moves every row to another chunk.)"""
    if count <= ALONE_ROWS:
        return list(range(count))
    picks = {0, count - 1}
    for chunk in CHUNKS:
        last = (count - 1) // chunk * chunk
        picks |= {last - 1, last} if 0 < last < count else set()
    g = torch.Generator().manual_seed(int(seed) + 5)
    picks |= set(torch.randint(0, count, (1,), generator=g).tolist())
    return sorted(r for r in picks if 0 <= r < count)


def _first_bad_row(got, want, dtype) -> int:
    """The first row where ``got`` and ``want`` differ beyond the tolerance."""
    diff, allowed = _diff_allowed(got, want, dtype, 1.0)
    ratio = (diff / allowed).nan_to_num(math.inf).amax(-1)
    return int((ratio > 1).nonzero().flatten()[0])


def check_layout_invariant(spec, case, ctx) -> float:
    """The weights of the case's rows given in its layout (rank, axis, memory layout; every
    copy along an expanded axis) equal, within the dtype's tolerance, the weights of the same
    rows given as one contiguous ``[R, L]`` block with ``dim=-1``."""
    layout = layout_of(case)
    if layout.plain:
        return 0.0
    scores = case.scores
    count, length = scores.shape
    want = weights(spec, scores, case.temperature, plain(count, length))
    out = given(spec, scores, case.temperature, layout)[1]
    read(out, layout)  # a tensor of the input's shape
    copies = collect(out, layout, copies="all")
    worst = 0.0
    for c in range(copies.shape[0]):
        ok, ex = close_mask(copies[c], want, scores.dtype)
        worst = max(worst, ex)
        if not ok:
            r = _first_bad_row(copies[c], want, scores.dtype)
            copy = f", copy {c} of {copies.shape[0]}" if copies.shape[0] > 1 else ""
            raise Violation(
                f"given as {layout.describe()}, the weights differ from those of the same rows "
                f"as one contiguous [{count}, {length}] block with dim=-1 (row {r}{copy}): "
                f"{mismatch_message(copies[c][r:r + 1], want[r:r + 1], scores.dtype)}",
                observed=ex, bound=1, ratio=ex, row=r, copy=c)
    return worst


def check_low_precision(spec, case, ctx) -> float:
    """Half-precision weights agree with the float64 weights of the same (rounded) scores,
    within the dtype's tolerance plus, at a temperature other than 1, what one rounding of the
    scaled logits ``z/T`` to the dtype moves the float64 weights (:func:`rounded_scalings`)."""
    scores, dtype = case.scores, case.scores.dtype
    moved = rounded_scalings(scores, case.temperature)
    out, want, *others = case_weights_many(spec, case, [scores, scores.to(torch.float64), *moved])
    slack = moved_by(as_float64(want), [as_float64(o) for o in others])
    ok, excess = close_mask(out, want, dtype, slack=slack)
    if not ok:
        raise Violation(
            f"{describe_dtype(dtype)} result vs float64 result of the same scores: "
            f"{mismatch_message(out, want, dtype, slack=slack)}",
            observed=excess, bound=1, ratio=excess,
        )
    return excess


# --------------------------------------------------------------------------------------------
# Output spaces


def _neg_check(out: torch.Tensor, dtype) -> None:
    lowest = float(out.min()) if out.numel() else 0.0
    if lowest < -tol_for(dtype).atol:
        raise Violation(f"negative weight {lowest:.3g}", observed=lowest, bound=0,
                        ratio=math.inf)


def _sum_check(out, scores, target_le: bool) -> float:
    live = _live_rows(scores)
    if not bool(live.any()):
        return 0.0
    sums = as_float64(out).sum(dim=-1)[live.cpu()]
    allowed = sum_tolerance(scores.dtype, scores.shape[-1])
    err = (sums - 1.0).clamp_min(0.0) if target_le else (sums - 1.0).abs()
    worst = float(err.max())
    if worst > allowed or math.isnan(worst):
        row = int(err.argmax())
        relation = "≤ 1" if target_le else "= 1"
        raise Violation(
            f"row sum {float(sums[row]):.10g} should be {relation} (allowed error {allowed:.2g})",
            observed=float(sums[row]), bound=1.0 + allowed, ratio=worst / allowed,
        )
    return worst / allowed


def check_simplex(spec, case, ctx) -> float:
    out = _out(spec, case)
    _neg_check(out, case.scores.dtype)
    return _sum_check(out, case.scores, target_le=False)


def check_sub_simplex(spec, case, ctx) -> float:
    out = _out(spec, case)
    _neg_check(out, case.scores.dtype)
    return _sum_check(out, case.scores, target_le=True)


def check_nonnegative(spec, case, ctx) -> float:
    _neg_check(_out(spec, case), case.scores.dtype)
    return 0.0


def check_affine_sum(spec, case, ctx) -> float:
    return _sum_check(_out(spec, case), case.scores, target_le=False)


#: Shifts tried after a failing one, each a tenth of the last (the failure is reported at the
#: smallest magnitude that still fails).
SHIFT_DECADES = 40


def shift_of(case) -> torch.Tensor:
    """The shifts ``c`` (``[R, 1]``, float64) ``shift_invariant`` adds to the case's rows: per
    row, a sign and a magnitude log-uniform over ``[1e-3, limit(dtype)]``
    (:mod:`attnverify.strategies.domain`), seeded by the case."""
    scores = case.scores
    g = torch.Generator().manual_seed(int(case.seed) + 4)
    lo, hi = -3.0, math.log10(domain.limit(scores.dtype))
    u = torch.rand(scores.shape[0], 2, generator=g, dtype=torch.float64)  # row i: u[i] alone
    sign = torch.where(u[:, 1:] < 0.5, -1.0, 1.0)
    scale = float(getattr(case, "shift_scale", 1.0) or 1.0)
    return sign * torch.pow(10.0, lo + (hi - lo) * u[:, :1]) * scale


def check_shift_invariant(spec, case, ctx) -> float:
    """f(z + c) = f(z) for a constant ``c`` per row drawn over the whole range of the dtype
    (:func:`shift_of`), the pair made exact (:func:`attnverify.strategies.domain.exact_shift`:
    both rows on the grid of the larger magnitude, so ``z + c`` is not rounded). Tolerance: the
    dtype's, plus the same-precision baseline of both rows (``checks.reference.baseline_slack``)
    and the rounding of ``z/T``; without a reference of the checker's, the dtype's tolerance
    grown with ``max|z + c|·eps/T`` (a kernel rounds the scores it scales). A failing shift is
    retried a tenth as large, and the smallest that still fails is reported."""
    c = shift_of(case)
    note_shifts(c)
    excess = _shift_verdict(spec, case, c)
    if isinstance(excess, Violation):
        failure, smaller = excess, case
        for _ in range(SHIFT_DECADES):
            smaller = smaller._replace(shift_scale=float(smaller.shift_scale) / 10.0)
            c = shift_of(smaller)
            if float(c.abs().max()) < 1e-3:
                break
            verdict = _shift_verdict(spec, smaller, c)
            if not isinstance(verdict, Violation):
                break
            failure = verdict
        raise failure
    return excess


def _shift_verdict(spec, case, c: torch.Tensor):
    """The ratio of ``f(a + c)`` vs ``f(a)`` (the pair of :func:`exact_shift`), or the
    :class:`Violation` (returned, not raised)."""
    scores = case.scores
    a, b, c = domain.exact_shift(scores, c)
    got, want = case_weights_many(spec, case, [b, a])
    t = case.temperature
    dtype = scores.dtype
    ok, excess = close_mask(got, want, dtype)
    if ok:  # within the dtype's tolerance: no allowance needed (nor its cost)
        return excess
    slack = _shift_slack(spec, a, b, t)
    if slack is None:
        top = float(torch.where(torch.isfinite(b), b.abs(), 0).max()) if b.numel() else 0.0
        scale = 1.0 + top * torch.finfo(dtype).eps / ((t or 1.0) * tol_for(dtype).rtol)
        ok, excess = close_mask(got, want, dtype, scale=scale)
        words = mismatch_message(got, want, dtype, scale) if not ok else ""
    else:
        ok, excess = close_mask(got, want, dtype, slack=slack)
        words = mismatch_message(got, want, dtype, slack=slack) if not ok else ""
    if ok:
        return excess
    r = _first_bad_row(got, want, dtype) if slack is None else _first_bad_row_slack(
        got, want, dtype, slack)
    return Violation(
        f"f(z + c) != f(z) (row {r}: c = {float(c[r]):.6g}, max |z| = "
        f"{_top(a[r]):.6g}; the shift is exact in {describe_dtype(dtype)}): {words}",
        observed=excess, bound=1, ratio=excess, shift=c.flatten().tolist()[:64], row=r,
        case=case._replace(scores=a))


def _top(row: torch.Tensor) -> float:
    finite = row[torch.isfinite(row)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def _shift_slack(spec, a, b, temperature):
    """The allowance on top of the dtype's tolerance: the baseline of both rows and the
    rounding of ``z/T`` (``None``: no reference of the checker's)."""
    ref = reference_spec(spec)
    if ref is None or reference_owner(spec) != "checker":
        return None
    total = None
    for x in (a, b):
        want = evaluate_reference(spec, ref, x, temperature)
        part = baseline_slack(spec, x, temperature, want) + moved_by(want, [
            evaluate_reference(spec, ref, m, temperature)
            for m in rounded_scalings(x, temperature)])
        total = part if total is None else total + part
    return total


def _first_bad_row_slack(got, want, dtype, slack) -> int:
    diff, allowed = _diff_allowed(got, want, dtype, 1.0, slack)
    ratio = (diff / allowed).nan_to_num(math.inf).amax(-1)
    return int((ratio > 1).nonzero().flatten()[0])


def check_order_preserving(spec, case, ctx) -> float:
    """z_i < z_j ⇒ α_i ≤ α_j and z_i = z_j ⇒ α_i = α_j over unmasked keys, within tolerance."""
    scores, out = case.scores, as_float64(_out(spec, case))
    z = as_float64(scores)
    order = torch.argsort(z, dim=-1, stable=True)
    zs, ws = z.gather(-1, order), out.gather(-1, order)
    t = tol_for(scores.dtype)
    allowed = t.atol + t.rtol * ws.abs()
    drop = (ws[..., :-1] - ws[..., 1:]) / allowed[..., 1:]
    tie = zs[..., :-1] == zs[..., 1:]
    ratio = torch.where(tie, drop.abs(), drop).nan_to_num(nan=math.inf)
    live = (zs[..., :-1] != NEG_INF) & (zs[..., 1:] != NEG_INF)  # masked keys are not ranked
    ratio = torch.where(live, ratio, torch.zeros_like(ratio))
    worst = float(ratio.max()) if ratio.numel() else 0.0
    if worst > 1:
        r, i = divmod(int(ratio.argmax()), ratio.shape[-1])
        a, b = int(order[r, i]), int(order[r, i + 1])
        raise Violation(
            f"row {r}: z[{a}]={float(z[r, a]):.6g} ≤ z[{b}]={float(z[r, b]):.6g} but "
            f"w[{a}]={float(out[r, a]):.6g} > w[{b}]={float(out[r, b]):.6g}",
            observed=worst, bound=1, ratio=worst,
        )
    return max(worst, 0.0)


def check_fully_masked_row(spec, case, ctx) -> float:
    """Mask every key of the first row, then :func:`verify_fully_masked_row` on that batch."""
    scores = case.scores.clone()
    scores[0] = NEG_INF
    return verify_fully_masked_row(spec, case._replace(scores=scores), ctx)


def verify_fully_masked_row(spec, case, ctx) -> float:
    """Every fully masked row returns all zeros and does not raise; the other rows equal the
    batch without the fully masked rows."""
    scores = case.scores
    live = _live_rows(scores)
    partial = bool(live.any()) and not bool(live.all())
    outs = case_weights_many(spec, case, [scores, scores[live]] if partial else [scores])
    out = outs[0]
    dead = out[~live]
    if not bool((dead == 0).all()):
        bad = dead[dead != 0]
        raise Violation(f"fully masked row gave {float(bad[0])} (all zeros expected)",
                        observed=float(bad.abs().nan_to_num(math.inf).max()), bound=0,
                        ratio=math.inf, input=scores)
    if partial:
        want = outs[1]
        ok, excess = close_mask(out[live], want, scores.dtype)
        if not ok:
            raise Violation("a fully masked row changed the other rows of the batch: "
                            + mismatch_message(out[live], want, scores.dtype),
                            observed=excess, bound=1, ratio=excess, input=scores)
    return 0.0


# --------------------------------------------------------------------------------------------
# Side effects (reported by the worker the target runs in: attnverify.worker.StateGuard)


def no_side_effects_applies(spec, ctx) -> str | None:
    if monitor_of(spec) is None:
        return ("the target runs in this process without attnverify's proxy: its side effects "
                "are not observed (certify, the pytest plugin and repro observe them)")
    return None


def recorded_cases(spec, ctx) -> list:
    """The inputs on which the worker saw a side effect earlier in the run (first here, so that
    the counterexample is the input that did it), each once."""
    monitor = monitor_of(spec)
    out, seen = [], set()
    for event in (monitor.effects if monitor is not None else []):
        case = event_case(event)
        if case is None:
            continue
        scores = case.scores
        key = (tuple(scores.shape), str(scores.dtype), scores.flatten()[:64].tolist().__repr__())
        if key in seen:
            continue
        seen.add(key)
        out.append(case)
    return out[:8]


def event_case(event):
    """The case a worker's report (:class:`attnverify.remote.Event`) is about, as a case a repro
    rebuilds: the case in flight with the scores of the call where they are its rows (a check
    that called the normaliser on rows it built, a single row say, gave those), else the case in
    flight itself (the call was on its rows in its layout); ``None`` without a case of rows."""
    case, scores = event.case, event.input
    if not hasattr(case, "_replace") or "scores" not in getattr(case, "_fields", ()):
        return None
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        return case  # the call was on the case's rows as its layout gives them
    if tuple(scores.shape) == tuple(case.scores.shape) and torch.equal(
            scores.nan_to_num(0.0, 1.0, -1.0), case.scores.nan_to_num(0.0, 1.0, -1.0)):
        return case
    fields = case._fields
    return case._replace(scores=scores, **({"layout": None} if "layout" in fields else {}))


#: How a write into an input is reported (:data:`attnverify.remote.MUTATED`; not imported:
#: the checks do not import the channel).
MUTATED = "the target wrote into its input"


def check_no_side_effects(spec, case, ctx) -> float:
    """:func:`verify_no_side_effects` on this case, and no side effect seen earlier in the run
    (in any property, by any request: forward, backward, forward mode)."""
    verify_no_side_effects(spec, case, ctx)
    monitor = monitor_of(spec)
    if monitor is not None and callable(getattr(monitor, "settle", None)):
        monitor.settle()  # earlier inputs read back again: a write after a call returned
    if monitor is not None and monitor.effects:
        event = monitor.effects[0]
        raise Violation(f"a call of the normalizer ({event.op} request, call {event.call} of the "
                        f"run) changed the global state: {event.what}"
                        f"{'' if event.what.startswith(MUTATED) else ' (the worker restored it)'}",
                        observed=len(monitor.effects), bound=0, ratio=math.inf,
                        changes=[e.what for e in monitor.effects[:8]], case=event_case(event))
    return 0.0


def verify_no_side_effects(spec, case, ctx) -> float:
    """Calling the normalizer on this case (forward; forward with grad and a backward pass;
    forward mode) leaves the global state a later call depends on as it was: grad mode, default
    dtype and device, deterministic algorithms, float32 matmul precision, thread count, anomaly
    mode, backend and rounding switches, the global random generator, and torch's public
    functions (:class:`attnverify.worker.StateGuard`)."""
    monitor = monitor_of(spec)
    if monitor is None:
        return 0.0
    start = len(monitor.effects)
    scores = case.scores
    _out(spec, case, scores.clone())
    if scores.is_floating_point():
        z = scores.detach().clone().to(torch.float64).requires_grad_(True)
        with torch.enable_grad():
            try:
                out = _out(spec, case, z)
                if out.requires_grad:
                    vjp(out, z, torch.ones_like(out), allow_unused=True)
            except Exception:  # noqa: BLE001 - no float64 or no backward: forward only
                pass
        try:
            forward_mode()
            torch.func.jvp(lambda x: _out(spec, case, x), (scores.detach().to(torch.float64),),
                           (torch.ones_like(scores, dtype=torch.float64),))
        except Exception:  # noqa: BLE001 - no forward mode
            pass
    new = monitor.effects[start:]
    if new:
        raise Violation(f"calling the normalizer ({new[0].op} request) changed the global "
                        f"state: {new[0].what} (the worker restored it)", observed=len(new),
                        bound=0, ratio=math.inf, changes=[e.what for e in new[:8]])
    return 0.0
