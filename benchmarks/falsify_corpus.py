"""The labelled corpus of ``benchmarks/falsify_power.py``: inequalities over softmax, sparsemax,
entmax15, sigmoid and ssmax (built-in defaults: T = 1 drawn freely, sigmoid's bias ``−log L``,
ssmax's ``s = 0.43``), each true or false.

A false bound carries a ``witness`` (a row and its temperature) at which it fails; a true bound
carries, where it is attained, a ``tight`` case at which it holds with equality, and a one-line
proof. ``tests/test_falsify_power.py`` checks every witness and every tight case against
closed forms computed by hand there (no normalizer code), so no label rests on the search being
measured. Sources: the papers' false statements (docs/THEORY.md §5.5, §6.7), and loosened (still
true) and tightened (false) variants of the true bounds, several tight everywhere on a family of
rows (numerically fragile: the search sits on equality and only the tolerance separates them).

Pure data: nothing here imports torch or attnverify (asv imports every module of this folder).
"""

from __future__ import annotations

from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class Case:
    scores: tuple[float, ...]
    temperature: float = 1.0


@dataclass(frozen=True)
class Bound:
    id: str
    target: str
    inequality: str
    is_false: bool
    why: str
    witness: Case | None = None  # false bounds: where it fails
    tight: Case | None = None  # true bounds: where it holds with equality (if attained)


def _row(*values: float) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


CORPUS: tuple[Bound, ...] = (
    # ---------------------------------------------------------------- softmax
    Bound("softmax_lemma1_upper", "softmax", "max_weight <= exp(2*a/T)/L", False,
          "Lemma 1 / Corollary 1: e^{l_i} <= e^{a}, each of the L terms of the sum >= e^{-a}",
          tight=Case(_row(0, 0, 0))),
    Bound("softmax_lemma1_exp_a", "softmax", "max_weight <= exp(a/T)/L", True,
          "Lemma 1 tightened in the exponent: L·max = L/(1+(L-1)e^{-2x}) ~ 1 + 2x(L-1)/L > e^x "
          "once L >= 3 (L = 2 holds: 1 + tanh x <= e^x)",
          witness=Case(_row(0.3, -0.3, -0.3))),
    Bound("softmax_lemma1_exp_1.5a", "softmax", "max_weight <= exp(1.5*a/T)/L", True,
          "Lemma 1 with exponent 1.5: false once 2(L-1)/L > 1.5, i.e. L >= 5 (no witness below)",
          witness=Case(_row(0.1, -0.1, -0.1, -0.1, -0.1))),
    Bound("softmax_lemma1_lower", "softmax", "min_weight >= exp(-2*a/T)/L", False,
          "Lemma 1, lower: e^{l_i} >= e^{-a}, each term of the sum <= e^{a}",
          tight=Case(_row(0, 0))),
    Bound("softmax_lemma1_lower_exp_a", "softmax", "min_weight >= exp(-a/T)/L", True,
          "the lower bound tightened: two keys at +x, one at -x",
          witness=Case(_row(0.3, 0.3, -0.3))),
    Bound("softmax_lemma1_sharp", "softmax", "max_weight <= 1/(1 + (L - 1)*exp(-2*a/T))", False,
          "t/(t+S) grows in t and falls in S: l_1 <= a, the others >= -a; equality on every "
          "row (+a, -a, ..., -a)", tight=Case(_row(0.5, -0.5, -0.5, -0.5))),
    Bound("softmax_cor3_entrywise", "softmax", "jacobian_entry <= 1/(4*T)", False,
          "THEORY §5.3: |J_ij| <= α_i(1-α_i)/T <= 1/(4T), equality at a two-way tie",
          tight=Case(_row(0, 0))),
    Bound("softmax_cor3_entrywise_0.24", "softmax", "jacobian_entry <= 0.24/T", True,
          "Corollary 3 entry-wise, tightened: the two-way tie reaches 1/4",
          witness=Case(_row(0, 0))),
    Bound("softmax_spectral_half", "softmax", "jacobian_spectral <= 1/(2*T)", False,
          "THEORY §5.4, equality at a two-way tie", tight=Case(_row(0, 0))),
    Bound("softmax_cor3_as_stated", "softmax", "jacobian_spectral <= min(1/(4*T), sqrt(2))", True,
          "the paper's Corollary 3 (THEORY §5.5): the two-way tie gives 1/(2T)",
          witness=Case(_row(0, 0))),
    Bound("softmax_cor3_sqrt2_cap", "softmax", "jacobian_spectral <= sqrt(2)", True,
          "the paper's √2 cap alone (THEORY §5.5): 1/(2T) > √2 once T < 0.354",
          witness=Case(_row(0, 0), temperature=0.1)),
    Bound("softmax_lemma3_l1", "softmax", "jacobian_l1_total <= 2*(1 - 1/L)/T", False,
          "THEORY §6.6: Σ|J| = 2(1-Σα²)/T, Σα² >= 1/L; equality at the uniform row",
          tight=Case(_row(0, 0, 0, 0))),
    Bound("softmax_lemma3_frobenius", "softmax", "jacobian_frobenius <= sqrt(L - 1)/(L*T)", True,
          "the paper's Lemma 3 read with ‖J‖_F (THEORY §6.7): a two-way tie beats the uniform row "
          "once L >= 3", witness=Case(_row(0, 0, -40))),
    Bound("softmax_frobenius_half", "softmax", "jacobian_frobenius <= 1/(2*T)", False,
          "THEORY §6.7: max ‖J‖_F = 1/(2T) at a two-way tie", tight=Case(_row(0, 0))),
    Bound("softmax_entropy_log_L", "softmax", "entropy <= log(L)", False,
          "Gibbs; equality at the uniform row (a sum of L equal terms: fragile at large L)",
          tight=Case(_row(*([0.0] * 64)))),
    Bound("softmax_entropy_0.999", "softmax", "entropy <= 0.999*log(L)", True,
          "tightened by 0.1%: the uniform row has entropy log L",
          witness=Case(_row(0, 0))),
    Bound("softmax_entropy_lower", "softmax", "entropy >= log(L) - 2*a/T", False,
          "-log α_i >= log L - 2a/T by Lemma 1, averaged over α", tight=Case(_row(0, 0, 0))),
    Bound("softmax_lemma1_padded", "softmax", "max_weight <= exp(2*a/T)/L_padded", True,
          "Lemma 1 with the padded length: a masked key takes no weight",
          witness=Case(_row(0, -INF))),
    Bound("softmax_tanh_spread", "softmax", "max_weight - min_weight <= tanh(a/T)", False,
          "(e^{l_max} - e^{l_min})/Σ <= tanh((l_max - l_min)/(2T)) <= tanh(a/T); equality at "
          "(x, -x)", tight=Case(_row(0.4, -0.4))),
    Bound("softmax_tanh_gap", "softmax", "max_weight - min_weight <= tanh(logit_gap/(2*T))", True,
          "equality at L = 2, false at L = 3: the smallest key can lie far below the second",
          witness=Case(_row(1, 0, -10))),
    # ---------------------------------------------------------------- sparsemax
    Bound("sparsemax_lemma1_sharp", "sparsemax", "max_weight <= 1/L + 2*(a/T)*(1 - 1/L)", False,
          "full support: p_max = 1/L + l_max - mean(l) <= 1/L + 2a(1-1/L); otherwise "
          "p_max <= min(1, 2a): equality on every (x, -x, ..., -x) with full support",
          tight=Case(_row(0.2, -0.2, -0.2))),
    Bound("sparsemax_lemma1_loosened", "sparsemax", "max_weight <= 1/L + a/T", True,
          "the sparsemax Lemma-1 bound with a halved slope: equality at L = 2, false at L = 3",
          witness=Case(_row(0.3, -0.3, -0.3))),
    Bound("sparsemax_lemma1_lower", "sparsemax", "min_weight >= 1/L - 2*(a/T)*(1 - 1/L)", False,
          "full support: p_min = 1/L + l_min - mean(l); a zero weight needs a >= 1/(2(L-1)), "
          "where the bound is <= 0", tight=Case(_row(0.1, 0.1, -0.1))),
    Bound("sparsemax_lemma1_lower_halved", "sparsemax", "min_weight >= 1/L - (a/T)*(1 - 1/L)",
          True, "the lower bound with a halved slope", witness=Case(_row(0.1, 0.1, -0.1))),
    Bound("sparsemax_frobenius_support", "sparsemax",
          "jacobian_frobenius <= sqrt(n_support - 1)/T", False,
          "J = (I_S - 1_S 1_Sᵀ/|S|)/T, a projection of rank |S| - 1: equality on every row",
          tight=Case(_row(0, 0, 0))),
    Bound("sparsemax_frobenius_one", "sparsemax", "jacobian_frobenius <= 1/T", True,
          "holds while the support has at most two keys (equality there), fails at three",
          witness=Case(_row(0, 0, 0))),
    Bound("sparsemax_spectral_one", "sparsemax", "jacobian_spectral <= 1/T", False,
          "a projection has norm 1 (support >= 2) or 0", tight=Case(_row(0, 0))),
    Bound("sparsemax_spectral_half", "sparsemax", "jacobian_spectral <= 1/(2*T)", True,
          "softmax's 1/(2T) on sparsemax: the projection has norm 1",
          witness=Case(_row(0, 0))),
    Bound("sparsemax_positive", "sparsemax", "min_weight > 0", True,
          "strict: sparsemax gives exact zeros", witness=Case(_row(1, -1))),
    # ---------------------------------------------------------------- entmax15
    Bound("entmax15_lemma1", "entmax15", "max_weight <= (1/sqrt(L) + a/T)**2", False,
          "p = u², u_i = l_i/(2T) - τ: full support gives Σu² = 1 with u_max - u_i <= a/T, so "
          "u_max <= 1/√L + a/T; else τ >= -a/(2T) and u_max <= a/T; equality at a = 0",
          tight=Case(_row(0, 0, 0))),
    Bound("entmax15_lemma1_half", "entmax15", "max_weight <= (1/sqrt(L) + a/(2*T))**2", True,
          "the slope halved: first order ties at L = 2 (holds), fails at L = 3",
          witness=Case(_row(0.3, -0.3, -0.3))),
    Bound("entmax15_spectral_one", "entmax15", "jacobian_spectral <= 1/T", False,
          "J = (diag(√p) - √p√pᵀ/Σ√p)/T, norm <= max √p_i <= 1 (loose: at most 1/√2 seen)"),
    Bound("entmax15_spectral_half", "entmax15", "jacobian_spectral <= 1/(2*T)", True,
          "the two-way tie gives 1/(√2 T)", witness=Case(_row(0, 0))),
    Bound("entmax15_entropy", "entmax15", "entropy <= log(L)", False,
          "Gibbs; equality at the uniform row", tight=Case(_row(0, 0, 0, 0, 0))),
    # ---------------------------------------------------------------- sigmoid (bias -log L)
    Bound("sigmoid_max_sharp", "sigmoid", "max_weight <= 1/(1 + L*exp(-a/T))", False,
          "σ(l_max/T - log L) grows with l_max <= a; equality whenever l_max = a",
          tight=Case(_row(0.7, -0.2))),
    Bound("sigmoid_lemma1_exp", "sigmoid", "max_weight <= exp(a/T)/L", False,
          "σ(y) < e^y: the ratio tends to 1 as a/T -> 0 and L grows, never reaching it"),
    Bound("sigmoid_lemma1_0.9", "sigmoid", "max_weight <= exp(0.9*a/T)/L", True,
          "false only on long rows: e^{0.1a} > 1 + e^a/L needs L of about 30 or more",
          witness=Case(_row(1.5, *([0.0] * 31)))),
    Bound("sigmoid_sum_one", "sigmoid", "sum_weight <= 1", True,
          "sigmoid weights are not normalised: two keys at 2 sum to 1.57",
          witness=Case(_row(2, 2))),
    Bound("sigmoid_sum_exp", "sigmoid", "sum_weight <= exp(a/T)", False,
          "Σσ(l/T - log L) < Σe^{l/T}/L <= e^{a/T} (ratio -> 1 at small a, large L)"),
    Bound("sigmoid_sum_sharp", "sigmoid", "sum_weight <= L/(1 + L*exp(-a/T))", False,
          "each term <= σ(a/T - log L); equality on a tie at +a", tight=Case(_row(0.5, 0.5, 0.5))),
    Bound("sigmoid_sum_lower", "sigmoid", "sum_weight >= L/(1 + L*exp(a/T))", False,
          "each term >= σ(-a/T - log L); equality on a tie at -a",
          tight=Case(_row(-0.5, -0.5))),
    # ---------------------------------------------------------------- ssmax (s = 0.43)
    Bound("ssmax_lemma1", "ssmax", "max_weight <= L**(0.86*a/T)/L", False,
          "ssmax is softmax at logits s·log(L)·l: Lemma 1 with a -> s·log(L)·a",
          tight=Case(_row(0, 0))),
    Bound("ssmax_softmax_lemma1", "ssmax", "max_weight <= exp(2*a/T)/L", True,
          "softmax's Lemma 1 on ssmax: false once s·log L·(L-1)/L > 1 (L >= 12 or so): length "
          "awareness escapes Lemma 1", witness=Case(_row(0.5, *([-0.5] * 15)))),
    Bound("ssmax_spectral", "ssmax", "jacobian_spectral <= 0.215*log(L)/T", False,
          "J = s·log(L)·(diag α - ααᵀ)/T, norm <= s·log(L)/(2T); equality at a two-way tie",
          tight=Case(_row(0, 0))),
    Bound("ssmax_spectral_half", "ssmax", "jacobian_spectral <= 1/(2*T)", True,
          "softmax's 1/(2T) on ssmax: false once s·log L > 1 (L >= 11) at a two-way tie",
          witness=Case(_row(10, 10, *([-10] * 14)))),
)
