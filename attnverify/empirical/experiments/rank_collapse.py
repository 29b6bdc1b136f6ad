"""Paper B's rank-collapse check at initialisation (no model involved)."""

from __future__ import annotations

from attnverify.empirical.collapse import collapse_curves
from attnverify.empirical.experiments.context import Context

CHOICES = [
    "Stacks of single-head attention layers, width d = --collapse-width, n = --collapse-tokens "
    "tokens, no mask, weights N(0, 1/d), inputs N(0, 1), no MLP: 'pure' (X ← Attn(X), Dong et "
    "al.), 'residual' (X ← X + Attn(X), no normalisation) and the pre-norm residual stacks "
    "'prenorm_layernorm' and 'prenorm_rmsnorm' (X ← X + Attn(Norm(X)), no learned gain).",
    "daGPAM: paper B's two maps, P = (1+λ⁺)·softmax(Q⁺Kᵀ/√d) − λ⁻·softmax(Q⁻Kᵀ/√d), "
    "Q⁻ = ReLU(Q⁺)·W_Q⁻; dagpam_λ is λ⁺ = λ⁻ = λ (paper B's one-λ form), dagpam_λ⁺_λ⁻ varies "
    "one λ with the other held at 1 (rows then sum to 1 + λ⁺ − λ⁻). The same seed gives the "
    "same inputs and W_Q, W_K, W_V for every kind.",
    "Gradient: ‖∂loss/∂W_Q‖_F per layer for loss = mean((X̂ − Y)²), X̂ = output / rms(output), "
    "Y a fixed Gaussian target. Medians over seeds (the quantities span many orders of "
    "magnitude); the rms of X per layer is reported because residual stacks grow, daGPAM's "
    "faster, which scales gradients and saturates later layers.",
    "The model under test is not used: paper B's check is about initialisation.",
]


def rank_collapse(ctx: Context) -> dict:
    cfg = ctx.config
    bar = ctx.bar("paper B rank collapse", 1)
    seeds = [cfg.seed * 1000 + i for i in range(cfg.collapse_seeds)]
    curves = collapse_curves(cfg.collapse_lambdas, cfg.collapse_depth, cfg.collapse_width,
                             cfg.collapse_tokens, seeds, cfg.collapse_pairs)
    bar.update(1)
    return {"depth": cfg.collapse_depth, "lambdas": list(cfg.collapse_lambdas),
            "pairs": [list(p) for p in cfg.collapse_pairs],
            "seeds": len(seeds), "width": cfg.collapse_width, "tokens": cfg.collapse_tokens,
            "architectures": curves, "choices": CHOICES}
