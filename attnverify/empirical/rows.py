"""Which attention rows ("tokens") each length L uses, and batches of them across heads.

[choice] A causal model's query at position t attends to t + 1 keys, so one forward pass over a
window of ``L_max`` tokens holds rows of every length up to ``L_max``. The tokens for length L
are query rows whose length lies in (L/2, L] — positions ``L/2 … L−1`` — sampled evenly to at most
``rows_per_length`` rows and always including the row of exactly L keys. The lengths' bands are
disjoint, so L = 32 … 1024 need one forward pass per window, not one per L.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from attnverify.empirical.extraction import Extraction


def band_rows(length: int, count: int) -> torch.Tensor:
    """Query positions of the band for length L: up to ``count`` of ``L/2 … L−1``, evenly."""
    lo, hi = length // 2, length - 1
    if hi - lo + 1 <= count:
        return torch.arange(lo, hi + 1)
    return torch.linspace(lo, hi, count).round().long().unique()


@dataclass
class RowBatch:
    """Rows of one band for every (window, head): logits ``[B, R, n]`` (``-inf`` on masked keys)
    and the value vectors ``[B, n, d]``; ``B = windows × heads`` with windows outer."""

    length: int
    rows: torch.Tensor
    logits: torch.Tensor
    values: torch.Tensor
    n_heads: int

    @property
    def valid(self) -> torch.Tensor:
        """``[R, n]``: key j is visible from row t when j ≤ t."""
        keys = torch.arange(self.logits.shape[-1], device=self.rows.device)
        return keys[None, :] <= self.rows[:, None].to(keys.device)

    def per_head(self, metric: torch.Tensor) -> torch.Tensor:
        """Mean over windows and rows: ``[B, R, ...]`` → ``[heads, ...]`` (NaN-aware)."""
        shaped = metric.reshape(-1, self.n_heads, *metric.shape[1:])
        return shaped.nanmean(dim=(0, 2))

    def per_window(self, metric: torch.Tensor) -> torch.Tensor:
        """Mean over rows only: ``[B, R, ...]`` → ``[window, head, ...]`` (NaN-aware)."""
        shaped = metric.reshape(-1, self.n_heads, *metric.shape[1:])
        return shaped.nanmean(dim=2)


def row_batch(ex: Extraction, length: int, count: int, dtype=torch.float32) -> RowBatch:
    rows = band_rows(length, count).to(ex.q.device)
    return RowBatch(
        length=length,
        rows=rows,
        logits=ex.row_logits(rows, length, dtype),
        values=ex.values(length, dtype),
        n_heads=ex.n_total_heads,
    )


def chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


#: Bytes of the largest temporary per chunk of heads. Small enough that the allocator reuses
#: freed blocks instead of mapping fresh pages for every operation (page faults dominated the
#: run time with 100 MB temporaries).
CHUNK_BYTES = 16 << 20


def chunk_size(batch: RowBatch, per_row_elements: int, budget_bytes: int = CHUNK_BYTES) -> int:
    """How many heads to process at once so that ``[heads, R, per_row_elements]`` floats stay
    within ``budget_bytes``."""
    rows = batch.logits.shape[1]
    item = batch.logits.element_size()
    return max(1, budget_bytes // max(1, rows * per_row_elements * item))


def over_chunks(batch: RowBatch, per_row_elements: int, fn: Callable, progress=None):
    """Apply ``fn(slice)`` to chunks of heads and concatenate each returned tensor along dim 0."""
    size = chunk_size(batch, per_row_elements)
    parts = []
    for sl in chunks(batch.logits.shape[0], size):
        parts.append(fn(sl))
        if progress is not None:
            progress.update(sl.stop - sl.start)
    if isinstance(parts[0], tuple):
        return tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))
    return torch.cat(parts)
