"""The labelled corpus of ``benchmarks/falsify_power.py``: inequalities over the built-in
normalizers (built-in defaults unless a bound sets ``params``: T drawn freely, sigmoid's bias
``−log L``, ssmax's ``s = 0.43``), each true or false.

A false bound carries a ``witness`` (a row and its temperature) at which it fails; a true bound
carries, where it is attained, a ``tight`` case at which it holds with equality, and a one-line
proof. ``tests/test_falsify_power.py`` checks every witness and every tight case against
closed forms computed by hand there (no normalizer code), so no label rests on the search being
measured. Sources: the papers' false statements (docs/THEORY.md §5.5, §6.7), and loosened (still
true) and tightened (false) variants of the true bounds, several tight everywhere on a family of
rows (numerically fragile: the search sits on equality and only the tolerance separates them);
then the red team's 63 bounds of issue #18 (``source`` says which, and the kind of witness they
were built to need: large L, narrow bands of a/T, T far from 1, heavy padding, right-hand sides
≤ 0, ties to split, ill-conditioned expressions), over every built-in but ``softmax_fused``.

Pure data: nothing here imports torch or attnverify (asv imports every module of this folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    #: The normalizer's parameters (``--params``), e.g. ``{"alpha": 3.0}``.
    params: dict[str, Any] = field(default_factory=dict)
    #: Where the bound comes from (empty: the corpus of issue #18's first round).
    source: str = ""


def _row(*values: float) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _two(length: int, k: int, hi: float, lo: float) -> tuple[float, ...]:
    """``k`` keys at ``hi``, the other ``length − k`` at ``lo``."""
    return _row(*([hi] * k + [lo] * (length - k)))


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
    # ---------------------------------------------------------------- red team (issue #18)
    Bound("sm_lemma1_1999", "softmax", "L*max_weight <= exp(1.999*a/T)", True,
          "L*max = L/(1+(L-1)e^{-2x}) ~ 1+2x(L-1)/L; beats e^{1.999x} only once (L-1)/L > 0.9995:"
          " L > 2000",
          witness=Case(_two(4096, 1, 0.3, -0.3)), source="red team: large L"),
    Bound("sm_lemma1_e", "softmax", "L*max_weight <= e**(2*a/T)", False,
          "Lemma 1 (constant e): e^{l_i}<=e^a, each term of the sum >= e^{-a}; ratio -> 1 as a ->"
          " 0",
          tight=Case(_row(0, 0, 0)), source="red team: tight, constant e"),
    Bound("sm_lower_k_Lm1", "softmax", "L*min_weight >= exp(-1.997*a/T)", True,
          "k keys at +a: L*min = L/(k e^{2x}+L-k) ~ 1-2xk/L; below e^{-1.997x} only if k/L > "
          "0.9985: k = L-1 at L=1024",
          witness=Case(_two(1024, 1023, 0.1, -0.1)), source="red team: k=L-1, large L"),
    Bound("sm_band_line", "softmax", "max_weight - min_weight <= 0.8056 + 0.0707*a/T", True,
          "sup of max-min is tanh(x) at L=2 (x,-x); the line lies below tanh only for x in "
          "~[1.55, 2.59]",
          witness=Case(_row(2, -2)), source="red team: narrow band a/T in [1.5,2.5], L=2"),
    Bound("sm_tanh_sinhcosh", "softmax", "max_weight - min_weight <= sinh(a/T)/cosh(a/T)", False,
          "(e^{l_max}-e^{l_min})/S <= tanh((l_max-l_min)/2T) <= tanh(x); equality on every L=2 "
          "row (x,-x)",
          tight=Case(_row(0.4, -0.4)), source="red team: tight family, sinh/cosh"),
    Bound("sm_tanh_099", "softmax", "max_weight - min_weight <= 0.99*sinh(a/T)/cosh(a/T)", True,
          "tightened by 0.99: L=2 (x,-x) gives tanh(x)",
          witness=Case(_row(1, -1)), source="red team: tightened 0.99"),
    Bound("sm_tanh_101", "softmax", "max_weight - min_weight <= 1.01*tanh(a/T)", False,
          "loosened by 1.01",
          source="red team: loosened 1.01"),
    Bound("sm_kl_hoeffding", "softmax", "entropy >= log(L) - (a/T)**2/2", False,
          "KL(p||u) = int_0^1 t Var_t(s) dt <= (2x)^2/4 /2 = x^2/2; ratio -> 1 as x -> 0 with k ="
          " L/2",
          tight=Case(_row(0, 0)), source="red team: tight as a->0, k=L/2"),
    Bound("sm_kl_0499", "softmax", "entropy >= log(L) - 0.499*(a/T)**2", True,
          "k=L/2 two-level: KL = x^2/2 - O(x^4) > 0.499x^2 only for x in ~(0.015, 0.07) (below "
          "0.015 under tolerance)",
          witness=Case(_row(0.04, -0.04)), source="red team: narrow band small a/T, k=L/2"),
    Bound("sm_lowT", "softmax", "L*max_weight <= exp(7*a/sqrt(T))", True,
          "exponent 7 sqrt(T) x < 2x(L-1)/L needs T < 0.082 and L >= 5 (false at T=0.05, true at "
          "T=0.1 and 1)",
          witness=Case(_two(8, 1, 0.0165, -0.0165), temperature=0.05),
          source="red team: T far below 1, L>=5"),
    Bound("sm_highT_spec", "softmax", "jacobian_spectral <= 0.5725/T**1.05", True,
          "sup = 1/(2T) at a two-way tie; 0.5725/T^1.05 < 0.5/T only for T > 15",
          witness=Case(_row(0, 0), temperature=20.0), source="red team: T far above 1 (jacobian)"),
    Bound("sm_spec_maxw", "softmax", "jacobian_spectral <= max_weight/T", False,
          "interlacing: eigenvalues of diag(p)-pp^T are <= max p; equality whenever the top two "
          "keys tie",
          tight=Case(_row(0, 0)), source="red team: tight family (jacobian)"),
    Bound("sm_spec_maxw_099", "softmax", "jacobian_spectral <= 0.99*max_weight/T", True,
          "tightened: two-way tie gives equality in the true bound",
          witness=Case(_row(0, 0)), source="red team: tightened 0.99 (jacobian)"),
    Bound("sm_entry", "softmax", "jacobian_entry <= max_weight*(1 - min_weight)/T", False,
          "|J_ii| = p_i(1-p_i)/T <= max(1-min)/T, |J_ij| = p_i p_j/T <= p_i(1-p_i)/T; equality at"
          " every uniform row",
          tight=Case(_row(0, 0, 0)), source="red team: tight at ties (jacobian entrywise)"),
    Bound("sm_frob", "softmax",
          "jacobian_frobenius <= sqrt(sum_sq_weight - sum_sq_weight**2)/T", False,
          "T^2||J||_F^2 = S2 - 2 S3 + S2^2 and S2^2 <= S3 (Cauchy-Schwarz); equality at uniform "
          "rows",
          tight=Case(_row(0, 0, 0, 0)), source="red team: tight at ties, fragile sqrt (jacobian)"),
    Bound("sm_logmin_large", "softmax", "log(min_weight) >= -1.99*a/T - log(L) - 1", True,
          "worst row k=L-1 at +a: log min = -2x - log(L-1+e^{-2x}); false iff 0.01x > 1 + "
          "log(L/(L-1+e^{-2x})): x > 100.02 (L=4096), x > 169 (L=2)",
          witness=Case(_row(200, -200)), source="red team: large a/T only (>100)"),
    Bound("sm_minw_pos", "softmax", "min_weight > 0", False,
          "exp > 0 (and below a/T = 300 no weight underflows to 0); it was falsified at "
          "min_weight = 3.7e-44 while the tolerance counted against a strict claim",
          source="red team: strict inequality vs tolerance (semantics)"),
    Bound("sm_pad_entropy", "softmax", "entropy >= log(L_padded) - 2*a/T - 1", True,
          "true without padding (H >= log L - 2x); with masked keys fails iff log(L_padded/L) > 1"
          " + 2x + (log L - H): needs L_padded > e*L",
          witness=Case(_row(0, -INF, -INF)), source="red team: masked only, L_padded > 2L"),
    Bound("sm_ratio_coshsinh", "softmax",
          "max_weight/min_weight <= (cosh(a/T) + sinh(a/T))**2", False,
          "max/min = e^{(l_max-l_min)/T} <= e^{2x}; equality on every row spanning [-a, a]",
          tight=Case(_row(0.3, -0.3)), source="red team: tight family, cosh/sinh"),
    Bound("sm_twolevel_entropy", "softmax",
          "entropy <= -((1 - L*min_weight)/(max_weight - "
          "min_weight))*max_weight*log(max_weight) - (L - (1 - L*min_weight)/(max_weight - "
          "min_weight))*min_weight*log(min_weight)", True,
          "RHS is the entropy of the two-level row with the same max, min and L (mass at the "
          "extremes minimises the concave sum); a three-level row has more",
          witness=Case(_row(1, 0, -1)), source="red team: three-level witness"),
    Bound("sm_entropy_log1p", "softmax", "entropy <= log1p(L - 1)", False,
          "H <= log L, equality at ties",
          tight=Case(_row(0, 0, 0)), source="red team: tight at ties, log1p"),
    Bound("sm_minent_2ln2", "softmax", "entropy >= 2*log(2)*(1 - max_weight)", False,
          "min entropy for max p is h(p) (p>=1/2, concave, chord from (1/2,ln2) to (1,0)) or "
          "larger; equality at L=2 ties",
          tight=Case(_row(0, 0)), source="red team: tight at L=2 tie"),
    Bound("sm_minent_pi", "softmax", "entropy >= (pi/2.2)*(1 - max_weight)", True,
          "pi/2.2 = 1.428 > 2 ln 2: L=2 tie has H = ln 2 < 0.714",
          witness=Case(_row(0, 0)), source="red team: constant pi"),
    Bound("sp_support", "sparsemax", "n_support >= min(L, T/(2*a))", False,
          "if some key is off the support, tau >= -x so each p_i <= 2x, and 1 <= |S| 2x; equality"
          " at 2xk = 1",
          tight=Case(_row(0.1, 0.1, 0.1)), source="red team: tight (integer plateaus)"),
    Bound("sp_support_102", "sparsemax", "n_support >= min(L, 1.02*T/(2*a))", True,
          "k keys at +a, rest -a, 2xk in [1, 1.02): support k < 1.02/(2x); narrow band of x for "
          "each k",
          witness=Case(_row(0.505, -0.505)), source="red team: narrow band (1/(2k), 1.02/(2k))"),
    Bound("sp_l1_support", "sparsemax", "jacobian_l1_total <= 2*(n_support - 1)/T", False,
          "J = (I_S - 11^T/|S|)/T on the support: l1 total = 2(|S|-1)/T, equality on every row",
          tight=Case(_row(0, 0, 0)), source="red team: equality everywhere (jacobian)"),
    Bound("sp_sumsq", "sparsemax", "sum_sq_weight <= 1/L + L*(a/T)**2", False,
          "full support: sum p^2 = 1/L + sum (s - mean)^2 <= 1/L + L x^2 (equality k = L/2); "
          "partial support checked numerically",
          tight=Case(_row(0.1, -0.1)), source="red team: tight at k=L/2"),
    Bound("sp_sumsq_099", "sparsemax", "sum_sq_weight <= 1/L + 0.99*L*(a/T)**2 + 1/L**2", True,
          "k=L/2, full support (x < 1/L): excess 0.01 L x^2 beats 1/L^2 only for L >~ 150 in x in"
          " ~(0.0026, 0.0039) at L=256",
          witness=Case(_two(256, 128, 0.0035, -0.0035)),
          source="red team: k=L/2, L>=150, narrow band tiny a/T"),
    Bound("sp_entropy_support", "sparsemax", "entropy <= log(n_support)", False,
          "Shannon <= log support size; equality when uniform on the support",
          tight=Case(_row(0, 0, 0)), source="red team: tight, exact zeros"),
    Bound("e15_spec_sqrt", "entmax15", "jacobian_spectral <= sqrt(max_weight)/T", False,
          "J = (diag(u) - uu^T/sum u)/T, u = sqrt(p): eigenvalues <= max u; equality when the top"
          " two tie",
          tight=Case(_row(0, 0)), source="red team: tight family (jacobian)"),
    Bound("e15_spec_rt2", "entmax15", "jacobian_spectral <= 1/(sqrt(2)*T)", True,
          "labelled true by the red team (1/sqrt2 at a two-way tie), but interlacing only bounds "
          "the norm by max u = sqrt(max p): one key above L - 1 lower ones, all on the support, "
          "gives 0.7157 > 0.7071 at L = 56 (found by this search; checked by hand)",
          witness=Case(_row(1, *([-0.7] * 55))),
          source="red team: tight at L=2 tie (jacobian), relabelled false"),
    Bound("e15_largeL", "entmax15", "L*max_weight <= (1 + 0.999*a/T*sqrt(L))**2", True,
          "full support: L*max = [((L-1)/sqrtL) x + sqrt(1-(L-1)x^2/L)]^2 ~ 1 + 2x(L-1)/sqrtL; "
          "beats 0.999 only for L > 1000",
          witness=Case(_two(4096, 1, 0.026, -0.026)), source="red team: large L"),
    Bound("e15_largeL_T", "entmax15", "L*max_weight <= (1 + a/T*sqrt(L))**2", False,
          "u_max - u_i <= x and sum u^2 = 1 over the support: u_max <= 1/sqrt(|S|) + x...; "
          "checked numerically",
          tight=Case(_row(0, 0, 0)), source="red team: tight as a->0"),
    Bound("ea3_spec_band", "entmax_alpha", "jacobian_spectral <= 100/T", True,
          "alpha=3: J = diag(1/p) - ss^T/sum s on the support; two tied keys just above the "
          "threshold give eigenvalue 1/p_low -> inf. L=3 (x,-x,-x): x in ~(0.2401, 0.25); L=2 is "
          "bounded (=2)",
          witness=Case(_row(0.245, -0.245, -0.245)), params={"alpha": 3.0},
          source="red team: L>=3, narrow band, near support boundary (jacobian)"),
    Bound("ea125_spec", "entmax_alpha", "jacobian_spectral <= max_weight**0.75/T", False,
          "alpha=1.25: J = diag(s) - ss^T/sum s, s = p^0.75: eigenvalues <= max s; equality at "
          "top-two ties (bisection solver)",
          tight=Case(_row(0, 0)), params={"alpha": 1.25},
          source="red team: tight family, bisection (jacobian)"),
    Bound("ea125_spec_099", "entmax_alpha", "jacobian_spectral <= 0.99*max_weight**0.75/T", True,
          "tightened 0.99: a two-way tie gives equality in the true bound",
          witness=Case(_row(0, 0)), params={"alpha": 1.25},
          source="red team: tightened 0.99 (jacobian)"),
    Bound("ss_spec_largeL", "ssmax", "jacobian_spectral <= 1.5/T", True,
          "J = s log L (diag p - pp^T)/T; a two-way tie with the rest far below gives 0.215 "
          "log(L)/T > 1.5 once L > 1071",
          witness=Case(_two(1200, 2, 3.0, -3.0)), source="red team: large L (jacobian)"),
    Bound("ss_s02_F", "ssmax", "L*max_weight <= exp(0.3996*log(L)*a/T)", True,
          "s=0.2: Lemma 1 at scale 0.2 log L: L*max ~ 1 + 0.4 log(L) x (L-1)/L; beats 0.3996 "
          "log(L) x only for L > 1000",
          witness=Case(_two(4096, 1, 0.42, -0.42)), params={"s": 0.2},
          source="red team: large L, params"),
    Bound("ss_s02_T", "ssmax", "L*max_weight <= exp(0.4*log(L)*a/T)", False,
          "Lemma 1 for softmax(0.2 log(L) z/T); ratio -> 1 as a -> 0",
          tight=Case(_row(0, 0, 0)), params={"s": 0.2}, source="red team: tight as a->0"),
    Bound("sg_band", "sigmoid", "jacobian_spectral <= 0.2499/T", True,
          "bias=-2: J = diag(sigma'(z/T - 2))/T; sigma' > 0.2499 only for z/T in (1.96, 2.04) "
          "(interior or vertex at a/T ~ 2)",
          witness=Case(_row(2)), params={"bias": -2.0},
          source="red team: narrow band / interior logit (jacobian)"),
    Bound("sg_pad", "sigmoid", "sum_weight <= L/(1 + L_padded*exp(-a/T)) + 0.05", True,
          "default bias -log L (unmasked): the tie at +a gives L/(1+L e^{-x}) exactly; with "
          "L_padded > L the RHS drops",
          witness=Case(_row(0, -INF)), source="red team: masked only"),
    Bound("sg_tanh", "sigmoid", "max_weight <= (1 + tanh((a/T - log(L))/2))/2", False,
          "sigma(y) = (1+tanh(y/2))/2 and y_max <= x - log L; equality whenever the max logit is "
          "+a",
          tight=Case(_row(0.7, -0.2)), source="red team: tight family, tanh"),
    Bound("sg_quarter", "sigmoid", "jacobian_spectral <= 1/(4*T)", False,
          "diagonal Jacobian sigma'(y)/T <= 1/(4T); equality at y = 0 (e.g. L=1 zero row)",
          tight=Case(_row(0)), source="red team: tight (jacobian)"),
    Bound("spk_T", "softpick", "sum_weight <= L*expm1(a/T)/(L*expm1(a/T) + 1e-6)", False,
          "sum = P/(P+N+eps) <= P/(P+eps), P <= L expm1(x); equality at a tie at +a",
          tight=Case(_row(0.5, 0.5)), source="red team: tight at ties, expm1, small a/T"),
    Bound("spk_F", "softpick", "sum_weight <= L*expm1(a/T)/(L*expm1(a/T) + 1.1e-6)", True,
          "tie at +a: difference ~ 1e-7/P, above tolerance only for small L*expm1(x) (x <~ 0.3 at"
          " L=1)",
          witness=Case(_row(0.001)), source="red team: small a/T only"),
    Bound("st_T", "stablemax", "L*max_weight <= (1 + a/T)**2", False,
          "Lemma 1 with F = s: s in [1/(1+x), 1+x]; ratio -> 1 as a -> 0 or L -> inf",
          tight=Case(_row(0, 0, 0)), source="red team: tight as a->0"),
    Bound("st_F", "stablemax", "L*max_weight <= (1 + a/T)**1.99", True,
          "L(1+x)^2/((1+x)^2+L-1) > (1+x)^1.99 needs L >~ 200",
          witness=Case(_two(4096, 1, 0.5, -0.5)), source="red team: large L"),
    Bound("st_spec", "stablemax", "jacobian_spectral <= 1/(2*T)", False,
          "numerical sup 1/(2T) at the zero two-way tie (own Nelder-Mead over L=2..4)",
          tight=Case(_row(0, 0)), source="red team: tight (jacobian), not shift-invariant"),
    Bound("s1_T", "softmax1", "L*max_weight <= exp(2*a/T)*L/(L+1)", False,
          "max <= e^x/(1+e^x+(L-1)e^{-x}) and L+1 <= e^x + e^{2x} + L - 1; equality at the zero "
          "row",
          tight=Case(_row(0, 0, 0)), source="red team: tight at zero row"),
    Bound("s1_F", "softmax1", "L*max_weight <= exp(1.999*a/T)*L/(L+1)", True,
          "small x: L*max ~ L/(L+1)(1 + x(2L-1)/(L+1)); beats e^{1.999x} only for L > 2999",
          witness=Case(_two(4096, 1, 0.3, -0.3)), source="red team: large L"),
    Bound("s1_log1p", "softmax1", "log1p(-sum_weight) >= -log1p(L*exp(a/T))", False,
          "log(1 - S/(1+S)) = -log(1+S), S <= L e^x; equality at a tie at +a. Mathematically "
          "true; sum_weight rounds to 1 for x >~ 37 (log1p(-1) = -inf)",
          tight=Case(_row(0.5, 0.5)), source="red team: numerically fragile, log1p"),
    Bound("rn_3level", "relu_norm", "max_weight <= max(a/(2*a - logit_gap), 2 - L)", True,
          "holds on every L<=2 row and every two-level row; a top c < a with a positive second "
          "key and a key at -a breaks it",
          witness=Case(_row(1, 0.5, -2)), source="red team: three-level, L>=3, off-vertex"),
    Bound("rn_T", "relu_norm", "max_weight*n_support >= sum_weight", False,
          "max >= mean over the support; equality at uniform positive rows and the all-"
          "nonpositive (zero) policy rows",
          tight=Case(_row(1, 1)), source="red team: tight, policy rows"),
    Bound("dg_sum", "dagpam", "sum_weight >= 1", False,
          "rows sum to exactly 1 (affine): equality everywhere",
          tight=Case(_row(0.3, -0.1)), source="red team: equality everywhere"),
    Bound("dg_max", "dagpam", "max_weight <= max(0.5 + tanh(a/T), 2 - L)", False,
          "L=2 (x,-x): 2 sigma(2x) - 1/2 = 1/2 + tanh x; own search L=2..6 finds nothing above",
          tight=Case(_row(0.3, -0.3)), source="red team: tight at L=2"),
    Bound("dg_max_F", "dagpam", "max_weight <= max(0.5 + 0.999*tanh(a/T), 2 - L)", True,
          "tightened: L=2 (x,-x)",
          witness=Case(_row(1, -1)), source="red team: tightened 0.999"),
    Bound("dg_min", "dagpam", "min_weight >= 1/L - tanh(a/T)", False,
          "L=2: equality 1/2 - tanh x; L>=3 slope 4(L-1)/L^2 < 1; checked numerically",
          tight=Case(_row(0.3, -0.3)), source="red team: tight at L=2"),
    Bound("sa_T", "sa_softmax", "max_weight <= 1/(1 + (L-1)*exp(-2*a/T))", False,
          "factor <= 1 times softmax's sharp Lemma 1; equality at (a,-a,...,-a)",
          tight=Case(_row(0.5, -0.5, -0.5)), source="red team: tight family"),
    Bound("sa_F", "sa_softmax", "min_weight <= 0.5*exp(-logit_gap/T)", True,
          "L=2 (a,b), 0<b<a: min = sigma(-y) b/a; false iff a/T > 2y/(1-e^{-y}), y = (a-b)/T: "
          "needs a/T > 2 and b interior",
          witness=Case(_row(3, 2.5)), source="red team: interior witness (b not at a vertex)"),
    Bound("sa_F2", "sa_softmax", "min_weight <= max(0.5*exp(-logit_gap/T), 2 - L)", True,
          "sa_F with L=1 excluded (sa_F fell to the trivial L=1 row): every witness needs a "
          "positive key strictly inside (0, a): L=2 (a,b) needs a/T > 2y/(1-e^{-y}); or (a, b, b)"
          " with b near a and large a/T",
          witness=Case(_row(3, 2.5)), source="red team: interior witness (b not at a vertex)"),
    Bound("ea3_band2", "entmax_alpha", "jacobian_spectral <= 100*L/T", True,
          "alpha=3: uniform rows give L/T (ea3_spec_band fell to uniform L>100); only two or more"
          " keys just above the support threshold (p < 1/(100L)) break it: L=3 (x,-x,-x), x in "
          "~(0.2467, 0.25)",
          witness=Case(_row(0.2495, -0.2495, -0.2495)), params={"alpha": 3.0},
          source="red team: L>=3, narrow band near support boundary (jacobian)"),
    Bound("sm_kl_0499_neg", "softmax", "-entropy <= 0.499*(a/T)**2 - log(L)", True,
          "sm_kl_0499 rearranged so both sides are negative (same truth set)",
          witness=Case(_row(0.04, -0.04)), source="red team: RHS <= 0 (ratio merit blind)"),
    Bound("sm_band_line_neg", "softmax", "min_weight - max_weight >= -0.8056 - 0.0707*a/T", True,
          "sm_band_line rearranged: RHS (after flip: min - max) is <= 0",
          witness=Case(_row(2, -2)), source="red team: RHS <= 0 (ratio merit blind), narrow band"),
)
