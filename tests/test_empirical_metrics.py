"""The model check's batched metrics against brute-force references on small cases.

Each batched function of :mod:`attnverify.empirical` (all heads and all N at once, prefix sums
over sorted weights) is compared with (a) plain loops written here and (b) the per-row reference
implementations in :mod:`attnverify.bounds`. Inputs are causal rows (a prefix of the keys is
visible), built from a seeded generator so a failure names its seed.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers import F64, TOL, close

from attnverify.bounds import theorem1, theorem2
from attnverify.empirical import collapse, distance, gradient, separation
from attnverify.empirical.rows import band_rows

SEEDS = range(6)


def case(seed: int, heads: int = 2, rows: int = 3, keys: int = 9, dim: int = 4, ties=False):
    """Logits, weights, embeddings and the causal validity of ``rows`` rows per head."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(heads, rows, keys, generator=gen, dtype=F64) * 2
    if ties:
        logits = logits.round()
    positions = torch.arange(keys - rows, keys)  # row r sees keys 0 … positions[r]
    valid = torch.arange(keys)[None, :] <= positions[:, None]
    alpha = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1)
    x = torch.randn(heads, keys, dim, generator=gen, dtype=F64)
    return alpha, x, valid


def loop_top(alpha_row, valid_row, n: int) -> list[int]:
    """I_N by plain sorting: N largest weights among visible keys, ties to the lower index."""
    keys = [i for i in range(len(alpha_row)) if valid_row[i]]
    return sorted(keys, key=lambda i: (-float(alpha_row[i]), i))[:n]


def loop_distance(alpha_row, x, valid_row, chosen) -> float:
    s = sum((alpha_row[i] * x[i] for i in chosen), torch.zeros(x.shape[-1], dtype=F64))
    return float(sum((alpha_row[i] * x[i] - s).norm() for i in range(len(alpha_row))
                     if valid_row[i] and i not in chosen))


# ---- Theorem 1 -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ties", [False, True])
def test_cumulative_distance_matches_loops_for_every_n(seed, ties):
    alpha, x, valid = case(seed, ties=ties)
    n_values = torch.tensor([1, 2, 3, 5])
    got = distance.cumulative_distance(distance.order_rows(alpha, x, valid), n_values)
    for b, r, (k, n) in itertools.product(range(2), range(3), enumerate(n_values.tolist())):
        chosen = loop_top(alpha[b, r], valid[r], n)
        want = loop_distance(alpha[b, r], x[b], valid[r], chosen)
        close(got[b, r, k], want, f"d̃ head {b} row {r} N={n} seed {seed} ties={ties}")


@pytest.mark.parametrize("seed", SEEDS)
def test_cumulative_distance_matches_bounds_reference(seed):
    alpha, x, valid = case(seed, rows=1, keys=8)
    alpha = alpha[:, 0]
    for n in (1, 3, 6):
        mask = theorem1.top_n_mask(alpha, n)
        want = theorem1.cumulative_distance(alpha, x, mask)
        o = distance.order_rows(alpha[:, None], x, valid)
        got = distance.cumulative_distance(o, torch.tensor([n]))[:, 0, 0]
        close(got, want, f"d̃ vs attnverify.bounds, N={n}, seed {seed}")


def test_cumulative_distance_is_nan_when_nothing_is_left():
    alpha, x, valid = case(0, rows=3, keys=5)  # rows see 3, 4, 5 keys
    got = distance.cumulative_distance(distance.order_rows(alpha, x, valid), torch.tensor([3]))
    assert torch.isnan(got[:, 0, 0]).all(), f"N = L = 3 must give NaN, got {got[:, 0, 0]}"
    assert torch.isfinite(got[:, 1:, 0]).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_set_bound_matches_reference_and_holds(seed):
    alpha, x, valid = case(seed)
    n_values = torch.tensor([1, 2, 4])
    o = distance.order_rows(alpha, x, valid)
    bound = distance.fixed_set_bound(o, n_values)
    dtilde = distance.cumulative_distance(o, n_values)
    for b, r, (k, n) in itertools.product(range(2), range(3), enumerate(n_values.tolist())):
        seen = valid[r]
        a, xs = alpha[b, r][seen], x[b][seen]
        mask = theorem1.top_n_mask(a, n)
        close(bound[b, r, k], theorem1.thm1_fixed_bound(a, xs, mask),
              f"Thm 1.1 bound head {b} row {r} N={n} seed {seed}")
    assert bool((dtilde <= bound + TOL.atol).all()), (
        f"Theorem 1.1 violated on softmax rows (seed {seed}): worst d̃/bound "
        f"{float((dtilde / bound).max()):.4f}"
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_main_term_matches_reference(seed):
    alpha, x, valid = case(seed)
    n_values = torch.tensor([1, 3])
    got = distance.expected_distance_main(alpha, x, valid, n_values)
    for b, r, (k, n) in itertools.product(range(2), range(3), enumerate(n_values.tolist())):
        seen = valid[r]
        want = theorem1.jensen_main_term(alpha[b, r][seen], x[b][seen], n)
        close(got[b, r, k], want, f"main term head {b} row {r} N={n} seed {seed}")


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_monte_carlo_e_agrees_with_enumeration(seed):
    """E by nested random orders: within 4 standard errors of the exact E (enumeration), and the
    exact E is at least the main term (ε ≥ 0)."""
    alpha, x, valid = case(seed, heads=1, rows=1, keys=10)
    gen = torch.Generator().manual_seed(100 + seed)
    n_values = torch.tensor([2, 4])
    mean, se = distance.expected_distance_mc(alpha, x, valid, n_values, 600, gen)
    main = distance.expected_distance_main(alpha, x, valid, n_values)
    for k, n in enumerate(n_values.tolist()):
        exact = float(theorem1.expected_distance_exact(alpha[0, 0], x[0], n))
        got, err = float(mean[0, 0, k]), float(se[0, 0, k])
        assert abs(got - exact) <= 4 * err, (
            f"MC E={got:.5f} ± {err:.5f} vs exact {exact:.5f} (N={n}, seed {seed})"
        )
        assert exact >= float(main[0, 0, k]) - TOL.atol, f"ε < 0 at N={n}, seed {seed}"


@pytest.mark.parametrize("seed", range(3))
def test_monte_carlo_e_is_accurate_with_an_attention_sink(seed):
    """One key holds ~99% of the mass: E is dominated by the few subsets holding it. The
    stratified estimator gets E from 12 draws where plain sampling would mostly miss them."""
    alpha, x, valid = case(seed, heads=1, rows=1, keys=12)
    logits = torch.randn(1, 1, 12, generator=torch.Generator().manual_seed(seed), dtype=F64)
    logits[0, 0, 5] = 9.0
    alpha = torch.softmax(logits, -1)
    n_values = torch.tensor([2])
    gen = torch.Generator().manual_seed(seed)
    mean, se = distance.expected_distance_mc(alpha, x, valid, n_values, 12, gen)
    exact = float(theorem1.expected_distance_exact(alpha[0, 0], x[0], 2))
    got, err = float(mean[0, 0, 0]), float(se[0, 0, 0])
    assert abs(got - exact) <= max(4 * err, 0.05 * exact), (
        f"MC E={got:.4f} ± {err:.4f} vs exact {exact:.4f} with a sink (seed {seed})"
    )


def test_random_orders_are_uniform_subsets():
    """The first N keys of a random order are a uniform N-subset of the visible keys."""
    alpha = torch.full((1, 1, 6), 1 / 4, dtype=F64)
    valid = torch.tensor([[True] * 4 + [False] * 2])
    x = torch.zeros(1, 6, 2, dtype=F64)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    draws = 4000
    for _ in range(draws // 100):
        o = distance.order_rows(alpha.expand(100, 1, 6), x.expand(100, 6, 2), valid, "random",
                                gen, depth=2)
        counts += (o.rank < 2).sum((0, 1)).to(counts.dtype)
    freq = counts / draws
    assert freq[4:].sum() == 0, f"an invisible key was selected: {freq.tolist()}"
    assert torch.allclose(freq[:4], torch.full((4,), 0.5), atol=0.04), freq.tolist()


# ---- Theorem 2 -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_separation_matches_loops_and_reference(seed):
    alpha, x, valid = case(seed, keys=10, dim=5)
    x = separation.to_sphere(x)
    delta = torch.full((2, 3), 0.3, dtype=F64)
    n_values = torch.arange(1, 6)
    sep = separation.separation(alpha, x, valid, delta, n_values)
    for b, r, (k, n) in itertools.product(range(2), range(3), enumerate(n_values.tolist())):
        seen = valid[r]
        a, xs = alpha[b, r][seen], x[b][seen]
        mask = theorem1.top_n_mask(a, n)
        want = float(theorem2.separable_fraction(a, xs, mask))
        chosen = loop_top(alpha[b, r], valid[r], n)
        s = sum(alpha[b, r, i] * x[b, i] for i in chosen)
        gaps = {i: float((alpha[b, r, i] * x[b, i] - s).norm()) for i in range(10) if seen[i]}
        radius = min(g for i, g in gaps.items() if i not in chosen)
        loop = sum(gaps[i] < radius for i in chosen) / n
        where = f"head {b} row {r} N={n} seed {seed}"
        close(sep.ratio[b, r, k], want, f"N_s/N vs attnverify.bounds, {where}")
        close(sep.ratio[b, r, k], loop, f"N_s/N vs loops, {where}")
        close(sep.radius[b, r, k], radius, f"r, {where}")
        xi = theorem2.xi(a, mask, 1.0, 0.3)
        r_t = torch.tensor(radius, dtype=F64)
        close(sep.lower[b, r, k], theorem2.thm2_lower_bound(xi, r_t, mask), f"lower, {where}")
        close(sep.upper[b, r, k], theorem2.thm2_upper_bound(xi, r_t, mask, 1.0),
              f"upper, {where}")


@pytest.mark.parametrize("seed", SEEDS)
def test_separation_lower_bound_holds_with_true_delta(seed):
    alpha, x, valid = case(seed, keys=12, dim=6)
    x = separation.to_sphere(x)
    delta, dups = separation.prefix_min_distance(x)
    rows = torch.arange(9, 12)
    sep = separation.separation(alpha, x, valid, delta[:, rows], torch.arange(1, 8))
    assert int(dups.sum()) == 0
    bad = sep.lower > sep.ratio + TOL.atol
    assert not bool(bad.any()), f"Theorem 2 lower bound violated (seed {seed})"


def test_prefix_min_distance_matches_loops_and_skips_duplicates():
    gen = torch.Generator().manual_seed(3)
    x = separation.to_sphere(torch.randn(1, 7, 3, generator=gen, dtype=F64))
    x[0, 5] = x[0, 2]  # a duplicate enters at key 5
    delta, dups = separation.prefix_min_distance(x)
    for j in range(1, 7):
        pairs = [float((x[0, i] - x[0, k]).norm()) for i in range(j + 1) for k in range(i)]
        distinct = [p for p in pairs if p > separation.DUPLICATE_TOLERANCE]
        close(delta[0, j], min(distinct), f"δ of prefix {j + 1}")
        assert int(dups[0, j]) == (1 if j >= 5 else 0), f"duplicates in prefix {j + 1}"
    assert math.isinf(float(delta[0, 0])), "a single key has no pair"


def test_row_entropy_extremes():
    valid = torch.ones(1, 4, dtype=torch.bool)
    uniform = torch.full((1, 1, 4), 0.25, dtype=F64)
    onehot = torch.tensor([[[1.0, 0, 0, 0]]], dtype=F64)
    close(separation.row_entropy(uniform, valid), [[math.log(4)]], "uniform entropy")
    close(separation.row_entropy(onehot, valid), [[0.0]], "one-hot entropy")


# ---- Algorithm 5 ---------------------------------------------------------------------------


def test_sensitivity_matches_loops_and_respects_bounds():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 4, 6, generator=gen, dtype=F64)
    logits[:, 0, 4:] = float("-inf")
    dirs = gradient.unit_directions(logits, gen)
    temps, eps = [0.01, 1.0], [1e-3, 10.0]
    mean, worst = gradient.sensitivity(logits, lambda s: torch.softmax(s, -1), temps, eps, dirs)
    for (ti, t), (ei, e), b in itertools.product(enumerate(temps), enumerate(eps), range(3)):
        deltas = []
        for r in range(4):
            seen = torch.isfinite(logits[b, r])
            base = torch.softmax(logits[b, r][seen] / t, -1)
            moved = torch.softmax((logits[b, r][seen] + e * dirs[b, r][seen]) / t, -1)
            deltas.append(float((moved - base).norm()) / e)
        close(mean[ti, ei, b], sum(deltas) / 4, f"mean δ, T={t}, ε={e}, head {b}")
        close(worst[ti, ei, b], max(deltas), f"max δ, T={t}, ε={e}, head {b}")
        assert worst[ti, ei, b] <= min(1 / (2 * t), 2**0.5 / e) + TOL.atol


def test_sensitivity_reaches_half_over_t_at_a_two_way_tie():
    """The witness of THEORY.md §5: two tied logits, v along (1, −1)/√2 — g → 1/(2T) > 1/(4T)."""
    logits = torch.tensor([[[0.0, 0.0, -1e9, -1e9]]], dtype=F64)
    v = torch.tensor([[[1.0, -1.0, 0.0, 0.0]]], dtype=F64) / 2**0.5
    mean, _ = gradient.sensitivity(logits, lambda s: torch.softmax(s, -1), [1.0], [1e-5], v)
    close(mean[0, 0, 0], 0.5, "g at a two-way tie", rtol=1e-4)


def test_masked_keys_do_not_count_even_when_a_normalizer_returns_nan_there():
    logits = torch.tensor([[[0.0, 1.0, float("-inf")]]], dtype=F64)
    v = gradient.unit_directions(logits, torch.Generator().manual_seed(0))

    def nan_on_masked(s):
        return torch.softmax(s, -1).masked_fill(torch.isinf(s), float("nan"))

    mean, _ = gradient.sensitivity(logits, nan_on_masked, [1.0], [1e-3], v)
    assert torch.isfinite(mean).all()


# ---- paper B and row selection -------------------------------------------------------------


def test_residual_ratio_and_cosine_on_known_matrices():
    same = torch.ones(4, 3, dtype=F64)
    assert collapse.residual_ratio(same) == pytest.approx(0.0, abs=1e-12)
    assert collapse.mean_cosine(same) == pytest.approx(1.0)
    centred = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=F64)
    assert collapse.residual_ratio(centred) == pytest.approx(1.0)
    assert collapse.mean_cosine(centred) == pytest.approx(-1.0)


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_dagpam_layer_rows_are_affine_with_the_stated_range(lam):
    gen = torch.Generator().manual_seed(1)
    weights = {k: v.detach() for k, v in collapse.init_weights(1, 8, gen)[0].items()}
    x = torch.randn(5, 8, generator=gen, dtype=F64)
    eye = dict(weights, v=torch.eye(8, dtype=F64))
    # With W_V = I the layer returns P·X; X has full row rank, so P = (P·X)·X⁺.
    p = collapse.attention_layer(x, eye, lam) @ torch.linalg.pinv(x)
    close(p.sum(-1), torch.ones(5), f"rows of P sum to 1 (λ={lam})", rtol=1e-6)
    assert bool((p >= -lam - 1e-6).all() and (p <= 1 + lam + 1e-6).all())


def test_collapse_curves_shapes_and_pairing():
    out = collapse.collapse_curves((0.5,), depth=3, width=8, tokens=6, seeds=[0, 1])
    for arch in ("pure", "residual"):
        assert set(out[arch]) == {"softmax", "dagpam_0.5"}
        soft = out[arch]["softmax"]
        assert len(soft["residual"]) == 4 and len(soft["grad_q"]) == 3
        assert soft["residual"][0] == out[arch]["dagpam_0.5"]["residual"][0], "same inputs"


@pytest.mark.parametrize("length,count", [(32, 64), (1024, 64), (100, 7)])
def test_band_rows_cover_the_band_and_end_at_exactly_l_keys(length, count):
    rows = band_rows(length, count)
    assert int(rows.min()) >= length // 2 and int(rows.max()) == length - 1
    assert len(rows) == min(count, length - length // 2)
    assert bool((rows[1:] > rows[:-1]).all())
