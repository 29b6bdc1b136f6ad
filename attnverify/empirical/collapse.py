"""Paper B's faithfulness test: rank collapse in deep attention stacks at initialisation.

[choice] Each stack is ``depth`` self-attention layers with no MLP, in four architectures:
``pure`` (``X ← Attn(X)``, the setting of Dong et al. 2021 where collapse is proved doubly
exponential), ``residual`` (``X ← X + Attn(X)``, no normalisation), and the pre-norm residual
stacks of today's models, ``prenorm_layernorm`` and ``prenorm_rmsnorm``
(``X ← X + Attn(Norm(X))``, the norm without learned gain or bias); one head of width
``d``, no mask, weights ``N(0, 1/d)``, inputs ``X₀ ~ N(0, 1)`` of ``n`` tokens. A softmax layer is
``X ← softmax(QKᵀ/√d)·V``; a daGPAM layer uses paper B's two maps (docs/THEORY.md §6):
``P⁺ = softmax(Q⁺Kᵀ/√d)``, ``P⁻ = softmax(Q⁻Kᵀ/√d)``, ``Q⁻ = ReLU(Q⁺)·W_Q⁻``,
``P = (1+λ⁺)P⁺ − λ⁻P⁻``; λ⁺ = λ⁻ = λ is paper B's one-λ form (rows sum to 1, entries in
``[−λ, 1+λ]``), and paper B also varies λ⁺ and λ⁻ separately (then rows sum to the fixed total
``1 + λ⁺ − λ⁻``) [choice: the two-parameter form].

Measured per layer: ``‖res(X)‖_F/‖X‖_F`` with ``res(X) = X − 1·x̄ᵀ`` (x̄ = column mean) and the
mean pairwise cosine similarity of the tokens; and, for the loss ``mean((X̂ − Y)²)`` with
``X̂ = X_depth / rms(X_depth)`` (so the loss scale does not depend on how the stack scales its
output) and a fixed Gaussian target ``Y``, the Frobenius norm of the gradient of every layer's
query weight ``W_Q`` (``W_Q⁺`` for daGPAM); and the root-mean-square entry of ``X`` per layer
(residual stacks grow, and a growing ``X`` saturates the next layer's softmax).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def residual_ratio(x: torch.Tensor) -> float:
    """``‖X − 1·x̄ᵀ‖_F / ‖X‖_F`` (0 = every token identical: full rank collapse)."""
    res = x - x.mean(0, keepdim=True)
    return float(res.norm() / x.norm().clamp_min(torch.finfo(x.dtype).tiny))


def mean_cosine(x: torch.Tensor) -> float:
    """Mean cosine similarity over pairs of distinct tokens (1 = all tokens aligned)."""
    unit = x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    sim = unit @ unit.T
    n = x.shape[0]
    return float((sim.sum() - sim.diagonal().sum()) / (n * (n - 1)))


ARCHITECTURES = ("pure", "residual", "prenorm_layernorm", "prenorm_rmsnorm")


def _pair(lam) -> tuple[float, float]:
    return (float(lam), float(lam)) if isinstance(lam, (int, float)) else tuple(map(float, lam))


def normalise(x: torch.Tensor, kind: str) -> torch.Tensor:
    """LayerNorm or RMSNorm over the width, without learned gain or bias."""
    if kind == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    return x / (x.square().mean(-1, keepdim=True) + 1e-6).sqrt()


def attention_layer(x, weights: dict[str, torch.Tensor], lam) -> torch.Tensor:
    """One single-head layer; ``lam = 0`` is softmax attention, otherwise daGPAM with
    ``lam = λ`` (λ⁺ = λ⁻) or ``lam = (λ⁺, λ⁻)``."""
    lam_pos, lam_neg = _pair(lam)
    d = x.shape[-1]
    q = x @ weights["q"]
    k = x @ weights["k"]
    v = x @ weights["v"]
    p = torch.softmax(q @ k.T / math.sqrt(d), dim=-1)
    if lam_pos or lam_neg:
        q_neg = torch.relu(q) @ weights["q_neg"]
        p_neg = torch.softmax(q_neg @ k.T / math.sqrt(d), dim=-1)
        p = (1 + lam_pos) * p - lam_neg * p_neg
    return p @ v


def init_weights(depth: int, width: int, generator) -> list[dict[str, torch.Tensor]]:
    scale = 1 / math.sqrt(width)
    return [
        {
            name: (torch.randn(width, width, generator=generator, dtype=torch.float64) * scale)
            .requires_grad_(True)
            for name in ("q", "q_neg", "k", "v")
        }
        for _ in range(depth)
    ]


def run_stack(
    lam, depth: int, width: int, tokens: int, seed: int, skip: bool = False,
    arch: str | None = None,
) -> dict[str, list]:
    """One stack at initialisation: per-layer residual ratio, cosine, query-gradient norm.

    ``arch`` is one of :data:`ARCHITECTURES` (``skip=True`` alone means ``residual``). The same
    seed gives the same inputs and the same ``W_Q, W_K, W_V`` for every λ, so the kinds are
    compared pairwise.
    """
    arch = arch or ("residual" if skip else "pure")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=gen, dtype=torch.float64)
    target = torch.randn(tokens, width, generator=gen, dtype=torch.float64)
    layers = init_weights(depth, width, gen)
    states = [x]
    for weights in layers:
        x = states[-1]
        if arch.startswith("prenorm_"):
            states.append(x + attention_layer(normalise(x, arch[len("prenorm_"):]), weights, lam))
        elif arch == "residual":
            states.append(x + attention_layer(x, weights, lam))
        else:
            states.append(attention_layer(x, weights, lam))
    out = states[-1]
    loss = (out / out.square().mean().sqrt() - target).square().mean()
    loss.backward()
    return {
        "residual": [residual_ratio(s.detach()) for s in states],
        "cosine": [mean_cosine(s.detach()) for s in states],
        "rms": [float(s.detach().square().mean().sqrt()) for s in states],
        "grad_q": [float(w["q"].grad.norm()) for w in layers],
    }


def collapse_curves(
    lambdas: Sequence[float], depth: int, width: int, tokens: int, seeds: Sequence[int],
    pairs: Sequence[tuple[float, float]] = (),
) -> dict[str, dict[str, list]]:
    """Median and quartiles over seeds (these quantities span many orders of magnitude, so a
    mean would be one seed's), per architecture (:data:`ARCHITECTURES`) and kind: ``softmax``,
    ``dagpam_λ`` for each λ, ``dagpam_λ⁺_λ⁻`` for each further pair.

    Runs single-threaded: these matrices are tiny, and thread hand-offs cost more than the work.
    """
    kinds = [(0.0, 0.0)] + [(float(lam), float(lam)) for lam in lambdas]
    kinds += [p for p in map(_pair, pairs) if p not in kinds]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {arch: _curves(kinds, depth, width, tokens, seeds, arch)
                for arch in ARCHITECTURES}
    finally:
        torch.set_num_threads(threads)


def kind_name(lam_pos: float, lam_neg: float) -> str:
    if lam_pos == lam_neg == 0:
        return "softmax"
    return f"dagpam_{lam_pos:g}" if lam_pos == lam_neg else f"dagpam_{lam_pos:g}_{lam_neg:g}"


def _curves(kinds, depth, width, tokens, seeds, arch: str) -> dict[str, dict[str, list]]:
    out = {}
    for lam_pos, lam_neg in kinds:
        runs = [run_stack((lam_pos, lam_neg), depth, width, tokens, seed, arch=arch)
                for seed in seeds]
        name = kind_name(lam_pos, lam_neg)
        out[name] = {"lambda": lam_pos if lam_pos == lam_neg else None,
                     "lambda_pos": lam_pos, "lambda_neg": lam_neg}
        for key in ("residual", "cosine", "rms", "grad_q"):
            table = torch.tensor([run[key] for run in runs], dtype=torch.float64)
            q = torch.quantile(table, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=0)
            out[name][key] = q[1].tolist()
            out[name][key + "_q25"], out[name][key + "_q75"] = q[0].tolist(), q[2].tolist()
    return out
