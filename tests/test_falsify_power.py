"""The labelled corpus of ``benchmarks/falsify_power.py``, checked by hand, and the benchmark's
JSON.

Every false bound's witness and every true bound's tight case is recomputed here from closed
forms (plain ``math``: the normalizers' definitions and the inequality written out by hand, no
attnverify code), then compared with what ``attnverify falsify`` evaluates there. So a label never
rests on the search the benchmark measures.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as test_bench_grid

from attnverify.expr import parse_inequality  # noqa: E402
from attnverify.falsify import FalsifyCase, evaluate  # noqa: E402
from attnverify.registry import load_target  # noqa: E402
from benchmarks import falsify_power  # noqa: E402
from benchmarks.falsify_corpus import CORPUS  # noqa: E402

S_SSMAX = 0.43


# --------------------------------------------------------------------------------------------
# The normalizers and quantities by hand


def _softmax(z):
    top = max(z)
    e = [math.exp(v - top) for v in z]
    return [x / sum(e) for x in e]


def _sparsemax(z):
    srt = sorted(z, reverse=True)
    k, csum = 0, 0.0
    for i, v in enumerate(srt, 1):  # support: the largest k with 1 + k·z_(k) > Σ_{i<=k} z_(i)
        if 1 + i * v > csum + v:
            k, csum = i, csum + v
        else:
            break
    tau = (csum - 1) / k
    return [max(v - tau, 0.0) for v in z]


def _entmax15(z):
    # p_i = [z_i/2 - τ]₊², Σp = 1: solve for τ by bisection on the monotone Σ[z/2 - τ]₊² - 1
    half = [v / 2 for v in z]
    lo, hi = max(half) - 1.0, max(half)
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(max(v - mid, 0.0) ** 2 for v in half) > 1:
            lo = mid
        else:
            hi = mid
    p = [max(v - lo, 0.0) ** 2 for v in half]
    return [x / sum(p) for x in p]


def hand_quantities(target: str, scores, t: float) -> SimpleNamespace:
    live = [v for v in scores if math.isfinite(v)]
    n = len(live)
    z = [v / t for v in live]
    if target == "softmax":
        p = _softmax(z)
        jac = (np.diag(p) - np.outer(p, p)) / t
    elif target == "ssmax":
        c = S_SSMAX * math.log(n)
        p = _softmax([c * v for v in z])
        jac = c * (np.diag(p) - np.outer(p, p)) / t
    elif target == "sparsemax":
        p = _sparsemax(z)
        s = np.array([1.0 if x > 0 else 0.0 for x in p])
        jac = (np.diag(s) - np.outer(s, s) / s.sum()) / t
    elif target == "entmax15":
        p = _entmax15(z)
        s = np.sqrt(np.array(p))
        jac = (np.diag(s) - np.outer(s, s) / s.sum()) / t
    elif target == "sigmoid":
        p = [1 / (1 + math.exp(-(v - math.log(n)))) for v in z]
        jac = np.diag([x * (1 - x) for x in p]) / t
    else:
        raise AssertionError(target)
    positive = [x for x in p if x > 0]
    top2 = sorted(live, reverse=True)[:2]
    return SimpleNamespace(
        L=n, L_padded=len(scores), T=t, a=max(abs(v) for v in live), max_weight=max(p),
        min_weight=min(p), sum_weight=sum(p), entropy=-sum(x * math.log(x) for x in positive),
        n_support=len(positive), logit_gap=top2[0] - top2[1] if n > 1 else 0.0,
        jacobian_entry=float(np.abs(jac).max()), jacobian_frobenius=float(np.linalg.norm(jac)),
        jacobian_l1_total=float(np.abs(jac).sum()),
        jacobian_spectral=float(np.abs(np.linalg.eigvalsh(jac)).max()),
    )


#: Each inequality written out by hand as ``(lhs, rhs)`` of ``lhs <= rhs`` (``<`` for strict).
HAND = {
    "softmax_lemma1_upper": lambda q: (q.max_weight, math.exp(2 * q.a / q.T) / q.L),
    "softmax_lemma1_exp_a": lambda q: (q.max_weight, math.exp(q.a / q.T) / q.L),
    "softmax_lemma1_exp_1.5a": lambda q: (q.max_weight, math.exp(1.5 * q.a / q.T) / q.L),
    "softmax_lemma1_lower": lambda q: (math.exp(-2 * q.a / q.T) / q.L, q.min_weight),
    "softmax_lemma1_lower_exp_a": lambda q: (math.exp(-q.a / q.T) / q.L, q.min_weight),
    "softmax_lemma1_sharp": lambda q: (q.max_weight,
                                       1 / (1 + (q.L - 1) * math.exp(-2 * q.a / q.T))),
    "softmax_cor3_entrywise": lambda q: (q.jacobian_entry, 1 / (4 * q.T)),
    "softmax_cor3_entrywise_0.24": lambda q: (q.jacobian_entry, 0.24 / q.T),
    "softmax_spectral_half": lambda q: (q.jacobian_spectral, 1 / (2 * q.T)),
    "softmax_cor3_as_stated": lambda q: (q.jacobian_spectral, min(1 / (4 * q.T), math.sqrt(2))),
    "softmax_cor3_sqrt2_cap": lambda q: (q.jacobian_spectral, math.sqrt(2)),
    "softmax_lemma3_l1": lambda q: (q.jacobian_l1_total, 2 * (1 - 1 / q.L) / q.T),
    "softmax_lemma3_frobenius": lambda q: (q.jacobian_frobenius, math.sqrt(q.L - 1) / (q.L * q.T)),
    "softmax_frobenius_half": lambda q: (q.jacobian_frobenius, 1 / (2 * q.T)),
    "softmax_entropy_log_L": lambda q: (q.entropy, math.log(q.L)),
    "softmax_entropy_0.999": lambda q: (q.entropy, 0.999 * math.log(q.L)),
    "softmax_entropy_lower": lambda q: (math.log(q.L) - 2 * q.a / q.T, q.entropy),
    "softmax_lemma1_padded": lambda q: (q.max_weight, math.exp(2 * q.a / q.T) / q.L_padded),
    "softmax_tanh_spread": lambda q: (q.max_weight - q.min_weight, math.tanh(q.a / q.T)),
    "softmax_tanh_gap": lambda q: (q.max_weight - q.min_weight,
                                   math.tanh(q.logit_gap / (2 * q.T))),
    "sparsemax_lemma1_sharp": lambda q: (q.max_weight,
                                         1 / q.L + 2 * (q.a / q.T) * (1 - 1 / q.L)),
    "sparsemax_lemma1_loosened": lambda q: (q.max_weight, 1 / q.L + q.a / q.T),
    "sparsemax_lemma1_lower": lambda q: (1 / q.L - 2 * (q.a / q.T) * (1 - 1 / q.L),
                                         q.min_weight),
    "sparsemax_lemma1_lower_halved": lambda q: (1 / q.L - (q.a / q.T) * (1 - 1 / q.L),
                                                q.min_weight),
    "sparsemax_frobenius_support": lambda q: (q.jacobian_frobenius,
                                              math.sqrt(q.n_support - 1) / q.T),
    "sparsemax_frobenius_one": lambda q: (q.jacobian_frobenius, 1 / q.T),
    "sparsemax_spectral_one": lambda q: (q.jacobian_spectral, 1 / q.T),
    "sparsemax_spectral_half": lambda q: (q.jacobian_spectral, 1 / (2 * q.T)),
    "sparsemax_positive": lambda q: (0.0, q.min_weight),  # strict
    "entmax15_lemma1": lambda q: (q.max_weight, (1 / math.sqrt(q.L) + q.a / q.T) ** 2),
    "entmax15_lemma1_half": lambda q: (q.max_weight, (1 / math.sqrt(q.L) + q.a / (2 * q.T)) ** 2),
    "entmax15_spectral_half": lambda q: (q.jacobian_spectral, 1 / (2 * q.T)),
    "entmax15_entropy": lambda q: (q.entropy, math.log(q.L)),
    "sigmoid_max_sharp": lambda q: (q.max_weight, 1 / (1 + q.L * math.exp(-q.a / q.T))),
    "sigmoid_lemma1_0.9": lambda q: (q.max_weight, math.exp(0.9 * q.a / q.T) / q.L),
    "sigmoid_sum_one": lambda q: (q.sum_weight, 1.0),
    "sigmoid_sum_sharp": lambda q: (q.sum_weight, q.L / (1 + q.L * math.exp(-q.a / q.T))),
    "sigmoid_sum_lower": lambda q: (q.L / (1 + q.L * math.exp(q.a / q.T)), q.sum_weight),
    "ssmax_lemma1": lambda q: (q.max_weight, q.L ** (0.86 * q.a / q.T) / q.L),
    "ssmax_softmax_lemma1": lambda q: (q.max_weight, math.exp(2 * q.a / q.T) / q.L),
    "ssmax_spectral": lambda q: (q.jacobian_spectral, 0.215 * math.log(q.L) / q.T),
    "ssmax_spectral_half": lambda q: (q.jacobian_spectral, 1 / (2 * q.T)),
}

WITNESSES = [b for b in CORPUS if b.is_false]
TIGHT = [b for b in CORPUS if b.tight is not None]


def _check(bound, case):
    q = hand_quantities(bound.target, case.scores, case.temperature)
    lhs, rhs = HAND[bound.id](q)
    ev = evaluate(load_target(bound.target), parse_inequality(bound.inequality),
                  FalsifyCase(torch.tensor(case.scores, dtype=torch.float64), case.temperature,
                              "corpus", 0), {})
    assert ev.lhs == pytest.approx(lhs, rel=1e-9, abs=1e-12), bound.id
    assert ev.rhs == pytest.approx(rhs, rel=1e-9, abs=1e-12), bound.id
    return lhs, rhs, ev


@pytest.mark.parametrize("bound", WITNESSES, ids=lambda b: b.id)
def test_every_false_bound_fails_at_its_witness_by_hand(bound):
    assert bound.witness is not None
    lhs, rhs, ev = _check(bound, bound.witness)
    strict = parse_inequality(bound.inequality).strict
    assert (lhs >= rhs) if strict else (lhs > rhs * (1 + 1e-6) + 1e-9), (lhs, rhs)
    assert ev.fails


@pytest.mark.parametrize("bound", TIGHT, ids=lambda b: b.id)
def test_every_tight_true_bound_holds_with_equality_at_its_tight_case_by_hand(bound):
    lhs, rhs, ev = _check(bound, bound.tight)
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-15)
    assert not ev.fails and not ev.undefined


def test_the_corpus_is_labelled_and_covers_the_normalizers():
    assert len(CORPUS) >= 30
    assert len({b.id for b in CORPUS}) == len(CORPUS)
    assert {b.target for b in CORPUS} == {"softmax", "sparsemax", "entmax15", "sigmoid", "ssmax"}
    for target in {b.target for b in CORPUS}:
        labels = {b.is_false for b in CORPUS if b.target == target}
        assert labels == {True, False}, target  # true and false bounds for every normalizer
    for b in CORPUS:
        parse_inequality(b.inequality)
        assert (b.witness is not None) == b.is_false, b.id
        assert b.id in HAND or (not b.is_false and b.tight is None), b.id
    ids = {b.id for b in CORPUS}
    assert {"softmax_cor3_as_stated", "softmax_lemma3_frobenius"} <= ids  # the papers' false ones
    assert sum(b.tight is not None for b in CORPUS) >= 10  # tight / numerically fragile ones
    assert any("jacobian" in b.inequality for b in CORPUS if b.is_false)


def test_the_benchmark_writes_the_issue_schema(tmp_path, capsys):
    path = tmp_path / "power.json"
    code = falsify_power.main(["--only", "softmax_lemma1_exp_a,sigmoid_sum_exp",
                               "--evaluations", "40", "--json", str(path)])
    assert code == 0
    data = json.loads(path.read_text())
    assert set(data) == {"methods", "bounds"}
    assert set(data["methods"]) == {"attnverify", "hypothesis", "differential_evolution"}
    for stats in data["methods"].values():
        assert set(stats) == {"found", "missed", "false_alarms", "median_evaluations_to_witness",
                              "median_seconds_to_witness"}
        assert stats["found"] + stats["missed"] == 1 and stats["false_alarms"] == 0
    ours = data["methods"]["attnverify"]
    assert ours["found"] == 1 and ours["median_evaluations_to_witness"] <= 40
    ids = [b["id"] for b in data["bounds"]]
    assert ids == ["softmax_lemma1_exp_a", "sigmoid_sum_exp"]
    for b in data["bounds"]:
        for got in b["methods"].values():
            assert got["evaluations"] <= 40
    out = capsys.readouterr().out
    assert "| attnverify | 1/1 | 0 | 0/1 |" in out
