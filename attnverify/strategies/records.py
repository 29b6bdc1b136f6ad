"""The records the strategies return (:class:`typing.NamedTuple`) and :func:`repro`, the
one-line call that rebuilds one."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Rows(NamedTuple):
    """Batched logit rows from :func:`logit_rows`; rows along the last dim.

    ``scores`` is ``[batch, length]`` in ``dtype`` on the requested device; ``-inf`` marks a
    masked key. ``scale`` is the magnitude the kind used (the huge magnitude for
    ``huge_range``); ``max_abs`` caps every finite ``|score|`` (None: only the dtype's range).
    """

    scores: torch.Tensor
    kind: str
    length: int
    batch: int
    dtype: torch.dtype
    scale: float
    seed: int
    max_abs: float | None = None


class BoundedRows(NamedTuple):
    """Rows with every logit in ``[-a, a]`` (Lemma 1), ``scores`` ``[batch, length]``."""

    scores: torch.Tensor
    a: float
    kind: str
    length: int
    batch: int
    dtype: torch.dtype
    seed: int


class QueryKeys(NamedTuple):
    """Queries and keys for Corollary 1.

    ``q`` is ``[batch, d]``, ``K`` ``[batch, length, d]``, ``logits = K q`` ``[batch, length]``
    (computed in float64 from the stored ``q``, ``K``, then rounded to ``dtype``), ``delta``
    ``[batch]`` float64 with ``delta = ‖q‖·max_j‖k_j‖`` (raised, if rounding needs it, so that
    every ``|logit| ≤ delta``).
    """

    q: torch.Tensor
    K: torch.Tensor
    logits: torch.Tensor
    delta: torch.Tensor
    kind: str
    length: int
    d: int
    batch: int
    dtype: torch.dtype
    scale: float
    seed: int


class Embeddings(NamedTuple):
    """Embeddings on a sphere (Theorem 2 hypotheses).

    ``x`` is ``[length, d]`` with every row of norm ``M`` (to the dtype's rounding), pairwise
    distinct; ``delta > 0`` is the minimum pairwise distance of ``x`` as stored (in float64);
    ``n_top`` is a top-set size N in ``1 … length-1``.
    """

    x: torch.Tensor
    M: float
    delta: float
    n_top: int
    length: int
    d: int
    dtype: torch.dtype
    seed: int


class EmbeddingSet(NamedTuple):
    """Arbitrary embeddings ``x`` ``[length, d]`` and a top-set size ``n_top`` in 1 … length-1
    (Theorem 1)."""

    x: torch.Tensor
    n_top: int
    kind: str
    length: int
    d: int
    dtype: torch.dtype
    scale: float
    seed: int


#: Builder and ``kwarg[=field]`` list that rebuild each record type.
_REPRO = {
    "Rows": ("build_rows", "length batch dtype scale seed max_abs"),
    "BoundedRows": ("build_bounded_rows", "a length batch dtype seed"),
    "QueryKeys": ("build_query_keys", "length d batch dtype scale seed"),
    "Embeddings": ("build_sphere_embeddings", "length d radius=M n_top dtype seed"),
    "EmbeddingSet": ("build_embedding_set", "length d n_top dtype scale seed"),
}


def repro(record: NamedTuple) -> str:
    """The one-line call that rebuilds ``record`` exactly (needs ``import torch,
    attnverify.strategies``), e.g. ``attnverify.strategies.build_rows('gaussian', length=3,
    batch=1, dtype=torch.float32, scale=1.0, seed=0, max_abs=None, device='cpu')``."""
    builder, spec = _REPRO[type(record).__name__]
    args = [repr(record.kind)] if "kind" in record._fields else []
    for item in spec.split():
        kwarg, _, field = item.partition("=")
        args.append(f"{kwarg}={getattr(record, field or kwarg)!r}")
    args.append(f"device={str(record[0].device)!r}")
    return f"attnverify.strategies.{builder}({', '.join(args)})"
