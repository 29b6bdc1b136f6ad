"""Theorem 1 of paper A on batches of attention rows: d̃, its fixed-set bound, and E.

Shapes: ``alpha`` is ``[b, R, n]`` (b heads, R query rows, n keys; weight 0 on invalid keys),
``x`` is ``[b, n, d]`` (the embeddings of the keys, shared by the rows of a head), ``valid`` is
``[b, R, n]`` or ``[R, n]``. ``n_values`` is an ascending ``LongTensor`` of top-N sizes; every
function returns one value per row and N, ``[b, R, k]``, so all N come from one pass over
prefix sums of the weights in selection order.

The per-row references these batched forms are tested against live in
:mod:`attnverify.bounds.theorem1` (including the exact E by enumeration for L ≤ 14).

Notation (docs/THEORY.md §3): ``I_N`` = indices of the N largest weights, ties to the lower index;
``s = Σ_{i∈I_N} α_i x_i``; ``d̃ = Σ_{i∉I_N} ‖α_i x_i − s‖`` (a sum of norms).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from attnverify.empirical.config import HEAVY_KEYS


@dataclass
class Ordered:
    """Rows with their keys in selection order (invalid keys last), without moving the keys.

    ``alpha``: ``[b, R, n]`` weights in the original key order (0 on invalid keys); ``x``:
    ``[b, n, d]``; ``index[..., j]``: the key selected j-th; ``rank[..., i]``: the position of
    key i in that order (so ``i ∈ I_N`` ⇔ ``rank_i < N``); ``valid``: ``[b, R, n]``.
    """

    alpha: torch.Tensor
    x: torch.Tensor
    index: torch.Tensor
    rank: torch.Tensor
    valid: torch.Tensor

    @property
    def n_valid(self) -> torch.Tensor:
        return self.valid.sum(-1)

    def top(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Weights ``[b, R, m]`` and embeddings ``[b, R, m, d]`` of the first m selected keys."""
        idx = self.index[..., :m]
        heads = torch.arange(idx.shape[0], device=idx.device)[:, None, None]
        return self.alpha.gather(-1, idx), self.x[heads, idx]


def order_rows(alpha, x, valid, how: str = "top", generator=None, depth=None) -> Ordered:
    """Put keys in selection order.

    ``how="top"``: by decreasing weight, ties broken by the lower index [choice, docs/THEORY.md];
    ``how="random"``: a uniformly random order, so the first N keys are a uniform N-subset
    (the random ``I_N`` of Theorem 1.2), nested across N. With ``depth`` only the first
    ``depth`` positions are ordered (``topk``; the others share rank ``n``), which is all that
    N ≤ depth needs.
    """
    valid = torch.broadcast_to(valid, alpha.shape)
    if how == "top":
        key = alpha.masked_fill(~valid, float("-inf"))
    elif how == "random":
        noise = torch.rand(alpha.shape, generator=generator, device=alpha.device)
        key = noise.to(alpha.dtype).masked_fill(~valid, -1.0)
    else:
        raise ValueError(f"how={how!r}: expected 'top' or 'random'")
    n = alpha.shape[-1]
    if depth is not None and how == "random" and depth < n:
        index = torch.topk(key, depth, dim=-1).indices
    else:
        index = torch.sort(key, dim=-1, descending=True, stable=True).indices
    positions = torch.arange(index.shape[-1], device=index.device).expand_as(index)
    rank = torch.full_like(alpha, n, dtype=torch.long).scatter_(-1, index, positions)
    return Ordered(alpha.masked_fill(~valid, 0.0), x, index, rank, valid)


def prefix_contexts(o: Ordered, n_values: torch.Tensor) -> torch.Tensor:
    """``s_N = Σ_{i∈I_N} α_i x_i`` for every N in ``n_values`` (prefix sums): ``[b, R, k, d]``."""
    m = int(n_values.max())
    alpha_top, x_top = o.top(m)
    in_set = torch.arange(m, device=x_top.device)[None, :] < n_values[:, None]  # [k, m]
    return torch.matmul(alpha_top[..., None, :] * in_set, x_top)


def residual_norms(o: Ordered, n_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``‖α_i x_i − s_N‖`` for every key i (original order) and N: ``[b, R, k, n]``, and ‖s_N‖.

    Computed as ``sqrt(α_i²‖x_i‖² − 2α_i⟨x_i, s_N⟩ + ‖s_N‖²)`` with one matmul per head against
    the head's keys; an invalid key (α = 0) gives exactly ``‖s_N‖``.
    """
    s = prefix_contexts(o, n_values)
    b, r, k, d = s.shape
    s_sq = (s * s).sum(-1)
    a_sq = o.alpha.square() * (o.x * o.x).sum(-1)[:, None, :]
    g = torch.matmul(s.reshape(b, r * k, d), o.x.transpose(-1, -2)).reshape(b, r, k, -1)
    g.mul_(-2.0 * o.alpha[..., None, :]).add_(a_sq[..., None, :]).add_(s_sq[..., None])
    return g.clamp_min_(0.0).sqrt_(), s_sq.sqrt()


def selected_mask(o: Ordered, n_values: torch.Tensor) -> torch.Tensor:
    """``[b, R, k, n]``: key i is in ``I_N``."""
    return o.rank[..., None, :] < n_values[:, None]


def cumulative_distance(o: Ordered, n_values: torch.Tensor) -> torch.Tensor:
    """d̃_N = Σ_{i∉I_N} ‖α_i x_i − s_N‖ over valid keys [stated, docs/THEORY.md §3]; ``[b,R,k]``.

    NaN where N ≥ the row's number of valid keys (nothing is left unselected).
    """
    g, s_norm = residual_norms(o, n_values)
    b, r, k, n = g.shape
    m = int(n_values.max())
    chosen = g.gather(-1, o.index[..., None, :m].expand(b, r, k, m))  # selection order
    in_set = torch.arange(m, device=g.device)[None, :] < n_values[:, None]
    total = g.sum(-1) - chosen.masked_fill_(~in_set, 0.0).sum(-1)
    total = total - (n - o.n_valid)[..., None].to(total.dtype) * s_norm
    return total.masked_fill(n_values >= o.n_valid[..., None], float("nan"))


def pairwise_distances(x: torch.Tensor) -> torch.Tensor:
    """``‖x_i − x_j‖`` for all pairs of a head's keys: ``[b, n, n]``."""
    sq = (x * x).sum(-1)
    dist = torch.matmul(x, x.transpose(-1, -2)).mul_(-2.0)
    return dist.add_(sq[..., :, None]).add_(sq[..., None, :]).clamp_min_(0.0).sqrt_()


def selected_spread(o: Ordered, n_values: torch.Tensor) -> torch.Tensor:
    """``d_1 = max_{i∉I_N, j∈I_N} ‖x_i − x_j‖`` for every N: ``[b, R, k]``.

    The head's distance matrix is computed once and the selected keys' rows are gathered.
    """
    m = int(n_values.max())
    b, r = o.index.shape[:2]
    heads = torch.arange(b, device=o.index.device)[:, None]
    rows = pairwise_distances(o.x)[heads, o.index[..., :m].reshape(b, r * m)]
    running = _running_max(rows.reshape(b, r, m, -1), n_values)
    outside = ~selected_mask(o, n_values) & o.valid[..., None, :]
    return running.masked_fill_(~outside, float("-inf")).amax(-1)


def _running_max(dist: torch.Tensor, n_values: torch.Tensor) -> torch.Tensor:
    """``max_{j<N} dist[..., j, :]`` for each N: ``[..., k, n]`` (block maxima, then a running
    maximum; ``torch.cummax`` along a middle dimension is far slower)."""
    out, prev, running = [], 0, None
    for n in n_values.tolist():
        block = dist[..., prev:n, :].amax(-2)
        running = block if running is None else torch.maximum(running, block)
        out.append(running)
        prev = n
    return torch.stack(out, dim=-2)


def fixed_set_bound(o: Ordered, n_values: torch.Tensor) -> torch.Tensor:
    """Theorem 1.1 [stated]: ``d̃ ≤ (1 − ᾱ_N)·d_1 + max_{j∈I_N}‖x_j‖·[ᾱ_N(L − N) − (1 − ᾱ_N)]``.

    ``L`` is the row's number of valid keys. A theorem for simplex weights only (α ≥ 0, Σα = 1).
    """
    m = int(n_values.max())
    alpha_top, x_top = o.top(m)
    mass = torch.cumsum(alpha_top, dim=-1)[..., n_values - 1]
    biggest = torch.cummax(x_top.norm(dim=-1), dim=-1).values[..., n_values - 1]
    spread = selected_spread(o, n_values)
    length = o.n_valid[..., None].to(mass.dtype)
    return (1 - mass) * spread + biggest * (mass * (length - n_values) - (1 - mass))


def expected_distance_main(alpha, x, valid, n_values: torch.Tensor) -> torch.Tensor:
    """Theorem 1.2's main term [derived, docs/THEORY.md §3], ``[b, R, k]``:
    ``((L−N)/L) Σ_i ‖c_i x_i − x̄‖``, ``c_i = α_i(1 + N/(L−1))``, ``x̄ = (N/(L−1)) Σ_j α_j x_j``.

    It is Jensen's lower bound on ``E = E[d̃]`` for a uniformly random ``I_N``, so ``E − main``
    (the paper's ε) is ≥ 0; the paper's claim that ε is small is measured, not assumed.
    """
    valid = torch.broadcast_to(valid, alpha.shape)
    alpha = alpha.masked_fill(~valid, 0.0)
    length = valid.sum(-1).to(alpha.dtype)[..., None]  # [b,R,1]
    out = torch.matmul(alpha, x)  # [b,R,d]
    dots = torch.matmul(out, x.transpose(-1, -2))  # [b,R,n]
    x_sq = (x * x).sum(-1)[:, None, None, :]
    out_sq = (out * out).sum(-1)[..., None, None]
    f = (n_values.to(alpha.dtype) / (length - 1))[..., None]  # [b,R,k,1]
    c = alpha[..., None, :] * (1 + f)
    sq = c.square() * x_sq - 2 * c * f * dots[..., None, :] + f.square() * out_sq
    total = sq.clamp_min_(0.0).sqrt_().masked_fill_(~valid[..., None, :], 0.0).sum(-1)
    return (length - n_values) / length * total




def expected_distance_mc(alpha, x, valid, n_values, draws: int, generator=None):
    """E = E[d̃] over a uniformly random ``I_N`` by Monte-Carlo, stratified on the heaviest
    keys; ``[b, R, k]`` mean and standard error over draws (NaN for one draw).

    [choice] Attention sinks make plain sampling useless: when a few keys hold most of the mass,
    E is dominated by the rare subsets (probability ~N/L) that contain them. Each draw therefore
    enumerates every inclusion pattern of the ``HEAVY_KEYS`` heaviest keys, fills the rest of
    ``I_N`` with a uniform random subset of the other keys (one nested order per pattern, so all
    N at once), and weights each pattern by its exact probability
    ``C(L−h, N−m) / C(L, N)`` (m of the h heavy keys inside). Unbiased; the variance from the
    heavy keys is gone.
    """
    strata = stratified_orders(alpha, x, valid, n_values, draws, generator)
    samples = torch.stack([stratified_draw(draw, n_values) for draw in strata])
    mean = samples.mean(0)
    if draws < 2:
        return mean, torch.full_like(mean, float("nan"))
    return mean, samples.std(0) / math.sqrt(draws)


def stratified_orders(alpha, x, valid, n_values, draws: int, generator=None) -> list:
    """Per draw, ``[(m, order)]`` for every inclusion pattern of the heaviest keys."""
    valid = torch.broadcast_to(valid, alpha.shape)
    h = min(HEAVY_KEYS, int(valid.sum(-1).min()) - 1)
    heavy = torch.topk(alpha.masked_fill(~valid, float("-inf")), h, dim=-1).indices
    depth = int(n_values.max()) + h
    out = []
    for _ in range(draws):
        noise = torch.rand(alpha.shape, generator=generator, device=alpha.device)
        noise = noise.to(alpha.dtype).masked_fill(~valid, -1.0)
        out.append([(sum(inside), _pattern_order(alpha, x, valid, noise, heavy, inside, depth))
                    for inside in itertools.product((True, False), repeat=h)])
    return out


def _pattern_order(alpha, x, valid, noise, heavy, inside, depth) -> Ordered:
    """Heavy keys marked ``inside`` first, the other heavy keys after every light key."""
    marks = torch.tensor([2.0 if flag else -0.5 for flag in inside], dtype=noise.dtype,
                         device=noise.device)
    key = noise.scatter(-1, heavy, marks.expand(heavy.shape))
    n = alpha.shape[-1]
    index = torch.topk(key, min(depth, n), dim=-1).indices
    positions = torch.arange(index.shape[-1], device=index.device).expand_as(index)
    rank = torch.full_like(alpha, n, dtype=torch.long).scatter_(-1, index, positions)
    return Ordered(alpha.masked_fill(~valid, 0.0), x, index, rank, valid)


def stratified_draw(draw: list, n_values: torch.Tensor) -> torch.Tensor:
    """One unbiased draw of E: ``Σ_patterns P(pattern | N) · d̃(pattern's order, N)``."""
    h = len(draw).bit_length() - 1
    total = None
    for m, order in draw:
        distance = torch.nan_to_num(cumulative_distance(order, n_values))
        term = distance * pattern_probability(order.n_valid, n_values, h, m).to(distance.dtype)
        total = term if total is None else total + term
    return total


def pattern_probability(n_valid, n_values, h: int, m: int) -> torch.Tensor:
    """P(one given pattern with m of the h heavy keys in I_N) for a uniform N-subset of L keys:
    ``C(L−h, N−m) / C(L, N)``, ``[b, R, k]`` (0 where impossible)."""
    length = n_valid[..., None].to(torch.float64)
    n = n_values.to(torch.float64)
    light = n - m
    possible = (light >= 0) & (light <= length - h)
    log_p = (_log_comb(length - h, light.clamp_min(0)) - _log_comb(length, n))
    return torch.where(possible, log_p.exp(), torch.zeros_like(log_p))


def _log_comb(a, b):
    b = torch.minimum(b, a).clamp_min(0)
    return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)
