"""The built-in targets, each as a :class:`NormalizerSpec`: the twelve normalizers of
docs/NORMALIZERS.md, then ``softmax_fused`` (attnverify's fused CPU softmax kernel, a target
certified against ``softmax``)."""

from __future__ import annotations

import torch

from attnverify.normalizers.dense import (
    dagpam,
    relu_norm,
    sa_softmax,
    sigmoid,
    softmax,
    softmax1,
    softpick,
    ssmax,
    stablemax,
    stablemax_ds,
    stablemax_s,
)
from attnverify.normalizers.fused import softmax_fused
from attnverify.normalizers.reference import REFERENCES
from attnverify.normalizers.sparse import entmax15, entmax_alpha, sparsemax
from attnverify.spec import Kernel, NormalizerSpec

__all__ = [
    "BUILTINS",
    "dagpam",
    "entmax15",
    "entmax_alpha",
    "relu_norm",
    "sa_softmax",
    "sigmoid",
    "softmax",
    "softmax1",
    "softmax_fused",
    "softpick",
    "sparsemax",
    "ssmax",
    "stablemax",
]

#: Paper A claims every simplex normalizer keeps (Theorem 1.1, Theorem 1.2's ε ≥ 0, Thm 2 lower).
SIMPLEX_PAPER = ("thm1_fixed_distance", "thm1_random_distance", "thm2_separation_lower")
SIMPLEX_BASE = ("simplex", "shift_invariant", "order_preserving", "fully_masked_row")

EXP_KERNEL = Kernel(
    F=lambda l, t: torch.exp(l / t),
    dF=lambda l, t: torch.exp(l / t) / t,
    formula="F(l) = exp(l/T)",
)
STABLEMAX_KERNEL = Kernel(
    F=lambda l, t: stablemax_s(l / t),
    dF=lambda l, t: stablemax_ds(l / t) / t,
    formula="F(l) = s(l/T), s(x) = x+1 (x>=0), 1/(1-x) (x<0)",
)

T = {"temperature": 1.0}

SOFTMAX_CLAIMS = (
    SIMPLEX_BASE
    + SIMPLEX_PAPER
    + (
        "lemma1_weight_bounds",
        "cor1_softmax_weight_bounds",
        "lemma2_jacobian",
        "cor3_entrywise",
        "jacobian_spectral_half",
        "fd_gradient",
        "lemma3_l1_uniform",
    )
)

_SPECS = [
    NormalizerSpec(
        id="softmax",
        fn=softmax,
        params=T,
        claims=SOFTMAX_CLAIMS,
        space="simplex",
        kernel=EXP_KERNEL,
        citation="softmax with temperature; Mudarisov et al. 2025, arXiv:2508.17821",
    ),
    NormalizerSpec(
        id="sparsemax",
        fn=sparsemax,
        params=T,
        claims=SIMPLEX_BASE + SIMPLEX_PAPER,
        space="simplex",
        citation="Martins & Astudillo 2016, arXiv:1602.02068",
    ),
    NormalizerSpec(
        id="entmax15",
        fn=entmax15,
        params=T,
        claims=SIMPLEX_BASE + SIMPLEX_PAPER,
        space="simplex",
        citation="Peters, Niculae & Martins 2019, arXiv:1905.05702",
    ),
    NormalizerSpec(
        id="entmax_alpha",
        fn=entmax_alpha,
        params={"alpha": 1.5, "temperature": 1.0},
        claims=SIMPLEX_BASE + SIMPLEX_PAPER,
        space="simplex",
        citation="Peters et al. 2019; bisection: Blondel et al. 2020, arXiv:1901.02324",
    ),
    NormalizerSpec(
        id="ssmax",
        fn=ssmax,
        params={"s": 0.43, "temperature": 1.0},
        claims=SIMPLEX_BASE + SIMPLEX_PAPER + ("length_aware",),
        space="simplex",
        length_aware=True,
        citation="Scalable-Softmax, Nakanishi 2025, arXiv:2501.19399",
    ),
    NormalizerSpec(
        id="sa_softmax",
        fn=sa_softmax,
        params=T,
        claims=("nonnegative", "sub_simplex", "order_preserving", "fully_masked_row"),
        space="nonnegative",
        citation="Self-Adjust Softmax, Zheng et al. 2025, arXiv:2502.18277",
    ),
    NormalizerSpec(
        id="sigmoid",
        fn=sigmoid,
        params={"bias": None, "temperature": 1.0},
        claims=("nonnegative", "order_preserving", "fully_masked_row"),
        space="nonnegative",
        length_aware=True,
        citation="sigmoid attention, Ramapuram et al. 2024, arXiv:2409.04431",
    ),
    NormalizerSpec(
        id="softpick",
        fn=softpick,
        params={"eps": 1e-6, "temperature": 1.0},
        claims=("sub_simplex", "nonnegative", "order_preserving", "fully_masked_row"),
        space="sub_simplex",
        citation="Zuhri et al. 2025, arXiv:2504.20966",
    ),
    NormalizerSpec(
        id="stablemax",
        fn=stablemax,
        params=T,
        claims=("simplex", "order_preserving", "fully_masked_row")
        + SIMPLEX_PAPER
        + ("lemma1_weight_bounds", "lemma2_jacobian"),
        space="simplex",
        kernel=STABLEMAX_KERNEL,
        citation="Prieto et al. 2025, arXiv:2501.04697",
    ),
    NormalizerSpec(
        id="softmax1",
        fn=softmax1,
        params=T,
        claims=("sub_simplex", "nonnegative", "order_preserving", "fully_masked_row"),
        space="sub_simplex",
        citation="softmax1 / quiet attention (Miller 2023); learned attention sinks",
    ),
    NormalizerSpec(
        id="relu_norm",
        fn=relu_norm,
        params=T,
        claims=("sub_simplex", "nonnegative", "order_preserving", "fully_masked_row"),
        space="simplex",
        citation="ReLU normalisation; a row with no positive score returns zeros (policy)",
    ),
    NormalizerSpec(
        id="dagpam",
        fn=dagpam,
        params={"lam": 0.5, "temperature": 1.0},
        claims=(
            "affine_sum",
            "gpam_range",
            "shift_invariant",
            "order_preserving",
            "fully_masked_row",
        ),
        space="affine",
        citation="daGPAM, Heo & Choi, arXiv:2410.15578 (single-row form, docs/THEORY.md §6)",
    ),
    # Not a normalizer of its own: attnverify's fused float32 CPU softmax kernel, a target like
    # a user's fast kernel, certified against the built-in softmax (its reference).
    NormalizerSpec(
        id="softmax_fused",
        fn=softmax_fused,
        params=T,
        claims=SOFTMAX_CLAIMS + ("matches_reference",),
        space="simplex",
        kernel=EXP_KERNEL,
        reference=softmax,
        citation="attnverify's fused float32 CPU softmax (normalizers/_fused.c); "
        "certified against the built-in softmax",
    ),
]

for _spec in _SPECS:
    object.__setattr__(_spec, "description", (_spec.fn.__doc__ or "").strip().splitlines()[0])

#: Built-ins whose gradient is itself smooth (grad of grad is checked against differences).
DOUBLE_BACKWARD = ("softmax", "softmax1", "ssmax", "sigmoid", "dagpam")

# Every built-in is differential-tested against its float64 formula (normalizers/reference.py).
for _spec in _SPECS:
    if _spec.id in REFERENCES:
        _extra = ("matches_reference",) + (("double_backward",) if _spec.id in DOUBLE_BACKWARD
                                           else ())
        object.__setattr__(_spec, "reference", REFERENCES[_spec.id])
        object.__setattr__(_spec, "claims", _spec.claims + _extra)

BUILTINS: dict[str, NormalizerSpec] = {spec.id: spec for spec in _SPECS}
