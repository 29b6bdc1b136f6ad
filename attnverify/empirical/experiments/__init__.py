"""The experiments of ``attnverify empirical``, by name (docs/INTERFACES.md names the first six)."""

from attnverify.empirical.experiments.context import Context
from attnverify.empirical.experiments.convergence import convergence
from attnverify.empirical.experiments.coverage import coverage
from attnverify.empirical.experiments.distances import (
    critical_topn,
    distance_vs_length,
    distance_vs_topn,
)
from attnverify.empirical.experiments.gradient_history import training
from attnverify.empirical.experiments.lemma1 import lemma1
from attnverify.empirical.experiments.rank_collapse import rank_collapse
from attnverify.empirical.experiments.sensitivity import gradient
from attnverify.empirical.experiments.separability import separability
from attnverify.empirical.experiments.temperature import temperature

RUNNERS = {
    "distance_vs_length": distance_vs_length,
    "distance_vs_topn": distance_vs_topn,
    "critical_topn": critical_topn,
    "separability": separability,
    "gradient": gradient,
    "lemma1": lemma1,
    "temperature": temperature,
    "coverage": coverage,
    "convergence": convergence,
    "rank_collapse": rank_collapse,
    "training": training,
}

#: Experiments that read the model (paper B's do not).
NEEDS_MODEL = tuple(name for name in RUNNERS if name not in ("rank_collapse", "training"))

__all__ = ["Context", "NEEDS_MODEL", "RUNNERS"]
