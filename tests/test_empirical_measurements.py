"""The measurements paper A reports beyond its algorithms (Lemma 1 on the model, temperature,
multi-head coverage, N → L), paper B's two-λ stacks and training run, the per-window standard
errors, and the comparison rows scored as the papers state them (THEORY.md §8).

Inputs are small and built from seeded generators, so every failure names its case.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import F64, close

from attnverify.empirical import collapse, comparison, separation, training
from attnverify.empirical.experiments.context import standard_error
from attnverify.empirical.experiments.coverage import layer_coverage
from attnverify.empirical.experiments.lemma1 import loglog_slopes, row_statistics
from attnverify.empirical.extraction import SharedRows
from attnverify.empirical.rows import RowBatch


def rows_case(seed: int, heads: int = 3, rows: int = 4, keys: int = 12, dim: int = 5):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(heads, rows, keys, generator=gen, dtype=F64) * 2
    positions = torch.arange(keys - rows, keys)
    valid = torch.arange(keys)[None, :] <= positions[:, None]
    alpha = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1)
    x = separation.to_sphere(torch.randn(heads, keys, dim, generator=gen, dtype=F64))
    return logits.masked_fill(~valid, float("-inf")), alpha, x, valid


# ---- separable sets and coverage -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 3, 6])
def test_separable_sets_count_what_separation_counts(seed, n):
    _, alpha, x, valid = rows_case(seed)
    chosen, sep = separation.separable_sets(alpha, x, valid, n)
    delta = torch.full(alpha.shape[:2], 0.1, dtype=F64)
    want = separation.separation(alpha, x, valid, delta, torch.tensor([n])).ratio[..., 0]
    close(sep.to(F64).mean(-1), want, f"N_s/N from separable_sets, N={n}, seed {seed}")
    top = alpha.topk(n, dim=-1).indices
    assert torch.equal(chosen.sort(-1).values, top.sort(-1).values), "I_N differs from top-N"


def test_coverage_of_one_head_is_that_heads_fraction():
    _, alpha, x, valid = rows_case(5, heads=1)
    got = layer_coverage(alpha, x, valid, 4)
    close(got["measured"], got["ratio"][0], "one head: coverage = its N_s/N")
    close(got["independent"], torch.full((4,), float(got["ratio"][0].mean())),
          "one head: independence prediction = its mean N_s/N")


def test_coverage_of_identical_heads_does_not_grow():
    _, alpha, x, valid = rows_case(6, heads=1)
    got = layer_coverage(alpha.expand(3, -1, -1), x.expand(3, -1, -1), valid, 4)
    close(got["measured"], got["ratio"][0], "copies of one head cover what it covers")
    assert float(got["independent"].mean()) > float(got["measured"].mean()), (
        "independence must predict more than identical heads reach on average"
    )
    close(got["union_over_n"], torch.ones(4), "the union of identical sets is one set")


# ---- Lemma 1 -------------------------------------------------------------------------------


def test_lemma1_row_statistics_uniform_and_peaked_rows():
    logits = torch.tensor([[[0.0] * 8, [5.0] + [-5.0] * 7]])
    top, entropy, spread, bad = row_statistics(logits)
    close(top[0, 0], 1 / 8, "uniform row: max weight 1/L")
    close(entropy[0, 0], 1.0, "uniform row: entropy = log L")
    close(spread[0], torch.tensor([0.0, 10.0]), "logit range")
    assert not bad.any(), "Corollary 1 with the row's own range cannot fail"
    assert top[0, 1] > 0.99 and entropy[0, 1] < 0.01


def test_lemma1_bound_check_fails_on_weights_it_does_not_describe():
    """The check is not vacuous: weights above e^ρ/L are flagged (a hand-made violation)."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0]]])
    top, _, spread, _ = row_statistics(logits)
    assert float(top) <= math.exp(float(spread)) / 4
    assert float(torch.softmax(torch.tensor([9.0, 0, 0, 0]), -1).max()) > math.exp(0) / 4


def test_loglog_slopes_recover_one_over_l():
    lengths = [32, 64, 128, 256]
    per_length = torch.tensor([[1 / L, 0.5, 1 / L**0.5] for L in lengths])
    close(loglog_slopes(lengths, per_length), torch.tensor([-1.0, 0.0, -0.5]), "slopes")


# ---- windows -------------------------------------------------------------------------------


def test_per_window_statistics_and_standard_error():
    metric = torch.arange(24, dtype=F64).reshape(4, 3, 2)  # 2 windows × 2 heads, 3 rows
    batch = RowBatch(length=8, rows=torch.arange(3), logits=torch.zeros(4, 3, 8),
                     values=torch.zeros(4, 8, 1), n_heads=2)
    per = batch.per_window(metric)
    assert per.shape == (2, 2, 2)
    close(per.mean(0), batch.per_head(metric), "windows average to the pooled per-head mean")
    close(standard_error([1.0, 3.0]), 1.0, "SE of two values")
    assert math.isnan(standard_error([2.0]))


def test_shared_rows_map_heads_to_their_layer():
    base = torch.arange(2 * 3 * 4 * 1, dtype=F64).reshape(2, 3, 4, 1)  # 2 windows, 3 layers
    rows = SharedRows(base, per_group=2, heads=6)
    assert rows.shape == (12, 4, 1)
    got = rows[slice(0, 12)]
    for b in range(12):
        w, layer = b // 6, (b % 6) // 2
        assert torch.equal(got[b], base[w, layer]), f"head {b}"
    assert torch.equal(rows[slice(7, 9)], got[7:9])


# ---- comparison rows scored as stated -------------------------------------------------------


def test_increases_then_saturates_shape():
    ok, _, _ = comparison.increases_then_saturates([1, 5, 10, 20, 100], [10, 20, 22, 23, 23.5])
    assert ok
    linear, _, _ = comparison.increases_then_saturates([1, 10, 100], [1, 10, 100])
    assert linear is False, "a straight line does not saturate"
    falling, _, _ = comparison.increases_then_saturates([1, 10, 100], [3, 2, 1])
    assert falling is False


def test_ks_second_reading_needs_a_switch_to_rejection():
    first = comparison._first_rejecting_after_accepting
    assert first([1, 2, 3, 4], [0.5, 0.3, 0.001, 0.2], 0.01) == 3
    assert first([1, 2, 3], [0.001, 0.002, 0.5], 0.01) is None


def separability_result(at_one: int, at_two: int) -> dict:
    own = {"ratio": [[1.0, 1.0], [0.5, 0.6]], "ratio_quantiles": [{"median": 1.0}] * 2,
           "upper_quantiles": [{"median": 0.9}] * 2, "lower_violation_fraction": [0, 0],
           "upper_violation_fraction": [0.9, 0.1], "upper_violated_on_average":
           [at_one, at_two], "plateau": [0.5, 0.6]}
    return {"N": [1, 2], "heads": ["L0H0", "L0H1"], "normalizers": {"softmax": own}}


def test_theorem2_upper_is_scored_on_n_at_least_2_and_n1_is_a_diagnostic():
    rows = comparison.thm2_upper(separability_result(at_one=2, at_two=0))
    stated = [r for r in rows if not r.get("diagnostic")]
    assert len(stated) == 1 and stated[0]["agrees"] is True, stated
    n1 = [r for r in rows if "N = 1" in r["claim"]]
    assert n1 and n1[0]["agrees"] is None and n1[0]["holds"] is False
    failing = comparison.thm2_upper(separability_result(at_one=0, at_two=1))
    assert [r for r in failing if not r.get("diagnostic")][0]["agrees"] is False


def test_diagnostics_are_left_out_of_the_count():
    rows = [{"agrees": True}, {"agrees": None, "diagnostic": True, "holds": False}]
    assert comparison.counted(rows) == rows[:1]


# ---- paper B -------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", [(0.5, 1.0), (1.0, 0.5)])
def test_two_lambda_dagpam_rows_sum_to_the_fixed_total(pair):
    gen = torch.Generator().manual_seed(2)
    weights = {k: v.detach() for k, v in collapse.init_weights(1, 8, gen)[0].items()}
    x = torch.randn(5, 8, generator=gen, dtype=F64)
    eye = dict(weights, v=torch.eye(8, dtype=F64))
    p = collapse.attention_layer(x, eye, pair) @ torch.linalg.pinv(x)
    close(p.sum(-1), torch.full((5,), 1 + pair[0] - pair[1]), f"rows of P, {pair}", rtol=1e-6)


def test_collapse_curves_have_prenorm_stacks_and_lambda_pairs():
    out = collapse.collapse_curves((0.5,), depth=3, width=8, tokens=6, seeds=[0],
                                   pairs=((0.5, 1.0),))
    assert set(out) == set(collapse.ARCHITECTURES)
    for arch, kinds in out.items():
        assert set(kinds) == {"softmax", "dagpam_0.5", "dagpam_0.5_1"}, arch
        assert kinds["dagpam_0.5_1"]["lambda"] is None
    x = torch.randn(6, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    x[0] *= 1e-3  # a row whose mean square is near the epsilon: the rms is below 1 by its share
    for kind in ("layernorm", "rmsnorm"):
        y = collapse.normalise(x, kind)
        centred = x - x.mean(-1, keepdim=True) if kind == "layernorm" else x
        m = centred.square().mean(-1)
        close(y.square().mean(-1), m / (m + 1e-6), f"{kind}: unit rms up to the epsilon",
              rtol=1e-12)
        assert float(y[1:].square().mean(-1).min()) > 1 - 1e-4, kind


def test_training_histories_are_deterministic_and_share_the_batches():
    prose = "It was the best of times, it was the worst of times. " * 40
    run = lambda: training.gradient_histories(prose, ((0.5, 0.5),), layers=2, width=16,  # noqa: E731
                                              context=16, batch=4, steps=3, seed=0,
                                              log_every=1)
    first, second = run(), run()
    assert list(first) == ["softmax", "dagpam_0.5"]
    assert first == second, "same seed, same histories"
    for name, h in first.items():
        assert h["step"] == [0, 1, 2] and all(len(g) == 2 for g in h["grad_q"]), name
        assert all(v > 0 for g in h["grad_q"] for v in g), name
