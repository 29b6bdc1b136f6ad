"""Attention-level checks. Each takes ``(spec, case, ctx)`` where ``spec`` is the lifted
:class:`~attnverify.registry.NormalizerSpec` (``spec.fn.attention`` is the kernel) and ``case`` an
:class:`~attnverify.attention.cases.AttnCase`; each returns the worst ratio observed / allowed or
raises :class:`Violation`. Outputs are compared with the float64 reference under the rule of
:mod:`attnverify.attention.tolerance`. With GQA, the reference, the tolerance and the hull read
the ``H_kv`` key/value heads for their query heads in place; only :func:`check_gqa` repeats
them, to call the kernel on repeated heads.
"""

from __future__ import annotations

import functools
import math

import torch

from attnverify.attention import mods, tolerance
from attnverify.attention.loader import load_attention
from attnverify.attention.reference import F64, allowed_and_bias, eager, expand_heads, scores_of
from attnverify.checks.base import NormalizerError, Violation, describe_dtype
from attnverify.registry import builtins
from attnverify.tolerances import tol_for

NEG_INF = float("-inf")


def attention_of(spec):
    return spec.fn.attention


def _mod_params(a) -> dict:
    return {k: v for k, v in a.params.items() if k in ("window", "cap")}


def run(a, q, k, v, mask=None, causal=False, scale=None, gqa=False) -> torch.Tensor:
    """Call the kernel; its exceptions come back as :class:`NormalizerError` (an output refused
    at the process boundary passes through: a violation); a result of the wrong type or shape
    is a violation."""
    kw = {"enable_gqa": True} if gqa else {}
    try:
        out = a(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, **kw)
    except Violation:  # an output refused at the process boundary: a violation, as for rows
        raise
    except Exception as exc:  # noqa: BLE001 - the kernel's fault, classified by certify
        raise NormalizerError(exc) from exc
    want = (*q.shape[:-1], v.shape[-1])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise Violation(f"output {got}, but should be {want}", observed=1, bound=0,
                        ratio=math.inf)
    return out


def reference(a, q, k, v, mask=None, causal=False, scale=None, gqa=False) -> torch.Tensor:
    """The float64 output the kernel must match: the eager reference of its normalizer (and
    score mod), or ``a.reference`` — a normalizer id, or an attention target run in float64
    where it takes float64 (else in the input dtype)."""
    if a.reference:
        other = _reference_target(a.reference)
        if other is not None:
            dtype = F64 if other.supports(F64) else q.dtype
            args = [t.to(dtype) for t in (q, k, v)]
            m = mask if mask is None or mask.dtype == torch.bool else mask.to(dtype)
            return run(other, *args, m, causal, scale, gqa).to(F64)
        return eager(q, k, v, mask, causal, scale, gqa, normalizer=a.reference,
                     score_mod=a.score_mod, mod_params=_mod_params(a))
    return eager(q, k, v, mask, causal, scale, gqa, normalizer=a.normalizer,
                 score_mod=a.score_mod, mod_params=_mod_params(a))


@functools.cache
def _reference_target(name: str):
    """The attention spec ``name`` names, or ``None`` when it is a normalizer id."""

    return None if name in builtins() else load_attention(name)


def allowed_keys(a, case, q=None, k=None, mask="case", causal=None) -> torch.Tensor:
    """Boolean ``[B, H, L_q, L_k]``: the keys each query attends (for the tolerance rule)."""
    q = case.q if q is None else q
    k = case.k if k is None else k
    mask = case.attn_mask if isinstance(mask, str) else mask
    causal = case.is_causal if causal is None else causal
    allowed, bias = allowed_and_bias(mask, causal, q.shape[-2], k.shape[-2], q.device)
    if bias is not None:
        allowed = allowed & ~torch.isneginf(bias)
    if a.score_mod is not None:
        allowed = allowed & mods.allowed(a.score_mod, q.shape[-2], k.shape[-2], q.device,
                                         **_mod_params(a))
    return allowed.expand(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])


def _modified(a, mask) -> bool:
    """The scores differ from scale·q·kᵀ: a score modification or an additive mask."""
    return a.score_mod in ("alibi", "softcap") or (
        isinstance(mask, torch.Tensor) and mask.dtype != torch.bool)


def _final_scores(a, q, k, mask, scale) -> torch.Tensor:
    s = scores_of(q, k, scale, score_mod=a.score_mod, mod_params=_mod_params(a))
    if isinstance(mask, torch.Tensor) and mask.dtype != torch.bool:
        s = s + mask.to(F64)
    return s


def compare(label: str, got, want, a, case, *, q=None, k=None, v=None, mask="case",
            causal=None, scale="case", allowed=None, **details) -> float:
    """``|got − want| ≤`` the tolerance rule, else a :class:`Violation` naming ``label``."""
    q = case.q if q is None else q
    k = case.k if k is None else k
    v = case.v if v is None else v
    scale = case.scale if scale == "case" else scale
    mask = case.attn_mask if isinstance(mask, str) else mask
    # k and v keep their H_kv heads under GQA: the scores and the tolerance read each for its
    # query heads (reference.group_matmul) instead of a repeated float64 copy.
    if allowed is None:
        allowed = allowed_keys(a, case, q, k, mask, causal)
    scores = _final_scores(a, q, k, mask, scale) if _modified(a, mask) else None
    limit = tolerance.output_allowed(want, q, k, v, scale, q.dtype, allowed, scores)
    g = got.detach().to(device="cpu", dtype=F64)
    w, limit = want.detach().to("cpu", F64), limit.cpu()
    diff = (g - w).abs().nan_to_num(nan=math.inf)
    ratio = diff / limit
    worst = float(ratio.max()) if ratio.numel() else 0.0
    if worst > 1 or math.isnan(worst):
        idx = int(ratio.flatten().nan_to_num(math.inf).argmax())
        n = int((ratio > 1).sum())
        pos = [int(x) for x in torch.unravel_index(torch.tensor(idx), ratio.shape)]
        raise Violation(
            f"{label}: mismatched elements {n} / {ratio.numel()}; greatest difference "
            f"{float(diff.flatten()[idx]):.3g} at [b, h, i, c] = {pos} (up to "
            f"{float(limit.flatten()[idx]):.3g} allowed; got {float(g.flatten()[idx]):.6g}, "
            f"reference {float(w.flatten()[idx]):.6g}) [{describe_dtype(q.dtype)}]",
            observed=worst, bound=1, ratio=worst, at=pos, **details)
    return worst


def _against_reference(label, spec, case, **over) -> float:
    a = attention_of(spec)
    args = dict(q=case.q, k=case.k, v=case.v, mask=case.attn_mask, causal=case.is_causal,
                scale=case.scale, gqa=case.enable_gqa)
    args.update(over)
    got = run(a, **args)
    want = reference(a, **args)
    return compare(label, got, want, a, case, q=args["q"], k=args["k"], v=args["v"],
                   mask=args["mask"], causal=args["causal"], scale=args["scale"])


# --------------------------------------------------------------------------------------------
# Checks


def check_reference(spec, case, ctx) -> float:
    """Output equals the float64 eager reference (masks, scale, GQA as the case says)."""
    return _against_reference("output vs the float64 eager reference", spec, case)


def check_mask(spec, case, ctx) -> float:
    """Output equals the reference under the case's mask, and keys masked for every query have
    no influence at all: changing their keys and values leaves the output bitwise unchanged."""
    ratio = _against_reference(f"{case.recipe['mask']} mask honoured", spec, case)
    return max(ratio, _masked_keys_inert(spec, case))


def _masked_keys_inert(spec, case) -> float:
    a, mask = attention_of(spec), case.attn_mask
    if mask is None or mask.dtype != torch.bool:
        return 0.0
    full = mask.expand(*case.q.shape[:-1], case.k.shape[-2])
    dead = ~full.any(dim=-2).any(dim=-2)  # [B, L_k]: masked for every head and query
    if not bool(dead.any()):
        return 0.0
    sel = dead[:, None, :, None]
    k2 = torch.where(sel, case.k * 100 + 7, case.k)
    v2 = torch.where(sel, torch.full_like(case.v, 1e3), case.v)
    base = run(a, case.q, case.k, case.v, mask, case.is_causal, case.scale, case.enable_gqa)
    moved = run(a, case.q, k2, v2, mask, case.is_causal, case.scale, case.enable_gqa)
    if not torch.equal(base.nan_to_num(), moved.nan_to_num()):
        diff = float((base.to(F64) - moved.to(F64)).abs().nan_to_num(math.inf).max())
        raise Violation(f"changing the keys and values of masked keys "
                        f"{dead.nonzero()[:, 1].tolist()[:16]} changed the output by up to "
                        f"{diff:.3g} (masked keys must have no influence)",
                        observed=diff, bound=0, ratio=math.inf)
    return 0.0


def check_padding(spec, case, ctx) -> float:
    """Key padding (``[B, 1, 1, L_k]``): equal to the reference, padded keys inert, and equal
    to the same kernel on the unpadded keys alone."""
    a = attention_of(spec)
    ratio = max(_against_reference("padding mask honoured", spec, case),
                _masked_keys_inert(spec, case))
    keys = case.attn_mask.expand(*case.q.shape[:-1], case.k.shape[-2])[:, 0, 0]  # [B, L_k]
    n_valid = keys.sum(-1)
    full = run(a, case.q, case.k, case.v, case.attn_mask, False, case.scale, case.enable_gqa)
    for b in range(case.q.shape[0]):
        n = int(n_valid[b])
        q, k, v = case.q[b:b + 1], case.k[b:b + 1, :, :n], case.v[b:b + 1, :, :n]
        alone = run(a, q, k, v, None, False, case.scale, case.enable_gqa)
        ratio = max(ratio, compare(f"batch {b}: padded to {case.k.shape[-2]} keys vs its {n} "
                                   "valid keys alone", full[b:b + 1], alone.to(F64), a, case,
                                   q=q, k=k, v=v, mask=None, causal=False))
    return ratio


def check_fully_masked(spec, case, ctx) -> float:
    """A query that may attend no key gets exactly 0 (finite, no NaN); the others match. For a
    differentiable kernel, the backward too (:func:`_dead_queries_backward`)."""
    a = attention_of(spec)
    out = run(a, case.q, case.k, case.v, case.attn_mask, case.is_causal, case.scale,
              case.enable_gqa)
    dead = ~allowed_keys(a, case).any(dim=-1)
    rows = out[dead]
    if rows.numel() and not bool((rows == 0).all()):
        bad = rows[rows != 0]
        where = [int(x) for x in dead.nonzero()[0]]
        raise Violation(f"a query with every key masked (at [b, h, i] = {where}) gave "
                        f"{float(bad.flatten()[0])} (all zeros expected)",
                        observed=float(bad.abs().nan_to_num(math.inf).max()), bound=0,
                        ratio=math.inf)
    ratio = _against_reference("other queries next to fully masked ones", spec, case)
    if a.differentiable and bool(dead.any()):
        ratio = max(ratio, _dead_queries_backward(a, case, dead))
    return ratio


def _dead_queries_backward(a, case, dead) -> float:
    """The backward of ⟨out, G⟩ (``G`` random, nonzero at the dead queries too, as in a model):
    dq of a query that attends no key is exactly 0 and finite (its output is 0 whatever ``q``
    is), every entry of dq, dk and dv is finite, and on float64 inputs (where
    ``attn_gradients`` judges gradients' values too) dq of the others, dk and dv equal the
    float64 eager reference's (which takes nothing from a dead query): a backward that leaks
    a dead query into dk or dv is caught there."""
    grads, ref_grads = _gradients(a, case)
    dq = grads[0]
    if dq is not None:
        _zero_where(dq, dead, case, "q", "[b, h, i, c]", "a query that attends no key (every key "
                    "masked; its output is exactly 0 whatever q is)")
    for name, got in zip("qkv", grads):
        if got is not None and not bool(torch.isfinite(got).all()):
            pos = [int(x) for x in (~torch.isfinite(got)).nonzero()[0]]
            raise Violation(
                f"d⟨out, G⟩/d{name} is {float(got[tuple(pos)])} at {pos}, next to a query that "
                f"attends no key: a gradient must be finite [{describe_dtype(case.q.dtype)}]",
                observed=math.inf, bound=0, ratio=math.inf, wrt=name, at=pos)
    if case.q.dtype != F64:
        return 0.0
    return _compare_gradients(case, grads, ref_grads)


#: Most elements of one step of :func:`_hull` (float64: 32 MiB).
HULL_STEP = 1 << 22


def _hull(proj_v: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` ``[B, H, L_q, n]``: the largest and smallest projection over the keys each
    query attends (``-inf``/``inf`` where it attends none), a block of queries at a time, so
    that the ``[B, H_kv, queries, L_k, n]`` comparison never holds more than :data:`HULL_STEP`
    elements (all of them at once reach gigabytes on the largest cases). ``proj_v``
    ``[B, H_kv, L_k, n]`` may have fewer heads than ``allowed`` ``[B, H, L_q, L_k]`` (GQA:
    query head ``h`` reads head ``h // g``); it is not repeated per query head."""
    b, h, l_q, l_k = allowed.shape
    kv, n = proj_v.shape[-3], proj_v.shape[-1]
    group = h // kv
    if l_q == 0:
        empty = proj_v.new_empty((*allowed.shape[:-2], 0, n))
        return empty, empty
    step = max(1, HULL_STEP // max(1, b * kv * l_k * n))
    each = proj_v[..., None, :, :]
    his, los = [], []
    for j in range(group):
        # query heads j, g + j, 2g + j, …: the j-th of each group, one per key/value head
        mine = allowed[:, j::group]
        hi_j, lo_j = [], []
        for start in range(0, l_q, step):
            big = mine[..., start:start + step, :, None]
            hi_j.append(torch.where(big, each, -math.inf).amax(-2))
            lo_j.append(torch.where(big, each, math.inf).amin(-2))
        his.append(torch.cat(hi_j, -2))
        los.append(torch.cat(lo_j, -2))
    if group == 1:
        return his[0], los[0]
    # [B, H_kv, g, L_q, n] → [B, H, L_q, n]: query head kv·g + j
    return torch.stack(his, -3).flatten(-4, -3), torch.stack(los, -3).flatten(-4, -3)


def check_convex_hull(spec, case, ctx) -> float:
    """Each output row lies in the convex hull of the values of the keys it attends: checked
    coordinate-wise and along 8 random directions (min ≤ ⟨u, out⟩ ≤ max over attended keys)."""
    a = attention_of(spec)
    out = run(a, case.q, case.k, case.v, case.attn_mask, case.is_causal, case.scale,
              case.enable_gqa).to(F64)
    v = case.v.to(F64)  # [B, H_kv, L_k, d_v]: _hull reads each head for its query heads
    allowed = allowed_keys(a, case)
    live = allowed.any(-1)
    g = torch.Generator().manual_seed(int(case.recipe["seed"]) + 11)
    dirs = torch.cat([torch.eye(v.shape[-1], dtype=F64),
                      torch.randn(8, v.shape[-1], generator=g, dtype=F64)]).to(v.device)
    proj_v = v @ dirs.T  # [B, H_kv, L_k, n]
    proj_o = out @ dirs.T  # [B, H, L_q, n]
    hi, lo = _hull(proj_v, allowed)
    scale = proj_v.abs().amax(dim=-2, keepdim=True)  # [B, H_kv, 1, n]
    if scale.shape[-3] != out.shape[-3]:  # GQA: n numbers a head, repeated to the query heads
        scale = scale.repeat_interleave(out.shape[-3] // scale.shape[-3], dim=-3)
    t = tol_for(case.q.dtype)
    rounding = t.rtol + tolerance.unit_roundoff(case.q.dtype) + (
        2.0 + math.sqrt(case.k.shape[-2])) * tolerance.U32
    limit = t.atol + rounding * scale
    excess = torch.maximum(proj_o - hi, lo - proj_o).clamp_min(0) / limit
    excess = torch.where(live[..., None], excess, torch.zeros_like(excess)).nan_to_num(math.inf)
    worst = float(excess.max()) if excess.numel() else 0.0
    if worst > 1:
        b, h, i, n = (int(x) for x in torch.unravel_index(excess.argmax(), excess.shape))
        raise Violation(f"output row [b, h, i] = {[b, h, i]} leaves the convex hull of its "
                        f"values along direction {n}: {float(proj_o[b, h, i, n]):.6g} not in "
                        f"[{float(lo[b, h, i, n]):.6g}, {float(hi[b, h, i, n]):.6g}]",
                        observed=worst, bound=1, ratio=worst)
    return worst


def check_key_permutation(spec, case, ctx) -> float:
    """Permuting keys and values (and the mask's key axis) leaves the output unchanged."""
    a = attention_of(spec)
    g = torch.Generator().manual_seed(int(case.recipe["seed"]) + 12)
    perm = torch.randperm(case.k.shape[-2], generator=g)
    mask = case.attn_mask
    pmask = None if mask is None else mask[..., perm] if mask.shape[-1] > 1 else mask
    base = run(a, case.q, case.k, case.v, mask, False, case.scale, case.enable_gqa)
    moved = run(a, case.q, case.k[..., perm, :], case.v[..., perm, :], pmask, False,
                case.scale, case.enable_gqa)
    return compare("keys permuted (mask alike) vs not", moved, base.to(F64), a, case,
                   perm=perm.tolist()[:64])


def check_gqa(spec, case, ctx) -> float:
    """``enable_gqa=True`` with fewer key/value heads equals the same kernel on key/value
    heads repeated (``repeat_interleave``: query head h reads key head h // (H / H_kv))."""
    a = attention_of(spec)
    heads = case.q.shape[-3]
    grouped = run(a, case.q, case.k, case.v, case.attn_mask, case.is_causal, case.scale, True)
    k, v = expand_heads(case.k, heads), expand_heads(case.v, heads)
    repeated = run(a, case.q, k, v, case.attn_mask, case.is_causal, case.scale, False)
    # The tolerance reads the case's grouped k and v: the same rule as on the repeated ones.
    ratio = compare(f"GQA ({heads} query heads, {case.k.shape[-3]} key/value heads) vs heads "
                    "repeated", grouped, repeated.to(F64), a, case)
    return max(ratio, _against_reference("GQA vs the float64 reference", spec, case,
                                         gqa=True))


def check_batch_head_independent(spec, case, ctx) -> float:
    """Each (batch, head) computed alone equals it computed inside the batch, next to slices
    whose queries are 50 times larger."""
    a = attention_of(spec)
    q = case.q.clone()
    q[1:] = q[1:] * 50
    if q.shape[1] > 1 and not case.enable_gqa:
        q[:, 1:] = q[:, 1:] * 50
    mask = case.attn_mask
    full = run(a, q, case.k, case.v, mask, case.is_causal, case.scale, case.enable_gqa)
    ratio = 0.0
    group = q.shape[1] // case.k.shape[1]
    for b, h in _slices(q.shape[0], q.shape[1], int(case.recipe["seed"])):
        hk = h // group
        m = None if mask is None else mask.expand(*q.shape[:-1], case.k.shape[-2])[
            b:b + 1, h:h + 1]
        alone = run(a, q[b:b + 1, h:h + 1], case.k[b:b + 1, hk:hk + 1],
                    case.v[b:b + 1, hk:hk + 1], m, case.is_causal, case.scale, False)
        ratio = max(ratio, compare(f"batch {b}, head {h} alone vs inside the batch",
                                   full[b:b + 1, h:h + 1], alone.to(F64), a, case,
                                   q=q[b:b + 1, h:h + 1], k=case.k[b:b + 1, hk:hk + 1],
                                   v=case.v[b:b + 1, hk:hk + 1], mask=m))
    return ratio


#: Most (batch, head) slices :func:`check_batch_head_independent` computes alone (a call each).
MAX_SLICES = 12


def _slices(batch: int, heads: int, seed: int) -> list[tuple[int, int]]:
    """Every (batch, head) slice, or :data:`MAX_SLICES` of them: the corners (first and last
    batch element and head) and a seeded sample of the others."""
    every = [(b, h) for b in range(batch) for h in range(heads)]
    if len(every) <= MAX_SLICES:
        return every
    corners = [(0, 0), (0, heads - 1), (batch - 1, 0), (batch - 1, heads - 1)]
    rest = [s for s in every if s not in corners]
    g = torch.Generator().manual_seed(seed + 14)
    pick = torch.randperm(len(rest), generator=g)[: MAX_SLICES - len(set(corners))].tolist()
    return sorted(set(corners) | {rest[i] for i in pick})


def check_low_precision(spec, case, ctx) -> float:
    """float16 / bfloat16 output vs the float64 reference of the same (rounded) inputs."""
    return _against_reference(f"{describe_dtype(case.q.dtype)} output vs the float64 "
                              "reference", spec, case)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that requires grad, with ``t``'s sizes, strides and storage offset (a
    Hugging Face view, a KV-cache slice, an offset view of a fused buffer stay such views)."""
    span = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    base = torch.zeros(span if t.numel() else 0, dtype=t.dtype, device=t.device)
    view = base.as_strided(t.shape, t.stride(), t.storage_offset() if t.numel() else 0)
    view.copy_(t.detach())
    return view.detach().requires_grad_(True)


def dead_keys(a, case) -> torch.Tensor:
    """Boolean ``[B, H_kv, L_k]``: the keys no query attends, of any query head that reads them
    (with GQA, query head ``h`` reads key/value head ``h // (H / H_kv)``)."""
    allowed = allowed_keys(a, case)  # [B, H, L_q, L_k]
    batch, heads, _, l_k = allowed.shape
    kv = case.k.shape[-3]
    live = allowed.any(-2).reshape(batch, kv, heads // kv, l_k).any(-2)
    return ~live


def _dead_keys_exact(a, case, grads) -> None:
    """The gradients w.r.t. the keys and values no query attends are exactly 0 (finite): such a
    key's score is masked everywhere, so neither it nor its value moves the output. A tolerance
    relative to the largest gradient would let a backward wrong only there pass."""
    dead = dead_keys(a, case)
    if not bool(dead.any()):
        return
    for name, got in (("k", grads[1]), ("v", grads[2])):
        if got is not None:
            _zero_where(got, dead, case, name, "[b, h_kv, j, c]",
                        "a key no query attends (masked for every query)")


def _zero_where(grad, rows, case, name: str, axes: str, what: str) -> None:
    """A gradient that must be exactly 0 on the rows ``rows`` marks (``[..., row]``): a
    violation naming its first nonzero entry and how many there are."""
    g = grad.detach().to("cpu", F64)
    bad = rows.cpu()[..., None].expand(g.shape) & (g != 0)
    if bool(bad.any()):
        pos = [int(x) for x in bad.nonzero()[0]]
        value = float(g[tuple(pos)])
        raise Violation(
            f"d⟨out, G⟩/d{name} is {value:.6g} at {axes} = {pos}, {what}, not exactly 0; "
            f"{int(bad.sum())} such entries [{describe_dtype(case.q.dtype)}]",
            observed=abs(value) if value == value else math.inf, bound=0, ratio=math.inf,
            wrt=name, at=pos)


def check_gradients(spec, case, ctx) -> float:
    """Gradients w.r.t. q, k and v (of ⟨out, G⟩ for a random G) equal the float64 eager
    reference's autograd gradients, and those w.r.t. keys and values no query attends are
    exactly 0 (:func:`_dead_keys_exact`)."""
    a = attention_of(spec)
    grads, ref_grads = _gradients(a, case)
    _dead_keys_exact(a, case, grads)
    return _compare_gradients(case, grads, ref_grads)


def _gradients(a, case):
    """``(grads, ref_grads)``: the gradients of ⟨out, G⟩ w.r.t. q, k and v (``G`` random,
    seeded by the case) by the kernel (``None`` where unused) and by the float64 eager
    reference."""
    g = torch.Generator().manual_seed(int(case.recipe["seed"]) + 13)
    leaves = [_leaf(t) for t in (case.q, case.k, case.v)]
    ref_leaves = [t.detach().to(F64).clone().requires_grad_(True) for t in leaves]
    out = run(a, *leaves, case.attn_mask, case.is_causal, case.scale, case.enable_gqa)
    cot = torch.randn(out.shape, generator=g, dtype=F64).to(out.device)
    try:
        grads = torch.autograd.grad((out * cot.to(out.dtype)).sum(), leaves, allow_unused=True)
    except Exception as exc:  # noqa: BLE001
        raise NormalizerError(exc) from exc
    want = reference(a, *ref_leaves, case.attn_mask, case.is_causal, case.scale,
                     case.enable_gqa)
    ref_grads = torch.autograd.grad((want * cot).sum(), ref_leaves)
    return grads, ref_grads


def _compare_gradients(case, grads, ref_grads) -> float:
    """Each of dq, dk, dv within :func:`attnverify.attention.tolerance.grad_allowed` of the
    reference's (NaN is a violation)."""
    ratio = 0.0
    for name, got, ref in zip("qkv", grads, ref_grads):
        if got is None:
            got = torch.zeros_like(ref)
        limit = tolerance.grad_allowed(ref, case.q, case.k, case.scale, case.q.dtype)
        diff = (got.to(F64) - ref).abs().nan_to_num(nan=math.inf)
        r = float((diff / limit).max()) if diff.numel() else 0.0
        if r > 1:
            raise Violation(f"d⟨out, G⟩/d{name}: greatest difference {float(diff.max()):.3g} "
                            f"from the float64 eager reference's autograd gradient (ratio "
                            f"{r:.3g} to the allowed) [{describe_dtype(case.q.dtype)}]",
                            observed=r, bound=1, ratio=r, wrt=name)
        ratio = max(ratio, r)
    return ratio
