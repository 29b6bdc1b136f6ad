"""Embeddings for Theorems 1 and 2: :func:`sphere_embeddings` (on a sphere, pairwise distinct)
and :func:`embedding_sets` (arbitrary), with their deterministic builders."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from attnverify.strategies.records import Embeddings, EmbeddingSet
from attnverify.strategies.scalars import (
    _SEEDS,
    DEFAULT_DTYPES,
    FLOAT_DTYPES,
    _draw_bounds,
    _draw_dtype,
    _draw_kind,
    _draw_length,
    _ints,
    _lengths,
    scales,
)
from attnverify.strategies.tensors import _Ctx, _ctx, _finish, _rand, _randint, _randn, _work
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

#: Kinds of :func:`embedding_sets`.
EMBEDDING_KINDS = ("gaussian", "mixed_norms", "duplicates", "collinear")
_MAX_RESAMPLES = 64
_CHUNK_PAIRS = 2**22  # pairwise distances computed per chunk in the δ search


def _sphere(c: _Ctx, n: int, radius: float) -> torch.Tensor:
    """``n`` points uniform on the sphere of ``radius`` in ``R^d`` (float64)."""
    z = _randn(c, n, c.d)
    return radius * z / z.norm(dim=1, keepdim=True)


def _duplicate_rows(x: torch.Tensor) -> torch.Tensor:
    """Boolean mask of rows equal to some other row."""
    _, inverse, counts = torch.unique(x, dim=0, return_inverse=True, return_counts=True)
    return counts[inverse] > 1


def _distinct_sphere(c: _Ctx, radius: float) -> torch.Tensor:
    """Sphere points that are pairwise distinct *after* rounding to the dtype (δ > 0).

    Rows that collide are redrawn from the same generator, so the result stays deterministic.
    """
    x = _finish(_sphere(c, c.length, radius), c.dtype, None)
    for _ in range(_MAX_RESAMPLES):
        dup = _duplicate_rows(x)
        if not bool(dup.any()):
            return x
        x[dup] = _finish(_sphere(c, int(dup.sum()), radius), c.dtype, None)
    raise InvalidArgument(
        f"could not place length={c.length} distinct points on a sphere in d={c.d} in "
        f"{c.dtype}; use a smaller length, a larger d or a wider dtype"
    )


def _min_pairwise_distance(x: torch.Tensor) -> float:
    """Smallest ``‖x_i − x_j‖`` over ``i ≠ j`` in float64, computed directly (no Gram trick,
    which loses close pairs) in chunks of rows."""
    wide = x.to(_work(x.device))
    n = wide.shape[0]
    step = max(1, _CHUNK_PAIRS // n)
    best = math.inf
    for start in range(0, n, step):
        dist = torch.cdist(
            wide[start : start + step], wide, compute_mode="donot_use_mm_for_euclid_dist"
        )
        rows = torch.arange(dist.shape[0], device=x.device)
        dist[rows, rows + start] = math.inf
        best = min(best, float(dist.min()))
    return best


def _check_embedding_key(length: int, d: int, n_top: int, dtype: torch.dtype, seed: int) -> None:
    """Validate the arguments every embedding builder shares."""
    _check_int("length", length, 2)
    _check_int("d", d, 1)
    _check_int("n_top", n_top, 1, length - 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_int("seed", seed, 0, 2**64 - 1)


def build_sphere_embeddings(
    *,
    length: int,
    d: int,
    radius: float = 1.0,
    n_top: int = 1,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: Any = "cpu",
) -> Embeddings:
    """Build ``length`` pairwise-distinct points uniform on the sphere of ``radius`` in ``R^d``
    and their minimum pairwise distance δ > 0 (cost O(length² · d) for δ)."""
    _check_embedding_key(length, d, n_top, dtype, seed)
    _check_positive("radius", radius)
    if radius > torch.finfo(dtype).max / 2:
        raise InvalidArgument(f"radius={radius!r} does not fit in {dtype}")
    if d == 1 and length > 2:
        raise InvalidArgument(f"d=1 has only 2 points on a sphere, but length={length}")
    c = _ctx(seed, device, dtype, radius, length=length, d=d)
    x = _distinct_sphere(c, float(radius))
    return Embeddings(x, float(radius), _min_pairwise_distance(x), n_top, length, d, dtype, seed)


def sphere_embeddings(
    *,
    min_length: int | SearchStrategy[int] = 2,
    max_length: int | SearchStrategy[int] = 64,
    d: int | SearchStrategy[int] | None = None,
    radius: float | SearchStrategy[float] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    device: Any = "cpu",
) -> SearchStrategy[Embeddings]:
    """Points uniform on the sphere of radius M with δ > 0 and a top-set size N (Theorem 2's
    hypotheses), as :class:`Embeddings`.

    ``d=None`` draws up to 64 (log-spread; 1 only when length ≤ 2, since a 1-d sphere has two
    points, and from 4 for half precision past length 64); points that round to the same value
    are redrawn, and a set that cannot be made distinct (a fixed small ``d``, a long set, half
    precision) raises :class:`InvalidArgument`. ``radius=None`` draws M from :func:`scales`.
    ``min_length`` is at least 2. Shrinks to length 2, d 1, M 1, N 1, seed 0.
    """
    _check_length_options(min_length, max_length, shortest=2)
    _static(d, _int_check("d", 1))
    _static(radius, _positive_check("radius"))
    _check_choices("dtypes", dtypes, FLOAT_DTYPES)
    _static(device, _check_device)
    if d == 1 and isinstance(min_length, int) and min_length > 2:
        raise InvalidArgument(f"d=1 has only 2 points on a sphere, but min_length={min_length}")
    options = (min_length, max_length, d, scales() if radius is None else radius, dtypes)
    return _sphere_embeddings(options, device)


@st.composite
def _sphere_embeddings(draw: Callable, options: tuple, device: Any) -> Embeddings:
    min_length, max_length, d, radius, dtypes_ = options
    lo, hi = _draw_bounds(draw, min_length, max_length, shortest=2)
    dtype = _draw_dtype(draw, dtypes_)
    length, dim = _draw_length_and_d(draw, lo, hi, d, dtype)
    radius = _resolve(draw, radius, _positive_check("radius"))
    n_top = draw(_ints(1, length - 1))
    seed = draw(_SEEDS)
    return build_sphere_embeddings(
        length=length, d=dim, radius=radius, n_top=n_top, dtype=dtype, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip


def _smallest_sphere_d(length: int, dtype: torch.dtype) -> int:
    """Default lower bound on d: a 1-d sphere has 2 points, and a half-precision circle only a
    few thousand, so long half-precision sets start at d = 4."""
    if length <= 2:
        return 1
    return 4 if length > 64 and torch.finfo(dtype).bits == 16 else 2


def _draw_length_and_d(draw: Callable, lo: int, hi: int, d: Any, dtype) -> tuple[int, int]:
    """Length and dimension, ``d = 1`` only for length ≤ 2 (see :func:`_smallest_sphere_d`)."""
    if d is None:
        length = _draw_length(draw, lo, hi)
        return length, _draw_length(draw, _smallest_sphere_d(length, dtype), 64)
    dim = _resolve(draw, d, _int_check("d", 1))
    if dim == 1 and lo > 2:
        raise InvalidArgument(f"d=1 has only 2 points on a sphere, but min_length={lo}")
    return _draw_length(draw, lo, min(hi, 2) if dim == 1 else hi), dim


def _embed_gaussian(c: _Ctx) -> torch.Tensor:
    return c.scale * _randn(c, c.length, c.d)


def _embed_mixed_norms(c: _Ctx) -> torch.Tensor:
    """Gaussian points with norms spread over six decades."""
    return _embed_gaussian(c) * torch.pow(10.0, -3 + 6 * _rand(c, c.length, 1))


def _embed_duplicates(c: _Ctx) -> torch.Tensor:
    """1 … length-1 distinct points, repeated: some embeddings coincide."""
    m = int(_randint(c, 1, c.length))
    points = c.scale * _randn(c, m, c.d)
    return points[_randint(c, 0, m, c.length)]


def _embed_collinear(c: _Ctx) -> torch.Tensor:
    """Points ``t_i·v`` on one line through the origin."""
    v = _randn(c, c.d)
    return c.scale * _randn(c, c.length, 1) * (v / v.norm())


_EMBEDDING_BUILDERS = {
    "gaussian": _embed_gaussian,
    "mixed_norms": _embed_mixed_norms,
    "duplicates": _embed_duplicates,
    "collinear": _embed_collinear,
}


def build_embedding_set(
    kind: str,
    *,
    length: int,
    d: int,
    n_top: int = 1,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
    seed: int = 0,
    device: Any = "cpu",
) -> EmbeddingSet:
    """Build ``length`` embeddings in ``R^d`` of one kind (``EMBEDDING_KINDS``)."""
    _check_member("kind", kind, EMBEDDING_KINDS)
    _check_embedding_key(length, d, n_top, dtype, seed)
    _check_positive("scale", scale)
    c = _ctx(seed, device, dtype, scale, length=length, d=d)
    x = _finish(_EMBEDDING_BUILDERS[kind](c), dtype, None)
    return EmbeddingSet(x, n_top, kind, length, d, dtype, float(scale), seed)


def embedding_sets(
    *,
    min_length: int | SearchStrategy[int] = 2,
    max_length: int | SearchStrategy[int] = 64,
    d: int | SearchStrategy[int] | None = None,
    scale: float | SearchStrategy[float] | None = None,
    kinds: Sequence[str] | SearchStrategy[str] = EMBEDDING_KINDS,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    device: Any = "cpu",
) -> SearchStrategy[EmbeddingSet]:
    """Arbitrary embeddings and a top-set size N in 1 … L−1 (Theorem 1), as
    :class:`EmbeddingSet`.

    Kinds (``EMBEDDING_KINDS``): ``gaussian``; ``mixed_norms`` (norms over six decades);
    ``duplicates`` (some points coincide); ``collinear``. ``d=None`` draws 1–64 (log-spread);
    ``scale=None`` draws from :func:`scales`. For weights of the same length, draw
    ``logit_rows(min_length=e.length, max_length=e.length)`` after this one (``st.data()``).
    """
    _check_length_options(min_length, max_length, shortest=2)
    _static(d, _int_check("d", 1))
    _static(scale, _positive_check("scale"))
    _check_choices("kinds", kinds, EMBEDDING_KINDS)
    _check_choices("dtypes", dtypes, FLOAT_DTYPES)
    _static(device, _check_device)
    d = _lengths(1, 64) if d is None else d
    options = (min_length, max_length, d, scales() if scale is None else scale, kinds, dtypes)
    return _embedding_sets(options, device)


@st.composite
def _embedding_sets(draw: Callable, options: tuple, device: Any) -> EmbeddingSet:
    min_length, max_length, d, scale, kinds, dtypes_ = options
    lo, hi = _draw_bounds(draw, min_length, max_length, shortest=2)
    dtype = _draw_dtype(draw, dtypes_)
    kind = _draw_kind(draw, kinds, EMBEDDING_KINDS)
    length = _draw_length(draw, lo, hi)
    dim = _resolve(draw, d, _int_check("d", 1))
    scale = _resolve(draw, scale, _positive_check("scale"))
    n_top = draw(_ints(1, length - 1))
    seed = draw(_SEEDS)
    return build_embedding_set(
        kind, length=length, d=dim, n_top=n_top, dtype=dtype, scale=scale, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip
