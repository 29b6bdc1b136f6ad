"""Paper A's Algorithm 4: geometric separability N_s/N, and the per-head saturation diagnostic."""

from __future__ import annotations

import math

import torch

from attnverify.empirical.experiments.context import (
    Context,
    exceeds,
    quantiles,
    window_medians,
)
from attnverify.empirical.extraction import SharedRows
from attnverify.empirical.rows import RowBatch, chunks, over_chunks
from attnverify.empirical.separation import (
    on_sphere,
    prefix_min_distance,
    row_entropy,
    separation,
)

CHOICES = [
    "Embeddings (--embeddings): projected onto the unit sphere (M = 1; N_s/N is scale-free).",
    "δ = the minimum pairwise distance among the row's keys; identical vectors (distance < 1e-6, "
    "e.g. a repeated token in a RoPE model's first layer) violate δ > 0 and are left out of δ "
    "and counted.",
    "Separable: ‖α_i x_i − s‖ < r (strict), r = min over unselected keys of ‖s − α_j x_j‖.",
    "Tokens: the rows of the L_max band; per-head means over tokens, distributions over heads.",
    "Upper-bound violations are counted per instance (row, N) and on average (per-head means).",
    "Diagnostic: per-head mean entropy / log(keys) (1 = uniform: Lemma 1's vanishing attention; "
    "0 = one-hot) next to the head's N_s/N plateau (mean over N ≥ 16).",
]
PLATEAU_FROM = 16


def sphere_geometry(batch: RowBatch):
    """Sphere-projected embeddings ``[B, n, d]``, δ per row ``[B, R]``, duplicate pairs
    ``[B, R]``. Embeddings shared by a layer's heads get δ once per layer."""
    x = on_sphere(batch.values)
    if isinstance(x, SharedRows):
        w, g, n, d = x.base.shape
        delta, dups = _prefix_geometry(x.base.reshape(w * g, n, d), batch.rows)
        window, group = x.groups(slice(0, x.shape[0]))
        pick = window * g + group
        return x, delta[pick].to(x.dtype), dups[pick]
    delta, dups = _prefix_geometry(x, batch.rows)
    return x, delta.to(x.dtype), dups


def _prefix_geometry(x, rows):
    n = x.shape[-2]
    deltas, dups = [], []
    size = max(1, (256 << 20) // (3 * n * n * 8))
    for sl in chunks(x.shape[0], size):
        delta, dup = prefix_min_distance(x[sl])
        deltas.append(delta[:, rows])
        dups.append(dup[:, rows])
    return torch.cat(deltas), torch.cat(dups)


def separation_rows(batch: RowBatch, weighting, x, delta, n_values):
    alpha = weighting(batch.logits)
    valid = batch.valid

    def fn(sl):
        sep = separation(alpha[sl], x[sl], valid, delta[sl], n_values)
        return sep.ratio, sep.lower, sep.upper

    ratio, lower, upper = over_chunks(batch, x.shape[-2] * len(n_values), fn)
    entropy = row_entropy(alpha, valid) / torch.log(valid.sum(-1).to(alpha.dtype))
    return ratio, lower, upper, entropy


def summarise(batch: RowBatch, n_values, ratio, lower, upper, entropy) -> dict:
    head_ratio = batch.per_head(ratio)  # [H, k]
    head_upper = batch.per_head(upper)
    plateau = n_values >= min(PLATEAU_FROM, int(n_values.max()))
    return {
        "ratio": head_ratio.T.tolist(),
        "ratio_quantiles": [quantiles(v) for v in head_ratio.T],
        "lower_quantiles": [quantiles(v) for v in batch.per_head(lower).T],
        "upper_quantiles": [quantiles(v) for v in head_upper.T],
        "lower_violation_fraction": _fraction(exceeds(lower, ratio)),
        "upper_violation_fraction": _fraction(exceeds(ratio, upper)),
        "upper_violated_on_average": exceeds(head_ratio, head_upper).sum(0).tolist(),
        "entropy_normalized": batch.per_head(entropy).tolist(),
        "plateau": head_ratio[:, plateau].mean(-1).tolist(),
        "ratio_window_median": window_medians(batch, ratio),  # [N][window]
        "plateau_window_median": _window_plateau(batch, ratio, plateau).median(-1).values.tolist(),
        "plateau_window_max": _window_plateau(batch, ratio, plateau).amax(-1).tolist(),
    }


def _window_plateau(batch: RowBatch, ratio, plateau) -> torch.Tensor:
    """Per window and head, the mean of N_s/N over the plateau's N: ``[window, head]``."""
    return batch.per_window(ratio)[..., plateau].mean(-1)


def _fraction(flags: torch.Tensor) -> list[float]:
    return flags.to(torch.float64).mean((0, 1)).tolist()


def separability(ctx: Context) -> dict:
    """Algorithm 4: N_s/N for N = 1 … ``--separability-max-n`` at L = L_max, both bounds."""
    batch = ctx.batch(ctx.max_length)
    n_values = torch.arange(1, ctx.config.separability_max_n + 1, device=ctx.device)
    x, delta, dups = sphere_geometry(batch)
    result = {
        "L": ctx.max_length, "N": n_values.tolist(), "rows": len(batch.rows),
        "delta": quantiles(batch.per_head(delta)),
        "rows_with_duplicates": int((dups > 0).sum()),
        "rows_total": int(dups.numel()),
        "heads": ctx.head_labels(), "choices": CHOICES, "normalizers": {},
    }
    bar = ctx.bar("Alg.4 separability", len(ctx.weightings))
    for w in ctx.weightings:
        parts = separation_rows(batch, w, x, delta, n_values)
        result["normalizers"][w.id] = summarise(batch, n_values, *parts)
        bar.update(1)
    return result


def coverage(p: float, heads: int) -> float:
    """Paper A: H independent heads separating a fraction p each cover ``1 − (1 − p)^H``."""
    return 1 - (1 - p) ** heads if math.isfinite(p) else float("nan")
