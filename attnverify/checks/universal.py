"""Checks every normalizer must pass (docs/INTERFACES.md, "Universal"), and the claimable ones about
the output space and invariances. Each takes ``(spec, case, ctx)`` where ``case.scores`` is a
``[batch, L]`` tensor (``-inf`` = masked) and ``case.temperature`` a float or ``None``.
"""

from __future__ import annotations

import math

import torch

from attnverify.checks.base import (
    Violation,
    as_float64,
    call,
    call_many,
    close_mask,
    describe_dtype,
    mismatch_message,
    monitor_of,
    sum_tolerance,
)
from attnverify.tolerances import tol_for

NEG_INF = float("-inf")


def _out(spec, case, scores=None):
    return call(spec, case.scores if scores is None else scores, case.temperature)


def _live_rows(scores: torch.Tensor) -> torch.Tensor:
    """Rows with at least one unmasked key."""
    return (scores != NEG_INF).any(dim=-1)


def check_shape(spec, case, ctx) -> float:
    out = _out(spec, case)
    if not isinstance(out, torch.Tensor):
        raise Violation(f"returned {type(out).__name__}, not a tensor", observed=1, bound=0,
                        ratio=math.inf)
    if out.shape != case.scores.shape or out.dtype != case.scores.dtype:
        raise Violation(
            f"out.shape={tuple(out.shape)} dtype={describe_dtype(out.dtype)}, but should be "
            f"{tuple(case.scores.shape)} {describe_dtype(case.scores.dtype)}",
            observed=out.numel(), bound=case.scores.numel(), ratio=math.inf,
        )
    if out.device != case.scores.device:
        raise Violation(f"output on {out.device}, input on {case.scores.device}",
                        observed=1, bound=0, ratio=math.inf)
    return 0.0


def check_finite(spec, case, ctx) -> float:
    out = _out(spec, case)
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        n = int(bad.sum())
        raise Violation(
            f"{n} / {out.numel()} weights are not finite (e.g. {float(out[bad][0])}) for finite "
            f"scores with max |score| = {float(case.scores.abs().max()):.3g}",
            observed=n, bound=0, ratio=math.inf,
        )
    return 0.0


#: The calls of ``deterministic``, in order (``B`` is ``A`` with its keys permuted: new values in
#: the same shape, written into the very tensor call 1 was given; the other calls get new
#: storage).
INTERLEAVING = ("A", "B = A with its keys permuted, in A's storage", "A again", "B again")


def check_deterministic(spec, case, ctx) -> float:
    """Equal inputs give bitwise-equal weights whatever was called in between: the calls A, B,
    A, B (:data:`INTERLEAVING`) give A's weights both times and B's both times, and B's weights
    are not A's weights returned again (an answer remembered from an earlier call of the same
    shape, the same address or the same tensor)."""
    scores = case.scores
    g = torch.Generator().manual_seed(int(case.seed) + 5)
    perm = torch.randperm(scores.shape[-1], generator=g).to(scores.device)
    other = scores[..., perm].contiguous()
    # one request: the worker makes the four calls in this order; call 2 reuses call 1's tensor
    first, second, third, fourth = call_many(spec, [scores, other, scores, other],
                                             case.temperature, reuse={1: 0})
    order = list(INTERLEAVING)
    for a, b, i, j in ((first, third, 0, 2), (second, fourth, 1, 3)):
        if not torch.equal(a.nan_to_num(), b.nan_to_num()):
            diff = float((as_float64(a) - as_float64(b)).abs().nan_to_num(math.inf).max())
            raise Violation(
                f"call {j + 1} ({INTERLEAVING[j]}, in new storage) differs from call {i + 1} "
                f"({INTERLEAVING[i]}) by up to {diff:.3g}: the weights depend on what was "
                f"called before (bitwise equality expected; calls: {', '.join(order)})",
                observed=diff, bound=0, ratio=math.inf, interleaving=order,
                perm=perm.tolist()[:64])
    moved = not torch.equal(scores.nan_to_num(), other.nan_to_num())
    if moved and torch.equal(second.nan_to_num(), first.nan_to_num()):
        ok, _ = close_mask(second, first[..., perm], scores.dtype)
        if not ok:
            raise Violation(
                "call 2 (B: the keys of A permuted) returned exactly the weights of call 1 (A), "
                "which are not A's weights permuted: an answer remembered from an earlier call "
                f"(calls: {', '.join(order)})", observed=1, bound=0, ratio=math.inf,
                interleaving=order, perm=perm.tolist()[:64])
    return 0.0


def check_no_mutation(spec, case, ctx) -> float:
    scores = case.scores.clone()
    before = scores.clone()
    _out(spec, case, scores)
    if not torch.equal(scores.nan_to_num(), before.nan_to_num()):
        changed = int((scores != before).sum())
        raise Violation(f"the input tensor was modified in place ({changed} entries changed)",
                        observed=changed, bound=0, ratio=math.inf)
    return 0.0


def check_permutation_equivariant(spec, case, ctx) -> float:
    scores = case.scores
    g = torch.Generator().manual_seed(int(case.seed) + 1)
    perm = torch.randperm(scores.shape[-1], generator=g).to(scores.device)
    base, moved = call_many(spec, [scores, scores[..., perm].contiguous()], case.temperature)
    want, got = base[..., perm], moved
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
    weights of the row without the masked keys."""
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
    rows = [r for r in range(scores.shape[0])
            if not bool((~masked[r]).all()) and bool((~masked[r]).any())]
    alone = call_many(spec, [scores[r : r + 1, ~masked[r]] for r in rows], case.temperature)
    for r, want in zip(rows, alone):
        keep = ~masked[r]
        ok, ex = close_mask(out[r : r + 1, keep], want, scores.dtype)
        excess = max(excess, ex)
        if not ok:
            raise Violation(
                f"row {r}: weights with keys masked differ from the row without those keys: "
                f"{mismatch_message(out[r:r + 1, keep], want, scores.dtype)}",
                observed=ex, bound=1, ratio=ex, row=r,
                masked=masked[r].nonzero().flatten().tolist(), input=scores,
            )
    return excess


def check_batch_independent(spec, case, ctx) -> float:
    """Each row alone, and as the first row of a batch of very different rows (scale 1e3), gives
    the weights it has in its own batch: :func:`verify_batch_independent` on the case's batch,
    then on each of those mixed batches (every call of a step in one request)."""
    scores = case.scores
    n = scores.shape[0]
    g = torch.Generator().manual_seed(int(case.seed) + 3)
    other = torch.randn(scores.shape, generator=g, dtype=torch.float64) * 1e3
    mixed = []
    for r in range(n):
        m = other.to(device=scores.device, dtype=scores.dtype, copy=True)
        m[0] = scores[r]
        mixed.append(m)
    outs = call_many(spec, [scores] + [scores[r : r + 1] for r in range(n)] + mixed,
                     case.temperature)
    out, alone, mixed_out = outs[0], outs[1:n + 1], outs[n + 1:]
    excess = _same_rows(out, alone, range(n), scores, n, scores)
    for r in range(n):
        excess = max(excess, _same_rows(mixed_out[r], [alone[r]], (0,), mixed[r], n,
                                        mixed[r]))
    return excess


def verify_batch_independent(spec, case, ctx, rows=None) -> float:
    """Each row (of ``rows``, default all) computed alone equals the same row in the batch."""
    scores = case.scores
    rows = list(range(scores.shape[0]) if rows is None else rows)
    outs = call_many(spec, [scores] + [scores[r : r + 1] for r in rows], case.temperature)
    return _same_rows(outs[0], outs[1:], rows, scores, scores.shape[0], scores)


def _same_rows(out, alone, rows, scores, size, given) -> float:
    excess = 0.0
    for r, single in zip(rows, alone):
        ok, ex = close_mask(single, out[r : r + 1], scores.dtype)
        excess = max(excess, ex)
        if not ok:
            raise Violation(
                f"row {r} computed alone differs from the same row in its batch of "
                f"{size}: {mismatch_message(single, out[r:r + 1], scores.dtype)}",
                observed=ex, bound=1, ratio=ex, row=r, input=given,
            )
    return excess


def check_low_precision(spec, case, ctx) -> float:
    """Half-precision weights agree with the float64 weights of the same (rounded) scores."""
    out, want = call_many(spec, [case.scores, case.scores.to(torch.float64)], case.temperature)
    ok, excess = close_mask(out, want, case.scores.dtype)
    if not ok:
        raise Violation(
            f"{describe_dtype(case.scores.dtype)} result vs float64 result of the same scores: "
            f"{mismatch_message(out, want, case.scores.dtype)}",
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


def check_shift_invariant(spec, case, ctx) -> float:
    """f(z + c) = f(z) for a per-row constant c; tolerance grows with |c|·eps (rounding z + c)."""
    scores = case.scores
    g = torch.Generator().manual_seed(int(case.seed) + 4)
    finite = scores[torch.isfinite(scores)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    c = (torch.rand(scores.shape[0], 1, generator=g, dtype=torch.float64) - 0.5) * 20
    shifted = (scores.to(torch.float64) + c).to(scores.dtype)
    got, want = call_many(spec, [shifted, scores], case.temperature)
    t = case.temperature or 1.0
    eps = torch.finfo(scores.dtype).eps
    slack = 1.0 + (scale + 10.0) * eps / (t * tol_for(scores.dtype).rtol)
    ok, excess = close_mask(got, want, scores.dtype, scale=slack)
    if not ok:
        raise Violation(
            f"f(z + c) != f(z) (c per row in [-10, 10]): "
            f"{mismatch_message(got, want, scores.dtype, slack)}",
            observed=excess, bound=1, ratio=excess, shift=c.flatten().tolist(),
        )
    return excess


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
    outs = call_many(spec, [scores, scores[live]] if partial else [scores], case.temperature)
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
        case = event.case
        scores = event.input
        if scores is None or not hasattr(case, "_replace") or "scores" not in case._fields:
            continue
        key = (tuple(scores.shape), str(scores.dtype), scores.flatten()[:64].tolist().__repr__())
        if key in seen:
            continue
        seen.add(key)
        out.append(case._replace(scores=scores))
    return out[:8]


def check_no_side_effects(spec, case, ctx) -> float:
    """:func:`verify_no_side_effects` on this case, and no side effect seen earlier in the run
    (in any property, by any request: forward, backward, forward mode)."""
    verify_no_side_effects(spec, case, ctx)
    monitor = monitor_of(spec)
    if monitor is not None and monitor.effects:
        event = monitor.effects[0]
        raise Violation(f"a call of the normalizer ({event.op} request, call {event.call} of the "
                        f"run) changed the global state: {event.what} (the worker restored it)",
                        observed=len(monitor.effects), bound=0, ratio=math.inf,
                        changes=[e.what for e in monitor.effects[:8]], input=event.input)
    return 0.0


def verify_no_side_effects(spec, case, ctx) -> float:
    """Calling the normalizer on this case (forward; forward with grad and a backward pass;
    forward mode) leaves the global state a later call depends on as it was: grad mode, default
    dtype and device, deterministic algorithms, float32 matmul precision, thread count, anomaly
    mode, and the torch functions the worker uses."""
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
                    torch.autograd.grad(out, z, torch.ones_like(out), allow_unused=True)
            except Exception:  # noqa: BLE001 - no float64 or no backward: forward only
                pass
        try:
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
