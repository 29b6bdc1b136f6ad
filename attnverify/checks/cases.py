"""Cases the properties run on: Hypothesis strategies built from :mod:`attnverify.strategies`,
plus a fixed battery of explicit adversarial cases that every run checks first (so a planted
defect is found under the ci profile whatever the random draws do).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from hypothesis import strategies as st

from attnverify import strategies as S
from attnverify.checks.base import Context
from attnverify.registry import NormalizerSpec

F64 = torch.float64


class RowCase(NamedTuple):
    scores: torch.Tensor  # [batch, L]
    temperature: float | None
    kind: str
    seed: int


class BoundedCase(NamedTuple):
    scores: torch.Tensor  # [batch, L], every logit in [−a, a]
    temperature: float | None
    a: float
    kind: str
    seed: int


class QueryKeyCase(NamedTuple):
    scores: torch.Tensor  # [batch, L] = K q
    temperature: float | None
    delta: torch.Tensor  # [batch]
    kind: str
    seed: int


class EmbeddingCase(NamedTuple):
    scores: torch.Tensor  # [1, L]
    x: torch.Tensor  # [L, d]
    n_top: int
    temperature: float | None
    radius: float
    delta: float
    kind: str
    seed: int


class JacobianCase(NamedTuple):
    scores: torch.Tensor  # [batch, L], float64
    temperature: float | None
    eps: float
    kind: str
    seed: int


class PeakCase(NamedTuple):
    a: float
    temperature: float | None
    seed: int


#: Every case type, by name (how a repro names the case it rebuilds).
CASE_TYPES: dict[str, type] = {}


def _temperature(spec: NormalizerSpec, ctx: Context | None = None, *, low: float = 1e-3):
    """The cases' temperature: ``None`` without one; the fixed ``ctx.temperature`` (``--params
    temperature=…``) when set; else drawn from [``low``, 10]."""
    if not spec.takes_temperature:
        return st.none()
    if ctx is not None and ctx.temperature is not None:
        return st.just(ctx.temperature)
    return S.temperatures(min_value=low, max_value=10.0)


def battery_temperature(spec: NormalizerSpec, ctx: Context, default: float = 1.0):
    """The temperature of an explicit case: ``None`` without one, the fixed one, or ``default``."""
    if not spec.takes_temperature:
        return None
    return default if ctx.temperature is None else ctx.temperature


# --------------------------------------------------------------------------------------------
# Rows


def _kinds(spec, kinds, allow_mask) -> tuple[str, ...]:
    """Adversarial kinds for a spec: fully masked rows only for normalizers that claim to handle
    them (``fully_masked_row``), masked keys only where ``allow_mask``."""
    kinds = tuple(kinds or S.ALL_KINDS)
    if not allow_mask:
        kinds = tuple(k for k in kinds if k not in S.MASK_KINDS)
    if "fully_masked_row" not in spec.claims:
        kinds = tuple(k for k in kinds if k != "fully_masked")
    return kinds


def row_cases(spec, ctx: Context, *, kinds=None, allow_mask=True, dtypes=None, max_length=None,
              min_batch=1):
    kinds = _kinds(spec, kinds, allow_mask)
    return st.builds(
        _row_case,
        S.logit_rows(
            min_length=1,
            max_length=max_length or ctx.max_length,
            batch=st.integers(min_batch, 4),
            dtypes=dtypes or ctx.full_dtypes,
            kinds=kinds,
            allow_mask=allow_mask,
            device=ctx.device,
        ),
        _temperature(spec, ctx),
    )


def _row_case(rows, temperature) -> RowCase:
    return RowCase(rows.scores, temperature, rows.kind, rows.seed)


def row_battery(spec, ctx: Context, *, kinds=None, allow_mask=True, dtypes=None,
                min_batch=1, long=True) -> list[RowCase]:
    """One explicit case per adversarial kind and dtype, a low-temperature one and a long row."""
    kinds = _kinds(spec, kinds, allow_mask)
    dtypes = tuple(dtypes or ctx.full_dtypes)
    out = []
    for dtype in dtypes:
        for kind in kinds:
            length = 1 if kind == "single" else 9
            rows = S.build_rows(kind, length=length, batch=max(3, min_batch), dtype=dtype,
                                seed=7, device=ctx.device)
            out.append(RowCase(rows.scores, battery_temperature(spec, ctx), kind, 7))
    if spec.takes_temperature and ctx.temperature is None:
        rows = S.build_rows("gaussian", length=12, batch=2, dtype=dtypes[0], scale=3.0, seed=11,
                            device=ctx.device)
        out.append(RowCase(rows.scores, 1e-3, "gaussian", 11))
    if long:
        length = min(ctx.max_length, 4096)
        rows = S.build_rows("gaussian", length=length, batch=max(2, min_batch), dtype=dtypes[0],
                            seed=13, device=ctx.device)
        out.append(RowCase(rows.scores, battery_temperature(spec, ctx), "gaussian", 13))
    return out


# --------------------------------------------------------------------------------------------
# Lemma 1 / Corollary 1 / length awareness


def bounded_cases(spec, ctx: Context):
    return st.builds(
        lambda rows, t: BoundedCase(rows.scores, t, rows.a, rows.kind, rows.seed),
        S.bounded_rows(max_length=min(ctx.max_length, 4096), dtypes=(F64,), device=ctx.device),
        _temperature(spec, ctx, low=0.05),
    )


def query_key_cases(spec, ctx: Context):
    return st.builds(
        lambda qk, t: QueryKeyCase(qk.logits, t, qk.delta, qk.kind, qk.seed),
        S.query_key_sets(max_length=min(ctx.max_length, 4096), dtypes=(F64,), device=ctx.device),
        _temperature(spec, ctx, low=0.05),
    )


def peak_cases(spec, ctx: Context):
    """Margins a ∈ [0.5, 4] at the normalizer's own parameters (temperature not varied, unless
    fixed)."""
    t = st.just(ctx.temperature) if ctx.temperature is not None and spec.takes_temperature \
        else st.none()
    return st.builds(PeakCase, st.floats(0.5, 4.0), t, st.integers(0, 2**16))


# --------------------------------------------------------------------------------------------
# Theorems 1 and 2: embeddings plus a logit row of the same length


EMBEDDING_MAX_LENGTH = 256
RANDOM_TOPN_MAX_LENGTH = 10


@st.composite
def embedding_cases(draw, spec, ctx: Context, *, sphere=False, max_length=EMBEDDING_MAX_LENGTH):
    if sphere:
        emb = draw(S.sphere_embeddings(max_length=max_length, dtypes=(F64,), device=ctx.device))
        x, radius, delta, kind = emb.x, float(emb.M), float(emb.delta), "sphere"
    else:
        emb = draw(S.embedding_sets(max_length=max_length, dtypes=(F64,), device=ctx.device))
        x, radius, delta, kind = emb.x, 0.0, 0.0, emb.kind
    length = x.shape[-2]
    rows = draw(S.logit_rows(min_length=length, max_length=length, batch=1, dtypes=(F64,),
                             allow_mask=False, device=ctx.device,
                             kinds=("gaussian", "uniform_bounded", "exact_ties", "two_way_tie",
                                    "near_ties", "one_hot_like")))
    t = draw(_temperature(spec, ctx, low=0.05))
    return EmbeddingCase(rows.scores, x, emb.n_top, t, radius, delta, f"{kind}/{rows.kind}",
                         rows.seed)


# --------------------------------------------------------------------------------------------
# Jacobians


JACOBIAN_MAX_LENGTH = 256
JACOBIAN_KINDS = ("gaussian", "two_way_tie", "exact_ties", "near_ties", "one_hot_like",
                  "uniform_bounded")
FD_EPSILONS = (1e-3, 1e-1, 10.0)


def jacobian_cases(spec, ctx: Context, *, max_length=JACOBIAN_MAX_LENGTH):
    return st.builds(
        lambda rows, t, eps: JacobianCase(rows.scores, t, eps, rows.kind, rows.seed),
        S.logit_rows(min_length=1, max_length=min(ctx.max_length, max_length), batch=1,
                     dtypes=(F64,), kinds=JACOBIAN_KINDS, allow_mask=False, device=ctx.device),
        _temperature(spec, ctx, low=0.01),
        st.sampled_from(FD_EPSILONS),
    )


def jacobian_battery(spec, ctx: Context) -> list[JacobianCase]:
    """The two-way tie (Corollary 3's witness), the uniform row and a Gaussian row."""
    t = battery_temperature(spec, ctx)
    out = []
    for kind, length in (("two_way_tie", 2), ("two_way_tie", 6), ("exact_ties", 5),
                         ("gaussian", 16)):
        rows = S.build_rows(kind, length=length, batch=1, dtype=F64, seed=3, device=ctx.device)
        for eps in (FD_EPSILONS[0], FD_EPSILONS[-1]):
            out.append(JacobianCase(rows.scores, t, eps, kind, 3))
    return out


CASE_TYPES.update({cls.__name__: cls for cls in (RowCase, BoundedCase, QueryKeyCase,
                                                  EmbeddingCase, JacobianCase, PeakCase)})
