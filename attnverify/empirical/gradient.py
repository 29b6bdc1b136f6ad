"""Paper A's Algorithm 5: finite-difference gradient sensitivity of a normalizer on real logits.

[stated] Per head and token, draw a unit vector ``v`` and take
``δ_t = ‖f((l + εv)/T) − f(l/T)‖₂ / ε``; average over tokens; ``g(T, ε)`` = max over heads.
[choice] ``l`` are the model's own scaled, causally masked logits ``q·k/√d_head``; ``v`` is
Gaussian on the row's unmasked keys, normalised, drawn once per (head, token) and reused for every
(T, ε) so the curves differ only through T and ε; arithmetic in float64.

For softmax (a simplex normalizer), the mean value theorem gives ``g ≤ min{1/(2T), √2/ε}``
(docs/THEORY.md §5); the paper's stated ``1/(4T)`` bounds only the Jacobian's entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def unit_directions(logits: torch.Tensor, generator=None) -> torch.Tensor:
    """A Gaussian direction per row, zero on masked keys, unit ℓ2 norm."""
    valid = torch.isfinite(logits)
    v = torch.randn(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    v = v.masked_fill(~valid, 0.0)
    return v / v.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)


def sensitivity(
    logits: torch.Tensor,
    normalize: Callable[[torch.Tensor], torch.Tensor],
    temperatures: Sequence[float],
    epsilons: Sequence[float],
    directions: torch.Tensor,
) -> torch.Tensor:
    """Mean and max over rows of ``δ_t`` per head: two ``[len(T), len(ε), b]`` tensors for
    logits ``[b, R, n]``.

    Masked keys are set to weight 0 whatever the normalizer returns there (a ``-inf·0 = NaN``
    on a masked key is the normalizer's own business and is certified elsewhere).
    """
    masked = ~torch.isfinite(logits)
    shape = (len(temperatures), len(epsilons), logits.shape[0])
    mean = torch.empty(shape, dtype=logits.dtype, device=logits.device)
    worst = torch.empty_like(mean)
    for ti, t in enumerate(temperatures):
        scaled = logits / t
        base = normalize(scaled)
        for ei, eps in enumerate(epsilons):
            diff = normalize(torch.add(scaled, directions, alpha=eps / t)).sub_(base)
            delta = torch.linalg.vector_norm(diff.masked_fill_(masked, 0.0), dim=-1) / eps
            mean[ti, ei] = delta.mean(-1)
            worst[ti, ei] = delta.amax(-1)
    return mean, worst
