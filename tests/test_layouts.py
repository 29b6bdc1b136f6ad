"""Certify on the inputs attention gives a normalizer (issue #17): every rank, axis, memory layout
and row count; kernels with the defects fast kernels have there are caught with a minimal
counterexample whose repro reproduces; correct ones, with declared restrictions or without, are
certified; the certificate says what it covered.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from attnverify import cli, normalizer_spec, serialize
from attnverify.certify import certify_target, make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.checks import cases as C
from attnverify.checks.cases import CASE_TYPES, RowCase
from attnverify.checks.layout import space_of
from attnverify.checks.shrink import simpler_layouts
from attnverify.errors import TargetError, UsageError
from attnverify.registry import load_target
from attnverify.report import terminal_table
from attnverify.strategies.layouts import (
    GAP_BASE,
    KINDS,
    ROW_TAILS,
    Layout,
    build_layout,
    collect,
    layout_space,
    plain,
    present,
    row_layouts,
)

FILE = str(Path(__file__).parent / "fixtures" / "planted_layout.py")
CTX = make_context("ci", seed=0)
#: Derandomized (``find`` takes its own settings): the same example on every run.
FIND = settings(database=None, max_examples=2000, deadline=None, derandomize=True)


def target(attr: str):
    return load_target(f"{FILE}:{attr}")


def failing(attr: str, prop: str) -> dict:
    r = run_property(PROPERTIES[prop], target(attr).with_claims(("simplex",)), CTX)
    assert r.status in ("violated", "error"), (attr, prop, r.status, r.message)
    return r.to_json()


def repro_exit(capsys, line: str) -> tuple[int, str]:
    argv = shlex.split(line)
    assert argv[:2] == ["attnverify", "repro"], line
    capsys.readouterr()
    code = cli.main(argv[1:])
    return code, capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# The layouts, by hand


def test_a_transposed_view_by_hand():
    rows = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # R = 2 rows of L = 3
    lay = build_layout(2, 3, rank=2, kind="transposed")
    assert lay.sizes == (2, 3) and lay.strides == (1, 2) and lay.offset == 0
    x = present(rows, lay)
    assert x.tolist() == rows.tolist() and x.stride() == (1, 2) and not x.is_contiguous()
    # its memory is the [3, 2] block rows.T, row-major
    assert torch.as_strided(x, (6,), (1,), 0).tolist() == [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    assert lay.describe() == "a transposed view of a [3, 2] block, dim=-1"
    assert lay.kinds == ("transposed",)


def test_the_issue_example_in_words():
    lay = build_layout(3, 5, rank=2, from_end=-2, positive=True, kind="transposed")
    assert lay.sizes == (5, 3) and lay.dim == 0
    assert lay.describe() == "a transposed view of a [3, 5] block, dim=0"
    rows = torch.arange(15.0).reshape(3, 5)
    assert torch.equal(present(rows, lay), rows.t())  # row r is column r: normalised along dim 0


def test_a_strided_slice_reads_gaps_a_storage_order_kernel_would_see():
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    lay = Layout((2, 2), -1, (0, 1), (1, 2))  # every second entry of a [2, 4] block
    assert lay.strides == (4, 2) and lay.kinds == ("strided",)
    x = present(rows, lay)
    memory = torch.as_strided(x, (8,), (1,), 0).tolist()
    assert memory[0::2] == [1.0, 2.0, 3.0, 4.0]
    assert all(v >= GAP_BASE for v in memory[1::2])  # large, finite: visibly wrong if read
    assert lay.describe() == "a strided view of a [2, 4] block (step 2 along axis 1), dim=-1"


def test_an_expanded_axis_and_an_offset():
    rows = torch.tensor([[1.0, 2.0]])
    lay = Layout((3, 2), -1, (0, 1), (1, 1), expand=(0,), offset=5)
    x = present(rows, lay)
    assert x.stride() == (0, 1) and x.storage_offset() == 5
    assert x.tolist() == [[1.0, 2.0]] * 3
    assert lay.rows == 1 and lay.rows_given == 3 and lay.kinds == ("offset", "expanded")
    assert collect(torch.softmax(x, -1), lay, copies="all").shape == (3, 1, 2)
    assert "axis 0 expanded with stride 0 to 3 copies, at storage offset 5" in lay.describe()


def test_fit_keeps_the_layout_for_other_row_counts():
    lay = build_layout(12, 5, rank=4, kind="permuted", detail=3)
    small = lay.fit(5, 7)
    assert (small.rows, small.length, small.rank, small.dim) == (5, 7, 4, lay.dim)
    rows = torch.randn(5, 7)
    assert torch.equal(collect(present(rows, small), small), rows)
    one = build_layout(1, 4, rank=1).fit(3, 4)  # a rank-1 layout given 3 rows: rank 2
    assert (one.rank, one.rows, one.length) == (2, 3, 4)


def test_layouts_combine_a_view_a_slice_an_expanded_axis_and_an_offset():
    rows = torch.arange(24.0).reshape(6, 4)
    lay = build_layout(6, 4, rank=4, kind=("transposed", "strided", "expanded", "offset"),
                       detail=5)
    assert set(lay.kinds) == {"transposed", "strided", "expanded", "offset"}, lay
    x = present(rows, lay)
    assert tuple(x.stride()) == lay.strides and x.storage_offset() == lay.offset > 0
    assert 0 in x.stride() and not x.is_contiguous()
    assert torch.equal(collect(x, lay), rows)
    for copy in collect(x, lay, copies="all"):
        assert torch.equal(copy, rows)
    text = lay.describe()
    assert text.startswith("a transposed and strided view of a ") and "step " in text
    assert "expanded with stride 0" in text and f"at storage offset {lay.offset}" in text
    assert Layout.from_json(json.loads(json.dumps(lay.to_json()))) == lay


def test_a_combination_is_named_by_its_kinds():
    assert build_layout(2, 3, kind=("contiguous",)) == build_layout(2, 3)
    with pytest.raises(InvalidArgument, match="transposed or permuted"):
        build_layout(2, 3, kind=("transposed", "permuted"))
    with pytest.raises(InvalidArgument, match="'sideways'"):
        build_layout(2, 3, kind=("offset", "sideways"))


def test_hypothesis_draws_the_features_of_a_layout_together():
    lay = find(row_layouts(rows=4, length=3), lambda lay: len(lay.kinds) >= 3, settings=FIND)
    assert len(lay.kinds) == 3, lay
    lay = find(row_layouts(rows=4, length=3), lambda lay: len(lay.kinds) == 4, settings=FIND)
    assert len(set(lay.kinds) & {"transposed", "permuted"}) == 1, lay


def test_each_feature_of_a_drawn_layout_shrinks_away_on_its_own():
    assert find(row_layouts(rows=4, length=3), lambda lay: True, settings=FIND) == plain(4, 3)
    lay = find(row_layouts(rows=4, length=3),
               lambda lay: {"offset", "transposed"} <= set(lay.kinds), settings=FIND)
    assert lay.kinds == ("offset", "transposed") and lay.rank == 2 and lay.dim == -1, lay
    lay = find(row_layouts(rows=4, length=3),
               lambda lay: {"strided", "expanded"} <= set(lay.kinds), settings=FIND)
    assert lay.kinds == ("strided", "expanded") and lay.dim == -1, lay


def test_a_declared_kind_is_taken_with_the_other_declared_kinds_and_nothing_else():
    declared = ("contiguous", "offset", "transposed")
    layouts = row_layouts(rows=4, length=5, kinds=declared)
    both = find(layouts, lambda lay: {"offset", "transposed"} <= set(lay.kinds), settings=FIND)
    assert set(both.kinds) == {"offset", "transposed"}
    only = layout_space(("contiguous",))
    for kinds in C.BATTERY_LAYOUTS:
        kind, rank, from_end, positive, detail = kinds
        for space, allowed in ((layout_space(declared), set(declared)), (only, {"contiguous"})):
            lay = build_layout(4, 9, rank=rank, from_end=from_end, positive=positive,
                               kind=kind, detail=detail, space=space)
            assert set(lay.kinds) <= allowed and (lay.rows, lay.length) == (4, 9), (kind, lay)


@settings(max_examples=150)
@given(st.integers(1, 9), st.integers(1, 6), st.data())
def test_every_drawn_layout_is_within_what_is_declared(rows, length, data):
    declared = data.draw(st.sampled_from([("contiguous",), ("contiguous", "offset"),
                                          ("contiguous", "offset", "transposed"),
                                          ("contiguous", "strided", "expanded")]))
    dims = data.draw(st.sampled_from([None, (-1,), (-2, -3)]))
    lay = data.draw(row_layouts(rows=rows, length=length, kinds=declared, dims=dims))
    assert set(lay.kinds) <= set(declared), (declared, lay)
    assert dims is None or lay.from_end in dims, (dims, lay)
    assert (lay.rows, lay.length) == (rows, length)


@settings(max_examples=60)
@given(st.integers(1, 70), st.integers(1, 9), st.data())
def test_every_layout_gives_the_rows_and_normalises_them(rows, length, data):
    lay = data.draw(row_layouts(rows=rows, length=length))
    scores = torch.randn(rows, length, dtype=torch.float64)
    x = present(scores, lay)
    assert tuple(x.stride()) == lay.strides and x.storage_offset() == lay.offset
    # a buffer of the span itself: presenting a case builds and copies no more than it reaches
    assert x.untyped_storage().nbytes() == lay.span * x.element_size(), lay
    assert torch.equal(collect(x, lay), scores)
    assert torch.allclose(collect(torch.softmax(x, lay.dim), lay), torch.softmax(scores, -1))
    assert Layout.from_json(json.loads(json.dumps(lay.to_json()))) == lay


def test_row_counts_cross_chunk_boundaries():
    assert {63, 65, 127, 129, 1023, 1025, 4095, 4097} <= set(ROW_TAILS)
    assert max(ROW_TAILS) >= 4096


# --------------------------------------------------------------------------------------------
# JSON and declared restrictions


def test_a_case_records_its_layout_and_decodes_to_the_same_strides():
    lay = build_layout(2, 3, rank=3, from_end=-2, kind="strided", detail=1)
    case = RowCase(torch.randn(2, 3), 1.0, "gaussian", 0, lay)
    data = json.loads(json.dumps(serialize.encode_case(case)))
    assert data["layout"]["strides"] == list(lay.strides)
    assert data["layout"]["storage_offset"] == lay.offset and data["layout"]["dim"] == lay.dim
    back = serialize.decode_case(data, CASE_TYPES)
    assert back.layout == lay
    data["layout"]["strides"] = [1, 1, 1]
    with pytest.raises(UsageError, match="strides"):
        serialize.decode_case(data, CASE_TYPES)
    del data["layout"]  # a case written before layouts existed: the contiguous block
    assert serialize.decode_case(data, CASE_TYPES).layout is None


def test_declared_restrictions_are_validated():
    def fn(scores, dim=-1):
        return torch.softmax(scores, dim)

    spec = normalizer_spec(fn, layouts=["contiguous", "offset"], dims=-1)
    assert spec.layouts == ("contiguous", "offset") and spec.dims == (-1,)
    with pytest.raises(TargetError, match="must include 'contiguous'"):
        normalizer_spec(fn, layouts=("transposed",))
    with pytest.raises(TargetError, match="'sideways'"):
        normalizer_spec(fn, layouts=("contiguous", "sideways"))
    with pytest.raises(TargetError, match="counted from the end"):
        normalizer_spec(fn, dims=(0,))
    assert normalizer_spec(fn, layouts=KINDS).layouts is None  # every one: nothing declared


def test_a_space_restricts_a_layout_to_what_it_admits():
    space = layout_space(("contiguous", "offset"), (-1,))
    lay = Layout((3, 2, 5), 0, (2, 1, 0), (1, 2, 1), offset=4)  # permuted, strided, dim=0
    got = space.restrict(lay)
    assert space.admits(got) and got.from_end == -1 and set(got.kinds) <= {"contiguous", "offset"}
    assert (got.rows, got.length) == (lay.rows, lay.length)


def test_shrinking_tries_simpler_layouts_only():
    lay = build_layout(4, 3, rank=4, from_end=-3, positive=True, kind="permuted", detail=2)
    candidates = simpler_layouts(lay)
    assert candidates[0] == plain(4, 3)
    assert all(c.rows == 4 and c.length == 3 for c in candidates)
    assert any(c.rank == 2 and c.from_end == -2 for c in candidates)  # same axis, rank 2


def test_shrinking_a_contiguous_layout_keeps_its_axis_at_a_lower_rank():
    """A contiguous block normalised along an axis other than the last, at rank 3: a rank-2
    block along the same axis is a candidate (a kernel that assumes ``dim=-1`` fails there too),
    not only the plain block and the axis moved last."""
    lay = build_layout(2, 2, rank=3, from_end=-3)
    assert lay.kinds == ("contiguous",) and lay.rank == 3
    candidates = simpler_layouts(lay)
    assert any(c.rank == 2 and c.from_end == -2 and c.kinds == ("contiguous",)
               for c in candidates), candidates


def test_shrinking_removes_each_feature_of_a_combination_on_its_own():
    lay = build_layout(6, 4, rank=4, kind=("transposed", "strided", "expanded", "offset"),
                       detail=5)
    candidates = simpler_layouts(lay)
    assert candidates[0] == plain(6, 4)
    assert [set(c.kinds) for c in candidates] == sorted(
        (set(c.kinds) for c in candidates), key=len)  # fewest kinds first
    kinds = set(lay.kinds)
    for feature in kinds:  # the layout itself less one feature, the others kept
        assert any(c.rank == 4 and set(c.kinds) == kinds - {feature} for c in candidates), feature
    # the whole combination at rank 2 (rank 2 before 4), the axis kept
    assert any(c.rank <= 3 and set(c.kinds) == kinds for c in candidates)
    assert all((c.rows, c.length) == (6, 4) for c in candidates)


# --------------------------------------------------------------------------------------------
# Planted defects of each class: caught, minimal, reproduced


def test_a_kernel_reading_storage_order_is_caught(capsys):
    r = failing("storage_order_softmax", "layout_invariant")
    ce = r["counterexample"]
    assert len(ce["layout"]["sizes"]) == 2 and ce["shape"][0] * ce["shape"][1] <= 4, ce
    assert ce["layout"]["text"] in r["message"]  # the message names the layout
    code, out = repro_exit(capsys, ce["repro"])
    # wrong weights, or (reading past the storage of a stride-0 view) the kernel's own error
    assert code == 1 and ("VIOLATED" in out if r["status"] == "violated" else "raised" in out)
    fixed = ce["repro"].replace("storage_order_softmax", "any_layout_softmax")
    assert repro_exit(capsys, fixed)[0] == 0


def test_a_kernel_ignoring_the_storage_offset_is_caught(capsys):
    ce = failing("storage_start_softmax", "layout_invariant")["counterexample"]
    assert ce["layout"]["kinds"] == ["offset"] and ce["layout"]["storage_offset"] == 1, ce
    assert ce["shape"] == [1, 2]
    assert repro_exit(capsys, ce["repro"])[0] == 1


def test_a_backward_wrong_only_on_views_is_caught(capsys):
    spec = target("view_backward_softmax")
    assert run_property(PROPERTIES["layout_invariant"], spec, CTX).status == "holds"
    ce = failing("view_backward_softmax", "gradient")["counterexample"]
    assert {"transposed", "permuted"} & set(ce["layout"]["kinds"]), ce["layout"]
    assert len(ce["layout"]["sizes"]) == 2 and ce["shape"] == [2, 2]
    code, out = repro_exit(capsys, ce["repro"])
    assert code == 1 and "gradient" in out


def test_a_kernel_normalising_the_last_axis_whatever_dim_says_is_caught(capsys):
    r = failing("last_axis_softmax", "layout_invariant")
    ce = r["counterexample"]
    lay = ce["layout"]
    assert lay["dim"] not in (-1, len(lay["sizes"]) - 1) and len(lay["sizes"]) == 2
    # two entries: one row of two keys, or two rows of one key normalised along dim 0
    assert lay["kinds"] == ["contiguous"] and sorted(ce["shape"]) == [1, 2]
    assert repro_exit(capsys, ce["repro"])[0] == 1
    assert sorted(failing("last_axis_softmax", "simplex")["counterexample"]["shape"]) == [1, 2]


def test_a_kernel_mishandling_the_tail_chunk_of_rows_is_caught(capsys):
    ce = failing("row_chunk_tail_softmax", "simplex")["counterexample"]
    assert ce["shape"] == [65, 1], ce["shape"]  # one chunk of 64 and a tail of one row
    assert repro_exit(capsys, ce["repro"])[0] == 1


def test_a_different_code_path_past_some_row_length_is_caught(capsys):
    ce = failing("long_row_path_softmax", "simplex")["counterexample"]
    assert ce["shape"] == [1, 1025], ce["shape"]  # one key past the switch
    assert repro_exit(capsys, ce["repro"])[0] == 1


def test_a_view_path_that_misreads_an_offset_is_caught_on_the_two_together(capsys):
    r = failing("aligned_view_softmax", "layout_invariant")
    ce = r["counterexample"]
    lay = ce["layout"]
    # an offset off the vector boundary, and something that makes a view: two features, rank 2
    assert "offset" in lay["kinds"] and lay["storage_offset"] % 4, lay
    assert set(lay["kinds"]) & {"transposed", "permuted", "strided", "expanded"}, lay
    # two rows at most: the value domain's draws (issue #25) reach it on a [2, 2] case now
    assert len(lay["kinds"]) == 2 and len(lay["sizes"]) == 2 and ce["shape"][0] <= 2 \
        and ce["shape"][1] == 2, ce
    assert lay["text"] in r["message"]
    code, out = repro_exit(capsys, ce["repro"])
    assert code == 1 and "VIOLATED" in out
    fixed = ce["repro"].replace("aligned_view_softmax", "any_layout_softmax")
    assert repro_exit(capsys, fixed)[0] == 0


def test_a_tail_chunk_wrong_only_on_views_is_caught_with_many_rows_in_a_view(capsys):
    ce = failing("view_tail_gather_softmax", "layout_invariant")["counterexample"]
    assert ce["shape"] == [129, 2], ce["shape"]  # one chunk of 128 and a tail of one row
    assert ce["layout"]["kinds"] != ["contiguous"] and len(ce["layout"]["sizes"]) == 2
    assert repro_exit(capsys, ce["repro"])[0] == 1


def test_a_path_past_some_number_of_entries_is_caught_at_the_joint_size(capsys):
    ce = failing("threaded_split_softmax", "batch_independent")["counterexample"]
    rows, length = ce["shape"]
    # more than 2**16 entries in rows that 4 threads do not share evenly, and no more than
    # that: one row or one key fewer and the kernel is right
    assert rows * length > 2**16 and rows % 4, ce["shape"]
    assert (rows - 1) * length <= 2**16 or (rows - 1) % 4 == 0
    assert rows * (length - 1) <= 2**16, ce["shape"]
    assert rows <= 4097 and length <= 4097
    assert repro_exit(capsys, ce["repro"])[0] == 1


def test_a_long_row_path_that_skips_masks_is_caught_on_long_masked_rows(capsys):
    ce = failing("long_mask_tile_softmax", "mask_zero")["counterexample"]
    assert ce["shape"] == [1, 2049], ce["shape"]  # one key past the two-tile switch
    assert repro_exit(capsys, ce["repro"])[0] == 1


def test_the_long_masked_rows_and_the_many_rows_come_in_views():
    spec = target("any_layout_softmax")
    for prop in ("mask_zero", "batch_independent", "layout_invariant", "simplex"):
        cases = PROPERTIES[prop].explicit(spec, CTX)
        long_masked = [c for c in cases if c.scores.shape[-1] > 2048
                       and bool(torch.isneginf(c.scores).any())]
        assert any(c.layout is not None and not c.layout.plain for c in long_masked), prop
        many = [c for c in cases if c.scores.shape[0] > 64]
        assert {c.scores.shape[0] for c in many} <= set(ROW_TAILS), prop
        views = {k for c in many for k in c.layout.kinds} - {"contiguous"}
        assert views == {"offset", "transposed", "permuted", "strided", "expanded"}, prop
    joint = [(c.scores.shape[0], c.scores.shape[1]) for c in
             PROPERTIES["batch_independent"].explicit(spec, CTX) if c.scores.numel() > 2**15]
    assert {(4097, 513), (1025, 2049), (257, 4097), (33, 4097)} <= set(joint)


def test_an_undeclared_restriction_fails_with_the_kernels_exception():
    r = run_property(PROPERTIES["shape"], target("contiguous_lastdim_kernel"), CTX)
    assert r.status == "error"
    assert "the normalizer raised ValueError: contiguous_lastdim_kernel" in r.message
    assert "(given as" in r.message


# --------------------------------------------------------------------------------------------
# Correct kernels, and what the certificate says


@pytest.mark.slow  # a whole certification
def test_a_kernel_with_declared_restrictions_is_certified_for_them():
    res = certify_target(target("contiguous_lastdim_declared"), None, CTX)
    assert res.verdict == "certified", [(r.property, r.message) for r in res.results
                                        if r.status != "holds"]
    data = res.to_json()
    assert data["certified_for"] == "contiguous, offset layouts only; the last axis only; " \
                                    "ranks 1–4"
    cover = data["coverage"]
    assert cover["declared"] == {"layouts": ["contiguous", "offset"], "dims": [-1]}
    assert set(cover["layouts"]) <= {"contiguous", "offset"}
    assert all(a in (-1, 0, 1, 2, 3) for a in cover["axes"])  # the last axis, either spelling
    table = terminal_table({"targets": [data]})
    assert "certified for: contiguous, offset layouts only; the last axis only" in table


@pytest.mark.slow  # a whole certification
def test_contiguous_alone_is_never_given_an_offset():
    """A row taken out of its batch (batch_independent, mask_zero, …) reaches a kernel that
    declares "contiguous" alone as a block at offset 0, like every other input."""
    res = certify_target(target("at_origin_declared"), None, CTX)
    assert res.verdict == "certified", [(r.property, r.message) for r in res.results
                                        if r.status != "holds"]
    assert res.to_json()["coverage"]["layouts"] == ["contiguous"]


@pytest.mark.slow  # a whole certification
def test_a_kernel_declaring_a_view_and_an_offset_is_certified_on_the_two_together():
    spec = target("transposed_declared")
    res = certify_target(spec, None, CTX)
    assert res.verdict == "certified", [(r.property, r.message) for r in res.results
                                        if r.status != "holds"]
    cover = res.to_json()["coverage"]
    assert cover["layouts"] == ["contiguous", "offset", "transposed"]
    space = space_of(spec)
    together = [i for i in range(len(C.BATTERY_LAYOUTS))
                if set(C.battery_layout(spec, 4, 9, i).kinds) == {"offset", "transposed"}]
    assert together and space.admits(C.battery_layout(spec, 4, 9, together[0]))


@pytest.mark.slow  # a whole certification
def test_a_correct_kernel_is_certified_on_every_layout_and_the_coverage_says_so():
    res = certify_target(target("any_layout_softmax"), None, CTX)
    assert res.verdict == "certified"
    data = res.to_json()
    cover = data["coverage"]
    assert cover["layouts"] == list(KINDS)
    assert cover["ranks"] == [1, 2, 3, 4] and set(cover["axes"]) == set(range(-4, 4))
    assert cover["row_count"][0] == 1 and cover["row_count"][1] >= 4096
    assert cover["row_length"] == [1, 4097]  # one key past the profile's longest block
    assert cover["elements"][0] == 1 and cover["elements"][1] >= 4097 * 513
    assert cover["large_cases"] >= 4 and [4097, 513] in cover["large_sizes"]
    assert cover["large_sizes"][0] == [4097, 513]  # largest first
    assert cover["properties"]["shape"]["elements"][1] < 2**21  # where a property differs
    assert cover["masked_keys"] > 0 and cover["declared"] is None
    # gradient has float32 and float64 units, as the run: no dtypes of its own
    assert "dtypes" not in cover["properties"].get("gradient", {})
    assert data["certified_for"] == "every layout; any axis; ranks 1–4"
    for r in data["results"]:
        if r["status"] != "not_applicable":  # no_side_effects: no proxy in this process
            assert r["coverage"]["cases"] == r["examples"], r["property"]
    table = terminal_table({"targets": [data]})
    assert "coverage: " in table and "layouts contiguous, offset, transposed" in table
    assert "entries 1–" in table and "the largest [4097, 513]" in table
