"""The property registry: every id of docs/INTERFACES.md with its statement, applicability, cases
and check. ``attnverify properties`` prints :data:`PROPERTIES`; a property's id is its report key.
"""

from __future__ import annotations

from attnverify.checks import cases as C
from attnverify.checks import gradient as G
from attnverify.checks import paper as P
from attnverify.checks import reference as R
from attnverify.checks import universal as U
from attnverify.checks.base import Context, Property, Violation
from attnverify.checks.base import own_float64 as _f64
from attnverify.registry import NormalizerSpec

__all__ = ["PROPERTIES", "Context", "Property", "Violation", "properties_for"]

# --------------------------------------------------------------------------------------------
# Applicability rules: None = applies, else the reason


def _needs_kernel(spec: NormalizerSpec, ctx: Context) -> str | None:
    if spec.kernel is None:
        return "needs a declared kernel F (strictly positive, length-independent general form)"
    if spec.length_aware:
        return "Lemma 1 / Lemma 2 need F independent of L; this normalizer is length-aware"
    return None


def _needs_temperature(spec: NormalizerSpec, ctx: Context) -> str | None:
    return None if spec.takes_temperature else "the normalizer takes no temperature"


def _needs_lam(spec: NormalizerSpec, ctx: Context) -> str | None:
    return None if "lam" in spec.params else "needs the daGPAM parameter 'lam' (λ)"


def _needs_low_precision(spec: NormalizerSpec, ctx: Context) -> str | None:
    return None if ctx.low_dtypes else "no float16 / bfloat16 in --dtypes"


# --------------------------------------------------------------------------------------------
# Builders


def _rows(id, statement, check, *, universal=False, applies=None, battery=True, scale=1.0,
          verify=None, **case_options):
    long = case_options.pop("long", True)
    low = case_options.pop("low", False)
    joint = case_options.pop("joint", None)

    def options(ctx):
        return {**case_options, "dtypes": ctx.low_dtypes} if low else case_options

    def cases(spec, ctx):
        return C.row_cases(spec, ctx, **options(ctx))

    def explicit(spec, ctx):
        return C.row_battery(spec, ctx, long=long, joint=joint, **options(ctx)) \
            if battery else []

    return Property(id=id, statement=statement, cases=cases, check=check, explicit=explicit,
                    applies=applies or (lambda spec, ctx: None), universal=universal,
                    examples_scale=scale, verify=verify,
                    dtypes=_low_units if low else None)


def _low_units(spec, ctx):
    return ctx.low_dtypes


def _reference_units(spec, ctx):
    return ctx.full_dtypes + ctx.low_dtypes


def _jac(id, statement, check, *, applies=None, scale=0.5):
    return Property(id=id, statement=statement, cases=C.jacobian_cases, check=check,
                    explicit=C.jacobian_battery, applies=applies or _needs_temperature,
                    examples_scale=scale, dtypes=_f64)


_ALL = [
    # ---- universal
    _rows("shape", "output has the input's shape, dtype and device", U.check_shape,
          universal=True, scale=0.5),
    _rows("finite", "finite scores give finite weights (huge logits included)", U.check_finite,
          universal=True, allow_mask=False),
    _rows("deterministic", "equal inputs give bitwise-equal weights whatever was called in "
          "between (calls A, B, A, B in new storage; B = A with its keys permuted)",
          U.check_deterministic, universal=True, scale=0.5),
    _rows("no_mutation", "the input tensor is left unchanged", U.check_no_mutation,
          universal=True, scale=0.5),
    _rows("permutation_equivariant", "f(z[π]) = f(z)[π] for a permutation π of the keys",
          U.check_permutation_equivariant, universal=True),
    _rows("mask_zero", "a masked key gets weight exactly 0 and the others equal the row "
          "without it", U.check_mask_zero, universal=True, verify=U.verify_mask_zero,
          kinds=tuple(k for k in C.S.ALL_KINDS if k != "fully_masked"), joint=C.JOINT_MASKED),
    _rows("batch_independent", "a row's weights do not depend on the other rows of the batch",
          U.check_batch_independent, universal=True, verify=U.verify_batch_independent,
          joint="all"),
    _rows("layout_invariant", "the weights of rows given in any rank, axis and memory layout "
          "(views, slices, stride-0 axes, offsets) equal those of the same rows as one contiguous "
          "[rows, L] block with dim=-1", U.check_layout_invariant, universal=True, scale=0.5),
    Property(id="no_side_effects", statement="calling the normalizer (forward, backward, "
             "forward mode) leaves grad mode, default dtype and device, deterministic "
             "algorithms, matmul precision, thread count, backend and rounding switches, the "
             "global random generator and torch's public functions as they were; "
             "checked on every call of the run, reported last",
             cases=lambda s, c: C.row_cases(s, c, max_length=64),
             check=U.check_no_side_effects, verify=U.verify_no_side_effects,
             explicit=lambda s, c: U.recorded_cases(s, c) + C.row_battery(s, c, long=False)[:4],
             applies=U.no_side_effects_applies, universal=True, examples_scale=0.2),
    # ---- output spaces and invariances
    _rows("simplex", "weights ≥ 0 and every (not fully masked) row sums to 1", U.check_simplex),
    _rows("sub_simplex", "weights ≥ 0 and every row sums to at most 1", U.check_sub_simplex),
    _rows("nonnegative", "weights ≥ 0", U.check_nonnegative),
    _rows("affine_sum", "every (not fully masked) row sums to 1; weights may be negative",
          U.check_affine_sum),
    _rows("shift_invariant", "f(z + c) = f(z) for a constant c added to the row",
          U.check_shift_invariant, allow_mask=True),
    _rows("order_preserving", "z_i < z_j ⇒ α_i ≤ α_j and z_i = z_j ⇒ α_i = α_j",
          U.check_order_preserving),
    Property(id="length_aware", statement="for a fixed-margin peak (+a, −a, …), L·max weight "
             "grows at least like L^(1/4) from L=16 to 4096 [choice]: no 1/L decay",
             cases=C.peak_cases, check=P.check_length_aware, examples_scale=0.3, dtypes=_f64),
    _rows("fully_masked_row", "an all-masked row returns all zeros and does not raise",
          U.check_fully_masked_row, min_batch=2, verify=U.verify_fully_masked_row),
    _rows("dtype_agreement", "float16 / bfloat16 weights match the float64 weights of the "
          "same scores within the dtype's tolerance", U.check_low_precision, universal=True,
          applies=_needs_low_precision, low=True),
    # ---- what the normalizer computes, and its derivatives (checks/reference.py, gradient.py)
    Property(id="matches_reference", statement="weights equal the reference normalizer's "
             "(evaluated in float64 on the same scores) within the dtype's tolerance; "
             "float16 / bfloat16 too when --dtypes asks", cases=R.reference_cases,
             check=R.check_matches_reference, explicit=R.reference_battery,
             applies=R.needs_reference, examples_scale=0.4, dtypes=_reference_units),
    Property(id="gradient", statement="with grad enabled the weights are those without; "
             "reverse mode (and forward mode where it exists) matches central differences "
             "along random directions (taken in float64), per float32 / float64 unit; kinks are "
             "stepped over; every entry is finite and exactly 0 at masked keys (the cotangent "
             "is not zero there)", cases=G.gradient_cases, check=G.check_gradient,
             explicit=G.gradient_battery, universal=True, examples_scale=0.3),
    Property(id="double_backward", statement="the gradient is differentiable (grad of grad) and "
             "its derivative matches central differences of the gradient (taken in float64), "
             "per float32 / float64 unit; both finite and exactly 0 at masked keys",
             cases=G.gradient_cases, check=G.check_double_backward,
             explicit=G.gradient_battery, examples_scale=0.2),
    # ---- paper A
    Property(id="lemma1_weight_bounds", statement="C1/L ≤ α_i ≤ C2/L for logits in [−a, a], "
             "C2 = max F / min F (Lemma 1)", cases=C.bounded_cases, check=P.check_lemma1,
             applies=_needs_kernel, dtypes=_f64),
    Property(id="cor1_softmax_weight_bounds", statement="(1/L)e^{−2Δ/T} ≤ α_i ≤ (1/L)e^{2Δ/T}, "
             "Δ = ‖q‖·max‖k_j‖ (Corollary 1)", cases=C.query_key_cases, check=P.check_cor1,
             dtypes=_f64),
    Property(id="thm1_fixed_distance", statement="d̃ ≤ (1−ᾱ_N)d_1 + max‖x_j‖·[ᾱ_N(L−N) − "
             "(1−ᾱ_N)] for the top-N set (Theorem 1.1)",
             cases=lambda s, c: C.embedding_cases(s, c), check=P.check_thm1_fixed, dtypes=_f64),
    Property(id="thm1_random_distance", statement="E[d̃] over uniform N-subsets ≥ the Jensen "
             "main term, i.e. ε ≥ 0 (Theorem 1.2, exact enumeration, L ≤ 10)",
             cases=lambda s, c: C.embedding_cases(s, c, max_length=C.RANDOM_TOPN_MAX_LENGTH),
             check=P.check_thm1_random, examples_scale=0.5, dtypes=_f64),
    Property(id="thm2_separation_lower", statement="N_s/N ≥ 1 − (1/(rN))Σξ_i on the sphere "
             "(Theorem 2, lower)", cases=lambda s, c: C.embedding_cases(s, c, sphere=True),
             check=P.check_thm2_lower, dtypes=_f64),
    Property(id="thm2_separation_upper", statement="N_s/N ≤ (1/N)Σ exp(−(r − ξ_i)²/(16M²)) per "
             "instance (Theorem 2, upper; false as stated)",
             cases=lambda s, c: C.embedding_cases(s, c, sphere=True),
             check=P.check_thm2_upper, dtypes=_f64),
    _jac("lemma2_jacobian", "‖J‖₂ ≤ (max|F'|/(L·min F))·(1 + max F/min F) (Lemma 2, derived)",
         P.check_lemma2, applies=lambda s, c: _needs_kernel(s, c) or _needs_temperature(s, c)),
    _jac("cor3_entrywise", "max_ij |∂α_i/∂l_j| ≤ 1/(4T) (Corollary 3, entry-wise)",
         P.check_cor3_entrywise),
    _jac("cor3_spectral_paper", "‖J‖₂ ≤ min{1/(4T), √2} (Corollary 3 as stated; false)",
         P.check_cor3_paper),
    _jac("jacobian_spectral_half", "‖J‖₂ ≤ 1/(2T) (corrected Corollary 3, tight at a two-way "
         "tie)", P.check_spectral_half),
    _jac("fd_gradient", "finite-difference δ = ‖f((l+εv)/T) − f(l/T)‖/ε ≤ min{1/(2T), √2/ε} "
         "(Algorithm 5)", P.check_fd_gradient),
    # ---- paper B
    _rows("gpam_range", "every weight lies in [−λ, 1+λ] (daGPAM)", P.check_gpam_range,
          applies=_needs_lam),
    _jac("lemma3_l1_uniform", "Σ_jk |J_jk| ≤ 2(1 − 1/L)/T, largest at the uniform row "
         "(Lemma 3, ℓ1)", P.check_lemma3_l1),
    _jac("lemma3_frobenius_uniform", "‖J‖_F ≤ ‖J(uniform)‖_F (Lemma 3 read with the Frobenius "
         "norm; false for L ≥ 3)", P.check_lemma3_frobenius),
]

PROPERTIES: dict[str, Property] = {p.id: p for p in _ALL}


def properties_for(claims, ctx: Context) -> list[Property]:
    """Universal properties first, then the claims, in registry order."""
    chosen = set(claims)
    out = [p for p in PROPERTIES.values() if p.universal or p.id in chosen]
    if not ctx.low_dtypes:  # half precision is checked only when asked for
        out = [p for p in out if p.id != "dtype_agreement"]
    # last: it reports every side effect the worker saw during the properties before it
    return [p for p in out if p.id not in LAST] + [p for p in out if p.id in LAST]


#: Properties run after every other one of a target.
LAST = ("no_side_effects",)
