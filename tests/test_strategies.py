"""Tests of attnverify's own Hypothesis strategies (the attnverify/strategies/ package).

Kept apart from the property suite adopters run: each kind is reachable and satisfies its
definition, shrinking reaches the minimal case, generated inputs satisfy the theorems'
hypotheses, bad arguments are rejected when the strategy is built, and records rebuild exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import attnverify.strategies
from attnverify import strategies as avs
from attnverify.tolerances import tol_for

# Derandomized: ``find`` takes its own settings, and a search that finds its example on one run
# must find it on every run (tests/conftest.py derandomizes everything else).
FIND = settings(database=None, max_examples=1000, deadline=None, derandomize=True)
FEW = settings(max_examples=12, deadline=None, database=None, derandomize=True)
SOME = settings(max_examples=30, deadline=None, database=None, derandomize=True)
FP32_EXP_OVERFLOW = math.log(torch.finfo(torch.float32).max)


def _rows_with(predicate, **options):
    """The minimal example of ``logit_rows(**options)`` satisfying ``predicate``."""
    return find(avs.logit_rows(**options), predicate, settings=FIND)


# --------------------------------------------------------------------------- kind definitions


def _per_row(scores, fn):
    return all(fn(row) for row in scores)


def _is_gaussian(r):
    return bool(torch.isfinite(r.scores).all())


def _is_uniform_bounded(r):
    return bool((r.scores.double().abs() <= r.scale).all())


def _has_exact_tie(r):
    return _per_row(r.scores, lambda row: row.unique().numel() < row.numel())


def _is_two_way_tie(r):
    def ok(row):
        top = row.double().sort(descending=True).values
        rest_below = row.numel() == 2 or top[2] <= top[0] - avs.TIE_GAP / 2
        return bool(top[0] == top[1]) and bool(rest_below)

    return _per_row(r.scores, ok)


def _is_near_tie(r):
    def ok(row):
        levels = row.unique()  # sorted
        up = torch.nextafter(levels[:-1], torch.full_like(levels[:-1], math.inf))
        return levels.numel() >= 2 and torch.equal(up, levels[1:])

    return _per_row(r.scores, ok)


def _overflows_fp32_exp(r):
    wide = r.scores.double()
    every_row = bool((wide.amax(dim=1) > FP32_EXP_OVERFLOW).all())
    overflow = bool(torch.isinf(torch.exp(r.scores.float())).any())
    return bool(torch.isfinite(wide).all()) and every_row and overflow


def _is_masked(r):
    finite, masked = torch.isfinite(r.scores), r.scores == -math.inf
    return bool((finite | masked).all() and finite.any(1).all() and masked.any(1).all())


def _has_fully_masked_row(r):
    return bool((r.scores == -math.inf).all(dim=1).any())


def _is_single(r):
    return r.length == 1 and r.scores.shape[-1] == 1


def _has_mixed_scales(r):
    peaks = r.scores.double().abs().amax(dim=1)
    return r.batch >= 2 and bool(peaks.max() >= 1e3 * peaks.min())


def _is_one_hot_like(r):
    def ok(row):
        top = row.double().topk(2).values
        return bool(top[0] - top[1] >= avs.PEAK_MARGIN / 2)

    return _per_row(r.scores, ok)


KIND_CHECKS = {
    "gaussian": _is_gaussian,
    "uniform_bounded": _is_uniform_bounded,
    "exact_ties": _has_exact_tie,
    "two_way_tie": _is_two_way_tie,
    "near_ties": _is_near_tie,
    "huge_range": _overflows_fp32_exp,
    "masked": _is_masked,
    "fully_masked": _has_fully_masked_row,
    "single": _is_single,
    "mixed_scale": _has_mixed_scales,
    "one_hot_like": _is_one_hot_like,
}


def test_every_kind_has_a_check():
    assert set(KIND_CHECKS) == set(avs.ALL_KINDS)


@pytest.mark.parametrize("kind", avs.ALL_KINDS)
def test_kind_satisfies_its_definition(kind):
    @FEW
    @given(avs.logit_rows(kinds=(kind,), max_length=256, dtypes=avs.FLOAT_DTYPES))
    def check(r):
        assert r.scores.shape == (r.batch, r.length), f"shape {tuple(r.scores.shape)} [{kind}]"
        assert r.scores.dtype == r.dtype and r.scores.device.type == "cpu"
        assert not torch.isnan(r.scores).any() and not (r.scores == math.inf).any()
        assert KIND_CHECKS[kind](r), f"{kind} row breaks its definition: {avs.repro(r)}"

    check()


@pytest.mark.parametrize("kind", avs.ALL_KINDS)
def test_kind_is_reachable_and_shrinks_to_its_minimal_case(kind):
    r = _rows_with(lambda r: r.kind == kind)
    needs_two = ("exact_ties", "two_way_tie", "near_ties", "masked", "one_hot_like")
    assert r.length == (2 if kind in needs_two else 1), avs.repro(r)
    assert (r.seed, r.dtype) == (0, torch.float32), avs.repro(r)
    assert r.batch == (2 if kind == "mixed_scale" else 1), avs.repro(r)
    assert r.scale == (avs.HUGE_MAGNITUDES[0] if kind == "huge_range" else 1.0), avs.repro(r)


# --------------------------------------------------------------------------- shrinking, reach


def test_length_predicate_shrinks_to_exact_length_and_simplest_kind():
    r = _rows_with(lambda r: r.scores.shape[-1] >= 3)
    assert (r.length, r.kind, r.batch, r.seed, r.scale) == (3, "gaussian", 1, 0, 1.0)
    assert r.dtype == torch.float32


def test_a_row_with_minus_inf_shrinks_to_the_first_masked_kind():
    r = _rows_with(lambda r: bool(torch.isinf(r.scores).any()))
    assert (r.kind, r.length, r.batch, r.seed) == ("masked", 2, 1, 0)


def test_profile_lengths_are_reachable():
    from attnverify.certify import PROFILES

    top = PROFILES["thorough"]["max_length"]
    assert find(avs.lengths(max_length=top), lambda n: n == top, settings=FIND) == top
    r = _rows_with(lambda r: r.length > 5000, max_length=top, kinds=("gaussian",))
    assert r.length == 5001 and r.scores.shape == (1, 5001)
    assert find(avs.lengths(max_length=top), lambda n: n > top // 2, settings=FIND) == top // 2 + 1


@pytest.mark.parametrize(
    ("kind", "predicate"),
    [
        ("exact_ties", lambda r: r.length >= 3 and r.scores[0].unique().numel() == 1),
        ("near_ties", lambda r: r.scores[0].unique().numel() == 4),
        ("huge_range", lambda r: r.dtype == torch.float32 and r.scores.abs().max() >= 1e30),
        ("huge_range", lambda r: r.dtype == torch.float16),
        ("fully_masked", lambda r: bool(torch.isfinite(r.scores).all(dim=1).any())),
        ("masked", lambda r: r.batch >= 2 and r.length >= 8),
        ("gaussian", lambda r: r.dtype == torch.bfloat16),
    ],
)
def test_edge_cases_are_reachable(kind, predicate):
    r = _rows_with(predicate, kinds=(kind,), dtypes=avs.FLOAT_DTYPES, max_length=256)
    assert KIND_CHECKS[kind](r)


def test_builder_defaults_give_each_kind_its_natural_magnitude():
    r = avs.build_rows("huge_range", length=4, dtype=torch.float32)
    assert r.scale == avs.HUGE_MAGNITUDES[0] and _overflows_fp32_exp(r)
    assert avs.build_rows("gaussian", length=4).scale == 1.0


def test_huge_range_fits_half_precision():
    r = _rows_with(lambda r: True, kinds=("huge_range",), dtypes=(torch.float16,))
    assert torch.isfinite(r.scores).all() and r.scale <= torch.finfo(torch.float16).max


def test_sphere_embeddings_shrink_to_the_minimal_case():
    e = find(avs.sphere_embeddings(), lambda e: True, settings=FIND)
    assert (e.length, e.d, e.M, e.n_top, e.seed) == (2, 1, 1.0, 1, 0)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [(avs.temperatures(), 1.0), (avs.scales(), 1.0), (avs.lengths(min_length=5), 5)],
)
def test_scalar_strategies_shrink_to_their_simplest_value(strategy, expected):
    assert find(strategy, lambda v: True, settings=FIND) == expected


def test_temperatures_reach_both_ends_and_stay_in_range():
    assert find(avs.temperatures(), lambda t: t < 0.01, settings=FIND) >= 1e-3
    assert find(avs.temperatures(), lambda t: t > 5.0, settings=FIND) <= 10.0
    low = find(avs.temperatures(min_value=2.0, max_value=3.0), lambda t: True, settings=FIND)
    assert 2.0 <= low <= 3.0


# --------------------------------------------------------------------------- hypotheses


@SOME
@given(avs.bounded_rows(dtypes=avs.FLOAT_DTYPES, max_length=256))
def test_bounded_rows_lie_in_minus_a_a(r):
    assert r.scores.shape == (r.batch, r.length)
    peak = r.scores.double().abs().max().item()
    assert peak <= r.a, f"max |logit| = {peak!r} > a = {r.a!r}: {avs.repro(r)}"


@pytest.mark.parametrize("dtype", avs.FLOAT_DTYPES)
def test_bounded_peak_reaches_a_when_a_is_not_representable(dtype):
    r = avs.build_bounded_rows("peak", a=0.1, length=5, batch=2, dtype=dtype)
    top = r.scores.max()
    assert float(top) <= 0.1 < float(torch.nextafter(top, torch.tensor(math.inf, dtype=dtype)))
    assert (r.scores == -top).sum() == 2 * 4


@SOME
@given(avs.logit_rows(max_abs=5.0, dtypes=avs.FLOAT_DTYPES))
def test_max_abs_caps_every_finite_score(r):
    finite = r.scores[torch.isfinite(r.scores)].double()
    assert r.kind != "huge_range" and (finite.abs() <= 5.0).all(), avs.repro(r)


@SOME
@given(avs.logit_rows(allow_mask=False))
def test_allow_mask_false_never_masks(r):
    assert torch.isfinite(r.scores).all(), avs.repro(r)


@SOME
@given(avs.query_key_sets(dtypes=avs.FLOAT_DTYPES))
def test_query_key_logits_lie_in_minus_delta_delta(qk):
    tol = tol_for(qk.dtype)
    q, K, logits = qk.q.double(), qk.K.double(), qk.logits.double()
    assert (logits.abs() <= qk.delta[:, None]).all(), avs.repro(qk)
    bound = q.norm(dim=-1) * K.norm(dim=-1).amax(dim=-1)
    assert torch.allclose(qk.delta, bound, rtol=tol.rtol, atol=0.0), avs.repro(qk)
    exact = torch.einsum("bld,bd->bl", K, q)
    assert torch.allclose(logits, exact, rtol=tol.rtol, atol=tol.atol), avs.repro(qk)


def test_aligned_keys_make_every_logit_reach_delta():
    qk = avs.build_query_keys("aligned", length=6, d=5, batch=3, seed=2)
    assert torch.allclose(qk.logits.abs(), qk.delta[:, None].expand(-1, 6), rtol=1e-12)


def _brute_force_min_distance(x):
    wide = x.double()
    dist = (wide[:, None, :] - wide[None, :, :]).norm(dim=-1)
    return float(dist.fill_diagonal_(math.inf).min())


@SOME
@given(avs.sphere_embeddings(dtypes=avs.FLOAT_DTYPES))
def test_sphere_embeddings_satisfy_theorem_2_hypotheses(e):
    norms = e.x.double().norm(dim=-1)
    assert torch.allclose(norms, torch.full_like(norms, e.M), rtol=tol_for(e.dtype).rtol, atol=0)
    assert e.delta > 0 and 1 <= e.n_top < e.length
    assert math.isclose(e.delta, _brute_force_min_distance(e.x), rel_tol=1e-12), avs.repro(e)


def test_long_half_precision_sphere_is_still_distinct():
    e = avs.build_sphere_embeddings(length=600, d=2, radius=2.0, dtype=torch.bfloat16)
    assert e.delta > 0 and e.x.unique(dim=0).shape[0] == 600


@SOME
@given(avs.embedding_sets(dtypes=avs.FLOAT_DTYPES))
def test_embedding_sets_have_a_top_set_size_below_length(e):
    assert e.x.shape == (e.length, e.d) and e.x.dtype == e.dtype
    assert 1 <= e.n_top <= e.length - 1 and torch.isfinite(e.x).all()
    if e.kind == "duplicates":
        assert e.x.unique(dim=0).shape[0] < e.length


# --------------------------------------------------------------------------- bad arguments

BAD_ARGUMENTS = [
    (avs.logit_rows, {"min_length": 3, "max_length": 2}, "min_length=3 is larger than max_len"),
    (avs.logit_rows, {"min_length": 0}, "min_length=0"),
    (avs.logit_rows, {"max_length": 2.5}, "max_length=2.5"),
    (avs.logit_rows, {"batch": 0}, "batch=0"),
    (avs.logit_rows, {"dtypes": (torch.int32,)}, "dtypes contains torch.int32"),
    (avs.logit_rows, {"dtypes": ()}, "dtypes=()"),
    (avs.logit_rows, {"kinds": ("nope",)}, "kinds contains 'nope'"),
    (avs.logit_rows, {"kinds": "gaussian"}, "kinds='gaussian'"),
    (avs.logit_rows, {"kinds": ("single",), "min_length": 2}, "min_length=2"),
    (avs.logit_rows, {"kinds": ("two_way_tie",), "max_length": 1}, "max_length=1"),
    (avs.logit_rows, {"kinds": ("masked",), "allow_mask": False}, "allow_mask=False"),
    (avs.logit_rows, {"kinds": ("huge_range",), "max_abs": 10.0}, "max_abs=10.0"),
    (avs.logit_rows, {"kinds": ("mixed_scale",), "batch": 1}, "batch=1"),
    (avs.logit_rows, {"scale": -1.0}, "scale=-1.0"),
    (avs.logit_rows, {"scale": math.nan}, "scale=nan"),
    (avs.logit_rows, {"max_abs": 0}, "max_abs=0"),
    (avs.logit_rows, {"device": "no-such-device"}, "device='no-such-device'"),
    (avs.bounded_rows, {"a": 0.0}, "a=0.0"),
    (avs.bounded_rows, {"kinds": ("gaussian",)}, "kinds contains 'gaussian'"),
    (avs.query_key_sets, {"d": 0}, "d=0"),
    (avs.sphere_embeddings, {"min_length": 1}, "min_length=1"),
    (avs.sphere_embeddings, {"d": 1, "min_length": 3}, "d=1"),
    (avs.sphere_embeddings, {"radius": -2.0}, "radius=-2.0"),
    (avs.embedding_sets, {"min_length": 1}, "min_length=1"),
    (avs.temperatures, {"min_value": 0.0}, "min_value=0.0"),
    (avs.temperatures, {"min_value": 2.0, "max_value": 1.0}, "min_value=2.0 is larger than"),
    (avs.lengths, {"min_length": 5, "max_length": 4}, "min_length=5 is larger than max_length=4"),
    (avs.dtypes, {"allowed": (torch.int64,)}, "allowed contains torch.int64"),
    (avs.build_rows, {"kind": "single", "length": 2}, "kind='single'"),
    (avs.build_sphere_embeddings, {"length": 3, "d": 1}, "d=1"),
    (avs.build_embedding_set, {"kind": "gaussian", "length": 4, "d": 2, "n_top": 4}, "n_top=4"),
]


@pytest.mark.parametrize(("factory", "kwargs", "message"), BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_when_built(factory, kwargs, message):
    kwargs = dict(kwargs)
    kind = kwargs.pop("kind", None)
    args = () if kind is None else (kind,)
    with pytest.raises(InvalidArgument) as info:
        factory(*args, **kwargs)
    assert message in str(info.value)


def test_cuda_is_rejected_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(InvalidArgument, match="device='cuda'"):
        avs.logit_rows(device="cuda")


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        (avs.logit_rows(batch=st.just(0)), "batch=0"),
        (avs.logit_rows(kinds=st.just("nope")), "kinds drew 'nope'"),
        (avs.logit_rows(kinds=st.just("single"), min_length=st.just(2)), "kinds drew 'single'"),
        (avs.logit_rows(dtypes=st.just(torch.int8)), "dtypes drew torch.int8"),
        (avs.bounded_rows(a=st.just(-1.0)), "a=-1.0"),
    ],
)
def test_bad_drawn_options_are_rejected_when_drawn(strategy, message):
    with pytest.raises(InvalidArgument, match=message):
        find(strategy, lambda r: True, settings=FIND)


def test_options_accept_strategies():
    options = {"min_length": st.just(4), "max_length": st.just(4), "batch": st.just(3)}
    r = _rows_with(lambda r: True, scale=st.just(2.0), dtypes=st.just(torch.float64), **options)
    assert (r.length, r.batch, r.scale, r.dtype) == (4, 3, 2.0, torch.float64)


# --------------------------------------------------------------------------- determinism

RECORD_STRATEGIES = [
    avs.logit_rows(dtypes=avs.FLOAT_DTYPES),
    avs.bounded_rows(),
    avs.query_key_sets(),
    avs.sphere_embeddings(),
    avs.embedding_sets(),
]


@pytest.mark.parametrize("strategy", RECORD_STRATEGIES)
def test_repro_rebuilds_the_record_exactly(strategy):
    @FEW
    @given(strategy)
    def check(record):
        line = avs.repro(record)
        rebuilt = eval(line, {"torch": torch, "attnverify": attnverify})
        for name, value in record._asdict().items():
            again = getattr(rebuilt, name)
            same = torch.equal(value, again) if torch.is_tensor(value) else value == again
            assert same, f"{name} differs after {line}"

    check()


def test_same_seed_same_tensor_and_other_seed_other_tensor():
    def build(seed):
        return avs.build_rows("gaussian", length=50, batch=2, seed=seed).scores

    assert torch.equal(build(7), build(7))
    assert not torch.equal(build(7), build(8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tensors_are_built_on_the_requested_device():
    r = avs.build_rows("masked", length=5, batch=2, device=torch.device("cuda"))
    assert r.scores.device.type == "cuda"
    cpu = avs.build_rows("masked", length=5, batch=2)
    assert torch.equal(r.scores.cpu(), cpu.scores), "the device must not change the values"

def test_repro_names_the_device():
    r = avs.build_rows("masked", length=5, batch=2, device=torch.device("cpu"))
    assert r.scores.device == torch.device("cpu")
    assert "device='cpu'" in avs.repro(r)


def test_the_tests_run_derandomized():
    """tests/conftest.py's profile is live, and the settings used here keep it."""
    for conf in (settings.default, FIND, FEW, SOME):
        assert conf.derandomize and conf.database is None, conf


def test_the_suites_own_settings_ignore_the_tests_profile():
    """certify, falsify, claims and the plugin search unseeded by the tests' profile: they use
    their own seed (hypothesis.seed), whatever profile is loaded in the process."""
    from attnverify.runconfig import hypothesis_settings, make_context

    conf = hypothesis_settings(make_context("ci"))
    assert not conf.derandomize and conf.database is None and conf.deadline is None
