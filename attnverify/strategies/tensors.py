"""Seeded tensor construction: every builder draws from a :class:`torch.Generator` in float64
(float32 on MPS) and converts to the requested dtype at the end."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class _Ctx(NamedTuple):
    """What a kind builder needs: the seeded generator and the shape and magnitude."""

    g: torch.Generator
    device: torch.device
    dtype: torch.dtype
    scale: float
    batch: int = 1
    length: int = 1
    d: int = 1


def _ctx(seed: int, device: Any, dtype: torch.dtype, scale: float, **shape: int) -> _Ctx:
    dev = torch.device(device)
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return _Ctx(g, dev, dtype, float(scale), **shape)


def _work(device: torch.device) -> torch.dtype:
    """float64, except on MPS which has none."""
    return torch.float32 if device.type == "mps" else torch.float64


def _randn(c: _Ctx, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=c.g, device=c.device, dtype=_work(c.device))


def _rand(c: _Ctx, *shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=c.g, device=c.device, dtype=_work(c.device))


def _randint(c: _Ctx, low: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=c.g, device=c.device)


def _signs(c: _Ctx, *shape: int) -> torch.Tensor:
    return torch.where(_rand(c, *shape) < 0.5, -1.0, 1.0).to(_work(c.device))


def _positions(c: _Ctx, k: int) -> torch.Tensor:
    """``k`` distinct random key positions per row, ``[batch, k]``."""
    return _rand(c, c.batch, c.length).argsort(dim=1)[:, :k]


def _floor_to_dtype(value: float, dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` that is ``<= value`` (``value >= 0``)."""
    t = torch.tensor(value, dtype=torch.float64).to(dtype)
    if float(t) > value:
        t = torch.nextafter(t, torch.zeros_like(t))
    return float(t)


def _finish(x: torch.Tensor, dtype: torch.dtype, max_abs: float | None) -> torch.Tensor:
    """Clamp finite entries to ``±cap`` (``max_abs`` and the dtype's range), convert to ``dtype``.

    ``cap`` is representable in ``dtype`` and rounding is monotone, so the result stays within
    ``±max_abs``; ``-inf`` (masked keys) is kept.
    """
    limit = torch.finfo(dtype).max if max_abs is None else min(max_abs, torch.finfo(dtype).max)
    cap = _floor_to_dtype(limit, dtype)
    wide = x.to(_work(x.device))
    return torch.where(torch.isfinite(wide), wide.clamp(-cap, cap), wide).to(dtype)
