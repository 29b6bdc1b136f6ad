"""What the user reads names what it shows (issue #28.5): the inequality as the user typed it,
every vector under its name (scores, x), no Python repr of a dict or a list."""

from __future__ import annotations

import dataclasses
import re

from attnverify.certify import make_context
from attnverify.claims import ClaimRow, _witness, table_markdown
from attnverify.falsify import falsify, summary
from attnverify.registry import load_target
from attnverify.report import _violation_lines

CTX = dataclasses.replace(make_context("dev", max_examples=60, seed=0), max_length=16)
#: A Python repr of a dict or of a list of strings: ``{'kind': …}``, ``['a', …]``.
REPR = re.compile(r"\{'|\['|': ")


def _row(ce: dict) -> ClaimRow:
    row = ClaimRow("c", "b", "n", "h", "softmax", "falsified", verdict="falsified")
    row.counterexample = ce
    return row


def test_two_claims_with_the_same_scores_show_what_differs_and_name_every_vector():
    # two paper cases drawn from one seed share their scores; the embeddings differ
    one = _row({"case": "EmbeddingCase", "scores": [[1.5409961082440433, -0.2934289057609464]],
                "x": [[0.8792233243398163], [-98.17230745126355]], "n_top": 1,
                "temperature": 1.0, "observed": 20.97, "bound": -20.97})
    two = _row({"case": "EmbeddingCase", "scores": [[1.5409961082440433, -0.2934289057609464]],
                "x": [[1.0], [-1.0]], "n_top": 1, "temperature": 1.0, "observed": 1.0,
                "bound": 0.9394})
    a, b = _witness(one), _witness(two)
    assert a != b
    for text in (a, b):
        assert "scores=[1.541, -0.2934]" in text and "x=[[" in text and "T=1" in text
        assert "observed" in text and "bound" in text
    table = table_markdown([one, two])
    assert not REPR.search(table), table


def test_a_falsify_row_names_its_sides_and_the_inequality_as_written():
    row = _row({"scores": [0.0, 0.0], "temperature": 1.0, "kind": "battery:two_level_1",
                "inequality": "jacobian_spectral <= min(1/(4*T), sqrt(2))", "lhs": 0.5,
                "rhs": 0.25, "ratio": 2.0})
    text = _witness(row)
    assert text == ("L=2, T=1, scores=[0, 0]: LHS 0.5 > RHS 0.25 in "
                    "jacobian_spectral <= min(1/(4*T), sqrt(2))")


def test_falsify_prints_the_inequality_as_the_user_typed_it():
    res = falsify(load_target("sparsemax"), "min_weight > 0", CTX)
    text = summary(res, CTX)
    assert res.falsified and text.startswith("FALSIFIED: min_weight > 0  [sparsemax]"), text
    assert "0 < min_weight" not in text
    assert "scores=[" in text  # the witness's vector is named
    assert not REPR.search(text), text


def test_a_certify_violation_line_shows_its_case_without_a_python_dict():
    lines = _violation_lines({"property": "p", "message": "m",
                              "counterexample": {"kind": "single", "seed": 7, "a": 2.5}})
    assert "    case: a 2.5, kind single, seed 7" in lines
    assert not any(REPR.search(line) for line in lines)
