"""Paper B's gradient histories during training, softmax against daGPAM (no model involved)."""

from __future__ import annotations

from attnverify.empirical.experiments.context import Context
from attnverify.empirical.text import load_text, resolve_text_path
from attnverify.empirical.training import gradient_histories

CHOICES = [
    "A pre-norm (LayerNorm) decoder of --training-layers blocks (single-head causal attention, "
    "4× GELU MLP), width 64, byte-level tokens, context 64, batch 16, Adam at lr 1e-3, "
    "--training-steps steps of next-byte prediction on the run's text; the same initial "
    "weights (all but W_Q⁻) and the same batches for every attention kind.",
    "daGPAM: P = (1+λ⁺)·softmax(Q⁺Kᵀ/√d) − λ⁻·softmax(Q⁻Kᵀ/√d), Q⁻ = ReLU(Q⁺)·W_Q⁻, λ fixed; "
    "λ⁺ = λ⁻ is paper B's one-λ form, the others vary one λ with the other held.",
    "Recorded every few steps: the loss, per layer ‖∂loss/∂W_Q‖_F and the norm of the gradient "
    "of all the layer's attention weights.",
]


def training(ctx: Context) -> dict:
    cfg = ctx.config
    text = load_text(resolve_text_path(cfg.text))
    bar = ctx.bar("paper B training run", 1)
    steps = cfg.training_steps
    histories = gradient_histories(
        text.prose, cfg.training_lambdas, cfg.training_layers, width=64, context=64,
        batch=16, steps=steps, seed=cfg.seed, log_every=max(1, steps // 30),
    )
    bar.update(1)
    return {"steps": steps, "layers": cfg.training_layers, "kinds": histories,
            "choices": CHOICES}
