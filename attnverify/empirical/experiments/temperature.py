"""Temperature against selectivity: N_s/N and d̃ of the model's rows at softmax(l/T).

Paper A [stated, docs/THEORY.md §8]: "at T ≥ 1 the gradient drops by two orders of magnitude but
selectivity is lost; avoid T ≤ 0.1". Alg. 5 measures the gradient side; this measures the
selectivity side on the same rows (the L_max band): the fraction of the top-N tokens that are
geometrically separable (Theorem 2's criterion, embeddings on the unit sphere) and the distance
d̃ of Theorem 1, for each T.
"""

from __future__ import annotations

import torch

from attnverify.empirical.distance import cumulative_distance, order_rows
from attnverify.empirical.experiments.context import Context, quantiles, window_medians
from attnverify.empirical.rows import over_chunks
from attnverify.empirical.separation import on_sphere, separable_sets

CHOICES = [
    "Rows: the L_max band (as Alg. 4 and 5); weights softmax(l/T) of the model's own scaled "
    "logits, T on --selectivity-temperatures (T = 1 is the model itself).",
    "Selectivity: N_s/N at N = --topn and N = 16 (where paper A's plateau starts), embeddings "
    "projected onto the unit sphere; d̃ at N = --topn on the unprojected embeddings (as Alg. 1).",
    "Per-head means over tokens; medians over heads; ± across windows.",
]
SELECTIVITY_N = 16


def temperature_rows(batch, temperature: float, n_values: list[int], x_sphere, topn: int):
    """Per row: N_s/N for each N ``[B, R, k]`` and d̃ at ``topn`` ``[B, R]``."""
    valid = batch.valid
    n_topn = torch.tensor([topn], device=batch.logits.device)

    def fn(sl):
        alpha = torch.softmax(batch.logits[sl] / temperature, dim=-1)
        ratios = [separable_sets(alpha, x_sphere[sl], valid, n)[1].to(alpha.dtype).mean(-1)
                  for n in n_values]
        d = cumulative_distance(order_rows(alpha, batch.values[sl], valid), n_topn)[..., 0]
        return torch.stack(ratios, -1), d

    return over_chunks(batch, batch.values.shape[-2] * 2, fn)


def temperature(ctx: Context) -> dict:
    cfg = ctx.config
    batch = ctx.batch(ctx.max_length)
    n_values = sorted({min(cfg.topn, ctx.max_length // 2), min(SELECTIVITY_N,
                                                                ctx.max_length // 2)})
    x_sphere = on_sphere(batch.values)
    temps = list(cfg.selectivity_temperatures)
    out = {"T": temps, "N": n_values, "L": ctx.max_length, "topn": cfg.topn,
           "rows": len(batch.rows), "choices": CHOICES, "ratio": [], "dtilde": [],
           "ratio_window_median": [], "dtilde_window_median": [], "ratio_quantiles": []}
    bar = ctx.bar("temperature vs selectivity", len(temps))
    for t in temps:
        ratio, d = temperature_rows(batch, t, n_values, x_sphere, cfg.topn)
        head_ratio = batch.per_head(ratio)  # [heads, k]
        out["ratio"].append(head_ratio.T.tolist())
        out["ratio_quantiles"].append([quantiles(v) for v in head_ratio.T])
        out["ratio_window_median"].append(window_medians(batch, ratio))
        out["dtilde"].append(batch.per_head(d).tolist())
        out["dtilde_window_median"].append(window_medians(batch, d))
        bar.update(1)
    return out
