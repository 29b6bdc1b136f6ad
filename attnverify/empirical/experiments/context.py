"""What every experiment receives: the settings, the captured heads, the normalizers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from attnverify.empirical.config import RunConfig
from attnverify.empirical.extraction import Extraction
from attnverify.empirical.rows import RowBatch, row_batch
from attnverify.empirical.targets import Weighting
from attnverify.tolerances import tol_for

#: Metrics are computed in this dtype (bounds are compared in it too); the gradient experiment
#: and δ of Theorem 2 use float64 where differences of nearly equal numbers are taken.
METRIC_DTYPE = torch.float32


@dataclass
class Context:
    config: RunConfig
    extraction: Extraction | None
    weightings: list[Weighting]
    lengths: tuple[int, ...]
    progress: object = None  # callable(desc, total) -> a tqdm-like bar
    _batches: dict = field(default_factory=dict)

    @property
    def max_length(self) -> int:
        return self.lengths[-1]

    def batch(self, length: int) -> RowBatch:
        """The rows of the band for ``length`` (cached: several experiments share them)."""
        if length not in self._batches:
            self._batches[length] = row_batch(
                self.extraction, length, self.config.rows_per_length, METRIC_DTYPE
            )
        return self._batches[length]

    @property
    def device(self) -> torch.device:
        return self.extraction.q.device if self.extraction is not None else torch.device("cpu")

    def generator(self, salt: int) -> torch.Generator:
        """A generator seeded from the run seed and a per-experiment salt."""
        return torch.Generator(device=self.device).manual_seed(self.config.seed * 1000 + salt)

    def bar(self, desc: str, total: int):
        return self.progress(desc, total) if self.progress else _NoBar()

    def head_labels(self) -> list[str]:
        ex = self.extraction
        return [ex.head_label(b) for b in range(ex.n_total_heads)]


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def exceeds(value: torch.Tensor, bound: torch.Tensor, terms: int = 1) -> torch.Tensor:
    """``value > bound`` beyond the metric dtype's tolerance, scaled by the number of summed
    terms (a sum of ``terms`` rounded values carries up to ``terms`` roundings)."""
    tol = tol_for(METRIC_DTYPE)
    slack = tol.atol + tol.rtol * terms * bound.abs()
    return value > bound + slack


def quantiles(per_head: torch.Tensor) -> dict[str, float]:
    """Median, quartiles, min, max and mean over heads (NaNs ignored)."""
    x = per_head[torch.isfinite(per_head)].to(device="cpu", dtype=torch.float64)
    if x.numel() == 0:
        return {k: float("nan") for k in ("min", "q25", "median", "q75", "max", "mean")}
    q = torch.quantile(x, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64))
    return {
        "min": float(q[0]), "q25": float(q[1]), "median": float(q[2]), "q75": float(q[3]),
        "max": float(q[4]), "mean": float(x.mean()),
    }


def window_medians(batch, metric: torch.Tensor) -> list:
    """Per window, the median over heads of the per-head mean over rows: ``[B, R, k]`` →
    ``[k][window]`` (``[B, R]`` → ``[window]``). The spread of these across windows gives the
    standard errors of the report's tables."""
    per = batch.per_window(metric)  # [W, H, ...]
    med = per.to(torch.float64).nanmedian(dim=1).values  # [W, ...]
    return med.T.tolist() if med.dim() > 1 else med.tolist()


def standard_error(values) -> float:
    """Standard error of the mean of ``values`` (NaNs dropped); NaN with fewer than two."""
    x = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(x) < 2:
        return float("nan")
    mean = sum(x) / len(x)
    return math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1) / len(x))
