"""The papers' bounds, one module per theorem, each bound a small pure function.

- :mod:`~attnverify.bounds.lemma1` — Lemma 1 and Corollary 1 of [A] (weights vanish as 1/L).
- :mod:`~attnverify.bounds.theorem1` — Theorem 1 of [A] (top-N representation distance), ``I_N``.
- :mod:`~attnverify.bounds.theorem2` — Theorem 2 of [A] (geometric separability).
- :mod:`~attnverify.bounds.jacobian_bounds` — Lemma 2 and Corollary 3 of [A] (gradient
  sensitivity) and the finite-difference estimator's bound.
- :mod:`~attnverify.bounds.gpam` — paper [B]: daGPAM range and sum, Lemma 3.

[A] arXiv:2508.17821, [B] arXiv:2410.15578; docs/THEORY.md tags each form stated / derived / choice/
false, and so does each docstring. Bounds take tensors and return tensors; the caller compares
with the tolerance of :mod:`attnverify.tolerances`.
"""

from attnverify.bounds.gpam import (
    GPAM_ROW_SUM,
    dagpam_reference,
    frobenius_maximum,
    gpam_range,
    lemma3_frobenius_uniform,
    lemma3_l1_bound,
    softmax_jacobian_frobenius,
    softmax_jacobian_l1_total,
)
from attnverify.bounds.jacobian_bounds import (
    cor3_entrywise_bound,
    cor3_paper_bound,
    fd_estimator_bound,
    general_jacobian,
    lemma2_bound,
    softmax_jacobian,
    softmax_spectral_bound,
    two_way_tie_logits,
)
from attnverify.bounds.lemma1 import (
    cor1_delta,
    cor1_softmax_weight_bounds,
    fixed_margin_peak,
    kernel_extremes,
    lemma1_weight_bounds,
    softmax_peak_weight,
)
from attnverify.bounds.theorem1 import (
    EXACT_MAX_LENGTH,
    MonteCarlo,
    RandomTopN,
    all_subset_masks,
    context_vector,
    cross_diameter,
    cumulative_distance,
    expected_distance_exact,
    expected_distance_mc,
    jensen_main_term,
    thm1_fixed_bound,
    thm1_random,
    top_n_indices,
    top_n_mask,
)
from attnverify.bounds.theorem2 import (
    min_pairwise_distance,
    offset_norms,
    project_to_sphere,
    separable_fraction,
    separable_mask,
    separation_radius,
    thm2_lower_bound,
    thm2_upper_bound,
    xi,
)

__all__ = [
    "EXACT_MAX_LENGTH",
    "GPAM_ROW_SUM",
    "MonteCarlo",
    "RandomTopN",
    "all_subset_masks",
    "context_vector",
    "cor1_delta",
    "cor1_softmax_weight_bounds",
    "cor3_entrywise_bound",
    "cor3_paper_bound",
    "cross_diameter",
    "cumulative_distance",
    "dagpam_reference",
    "expected_distance_exact",
    "expected_distance_mc",
    "fd_estimator_bound",
    "fixed_margin_peak",
    "frobenius_maximum",
    "general_jacobian",
    "gpam_range",
    "jensen_main_term",
    "kernel_extremes",
    "lemma1_weight_bounds",
    "lemma2_bound",
    "lemma3_frobenius_uniform",
    "lemma3_l1_bound",
    "min_pairwise_distance",
    "offset_norms",
    "project_to_sphere",
    "separable_fraction",
    "separable_mask",
    "separation_radius",
    "softmax_jacobian",
    "softmax_jacobian_frobenius",
    "softmax_jacobian_l1_total",
    "softmax_peak_weight",
    "softmax_spectral_bound",
    "thm1_fixed_bound",
    "thm1_random",
    "thm2_lower_bound",
    "thm2_upper_bound",
    "top_n_indices",
    "top_n_mask",
    "two_way_tie_logits",
    "xi",
]
