"""Tests of :mod:`attnverify.bounds`: hand-computed cases first, then brute force and random rows.

Every random check draws small structural parameters and builds tensors from a seeded generator,
so a failure names the seed that reproduces it.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers import F64, TOL, close
from hypothesis import given, settings
from hypothesis import strategies as st

from attnverify import bounds

FAST = settings(max_examples=40, deadline=None)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_le(observed, bound, what: str) -> None:
    """``observed ≤ bound`` within the float64 tolerance, with a message saying by how much."""
    observed, bound = torch.broadcast_tensors(
        torch.as_tensor(observed, dtype=F64), torch.as_tensor(bound, dtype=F64)
    )
    bad = observed > bound + TOL.atol + TOL.rtol * bound.abs()
    assert not bool(bad.any()), (
        f"{what}: observed {observed[bad].tolist()} > bound {bound[bad].tolist()}"
    )


def stablemax_F(l, t=1.0):
    """Stablemax's kernel s(x) = x + 1 (x ≥ 0), 1/(1 − x) (x < 0), at x = l/t."""
    x = l / t
    return torch.where(x >= 0, x.clamp_min(0) + 1, 1 / (1 - x.clamp_max(0)))


def stablemax_dF(l, t=1.0):
    x = l / t
    return torch.where(x >= 0, torch.ones_like(x), (1 - x.clamp_max(0)) ** -2) / t


KERNELS = {
    "exp": (lambda l, t=1.0: torch.exp(l / t), lambda l, t=1.0: torch.exp(l / t) / t),
    "stablemax": (stablemax_F, stablemax_dF),
}


def general(F):
    return lambda row, t=1.0: F(row, t) / F(row, t).sum(-1, keepdim=True)


# --------------------------------------------------------------------------------------------
# I_N: top-N with ties to the lower index


def test_top_n_breaks_ties_by_lower_index():
    alpha = torch.tensor([0.1, 0.3, 0.3, 0.2, 0.3])
    assert bounds.top_n_indices(alpha, 2).tolist() == [1, 2]
    assert bounds.top_n_indices(alpha, 3).tolist() == [1, 2, 4]
    assert bounds.top_n_mask(alpha, 4).tolist() == [False, True, True, True, True]


@FAST
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 12), data=st.data())
def test_top_n_matches_sorted_reference(seed, length, data):
    n = data.draw(st.integers(0, length))
    alpha = torch.randint(0, 3, (4, length), generator=gen(seed)).to(F64)  # many ties
    got = bounds.top_n_indices(alpha, n).tolist()
    want = [sorted(range(length), key=lambda i: (-float(r[i]), i))[:n] for r in alpha]
    assert got == want, f"seed={seed}: top_n_indices={got}, reference={want}"


def test_top_n_keeps_index_order_in_long_ties():
    # torch.topk(zeros(10), 3) returns [8, 6, 7] and an unstable sort reorders ties from ~100
    # keys on; I_N must still be the lowest indices.
    alpha = torch.zeros(2, 300, dtype=F64)
    alpha[1, 150:] = 1.0
    got = bounds.top_n_indices(alpha, 160)
    assert got[0].tolist() == list(range(160))
    assert got[1].tolist() == list(range(150, 300)) + list(range(10))


def test_top_n_rejects_n_outside_range():
    with pytest.raises(ValueError, match="n=4"):
        bounds.top_n_indices(torch.zeros(3), 4)


# --------------------------------------------------------------------------------------------
# Lemma 1 and Corollary 1


def test_lemma1_hand_case_two_keys():
    # softmax, L = 2, logits (1, -1): on [-1, 1], min F = e^-1, max F = e, C2 = e^2,
    # so e^-2/2 ≤ α_i ≤ e^2/2; the weights are 1/(1+e^-2) = 0.8808 and 0.1192.
    f_min, f_max = bounds.kernel_extremes(KERNELS["exp"][0], 1.0)
    close(f_min, math.exp(-1), "min exp on [-1, 1]")
    close(f_max, math.e, "max exp on [-1, 1]")
    lo, hi = bounds.lemma1_weight_bounds(f_min, f_max, 2)
    close(lo, math.exp(-2) / 2, "Lemma 1 lower")
    close(hi, math.exp(2) / 2, "Lemma 1 upper")
    alpha = torch.softmax(torch.tensor([1.0, -1.0], dtype=F64), -1)
    close(alpha[0], 1 / (1 + math.exp(-2)), "softmax(1, -1)")
    assert bool((alpha >= lo).all() and (alpha <= hi).all())


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 64),
    scale=st.floats(0.01, 8.0),
    kernel=st.sampled_from(sorted(KERNELS)),
    temperature=st.sampled_from([0.25, 1.0, 3.0]),
)
def test_lemma1_holds_for_positive_kernels(seed, length, scale, kernel, temperature):
    F, _ = KERNELS[kernel]
    row = scale * torch.randn(length, generator=gen(seed), dtype=F64)
    alpha = general(F)(row, temperature)
    f_min, f_max = bounds.kernel_extremes(F, row.abs().max(), temperature)
    lo, hi = bounds.lemma1_weight_bounds(f_min, f_max, length)
    assert_le(lo, alpha.min(), f"Lemma 1 lower, {kernel}, seed={seed}")
    assert_le(alpha.max(), hi, f"Lemma 1 upper, {kernel}, seed={seed}")


@FAST
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 64), d=st.integers(1, 8))
def test_cor1_holds_and_equals_lemma1_for_softmax(seed, length, d):
    g = gen(seed)
    q, k = torch.randn(d, generator=g, dtype=F64), torch.randn(length, d, generator=g, dtype=F64)
    delta = bounds.cor1_delta(q, k)
    alpha = torch.softmax(k @ q / 0.5, -1)
    lo, hi = bounds.cor1_softmax_weight_bounds(delta, length, 0.5)
    assert_le(lo, alpha.min(), f"Cor 1 lower, seed={seed}")
    assert_le(alpha.max(), hi, f"Cor 1 upper, seed={seed}")
    f_min, f_max = bounds.kernel_extremes(KERNELS["exp"][0], delta, 0.5)
    close(
        torch.stack(bounds.lemma1_weight_bounds(f_min, f_max, length)),
        torch.stack((lo, hi)),
        "Cor 1 = Lemma 1 with F = exp",
    )


def test_fixed_margin_peak_weight_decays_like_one_over_length():
    # softmax of (a, -a, ..., -a): 1/(1 + (L-1)e^{-2a}); for a = 1, L = 2: 1/(1 + e^-2).
    close(bounds.softmax_peak_weight(2, 1.0), 1 / (1 + math.exp(-2)), "peak weight, L = 2")
    for length in (2, 17, 1000):
        row = bounds.fixed_margin_peak(length, 1.0)
        close(torch.softmax(row, -1)[0], bounds.softmax_peak_weight(length, 1.0), f"L={length}")
    _, hi = bounds.lemma1_weight_bounds(math.exp(-1), math.e, 10**6)
    assert float(bounds.softmax_peak_weight(10**6, 1.0)) <= float(hi)


# --------------------------------------------------------------------------------------------
# Theorem 1


def test_thm1_fixed_hand_case():
    # α = (0.5, 0.3, 0.2), x = e1, e2, e3, N = 1: s = 0.5 e1,
    # d̃ = ‖0.3e2 − 0.5e1‖ + ‖0.2e3 − 0.5e1‖ = √0.34 + √0.29,
    # d1 = √2, bound = 0.5·√2 + 1·(0.5·2 − 0.5) = 0.5√2 + 0.5.
    alpha, x = torch.tensor([0.5, 0.3, 0.2], dtype=F64), torch.eye(3, dtype=F64)
    mask = bounds.top_n_mask(alpha, 1)
    close(bounds.context_vector(alpha, x, mask), [0.5, 0.0, 0.0], "s")
    close(bounds.cumulative_distance(alpha, x, mask), math.sqrt(0.34) + math.sqrt(0.29), "d̃")
    close(bounds.cross_diameter(x, mask), math.sqrt(2), "d1")
    close(bounds.thm1_fixed_bound(alpha, x, mask), 0.5 * math.sqrt(2) + 0.5, "Thm 1.1 bound")


def test_thm1_all_selected_gives_zero_distance():
    alpha, x = torch.tensor([0.6, 0.4], dtype=F64), torch.randn(2, 3, dtype=F64)
    mask = bounds.top_n_mask(alpha, 2)
    close(bounds.cumulative_distance(alpha, x, mask), 0.0, "d̃ with N = L")
    close(bounds.cross_diameter(x, mask), 0.0, "d1 with N = L")


@FAST
@given(
    seed=st.integers(0, 2**31 - 1), length=st.integers(2, 40), d=st.integers(1, 6), data=st.data()
)
def test_thm1_fixed_holds_on_the_simplex(seed, length, d, data):
    n = data.draw(st.integers(1, length))
    g = gen(seed)
    alpha = torch.softmax(4 * torch.randn(3, length, generator=g, dtype=F64), -1)
    x = torch.randn(3, length, d, generator=g, dtype=F64)
    mask = bounds.top_n_mask(alpha, n)
    assert_le(
        bounds.cumulative_distance(alpha, x, mask),
        bounds.thm1_fixed_bound(alpha, x, mask),
        f"Thm 1.1, seed={seed}, N={n}",
    )


def brute_force_expectation(alpha, x, n):
    """E[d̃] by a plain loop over itertools.combinations and per-vector norms."""
    length, total, count = len(alpha), 0.0, 0
    for subset in itertools.combinations(range(length), n):
        s = sum(float(alpha[j]) * x[j] for j in subset)
        total += sum(
            float(torch.linalg.vector_norm(alpha[i] * x[i] - s))
            for i in range(length)
            if i not in subset
        )
        count += 1
    return total / count


def test_thm1_random_hand_case_is_jensen_tight_at_two_keys():
    # L = 2, N = 1: E[d̃] = ‖α0 x0 − α1 x1‖ (both subsets give it), and the main term is
    # ½·Σ_i ‖2α_i x_i − (α0 x0 + α1 x1)‖ = ‖α0 x0 − α1 x1‖: ε = 0 exactly.
    alpha = torch.tensor([0.7, 0.3], dtype=F64)
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]], dtype=F64)
    want = float(torch.linalg.vector_norm(0.7 * x[0] - 0.3 * x[1]))
    result = bounds.thm1_random(alpha, x, 1)
    assert result.exact
    close(result.expected, want, "E[d̃]")
    close(result.main, want, "main term")
    close(result.epsilon, 0.0, "ε")


@pytest.mark.parametrize("length,n", [(3, 1), (5, 2), (8, 3), (8, 7)])
def test_exact_expectation_matches_brute_force(length, n):
    g = gen(length * 10 + n)
    alpha = torch.softmax(2 * torch.randn(length, generator=g, dtype=F64), -1)
    x = torch.randn(length, 4, generator=g, dtype=F64)
    close(
        bounds.expected_distance_exact(alpha, x, n),
        brute_force_expectation(alpha, x, n),
        f"E[d̃], L={length}, N={n}",
    )
    assert bounds.all_subset_masks(length, n).sum(-1).eq(n).all()
    assert len(bounds.all_subset_masks(length, n)) == math.comb(length, n)


@FAST
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(2, 10), data=st.data())
def test_thm1_random_epsilon_is_nonnegative(seed, length, data):
    n = data.draw(st.integers(1, length - 1))
    g = gen(seed)
    alpha = torch.softmax(3 * torch.randn(length, generator=g, dtype=F64), -1)
    x = torch.randn(length, 3, generator=g, dtype=F64)
    result = bounds.thm1_random(alpha, x, n)
    assert_le(result.main, result.expected, f"Jensen main ≤ E[d̃], seed={seed}, N={n}")


def test_monte_carlo_agrees_with_enumeration_and_is_seeded():
    g = gen(7)
    alpha = torch.softmax(torch.randn(10, generator=g, dtype=F64), -1)
    x = torch.randn(10, 5, generator=g, dtype=F64)
    exact = bounds.expected_distance_exact(alpha, x, 3)
    mc = bounds.expected_distance_mc(alpha, x, 3, samples=4000, seed=1)
    assert abs(float(mc.mean - exact)) <= 5 * float(mc.stderr), (
        f"MC {float(mc.mean)} ± {float(mc.stderr)} vs exact {float(exact)}"
    )
    again = bounds.expected_distance_mc(alpha, x, 3, samples=4000, seed=1)
    assert float(again.mean) == float(mc.mean)
    result = bounds.thm1_random(alpha, x, 3, max_length=8, samples=500, seed=3)
    assert not result.exact and result.samples == 500 and result.seed == 3


def test_expectation_is_batched_over_leading_dims():
    g = gen(11)
    alpha = torch.softmax(torch.randn(3, 6, generator=g, dtype=F64), -1)
    x = torch.randn(3, 6, 2, generator=g, dtype=F64)
    batched = bounds.expected_distance_exact(alpha, x, 2)
    close(batched, [bounds.expected_distance_exact(alpha[i], x[i], 2) for i in range(3)], "rows")
    assert bounds.expected_distance_mc(alpha, x, 2, samples=50, seed=0).mean.shape == (3,)


def test_thm1_random_epsilon_is_not_small_at_the_theory_example():
    # THEORY.md §3: L = 1024, N = 20, Gaussian x gives E ≈ 70 against a main term ≈ 18
    # (reproduced with uniform α and d = 256): "ε is small" is false, ε ≈ 3 × main.
    g = gen(0)
    x = torch.randn(1024, 256, generator=g, dtype=F64)
    alpha = torch.full((1024,), 1 / 1024, dtype=F64)
    result = bounds.thm1_random(alpha, x, 20, samples=32, seed=0)
    assert not result.exact
    assert 63 <= float(result.expected) <= 77, float(result.expected)
    assert 16.2 <= float(result.main) <= 19.8, float(result.main)
    assert float(result.epsilon) > 2 * float(result.main) + 5 * float(result.stderr)


def test_exact_expectation_refuses_long_rows():
    with pytest.raises(ValueError, match="L=15"):
        bounds.expected_distance_exact(torch.ones(15) / 15, torch.zeros(15, 2), 3)


# --------------------------------------------------------------------------------------------
# Theorem 2


def test_sphere_projection_and_min_distance_hand_case():
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]], dtype=F64)
    close(bounds.min_pairwise_distance(x), 1.0, "δ")
    y = bounds.project_to_sphere(torch.tensor([[3.0, 4.0], [0.0, -2.0]], dtype=F64), 2.0)
    close(y, [[1.2, 1.6], [0.0, -2.0]], "projection onto the radius-2 sphere")


def test_thm2_hand_case():
    # x on the unit circle at 0°, 90°, 180°; α = (0.5, 0.3, 0.2), N = 2, I = {0, 1}:
    # s = (0.5, 0.3); ‖α2 x2 − s‖ = ‖(-0.2, 0) − (0.5, 0.3)‖ = √0.58 = r;
    # ‖α0 x0 − s‖ = 0.3 < r and ‖α1 x1 − s‖ = 0.5 < r: both separable.
    # δ = √2 (neighbours), ξ0 = M·α1 = 0.3, ξ1 = 0.5 (one other key: no cross term).
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=F64)
    alpha = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    mask = bounds.top_n_mask(alpha, 2)
    r = bounds.separation_radius(alpha, x, mask)
    close(r, math.sqrt(0.58), "r")
    assert bounds.separable_mask(alpha, x, mask).tolist() == [True, True, False]
    close(bounds.separable_fraction(alpha, x, mask), 1.0, "N_s/N")
    delta = bounds.min_pairwise_distance(x)
    close(delta, math.sqrt(2), "δ")
    xi = bounds.xi(alpha, mask, 1.0, delta)
    close(xi[:2], [0.3, 0.5], "ξ")
    close(bounds.thm2_lower_bound(xi, r, mask), 1 - 0.8 / (2 * math.sqrt(0.58)), "lower")
    want_upper = sum(math.exp(-((math.sqrt(0.58) - v) ** 2) / 16) for v in (0.3, 0.5)) / 2
    close(bounds.thm2_upper_bound(xi, r, mask, 1.0), want_upper, "upper")


def test_separability_is_strict_on_the_boundary():
    # x1 = x2 = (0, 1), α = (0.5, 0.25, 0.25), N = 2 (tie → I = {0, 1}): s = (0.5, 0.25);
    # ‖α1 x1 − s‖ = ‖(−0.5, 0)‖ = 0.5 = r = ‖α2 x2 − s‖ (the same floating-point
    # computation), so key 1 lies on the ball's boundary and is not separable; key 0 is (0.25).
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=F64)
    alpha = torch.tensor([0.5, 0.25, 0.25], dtype=F64)
    mask = bounds.top_n_mask(alpha, 2)
    assert mask.tolist() == [True, True, False]
    assert float(bounds.separation_radius(alpha, x, mask)) == 0.5
    assert bounds.separable_mask(alpha, x, mask).tolist() == [True, False, False]


def test_xi_hand_case_with_cross_term():
    # I = {0,1,2}, α = (0.5, 0.3, 0.2), M = 2, δ = 1: for i = 0 the others are (0.3, 0.2):
    # ξ0² = 4·0.25 − ½·(2·0.3·0.2) = 1 − 0.06 = 0.94.
    alpha = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=F64)
    mask = torch.tensor([True, True, True, False])
    close(bounds.xi(alpha, mask, 2.0, 1.0)[0], math.sqrt(0.94), "ξ0")


def sphere_case(seed: int, length: int, d: int, n: int, radius: float = 1.0):
    g = gen(seed)
    x = bounds.project_to_sphere(torch.randn(length, d, generator=g, dtype=F64), radius)
    q = torch.randn(d, generator=g, dtype=F64)
    alpha = torch.softmax(x @ q, -1)
    mask = bounds.top_n_mask(alpha, n)
    delta = bounds.min_pairwise_distance(x)
    xi = bounds.xi(alpha, mask, radius, delta)
    return alpha, x, mask, xi, bounds.separation_radius(alpha, x, mask)


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(3, 40),
    d=st.integers(2, 8),
    radius=st.sampled_from([0.5, 1.0, 3.0]),
    data=st.data(),
)
def test_xi_bounds_the_offset_and_thm2_lower_holds(seed, length, d, radius, data):
    n = data.draw(st.integers(1, length - 1))
    alpha, x, mask, xi, r = sphere_case(seed, length, d, n, radius)
    offsets = bounds.offset_norms(alpha, x, mask)
    assert_le(offsets[mask], xi[mask], f"‖s − α_i x_i‖ ≤ ξ_i, seed={seed}")
    lower = bounds.thm2_lower_bound(xi, r, mask)
    assert_le(lower, bounds.separable_fraction(alpha, x, mask), f"Thm 2 lower, seed={seed}")


def test_thm2_upper_bound_is_false_per_instance():
    # THEORY.md §4: uniform sphere, L = 256, d = 64, N = 5. Seed 0 separates all 5 selected keys
    # while the stated upper bound is just below 1 (its exponent (r − ξ)²/16M² is tiny).
    alpha, x, mask, xi, r = sphere_case(0, 256, 64, 5)
    fraction = bounds.separable_fraction(alpha, x, mask)
    upper = bounds.thm2_upper_bound(xi, r, mask, 1.0)
    assert float(fraction) == 1.0
    assert float(fraction) > float(upper) + TOL.atol, f"N_s/N={float(fraction)}, upper={upper}"


# --------------------------------------------------------------------------------------------
# Lemma 2 and Corollary 3


def autograd_jacobian(fn, row):
    return torch.autograd.functional.jacobian(fn, row)


def test_softmax_jacobian_hand_case_two_way_tie():
    # α = (½, ½), T = 2: J = ½·[[¼, −¼], [−¼, ¼]], eigenvalues 0 and ¼ = 1/(2T).
    J = bounds.softmax_jacobian(torch.tensor([0.5, 0.5], dtype=F64), 2.0)
    close(J, [[0.125, -0.125], [-0.125, 0.125]], "J at the tie")
    close(torch.linalg.matrix_norm(J, 2), bounds.softmax_spectral_bound(2.0), "‖J‖₂ = 1/(2T)")
    close(J.abs().max(), bounds.cor3_entrywise_bound(2.0), "max|J| = 1/(4T)")


@pytest.mark.parametrize("temperature", [0.05, 0.5, 1.0, 4.0])
def test_cor3_as_stated_is_false_at_the_two_way_tie(temperature):
    # Witness (0, 0, −∞, −∞): α = (½, ½, 0, 0), ‖J‖₂ = 1/(2T). The stated min{1/(4T), √2} is
    # exceeded by the ratio 2 when 1/(4T) ≤ √2, and by 1/(2√2·T) > 2 below T = 1/(4√2).
    row = bounds.two_way_tie_logits(4)
    J = autograd_jacobian(lambda l: torch.softmax(l / temperature, -1), row)
    spectral = torch.linalg.matrix_norm(J, 2)
    close(spectral, 1 / (2 * temperature), "‖J‖₂ at the tie")
    ratio = float(spectral / bounds.cor3_paper_bound(temperature))
    want = 2.0 if 1 / (4 * temperature) <= math.sqrt(2) else 1 / (2 * math.sqrt(2) * temperature)
    assert ratio == pytest.approx(want, rel=TOL.rtol), f"T={temperature}: ratio {ratio}"
    assert ratio >= 2.0 - TOL.rtol
    close(J.abs().max(), bounds.cor3_entrywise_bound(temperature), "entry-wise form is tight")


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 24),
    scale=st.floats(0.0, 10.0),
    temperature=st.sampled_from([0.1, 1.0, 5.0]),
)
def test_softmax_jacobian_formula_and_corrected_bounds(seed, length, scale, temperature):
    row = scale * torch.randn(length, generator=gen(seed), dtype=F64)
    J = autograd_jacobian(lambda l: torch.softmax(l / temperature, -1), row)
    close(
        bounds.softmax_jacobian(torch.softmax(row / temperature, -1), temperature),
        J,
        f"(diag α − ααᵀ)/T, seed={seed}",
    )
    assert_le(
        torch.linalg.matrix_norm(J, 2),
        bounds.softmax_spectral_bound(temperature),
        f"‖J‖₂ ≤ 1/(2T), seed={seed}",
    )
    assert_le(
        J.abs().max(), bounds.cor3_entrywise_bound(temperature), f"max|J| ≤ 1/(4T), seed={seed}"
    )


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 24),
    scale=st.floats(0.01, 6.0),
    kernel=st.sampled_from(sorted(KERNELS)),
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_general_jacobian_and_lemma2(seed, length, scale, kernel, temperature):
    F, dF = KERNELS[kernel]
    row = scale * torch.randn(length, generator=gen(seed), dtype=F64)
    J = autograd_jacobian(lambda l: general(F)(l, temperature), row)
    Fv, dFv = F(row, temperature), dF(row, temperature)
    close(bounds.general_jacobian(Fv, dFv), J, f"(I − α1ᵀ)diag(F')/S, {kernel}, seed={seed}")
    assert_le(
        torch.linalg.matrix_norm(J, 2),
        bounds.lemma2_bound(Fv, dFv),
        f"Lemma 2, {kernel}, seed={seed}",
    )


def test_lemma2_hand_case():
    # F = exp at logits (0, 0): max|F'| = 1, min F = max F = 1, L = 2: bound (1/2)·2 = 1.
    ones = torch.ones(2, dtype=F64)
    close(bounds.lemma2_bound(ones, ones), 1.0, "Lemma 2 at the tie")


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(2, 32),
    temperature=st.sampled_from([1e-3, 0.1, 1.0, 10.0]),
    eps=st.sampled_from([1e-3, 0.1, 10.0]),
)
def test_fd_estimator_bound(seed, length, temperature, eps):
    g = gen(seed)
    row, v = (
        torch.randn(length, generator=g, dtype=F64),
        torch.randn(length, generator=g, dtype=F64),
    )
    v = v / v.norm()
    moved = torch.softmax((row + eps * v) / temperature, -1) - torch.softmax(row / temperature, -1)
    assert_le(moved.norm() / eps, bounds.fd_estimator_bound(temperature, eps), f"seed={seed}")


def test_fd_estimator_bound_hand_values():
    close(bounds.fd_estimator_bound(1.0, 1e-3), 0.5, "min{1/2, √2·1000}")
    close(bounds.fd_estimator_bound(1.0, 10.0), math.sqrt(2) / 10, "min{1/2, √2/10}")


# --------------------------------------------------------------------------------------------
# Paper B: daGPAM and Lemma 3


def test_dagpam_hand_cases():
    # (0, 0): P⁺ = P⁻ = (½, ½) so P = (½, ½) for any λ; λ = 0 is softmax.
    close(bounds.dagpam_reference(torch.zeros(2, dtype=F64), 0.7), [0.5, 0.5], "tie")
    row = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    close(bounds.dagpam_reference(row, 0.0), torch.softmax(row, -1), "λ = 0")
    lo, hi = bounds.gpam_range(0.5)
    close(torch.stack((lo, hi)), [-0.5, 1.5], "range for λ = 0.5")


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 40),
    scale=st.floats(0.0, 50.0),
    lam=st.sampled_from([0.0, 0.5, 2.0]),
)
def test_dagpam_range_and_sum(seed, length, scale, lam):
    p = bounds.dagpam_reference(scale * torch.randn(length, generator=gen(seed), dtype=F64), lam)
    lo, hi = bounds.gpam_range(lam)
    close(p.sum(), bounds.GPAM_ROW_SUM, f"row sum, seed={seed}")
    assert_le(lo, p.min(), f"range lower, seed={seed}")
    assert_le(p.max(), hi, f"range upper, seed={seed}")


@FAST
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 24), scale=st.floats(0.0, 8.0))
def test_lemma3_l1_total_formula_and_bound(seed, length, scale):
    row = scale * torch.randn(length, generator=gen(seed), dtype=F64)
    p = torch.softmax(row, -1)
    J = autograd_jacobian(lambda l: torch.softmax(l, -1), row)
    close(bounds.softmax_jacobian_l1_total(p), J.abs().sum(), f"2(1 − Σp²), seed={seed}")
    close(bounds.softmax_jacobian_frobenius(p), torch.linalg.matrix_norm(J), f"‖J‖_F, seed={seed}")
    assert_le(J.abs().sum(), bounds.lemma3_l1_bound(length), f"Lemma 3 ℓ1, seed={seed}")
    assert_le(torch.linalg.matrix_norm(J), bounds.frobenius_maximum(), f"‖J‖_F ≤ ½, seed={seed}")


def test_lemma3_l1_is_attained_at_uniform():
    for length in (2, 3, 10):
        p = torch.full((length,), 1 / length, dtype=F64)
        close(bounds.softmax_jacobian_l1_total(p), bounds.lemma3_l1_bound(length), f"L={length}")


@pytest.mark.parametrize("length", [3, 4, 8, 50])
def test_lemma3_frobenius_form_is_false_at_a_two_way_tie(length):
    # Softmax J = diag p − ppᵀ. Uniform: ‖J‖_F² = 1/L − 1/L² = (L−1)/L², so ‖J‖_F = √(L−1)/L
    # (L = 3: √2/3 = 0.4714). Two-way tie (½, ½, 0, …): J = [[¼, −¼], [−¼, ¼]] ⊕ 0,
    # ‖J‖_F² = 4/16 = ¼, ‖J‖_F = ½ > √(L−1)/L for every L ≥ 3. (The "¼" of THEORY.md §6 is
    # the squared norm.)
    tie = torch.softmax(bounds.two_way_tie_logits(length), -1)
    J_uniform = autograd_jacobian(lambda l: torch.softmax(l, -1), torch.zeros(length, dtype=F64))
    close(torch.linalg.matrix_norm(J_uniform), math.sqrt(length - 1) / length, "uniform ‖J‖_F")
    close(bounds.lemma3_frobenius_uniform(length), math.sqrt(length - 1) / length, "claimed max")
    J = bounds.softmax_jacobian(tie)
    close(torch.linalg.matrix_norm(J) ** 2, 0.25, "‖J‖_F² at the tie")
    close(bounds.softmax_jacobian_frobenius(tie), bounds.frobenius_maximum(), "‖J‖_F = ½")
    assert float(bounds.frobenius_maximum()) > float(bounds.lemma3_frobenius_uniform(length))


def test_lemma3_frobenius_claim_holds_only_at_two_keys():
    # L = 2: the uniform row *is* the two-way tie, √1/2 = ½.
    close(bounds.lemma3_frobenius_uniform(2), bounds.frobenius_maximum(), "L = 2")


def test_min_pairwise_distance_keeps_close_pairs():
    # 40 rows (> 25) is where cdist's matrix-product shortcut would cancel this gap to 0
    x = torch.randn(40, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[7] = x[3] + 1e-9
    assert bounds.min_pairwise_distance(x).item() == pytest.approx(8**0.5 * 1e-9, rel=1e-6)
