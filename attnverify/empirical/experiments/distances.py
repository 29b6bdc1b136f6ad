"""Paper A's Algorithms 1–3: the distance d̃ of Theorem 1 against length and top-N."""

from __future__ import annotations

import torch
from scipy.stats import ks_2samp

from attnverify.empirical.distance import (
    HEAVY_KEYS,
    cumulative_distance,
    expected_distance_main,
    expected_distance_mc,
    fixed_set_bound,
    order_rows,
    stratified_draw,
    stratified_orders,
)
from attnverify.empirical.experiments.context import (
    Context,
    exceeds,
    quantiles,
    window_medians,
)
from attnverify.empirical.rows import RowBatch, chunk_size, chunks, over_chunks

COMMON_CHOICES = [
    "x_i: see --embeddings (the run's choice is in the results' settings): value = the "
    "head's value vector of key i (what the attention weights average); hidden = the layer's "
    "normalised input hidden state; input = the token embedding.",
    "Tokens for length L: query rows attending to L/2+1 … L keys (causal), sampled evenly, "
    "always including the row of exactly L keys; 'L' in a bound is the row's own key count.",
    "I_N = the N largest weights, ties to the lower index.",
    "E = E[d̃] over a uniform random N-subset, by Monte-Carlo with nested random orders, "
    f"stratified on the {HEAVY_KEYS} heaviest keys: each draw enumerates their "
    f"{2**HEAVY_KEYS} inclusion patterns, fills I_N with random other keys and weights each "
    "pattern by its exact probability (an attention sink makes plain sampling miss the subsets "
    "that dominate E). Per-head standard errors are "
    "reported; Theorem 1.2's ε ≥ 0 is checked on per-head means (ε < −3 SE counts as a "
    "violation). Theorem 1.2's main term is Jensen's lower bound on E.",
    "Arithmetic in float32 (the model's own precision); bounds are compared with float32's "
    "tolerance scaled by the number of summed terms.",
]


def theorem1_rows(batch: RowBatch, weighting, n_values, draws: int, gen, bar):
    """Per row and N: d̃, the Theorem 1.1 bound, E's main term and E (Monte-Carlo ± SE)."""
    alpha = weighting(batch.logits)
    valid = batch.valid

    def fn(sl):
        a, x = alpha[sl], batch.values[sl]
        o = order_rows(a, x, valid, "top")
        mc, se = expected_distance_mc(a, x, valid, n_values, draws, gen)
        return (cumulative_distance(o, n_values), fixed_set_bound(o, n_values),
                expected_distance_main(a, x, valid, n_values), mc, se)

    n, rows = batch.values.shape[-2], len(batch.rows)
    per_row = n * (int(n_values.max()) + len(n_values)) + n * n // rows
    keys = ("dtilde", "bound", "E_main", "E_mc", "E_mc_se")
    return dict(zip(keys, over_chunks(batch, per_row, fn, bar)))


def summarise(batch: RowBatch, rows: dict, n_values) -> dict:
    """Per-head means (lists ``[N][head]``), bound violations, and the measured ε = E − main."""
    count = rows["dtilde"].shape[0] // batch.n_heads * rows["dtilde"].shape[1]
    head = {k: batch.per_head(v) for k, v in rows.items() if k != "E_mc_se"}
    head["E_mc_se"] = (batch.per_head(rows["E_mc_se"].square()) / count).sqrt()
    eps = rows["E_mc"] - rows["E_main"]
    head_eps = batch.per_head(eps)
    out = {k: v.T.tolist() for k, v in head.items()}
    n_keys = batch.length
    out["bound_violations"] = exceeds(rows["dtilde"], rows["bound"], n_keys).sum((0, 1)).tolist()
    out["epsilon_negative_heads"] = (head_eps < -3 * head["E_mc_se"]).sum(0).tolist()
    out["epsilon_over_E"] = [quantiles(v) for v in (head_eps / head["E_mc"]).T]
    out["rows"] = int(rows["dtilde"].shape[0] * rows["dtilde"].shape[1])
    out["worst_bound_ratio"] = (rows["dtilde"] / rows["bound"]).amax((0, 1)).tolist()
    for key in ("dtilde", "bound", "E_main", "E_mc"):
        out[f"{key}_window_median"] = window_medians(batch, rows[key])  # [N][window]
    return out


def distance_vs_length(ctx: Context) -> dict:
    """Algorithm 1: fixed N, L = 32 … L_max; d̃, the Theorem 1.1 bound and E per head."""
    n_values = torch.tensor([ctx.config.topn], device=ctx.device)
    gen = ctx.generator(1)
    result = {"N": ctx.config.topn, "lengths": list(ctx.lengths), "normalizers": {},
              "choices": COMMON_CHOICES}
    bar = ctx.bar("Alg.1 distance vs length", len(ctx.weightings) * len(ctx.lengths))
    for w in ctx.weightings:
        per_length = []
        for length in ctx.lengths:
            batch = ctx.batch(length)
            rows = theorem1_rows(batch, w, n_values, ctx.config.mc_draws, gen, None)
            per_length.append(_first_n(summarise(batch, rows, n_values)))
            bar.update(1)
        result["normalizers"][w.id] = _transpose(per_length)
    result["rows_per_length"] = [len(ctx.batch(L).rows) for L in ctx.lengths]
    return result


def distance_vs_topn(ctx: Context) -> dict:
    """Algorithm 2: L = L_max, N from ``--topn-list``; the same quantities per N."""
    n_values = torch.tensor(ctx.config.topn_list, device=ctx.device)
    gen = ctx.generator(2)
    batch = ctx.batch(ctx.max_length)
    result = {"L": ctx.max_length, "N": list(ctx.config.topn_list), "normalizers": {},
              "choices": COMMON_CHOICES, "rows": len(batch.rows)}
    bar = ctx.bar("Alg.2 distance vs top-N", len(ctx.weightings))
    for w in ctx.weightings:
        rows = theorem1_rows(batch, w, n_values, ctx.config.mc_draws, gen, None)
        result["normalizers"][w.id] = summarise(batch, rows, n_values)
        bar.update(1)
    return result


def _first_n(summary: dict) -> dict:
    """Unwrap the single-N lists of Algorithm 1."""
    return {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in summary.items()}


def _transpose(per_length: list[dict]) -> dict:
    return {key: [entry[key] for entry in per_length] for key in per_length[0]}


# ------------------------------------------------------------------------------------------
# Algorithm 3


CRITICAL_CHOICES = [
    "Per L, d̃ (top-N) and E (random N-subset, Monte-Carlo) are averaged over the band's "
    "tokens for every head; the two samples of per-head means are compared by "
    "scipy.stats.ks_2samp for every N = 1 … N_max; the critical N is the first N whose test no "
    "longer rejects at α (0.01 and 0.05 both reported: the paper is inconsistent).",
    "N_max = --critical-max-fraction × L (default L/4); a critical N not found below N_max is "
    "reported as censored (null). N is first scanned on a geometric grid (×1.4: 1, 2, 3, 4, 6, "
    "8, 11, …, N_max), then on every N between the last rejecting and the first non-rejecting "
    "grid point, so the first non-rejecting N is exact unless p(N) is non-monotone inside a "
    "grid step.",
    "The '6% rule' is the least-squares slope of critical N against L through the origin.",
]
ALPHAS = (0.01, 0.05)


def critical_scan(batch: RowBatch, weighting, cap: int, draws: int, gen):
    """Per-head means of d̃ (top-N) and E (random N-subsets) and the KS p-value, on a geometric
    grid of N up to ``cap`` and then on every N inside the bracket where each α's test first
    stops rejecting. Returns ``{N: (p, top[H], rand[H])}``.

    The refinement regenerates each row's random orders from the saved generator state, so
    grid and refinement see the same nested subsets without holding them in memory.
    """
    alpha = weighting(batch.logits)
    grid = geometric_grid(cap)
    state = gen.get_state()
    found = _evaluate(batch, alpha, grid, cap, draws, gen)
    refine = sorted(set().union(*(_bracket(found, a) for a in ALPHAS)) - set(found))
    if refine:
        gen.set_state(state)
        found.update(_evaluate(batch, alpha, refine, cap, draws, gen))
    return dict(sorted(found.items()))


def geometric_grid(cap: int, ratio: float = 1.4) -> list[int]:
    """1, 2, 3, 4, 6, 8, 11, … (×1.4, rounded, distinct) up to ``cap``, ``cap`` included."""
    out, value = [], 1.0
    while round(value) < cap:
        if round(value) not in out:
            out.append(round(value))
        value *= ratio
    return out + [cap]


def _bracket(found: dict, alpha: float) -> set[int]:
    """The integers strictly between the last rejecting grid N and the first non-rejecting one."""
    ns = sorted(found)
    first = next((i for i, n in enumerate(ns) if found[n][0] > alpha), None)
    if not first:
        return set()
    return set(range(ns[first - 1] + 1, ns[first]))


def _evaluate(batch: RowBatch, alpha, ns: list[int], cap: int, draws: int, gen) -> dict:
    n_values = torch.tensor(ns, device=alpha.device)
    cap_values = torch.tensor([cap], device=alpha.device)
    valid = batch.valid
    tops, rands = [], []
    for sl in chunks(alpha.shape[0], chunk_size(batch, batch.values.shape[-2] * len(ns))):
        a, x = alpha[sl], batch.values[sl]
        tops.append(cumulative_distance(order_rows(a, x, valid, "top"), n_values))
        strata = stratified_orders(a, x, valid, cap_values, draws, gen)
        rands.append(torch.stack([stratified_draw(d, n_values) for d in strata]).mean(0))
    top = batch.per_head(torch.cat(tops)).cpu()
    rand = batch.per_head(torch.cat(rands)).cpu()
    pvalues = ks_scan(top, rand)
    return {n: (pvalues[i], top[:, i], rand[:, i]) for i, n in enumerate(ns)}


def ks_scan(top: torch.Tensor, rand: torch.Tensor) -> list[float]:
    """KS p-value of the per-head means of d̃ against those of E, for each N."""
    out = []
    for i in range(top.shape[1]):
        a, b = top[:, i], rand[:, i]
        keep = torch.isfinite(a) & torch.isfinite(b)
        out.append(float(ks_2samp(a[keep].numpy(), b[keep].numpy()).pvalue) if keep.any()
                   else float("nan"))
    return out


def fit_through_origin(lengths: list[int], critical: list[int | None]) -> dict:
    """Least-squares ``N* ≈ c·L`` over the lengths where N* was found, with R²."""
    pairs = [(L, n) for L, n in zip(lengths, critical) if n is not None]
    if not pairs:
        return {"slope": None, "r2": None, "points": 0}
    ls = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    ns = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    slope = float((ls * ns).sum() / (ls * ls).sum())
    resid = ((ns - slope * ls) ** 2).sum()
    total = ((ns - ns.mean()) ** 2).sum()
    r2 = float(1 - resid / total) if total > 0 else None
    return {"slope": slope, "r2": r2, "points": len(pairs)}


def critical_topn(ctx: Context) -> dict:
    """Algorithm 3: per L, the first N where top-N and random selection stop differing."""
    gen = ctx.generator(3)
    caps = [max(1, min(int(L * ctx.config.critical_max_fraction), L // 2)) for L in ctx.lengths]
    result = {"lengths": list(ctx.lengths), "N_max": caps, "alphas": list(ALPHAS),
              "normalizers": {}, "choices": CRITICAL_CHOICES,
              "draws": ctx.config.critical_draws}
    bar = ctx.bar("Alg.3 critical top-N", len(ctx.weightings) * len(ctx.lengths))
    for w in ctx.weightings:
        per_length = []
        for length, cap in zip(ctx.lengths, caps):
            scan = critical_scan(ctx.batch(length), w, cap, ctx.config.critical_draws, gen)
            per_length.append(_critical_entry(length, scan))
            bar.update(1)
        fits = {str(a): fit_through_origin(
            list(ctx.lengths), [e["critical"][str(a)] for e in per_length]) for a in ALPHAS}
        result["normalizers"][w.id] = {"per_length": per_length, "fit": fits}
    return result


def _critical_entry(length: int, scan: dict) -> dict:
    ns = list(scan)
    pvalues = [scan[n][0] for n in ns]
    critical = {str(a): _first_not_rejected(ns, pvalues, a) for a in ALPHAS}
    return {
        "L": length,
        "N": ns,
        "p_value": pvalues,
        "critical": critical,
        "critical_over_L": {k: (v / length if v else None) for k, v in critical.items()},
        "dtilde_median": [float(scan[n][1].nanmedian()) for n in ns],
        "E_median": [float(scan[n][2].nanmedian()) for n in ns],
    }


def _first_not_rejected(ns: list[int], pvalues: list[float], alpha: float) -> int | None:
    return next((n for n, p in zip(ns, pvalues) if p > alpha), None)
