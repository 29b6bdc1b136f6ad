"""Row plumbing shared by the built-ins: precision, temperature, masks, the fully-masked policy.

Conventions every built-in follows (docs/NORMALIZERS.md):

- ``-inf`` in the scores marks a masked key; it gets weight exactly 0 and the other weights are
  those of the row without it.
- A fully masked row returns all zeros (the declared policy), never NaN and never an exception.
- float16 / bfloat16 inputs are computed in float32 and returned in the input dtype.
"""

from __future__ import annotations

import math

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)
NEG_INF = float("-inf")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: float32 for half types, the input dtype otherwise."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def check_temperature(temperature: float) -> None:
    t = float(temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")


def prepare(scores: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Scores in the compute dtype, divided by the temperature (a new tensor when it changes)."""
    check_temperature(temperature)
    if not torch.is_floating_point(scores):
        raise TypeError(f"scores must be a floating-point tensor, got {scores.dtype}")
    x = scores.to(compute_dtype(scores.dtype))
    if temperature != 1.0:
        x = x / temperature
    return x


def finish(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Return ``y`` in the dtype of the original scores."""
    return y if y.dtype == like.dtype else y.to(like.dtype)


def masked(x: torch.Tensor) -> torch.Tensor:
    """Boolean mask of masked keys (score ``-inf``)."""
    return x == NEG_INF


def fully_masked(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows (keepdim) whose every key is masked; a length-0 row counts as fully masked."""
    return masked(x).all(dim=dim, keepdim=True)


def unmasked_count(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Number of unmasked keys per row (keepdim), in the dtype of ``x``."""
    return (~masked(x)).sum(dim=dim, keepdim=True).to(x.dtype)


def safe_divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` with rows where ``den == 0`` giving 0 (and a zero, not NaN, gradient)."""
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def row_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Largest score per row (keepdim), detached; 0 for a fully masked row."""
    m = x.detach().amax(dim=dim, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))
