"""Paper A's Algorithm 5: g(T, ε) on the model's own logits, against the bounds of Fig. 4."""

from __future__ import annotations

import math

import torch

from attnverify import bounds
from attnverify.empirical.experiments.context import Context, exceeds
from attnverify.empirical.gradient import sensitivity, unit_directions
from attnverify.empirical.rows import CHUNK_BYTES, chunks

CHOICES = [
    "Logits: the model's own scaled, causally masked q·k/√d_head of the L_max band's tokens; "
    "T divides them: f(l/T).",
    "v: Gaussian on the row's visible keys, unit norm, drawn once per (head, token) and reused "
    "for every (T, ε).",
    "g(T, ε) = max over heads of the per-head mean over tokens; float64 throughout.",
    "Bounds: by the mean value theorem, √2/ε holds for every simplex normalizer and 1/(2T) for "
    "softmax (its Jacobian's spectral norm); 1/(4T) is the paper's Corollary 3 (true "
    "entry-wise, not for this norm).",
]


def per_head_sensitivity(ctx: Context, weighting, logits, directions):
    """Mean over tokens per window and head ``[T, ε, window, heads]``; worst token per head
    ``[T, ε, heads]``."""
    cfg = ctx.config
    size = max(1, CHUNK_BYTES // (logits[0].numel() * 8))
    means, worsts = [], []
    for sl in chunks(logits.shape[0], size):
        mean, worst = sensitivity(logits[sl], weighting, cfg.temperatures, cfg.epsilons,
                                  directions[sl])
        means.append(mean)
        worsts.append(worst)
    heads = ctx.extraction.n_total_heads
    mean = torch.cat(means, -1).reshape(len(cfg.temperatures), len(cfg.epsilons), -1, heads)
    worst = torch.cat(worsts, -1).reshape(mean.shape)
    return mean, worst.amax(2)


def gradient(ctx: Context) -> dict:
    """Algorithm 5: per (T, ε), g = the largest per-head mean of δ_t."""
    cfg = ctx.config
    batch = ctx.batch(ctx.max_length)
    logits = batch.logits.to(torch.float64)
    directions = unit_directions(logits, ctx.generator(5))
    temps = torch.tensor(cfg.temperatures, dtype=logits.dtype, device=logits.device)
    eps = torch.tensor(cfg.epsilons, dtype=logits.dtype, device=logits.device)
    half = bounds.softmax_spectral_bound(temps)[:, None, None]
    quarter = bounds.cor3_entrywise_bound(temps)[:, None, None]
    sqrt2 = (math.sqrt(2.0) / eps)[None, :, None]
    labels = ctx.head_labels()
    result = {"L": ctx.max_length, "T": list(cfg.temperatures), "eps": list(cfg.epsilons),
              "rows": len(batch.rows), "choices": CHOICES, "normalizers": {}}
    bar = ctx.bar("Alg.5 gradient", len(ctx.weightings))
    for w in ctx.weightings:
        per_window, worst = per_head_sensitivity(ctx, w, logits, directions)
        mean = per_window.mean(2)
        g, arg = mean.max(-1)
        result["normalizers"][w.id] = {
            "g": g.T.tolist(),  # [eps][T]
            "g_window": per_window.amax(-1).permute(1, 0, 2).tolist(),  # [eps][T][window]
            "argmax_head": [[labels[i] for i in row] for row in arg.T.tolist()],
            "per_head_median": mean.median(-1).values.T.tolist(),
            "worst_token": worst.amax(-1).T.tolist(),
            "violations": {
                "half_over_T": int(exceeds(worst, half.expand_as(worst)).sum()),
                "sqrt2_over_eps": int(exceeds(worst, sqrt2.expand_as(worst)).sum()),
                "quarter_over_T": int(exceeds(worst, quarter.expand_as(worst)).sum()),
                "checked": int(worst.numel()),
            },
        }
        bar.update(1)
    return result
