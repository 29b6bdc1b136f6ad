"""Reach is tested, not assumed (issue #25): the ``ci`` profile at the default seed reaches every
declared extreme of the input space, for normalizers and attention kernels alike.

Cheap: each property runs as certify runs it (:func:`attnverify.certify.run_unit`: the same
units, seeds, battery, Hypothesis settings and example counts), with its check replaced by a
recorder that returns at once, so the cases are those the ci run generates and the coverage is
the one its certificate states, without calling a target. (A recorder has no ratio to steer
Hypothesis's target phase by, which moves only the examples of that phase.)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from attnverify.attention import cases as AC
from attnverify.attention.coverage import SHAPE_TEXT
from attnverify.attention.lift import lift
from attnverify.attention.loader import load_attention
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.certify import make_context, run_unit, unit_contexts
from attnverify.checks import PROPERTIES
from attnverify.checks import universal as U
from attnverify.checks.cases import RowCase
from attnverify.coverage import expand, merge, note_shifts
from attnverify.registry import load_target
from attnverify.strategies import domain as D
from attnverify.strategies.layouts import KINDS

CTX = make_context("ci", seed=0)


def _record(spec, case, ctx) -> float:
    return 0.0


def _record_shift(spec, case, ctx) -> float:
    note_shifts(U.shift_of(case))  # what check_shift_invariant adds to the case's rows
    return 0.0


def _coverage(spec, props) -> dict:
    blocks = []
    for prop in props:
        if prop.applies(spec, CTX):
            continue
        fake = dataclasses.replace(
            prop, check=_record_shift if prop.id == "shift_invariant" else _record)
        for _, uctx in unit_contexts(prop, spec, CTX):
            result = run_unit(fake, spec, uctx)
            assert result.status == "holds", (prop.id, result.message)
            if result.coverage:
                blocks.append(result.coverage)
    return merge(blocks)


@functools.cache
def normalizer_coverage() -> dict:
    """What certify's ci run gives softmax (every universal property and claim on rows)."""
    spec = load_target("softmax")
    rows = [p for p in PROPERTIES.values()
            if (p.universal or p.id in spec.claims) and p.id != "no_side_effects"
            and _row_property(p, spec)]
    return _coverage(spec, rows)


def _row_property(prop, spec) -> bool:
    """Its cases are rows of scores (the paper properties' are embeddings, margins, …)."""
    explicit = prop.explicit(spec, CTX)
    return bool(explicit) and isinstance(explicit[0], RowCase)


@functools.cache
def attention_coverage() -> dict:
    """What certify's ci run gives sdpa (its attention properties)."""
    return _coverage(lift(load_attention("sdpa")), list(ATTENTION_PROPERTIES.values()))


def _missing(decades: dict, dtype: str, wanted) -> dict:
    seen = (decades or {}).get(dtype) or {}
    return {sign: sorted(set(wanted) - expand(seen.get(sign))) for sign in ("+", "-")
            if set(wanted) - expand(seen.get(sign))}


def test_every_layout_kind_rank_and_axis_is_reached():
    c = normalizer_coverage()
    assert c["layouts"] == list(KINDS), c["layouts"]
    assert c["ranks"] == [1, 2, 3, 4] and min(c["axes"]) == -4 and max(c["axes"]) == 3
    assert c["masked_keys"] > 0 and c["fully_masked_rows"] > 0


def test_every_magnitude_decade_in_both_signs_is_reached_per_dtype():
    c = normalizer_coverage()
    for dtype in (torch.float32, torch.float64):
        name = str(dtype).removeprefix("torch.")
        # every decade from 1 to the dtype's limit, in both signs, and the small magnitudes
        missing = _missing(c["decades"], name, range(0, math.floor(math.log10(
            D.limit(dtype))) + 1))
        assert not missing, f"{name}: decades never reached: {missing}"
        small = range(math.ceil(math.log10(D.SMALLEST)), 0)
        seen = expand(c["decades"][name]["+"]) | expand(c["decades"][name]["-"])
        assert set(small) <= seen, f"{name}: small magnitudes missing {set(small) - seen}"


def test_rows_far_below_zero_and_at_both_ends_of_the_range_are_reached():
    c = normalizer_coverage()
    assert c["far_below"] >= 10, c["far_below"]
    low, high = c["values"]
    assert low <= -D.limit(torch.float64) and high >= D.limit(torch.float64), c["values"]


def test_every_shift_decade_is_reached():
    c = normalizer_coverage()
    top = math.floor(math.log10(D.limit(torch.float64)))
    missing = sorted(set(range(-3, top + 1)) - set(c["shift_decades"] or []))
    assert not missing, f"shift decades never reached: {missing}"


def test_temperatures_well_outside_the_usual_range_are_reached():
    lo, hi = normalizer_coverage()["temperature"]
    assert lo <= 1e-5 and hi >= 1e5, (lo, hi)


def test_attention_reaches_every_mask_shape_view_gqa_group_and_dimension():
    c = attention_coverage()
    a = c["attention"]
    words = set(a["masks"])
    for shape in AC.MASK_SHAPES:
        assert any(w for w in words if _shape_of(w) == shape), (shape, sorted(words))
    for view in ("expanded", "sliced"):
        assert any(w.endswith(view) for w in words), (view, sorted(words))
    assert {"bool", "additive"} <= {w.split(" ", 1)[0] for w in words}
    assert {"is_causal", "none"} <= words
    assert set(a["groups"]) >= {1, 2, 3, 4, 8, 16}, a["groups"]
    assert a["unequal_lengths"] > 0 and a["unequal_dims"] > 0
    assert a["fully_masked"], "no mask left a query without a key"
    assert set(a["qkv_layouts"]) == set(AC.LAYOUTS)


def test_attention_reaches_float_masks_of_large_constant_offsets():
    lo, hi = attention_coverage()["mask_bias"]
    assert lo <= -1e9 and hi >= 1e6, (lo, hi)


def _shape_of(words: str) -> str | None:
    for name, text in SHAPE_TEXT.items():
        if text in words:
            return name
    return None


def _far_and_every_decade(c, prop, dtypes):
    """Rows far below zero, and every decade of each dtype up to its largest finite value."""
    assert c["far_below"] >= 1, (prop, c["far_below"])
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        missing = _missing(c["decades"], name, range(0, math.floor(math.log10(
            D.limit(dtype))) + 1))
        assert not missing, f"{prop}, {name}: decades never reached: {missing}"


def test_the_derivative_properties_reach_the_whole_value_domain():
    """``gradient`` and ``double_backward`` on their own (they once kept the narrow ranges): rows
    far below zero, every decade in both signs per dtype, the widest temperatures."""
    spec = load_target("softmax")
    for prop in ("gradient", "double_backward"):
        c = _coverage(spec, [PROPERTIES[prop]])
        _far_and_every_decade(c, prop, (torch.float32, torch.float64))
        lo, hi = c["temperature"]
        assert lo <= 1e-5 and hi >= 1e5, (prop, lo, hi)


def test_the_half_precision_agreements_reach_the_whole_value_domain():
    """``dtype_agreement`` and ``matches_reference`` in float16 / bfloat16 (they once kept the
    narrow ranges): rows far below zero and every decade of each half type, both signs."""
    ctx = make_context("ci", seed=0, dtypes="float16,bfloat16")
    spec = load_target("softmax")
    for prop in ("dtype_agreement", "matches_reference"):
        blocks = []
        for _, uctx in unit_contexts(PROPERTIES[prop], spec, ctx):
            result = run_unit(dataclasses.replace(PROPERTIES[prop], check=_record), spec, uctx)
            blocks.append(result.coverage)
        c = merge(blocks)
        _far_and_every_decade(c, prop, (torch.float16, torch.bfloat16))
