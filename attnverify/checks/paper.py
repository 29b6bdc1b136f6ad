"""Checks of the papers' claims (docs/THEORY.md §2–6), each comparing an observed quantity with a
bound from :mod:`attnverify.bounds`. All run in float64: they test mathematics, not rounding; the
slack is the float64 row of the tolerance table.
"""

from __future__ import annotations

import math

import torch

from attnverify import bounds, jacobian
from attnverify.checks.base import Violation, as_float64
from attnverify.checks.layout import case_weights
from attnverify.tolerances import tol_for

F64 = torch.float64


def _weights(spec, case) -> torch.Tensor:
    """The case's weights, its rows given in its layout."""
    return as_float64(case_weights(spec, case))


def _t(case) -> float:
    return 1.0 if case.temperature is None else float(case.temperature)


def _slack(bound: torch.Tensor) -> torch.Tensor:
    t = tol_for(F64)
    return t.atol + t.rtol * bound.abs()


def _denominator(value: torch.Tensor) -> torch.Tensor:
    """What a ratio divides by: the value itself, or value + slack where the value is within the
    slack of 0 (a bound of 0 met by an observation of 1e-17 is a ratio near 0, not 1e292)."""
    slack = _slack(value)
    return torch.where(value.abs() > slack, value, value.clamp_min(0.0) + slack)


def _upper(observed: torch.Tensor, bound: torch.Tensor, what: str, **details) -> float:
    """Raise unless ``observed ≤ bound`` (elementwise, within slack); return the worst ratio."""
    observed, bound = as_float64(observed), as_float64(bound).expand_as(as_float64(observed))
    excess = observed - bound - _slack(bound)
    ratio = observed / _denominator(bound)
    worst_i = int(torch.argmax(excess.nan_to_num(math.inf)))
    flat_o, flat_b = observed.flatten(), bound.flatten()
    if bool((excess.nan_to_num(math.inf) > 0).any()):
        o, b = float(flat_o[worst_i]), float(flat_b[worst_i])
        ratio_ob = (o / b) if b > 0 else math.inf
        raise Violation(f"{what}: observed {o:.6g} > bound {b:.6g} (ratio {ratio_ob:.4g})",
                        observed=o, bound=b, ratio=ratio_ob, **details)
    return float(ratio.max()) if ratio.numel() else 0.0


def _lower(observed: torch.Tensor, bound: torch.Tensor, what: str, **details) -> float:
    """Raise unless ``observed ≥ bound`` (within slack); return the worst ratio bound / observed."""
    observed, bound = as_float64(observed), as_float64(bound).expand_as(as_float64(observed))
    short = bound - observed - _slack(bound)
    if bool((short.nan_to_num(math.inf) > 0).any()):
        i = int(torch.argmax(short.nan_to_num(math.inf)))
        o, b = float(observed.flatten()[i]), float(bound.flatten()[i])
        raise Violation(f"{what}: observed {o:.6g} < lower bound {b:.6g}",
                        observed=o, bound=b, ratio=(b / o) if o > 0 else math.inf, **details)
    ratio = bound / _denominator(observed)
    return float(ratio.max()) if ratio.numel() else 0.0


# --------------------------------------------------------------------------------------------
# Lemma 1 / Corollary 1 / length awareness


def check_lemma1(spec, case, ctx) -> float:
    """C1/L ≤ α_i ≤ C2/L with C2 = max F / min F over [−a, a] (Lemma 1, constants derived)."""
    alpha = _weights(spec, case)
    f_min, f_max = bounds.kernel_extremes(spec.kernel.F, case.a, _t(case))
    lo, hi = bounds.lemma1_weight_bounds(f_min, f_max, alpha.shape[-1])
    r1 = _upper(alpha, hi, "Lemma 1 upper C2/L")
    r2 = _lower(alpha, lo, "Lemma 1 lower C1/L")
    return max(r1, r2)


def check_cor1(spec, case, ctx) -> float:
    """(1/L)e^{−2Δ/T} ≤ α_i ≤ (1/L)e^{2Δ/T}, Δ = ‖q‖·max‖k_j‖ (Corollary 1, stated)."""
    alpha = _weights(spec, case)
    lo, hi = bounds.cor1_softmax_weight_bounds(case.delta.unsqueeze(-1), alpha.shape[-1],
                                               _t(case))
    return max(_upper(alpha, hi, "Corollary 1 upper"), _lower(alpha, lo, "Corollary 1 lower"))


#: Length awareness [choice]: L·max weight of the fixed-margin peak must grow at least like
#: L^(1/4) between these lengths (a length-independent F keeps it bounded by C2).
LENGTH_AWARE_LENGTHS = (16, 4096)
LENGTH_AWARE_EXPONENT = 0.25


def check_length_aware(spec, case, ctx) -> float:
    short, long_ = LENGTH_AWARE_LENGTHS
    growth = []
    for length in (short, long_):
        row = bounds.fixed_margin_peak(length, case.a).unsqueeze(0)
        w = as_float64(case_weights(spec, case, row))[0, 0]
        growth.append(length * float(w))
    need = (long_ / short) ** LENGTH_AWARE_EXPONENT
    got = growth[1] / growth[0]
    if not got >= need:
        raise Violation(
            f"peak weight decays like 1/L: L·max_weight grew {got:.3g}× from L={short} to "
            f"L={long_} (margin a={case.a:.3g}); a length-aware normalizer needs ≥ {need:.3g}×",
            observed=got, bound=need, ratio=need / got if got > 0 else math.inf,
        )
    return need / got


# --------------------------------------------------------------------------------------------
# Theorem 1 and Theorem 2


def check_thm1_fixed(spec, case, ctx) -> float:
    alpha = _weights(spec, case)[0]
    mask = bounds.top_n_mask(alpha, case.n_top)
    d = bounds.cumulative_distance(alpha, case.x, mask)
    bound = bounds.thm1_fixed_bound(alpha, case.x, mask)
    return _upper(d, bound, f"Theorem 1.1 d̃ (N={case.n_top})")


def check_thm1_random(spec, case, ctx) -> float:
    alpha = _weights(spec, case)[0]
    res = bounds.thm1_random(alpha, case.x, case.n_top)
    return _lower(res.expected, res.main, f"Theorem 1.2 E[d̃] ≥ main term (N={case.n_top})",
                  epsilon=float(res.epsilon))


def _separation(spec, case):
    alpha = _weights(spec, case)[0]
    mask = bounds.top_n_mask(alpha, case.n_top)
    r = bounds.separation_radius(alpha, case.x, mask)
    xi = bounds.xi(alpha, mask, case.radius, case.delta)
    frac = bounds.separable_fraction(alpha, case.x, mask)
    return alpha, mask, r, xi, frac


def check_thm2_lower(spec, case, ctx) -> float:
    _, mask, r, xi, frac = _separation(spec, case)
    low = bounds.thm2_lower_bound(xi, r, mask)
    _lower(frac, low, f"Theorem 2 lower bound on N_s/N (N={case.n_top})")
    return float(low.clamp_min(0.0)) / max(float(frac), 1e-300) if float(frac) > 0 else 0.0


def check_thm2_upper(spec, case, ctx) -> float:
    _, mask, r, xi, frac = _separation(spec, case)
    up = bounds.thm2_upper_bound(xi, r, mask, case.radius)
    return _upper(frac, up, f"Theorem 2 upper bound on N_s/N (N={case.n_top})")


# --------------------------------------------------------------------------------------------
# Jacobians


def _row_map(spec, case):
    """Rows ↦ weights, the rows given in the case's layout (expanded copies: their mean)."""
    return lambda z: case_weights(spec, case, z, copies="mean")


def _spectral(spec, case) -> torch.Tensor:
    # dense up to R·L² = 2^20 entries: one batch of products instead of a Lanczos run of up to
    # 2·128 of them (each a request to the worker the target runs in)
    res = jacobian.spectral_norm(_row_map(spec, case), case.scores.to(F64), seed=case.seed,
                                 method="auto")
    return res.value


def check_lemma2(spec, case, ctx) -> float:
    """‖J‖₂ ≤ (max|F'| / (L·min F))·(1 + max F / min F) over the row's logits (derived)."""
    z = case.scores.to(F64)
    k = spec.kernel
    bound = bounds.lemma2_bound(k.F(z, _t(case)), k.dF(z, _t(case)))
    # F overflowing (exp of a huge logit) makes the bound inf/inf: it is vacuous, not violated
    bound = torch.nan_to_num(bound, nan=math.inf)
    return _upper(_spectral(spec, case), bound, "Lemma 2 ‖J‖₂")


def check_cor3_entrywise(spec, case, ctx) -> float:
    observed = jacobian.entry_max_abs(_row_map(spec, case), case.scores.to(F64))
    return _upper(observed, bounds.cor3_entrywise_bound(_t(case)), "max |J_ij| ≤ 1/(4T)")


def check_cor3_paper(spec, case, ctx) -> float:
    return _upper(_spectral(spec, case), bounds.cor3_paper_bound(_t(case)),
                  "Corollary 3 as stated: ‖J‖₂ ≤ min{1/(4T), √2}")


def check_spectral_half(spec, case, ctx) -> float:
    return _upper(_spectral(spec, case), bounds.softmax_spectral_bound(_t(case)),
                  "‖J‖₂ ≤ 1/(2T)")


def check_fd_gradient(spec, case, ctx) -> float:
    z = case.scores.to(F64)
    v = jacobian.unit_directions(z.shape, seed=case.seed)
    # δ = ‖f_T(l + εv) − f_T(l)‖/ε with the normalizer at the case's temperature T (for softmax
    # the same as Algorithm 5's f((l + εv)/T)): one temperature for the map and the bound, never
    # T applied twice, and a normalizer only ever runs at the T a case (or --params) gives
    f = _row_map(spec, case)
    delta = jacobian.fd_estimate(f, z, v, eps=case.eps, temperature=1.0)
    return _upper(delta, bounds.fd_estimator_bound(_t(case), case.eps),
                  f"finite-difference δ ≤ min{{1/(2T), √2/ε}} (ε={case.eps:g})")


def check_lemma3_l1(spec, case, ctx) -> float:
    observed = jacobian.l1_total(_row_map(spec, case), case.scores.to(F64))
    bound = bounds.lemma3_l1_bound(case.scores.shape[-1], _t(case))
    return _upper(observed, bound, "Lemma 3 (ℓ1): Σ|J_jk| ≤ 2(1 − 1/L)/T")


def check_lemma3_frobenius(spec, case, ctx) -> float:
    observed = jacobian.frobenius(_row_map(spec, case), case.scores.to(F64))
    bound = bounds.lemma3_frobenius_uniform(case.scores.shape[-1], _t(case))
    return _upper(observed, bound, "Lemma 3 (Frobenius): ‖J‖_F ≤ ‖J(uniform)‖_F")


# --------------------------------------------------------------------------------------------
# GPAM


def check_gpam_range(spec, case, ctx) -> float:
    alpha = _weights(spec, case)
    live = (case.scores != float("-inf")).any(-1).cpu()
    alpha = alpha[live]
    lo, hi = bounds.gpam_range(float(spec.params["lam"]))
    if alpha.numel() == 0:
        return 0.0
    r1 = _upper(alpha, hi, f"GPAM range: weight ≤ 1 + λ = {float(hi):g}")
    _lower(alpha, lo, f"GPAM range: weight ≥ −λ = {float(lo):g}")
    return r1
