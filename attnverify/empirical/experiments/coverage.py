"""Multi-head coverage, measured: the union of the separable sets of a layer's heads.

Paper A [stated, docs/THEORY.md §4 and §8]: a single head separates at most ≈ 80% of its selected
tokens, so several heads are needed; H independent heads separating a fraction p each cover
``1 − (1 − p)^H`` (p = 0.8, H = 3 → 99.2%). Here, per query row of a layer, each head h selects its
own top-N set I_h and separates S_h ⊆ I_h; the layer's coverage is ``|∪ S_h| / |∪ I_h|``, set
beside two predictions: the paper's formula with the layer's mean p and H heads, and the
independence prediction per token, ``1 − Π_{h: t ∈ I_h} (1 − p_h)``, averaged over ∪ I_h.
"""

from __future__ import annotations

import torch

from attnverify.empirical.experiments.context import Context, quantiles
from attnverify.empirical.separation import on_sphere, separable_sets

CHOICES = [
    "Rows: the L_max band; N = --coverage-n (default 16, where paper A's plateau starts); "
    "embeddings on the unit sphere; separable as in Alg. 4.",
    "Per (window, layer, row): coverage = |∪_h S_h| / |∪_h I_h| over the layer's query heads; "
    "p_h = head h's mean N_s/N over the window's rows.",
    "Predictions: the paper's 1 − (1 − p̄)^H (p̄ = the layer's mean p_h, H = query heads per "
    "layer) and, per token of ∪ I_h, 1 − Π over the heads that selected it of (1 − p_h).",
    "Per layer: means over windows and rows; ± across windows of the median over layers.",
]


def layer_coverage(alpha, x_sphere, valid, n: int) -> dict[str, torch.Tensor]:
    """One layer's heads ``alpha [H, R, keys]``, ``x [H, keys, d]``: per row ``[R]`` the
    measured coverage, both predictions, and each head's N_s/N ``[H, R]``."""
    chosen, sep = separable_sets(alpha, x_sphere, valid, n)
    heads, rows, keys = alpha.shape
    picked = torch.zeros(heads, rows, keys, dtype=torch.bool, device=alpha.device)
    picked.scatter_(-1, chosen, True)
    separated = torch.zeros_like(picked).scatter_(-1, chosen, sep)
    ratio = sep.to(torch.float64).mean(-1)  # [H, R]
    p = ratio.mean(-1).clamp(max=1 - 1e-12)  # [H]
    union = picked.any(0)
    size = union.sum(-1).to(torch.float64)
    measured = separated.any(0).sum(-1) / size
    log_miss = (picked * torch.log1p(-p)[:, None, None]).sum(0)  # [R, keys]
    independent = ((1 - torch.exp(log_miss)) * union).sum(-1) / size
    formula = (1 - (1 - p.mean()) ** heads).expand(rows)
    return {"measured": measured, "independent": independent, "formula": formula,
            "ratio": ratio, "union_over_n": size / n}


def coverage(ctx: Context) -> dict:
    ex = ctx.extraction
    batch = ctx.batch(ctx.max_length)
    n = min(ctx.config.coverage_n, ctx.max_length // 2)
    x = on_sphere(batch.values)
    per_layer = ex.n_heads
    windows = batch.logits.shape[0] // ex.n_total_heads
    keys = ("measured", "independent", "formula", "best_head", "union_over_n")
    table = {k: torch.zeros(windows, ex.n_layers, dtype=torch.float64) for k in keys}
    bar = ctx.bar("multi-head coverage", windows * ex.n_layers)
    for w in range(windows):
        for layer in range(ex.n_layers):
            start = w * ex.n_total_heads + layer * per_layer
            sl = slice(start, start + per_layer)
            alpha = torch.softmax(batch.logits[sl], dim=-1)
            got = layer_coverage(alpha, x[sl], batch.valid, n)
            for k in ("measured", "independent", "formula", "union_over_n"):
                table[k][w, layer] = got[k].nanmean()
            table["best_head"][w, layer] = got["ratio"].nanmean(-1).max()
            bar.update(1)
    return {
        "L": ctx.max_length, "N": n, "heads_per_layer": per_layer, "layers": ex.n_layers,
        "rows": len(batch.rows), "choices": CHOICES,
        **{k: v.nanmean(0).tolist() for k, v in table.items()},  # [layer]
        **{f"{k}_window_median": v.nanmedian(-1).values.tolist() for k, v in table.items()},
        "measured_quantiles": quantiles(table["measured"].nanmean(0)),
    }
