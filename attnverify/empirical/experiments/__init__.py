"""The six experiments of ``attnverify empirical``, by name (INTERFACES.md)."""

from attnverify.empirical.experiments.context import Context
from attnverify.empirical.experiments.distances import (
    critical_topn,
    distance_vs_length,
    distance_vs_topn,
)
from attnverify.empirical.experiments.rank_collapse import rank_collapse
from attnverify.empirical.experiments.sensitivity import gradient
from attnverify.empirical.experiments.separability import separability

RUNNERS = {
    "distance_vs_length": distance_vs_length,
    "distance_vs_topn": distance_vs_topn,
    "critical_topn": critical_topn,
    "separability": separability,
    "gradient": gradient,
    "rank_collapse": rank_collapse,
}

#: Experiments that read the model (rank_collapse does not).
NEEDS_MODEL = tuple(name for name in RUNNERS if name != "rank_collapse")

__all__ = ["Context", "NEEDS_MODEL", "RUNNERS"]
