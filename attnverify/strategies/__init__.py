"""Public Hypothesis strategies for attnverify's property suite.

Conventions follow Hypothesis's numpy strategies:

* options are keyword-only; an option of a tensor strategy accepts a value or a strategy that
  draws the value (the bounds of the scalar strategies :func:`lengths`, :func:`scales` and
  :func:`temperatures` are plain values, as in ``st.integers``);
* arguments are validated when the strategy is built, with
  :class:`hypothesis.errors.InvalidArgument` naming the argument; a value drawn from a strategy
  option is validated when it is drawn;
* results are :class:`typing.NamedTuple` records.

Every strategy draws only small structural parameters (length, dimension, dtype, kind of
adversary, scale, seed) and builds its tensors from a seeded :class:`torch.Generator` in float64
on the requested device, converting to the drawn dtype at the end. Examples stay cheap at large
lengths and shrink to a minimal case: the shortest length, the first (simplest) kind and dtype,
scale 1 and seed 0. Lengths are drawn as a power-of-two bucket then a length inside it, so they
shrink towards small values while ``max_length`` (the caller's; the settings profiles are in
:data:`attnverify.certify.PROFILES`) stays reachable.

Each tensor strategy has a deterministic builder (``logit_rows`` → :func:`build_rows`, ...) taking
the record's structural fields; :func:`repro` prints the one-line call that rebuilds a record. The
same seed gives the same tensor on the same device type (CPU and CUDA generators differ).

Inputs are constructed to satisfy a theorem's hypotheses (docs/THEORY.md), never filtered with
``assume``.

The package is split by concern, every public name re-exported here (``attnverify.strategies.X``
is the name to use): :mod:`~attnverify.strategies.rows` (logit rows, bounded rows),
:mod:`~attnverify.strategies.queries` (queries and keys), :mod:`~attnverify.strategies.embeddings`,
:mod:`~attnverify.strategies.scalars` (lengths, dtypes, scales, temperatures and the shared
draws), :mod:`~attnverify.strategies.records` (the result types and :func:`repro`),
:mod:`~attnverify.strategies.tensors` (seeded tensor construction),
:mod:`~attnverify.strategies.layouts` (how rows are given to a normalizer: rank, axis, memory
layout, row counts and lengths across block sizes) and
:mod:`~attnverify.strategies.validation` (argument checks).
"""

from __future__ import annotations

from attnverify.strategies.embeddings import (
    EMBEDDING_KINDS,
    build_embedding_set,
    build_sphere_embeddings,
    embedding_sets,
    sphere_embeddings,
)
from attnverify.strategies.layouts import (
    Layout,
    block_lengths,
    build_layout,
    collect,
    present,
    row_counts,
    row_layouts,
)
from attnverify.strategies.queries import (
    QUERY_KEY_KINDS,
    build_query_keys,
    query_key_sets,
)
from attnverify.strategies.records import (
    BoundedRows,
    Embeddings,
    EmbeddingSet,
    QueryKeys,
    Rows,
    repro,
)
from attnverify.strategies.rows import (
    ALL_KINDS,
    BOUNDED_KINDS,
    HUGE_MAGNITUDES,
    MASK_KINDS,
    PEAK_MARGIN,
    TIE_GAP,
    bounded_rows,
    build_bounded_rows,
    build_rows,
    logit_rows,
)
from attnverify.strategies.scalars import (
    DEFAULT_DTYPES,
    FLOAT_DTYPES,
    dtypes,
    lengths,
    scales,
    temperatures,
)

__all__ = [
    "ALL_KINDS",
    "BOUNDED_KINDS",
    "DEFAULT_DTYPES",
    "EMBEDDING_KINDS",
    "FLOAT_DTYPES",
    "HUGE_MAGNITUDES",
    "MASK_KINDS",
    "PEAK_MARGIN",
    "QUERY_KEY_KINDS",
    "TIE_GAP",
    "BoundedRows",
    "EmbeddingSet",
    "Embeddings",
    "Layout",
    "QueryKeys",
    "Rows",
    "block_lengths",
    "bounded_rows",
    "build_bounded_rows",
    "build_embedding_set",
    "build_layout",
    "build_query_keys",
    "build_rows",
    "build_sphere_embeddings",
    "collect",
    "dtypes",
    "embedding_sets",
    "row_layouts",
    "lengths",
    "logit_rows",
    "present",
    "query_key_sets",
    "repro",
    "row_counts",
    "scales",
    "sphere_embeddings",
    "temperatures",
]
