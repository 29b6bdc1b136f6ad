"""Queries and keys for Corollary 1: :func:`query_key_sets` and :func:`build_query_keys`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from attnverify.strategies.records import QueryKeys
from attnverify.strategies.scalars import (
    _SEEDS,
    DEFAULT_DTYPES,
    FLOAT_DTYPES,
    _check_common,
    _draw_batch,
    _draw_bounds,
    _draw_dtype,
    _draw_kind,
    _draw_length,
    _lengths,
    scales,
)
from attnverify.strategies.tensors import _Ctx, _ctx, _finish, _rand, _randn, _signs, _work
from attnverify.strategies.validation import (
    _check_choices,
    _check_device,
    _check_int,
    _check_length_options,
    _check_member,
    _check_positive,
    _int_check,
    _positive_check,
    _resolve,
    _static,
)

#: Kinds of :func:`query_key_sets`: Gaussian keys; keys ±√d·q̂ (|logit| = Δ); keys of mixed norm.
QUERY_KEY_KINDS = ("gaussian", "aligned", "mixed_norms")


def _keys_gaussian(c: _Ctx, q: torch.Tensor) -> torch.Tensor:
    return _randn(c, c.batch, c.length, c.d)


def _keys_aligned(c: _Ctx, q: torch.Tensor) -> torch.Tensor:
    """Keys ``±√d·q̂``: every ``|logit|`` equals Δ, the tight case of Corollary 1."""
    direction = q / q.norm(dim=-1, keepdim=True)
    return _signs(c, c.batch, c.length, 1) * math.sqrt(c.d) * direction[:, None, :]


def _keys_mixed_norms(c: _Ctx, q: torch.Tensor) -> torch.Tensor:
    """Gaussian keys with norms spread over four decades (1e-3 … 10)."""
    norms = torch.pow(10.0, -3 + 4 * _rand(c, c.batch, c.length, 1))
    return norms * _randn(c, c.batch, c.length, c.d)


_KEY_BUILDERS = {
    "gaussian": _keys_gaussian,
    "aligned": _keys_aligned,
    "mixed_norms": _keys_mixed_norms,
}


def _fit_query(q: torch.Tensor, K: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Scale ``q`` down where ``Δ = ‖q‖·max‖k‖`` would not fit comfortably in ``dtype``."""
    delta = q.norm(dim=-1) * K.norm(dim=-1).amax(dim=-1)
    factor = (torch.finfo(dtype).max / 4 / delta).clamp(max=1.0)
    return q * factor[:, None]


def _delta(q: torch.Tensor, K: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``‖q‖·max_j‖k_j‖`` in float64, raised to ``max |logit|`` if rounding put one above it."""
    wide = _work(q.device)
    cs = q.to(wide).norm(dim=-1) * K.to(wide).norm(dim=-1).amax(dim=-1)
    return torch.maximum(cs, logits.to(wide).abs().amax(dim=-1))


def build_query_keys(
    kind: str,
    *,
    length: int,
    d: int,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
    seed: int = 0,
    device: Any = "cpu",
) -> QueryKeys:
    """Build queries ``q`` (entries N(0, scale²/d), so a Gaussian logit has std ≈ scale) and
    keys ``K`` of one kind (``QUERY_KEY_KINDS``), with ``logits = K q`` and Δ."""
    _check_member("kind", kind, QUERY_KEY_KINDS)
    for name, value in (("length", length), ("d", d), ("batch", batch)):
        _check_int(name, value, 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_positive("scale", scale)
    _check_int("seed", seed, 0, 2**64 - 1)
    c = _ctx(seed, device, dtype, scale, batch=batch, length=length, d=d)
    q = c.scale / math.sqrt(d) * _randn(c, batch, d)
    K = _KEY_BUILDERS[kind](c, q)
    q, K = _finish(_fit_query(q, K, dtype), dtype, None), _finish(K, dtype, None)
    logits = torch.einsum("bld,bd->bl", K.to(_work(c.device)), q.to(_work(c.device))).to(dtype)
    return QueryKeys(
        q, K, logits, _delta(q, K, logits), kind, length, d, batch, dtype, float(scale), seed
    )


def query_key_sets(
    *,
    min_length: int | SearchStrategy[int] = 1,
    max_length: int | SearchStrategy[int] = 64,
    d: int | SearchStrategy[int] | None = None,
    batch: int | SearchStrategy[int] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    kinds: Sequence[str] | SearchStrategy[str] = QUERY_KEY_KINDS,
    scale: float | SearchStrategy[float] | None = None,
    device: Any = "cpu",
) -> SearchStrategy[QueryKeys]:
    """Queries, keys, ``logits = K q`` and ``Δ = ‖q‖·max_j‖k_j‖`` for Corollary 1, as
    :class:`QueryKeys` (every logit lies in ``[-Δ, Δ]``).

    Kinds (``QUERY_KEY_KINDS``): ``gaussian``; ``aligned`` (keys ``±√d·q̂``, so ``|logit| = Δ``);
    ``mixed_norms`` (key norms over four decades). ``d=None`` draws 1–64 (log-spread);
    ``scale=None`` draws from :func:`scales`.
    """
    _check_length_options(min_length, max_length)
    _static(d, _int_check("d", 1))
    _check_common(batch, dtypes, device)
    _check_choices("kinds", kinds, QUERY_KEY_KINDS)
    _static(scale, _positive_check("scale"))
    d = _lengths(1, 64) if d is None else d
    scale = scales() if scale is None else scale
    options = (min_length, max_length, d, batch, dtypes, kinds, scale)
    return _query_key_sets(options, device)


@st.composite
def _query_key_sets(draw: Callable, options: tuple, device: Any) -> QueryKeys:
    min_length, max_length, d, batch, dtypes_, kinds, scale = options
    lo, hi = _draw_bounds(draw, min_length, max_length)
    dtype = _draw_dtype(draw, dtypes_)
    kind = _draw_kind(draw, kinds, QUERY_KEY_KINDS)
    length = _draw_length(draw, lo, hi)
    dim = _resolve(draw, d, _int_check("d", 1))
    rows = _draw_batch(draw, batch)
    scale = _resolve(draw, scale, _positive_check("scale"))
    seed = draw(_SEEDS)
    return build_query_keys(
        kind, length=length, d=dim, batch=rows, dtype=dtype, scale=scale, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip
