"""Paper A's Lemma 1 on the model: does attention vanish as L grows (max weight, entropy vs L)?

Lemma 1 / Corollary 1 [stated, docs/THEORY.md §2]: with every logit of a row in ``[-a, a]``, a
normalizer that ignores L gives ``C1/L ≤ α_i ≤ C2/L``. On one row the tightest such constants
come from the row's own logit range ``ρ = max l − min l``: ``e^{-ρ}/L ≤ α_i ≤ e^{ρ}/L`` (softmax,
T = 1); both are checked on every row. Whether attention *vanishes* then depends on how ρ grows
with L, which only the model can say: the per-head mean of the largest weight and of the
normalised entropy are measured against L.
"""

from __future__ import annotations

import math

import torch

from attnverify.bounds.lemma1 import lemma1_weight_bounds
from attnverify.empirical.experiments.context import Context, quantiles, window_medians
from attnverify.empirical.separation import row_entropy

CHOICES = [
    "The model's own softmax on the rows of each length's band (as Alg. 1); per row: the "
    "largest weight, the entropy / log(keys), the logit range ρ = max l − min l over the "
    "visible keys.",
    "Bounds checked per row: e^{−ρ}/L ≤ min α and max α ≤ e^{ρ}/L (Corollary 1 with the row's "
    "own range, L = the row's key count), with float32's tolerance.",
    "Vanishing: per head, the least-squares slope of log(mean max weight) against log L; −1 is "
    "1/L decay (Lemma 1's regime), 0 is a weight that does not dilute (e.g. an attention sink).",
]


def row_statistics(logits: torch.Tensor):
    """Per row ``[B, R]``: max weight, normalised entropy, logit range, and whether either
    bound of Corollary 1 (with the row's own range) is violated."""
    valid = torch.isfinite(logits)
    alpha = torch.softmax(logits, dim=-1)
    keys = valid.sum(-1).to(alpha.dtype)
    hi = logits.masked_fill(~valid, float("-inf")).amax(-1)
    lo = logits.masked_fill(~valid, float("inf")).amin(-1)
    spread = (hi - lo).to(torch.float64)
    top = alpha.amax(-1)
    bottom = alpha.masked_fill(~valid, float("inf")).amin(-1)
    slack = 1e-5  # float32 rounding of the weights, relative
    # softmax's F = exp: max F / min F over the row's logits is e^(spread)
    lower, upper = lemma1_weight_bounds(1.0, torch.exp(spread), keys)
    bad = (top > upper * (1 + slack)) | (bottom < lower * (1 - slack))
    entropy = row_entropy(alpha, valid) / torch.log(keys)
    return top, entropy, spread, bad


def loglog_slopes(lengths, per_length: torch.Tensor) -> torch.Tensor:
    """Least-squares slope of ``log y`` against ``log L`` per column of ``[L, heads]``."""
    x = torch.log(torch.tensor(lengths, dtype=torch.float64))[:, None]
    y = torch.log(per_length.to(torch.float64).clamp_min(1e-300))
    xc = x - x.mean(0)
    return (xc * (y - y.mean(0))).sum(0) / (xc * xc).sum(0)


def lemma1(ctx: Context) -> dict:
    """Per length: per-head mean max weight and entropy / log(keys), bound violations."""
    bar = ctx.bar("Lemma 1 vs length", len(ctx.lengths))
    top_heads, ent_heads, out = [], [], {"max_weight_window_median": [],
                                         "entropy_window_median": [], "violations": [],
                                         "rows": [], "range_quantiles": []}
    for length in ctx.lengths:
        batch = ctx.batch(length)
        top, entropy, spread, bad = row_statistics(batch.logits)
        top_heads.append(batch.per_head(top))
        ent_heads.append(batch.per_head(entropy))
        out["max_weight_window_median"].append(window_medians(batch, top))
        out["entropy_window_median"].append(window_medians(batch, entropy))
        out["violations"].append(int(bad.sum()))
        out["rows"].append(int(bad.numel()))
        out["range_quantiles"].append(quantiles(batch.per_head(spread)))
        bar.update(1)
    tops, ents = torch.stack(top_heads), torch.stack(ent_heads)  # [L, heads]
    slopes = loglog_slopes(list(ctx.lengths), tops)
    return {
        "lengths": list(ctx.lengths), "heads": ctx.head_labels(), "choices": CHOICES,
        "max_weight": tops.tolist(), "entropy_normalized": ents.tolist(),
        "max_weight_slope": slopes.tolist(),
        "max_weight_slope_quantiles": quantiles(slopes),
        "vanishing_heads": int((slopes <= -0.5).sum()),
        **out,
    }


def times_length(result: dict) -> list[float]:
    """L · (median max weight) per L: constant under 1/L decay."""
    meds = [torch.tensor(row).nanmedian().item() for row in result["max_weight"]]
    return [length * m if math.isfinite(m) else float("nan")
            for length, m in zip(result["lengths"], meds)]
