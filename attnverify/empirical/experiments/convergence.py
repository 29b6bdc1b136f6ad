"""N → L: the actual distance d̃, the expected distance E and Theorem 1.1's bound as N grows to
L − 1 at L = L_max.

Paper A [stated, docs/THEORY.md §8]: "as N approaches 100 (L = 1024) the actual and the expected
distance converge and the upper bound is tight"; Corollary 2(ii): d̃ and E → 0 as N → L. Alg. 2
stops at N = 100 on rows of L/2 … L keys; here only the row with exactly L keys is used (one per
window), so N can run to L − 1.
"""

from __future__ import annotations

import torch

from attnverify.empirical.experiments.context import Context, quantiles, window_medians
from attnverify.empirical.experiments.distances import geometric_grid, theorem1_rows
from attnverify.empirical.rows import RowBatch
from attnverify.empirical.targets import model_weighting

CHOICES = [
    "Rows: the query with exactly L = L_max keys in each window (one row per head and window); "
    "N on a ×1.4 grid from 1 to L − 1, with 5, 10, 20 and 100 added where N < L.",
    "d̃ (top-N), Theorem 1.1's bound and E (random N-subset, Monte-Carlo as Alg. 1) per head; "
    "medians over heads.",
    "Convergence: |d̃ − E| / max(d̃, E); tightness: d̃ / bound (1 = tight).",
]
EXTRA_N = (5, 10, 20, 100)


def last_row_batch(ctx: Context) -> RowBatch:
    ex, length = ctx.extraction, ctx.max_length
    rows = torch.tensor([length - 1], device=ex.q.device)
    return RowBatch(length=length, rows=rows, logits=ex.row_logits(rows, length),
                    values=ex.values(length), n_heads=ex.n_total_heads)


def n_grid(length: int) -> list[int]:
    cap = length - 1
    return sorted(set(geometric_grid(cap)) | {n for n in EXTRA_N if n < length})


def convergence(ctx: Context) -> dict:
    batch = last_row_batch(ctx)
    ns = n_grid(ctx.max_length)
    n_values = torch.tensor(ns, device=batch.logits.device)
    bar = ctx.bar("N → L convergence", 1)
    rows = theorem1_rows(batch, model_weighting(), n_values, ctx.config.mc_draws,
                         ctx.generator(7), None)
    bar.update(1)
    d, bound, e = (batch.per_head(rows[k]) for k in ("dtilde", "bound", "E_mc"))  # [H, k]
    gap = (d - e).abs() / torch.maximum(d, e)
    tight = d / bound
    return {
        "L": ctx.max_length, "N": ns, "windows": batch.logits.shape[0] // batch.n_heads,
        "choices": CHOICES,
        "dtilde": d.T.tolist(), "bound": bound.T.tolist(), "E_mc": e.T.tolist(),
        "gap_quantiles": [quantiles(v) for v in gap.T],
        "tightness_quantiles": [quantiles(v) for v in tight.T],
        **{f"{k}_window_median": window_medians(batch, rows[k])
           for k in ("dtilde", "bound", "E_mc")},  # [N][window]
    }
