"""The zoo (``tests/zoo.py``): every planted defect is registered with its expected verdict and
the test that runs it, and the zoo's own entries (the value-domain defects of issue #25 and
their correct controls) run here under the ci profile at the default seed, table-driven.

A defect of the value domain is caught by the property the zoo names; a control that computes
differently (online blocks, split rows merged by log-sum-exp, float32 accumulators, threads;
Hugging Face's eager attention in half precision, an online float32 attention kernel) holds on
every property the widened domain reaches: no false alarm.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from zoo import ATTENTION, COVERED, FIXTURES, PLANTED, SELF, ZOO, Entry

from attnverify.attention.lift import lift
from attnverify.attention.loader import load_attention
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.certify import fix_reference, make_context, run_property, with_reference
from attnverify.checks import PROPERTIES
from attnverify.registry import load_target

HERE = Path(__file__).parent
#: The zoo's tables other tests draw their parameters from.
TABLES = {"PLANTED": PLANTED, "ATTENTION": ATTENTION}
CTX = make_context("ci", seed=0)
#: The controls run on the dev profile (the same value domain and battery, fewer examples: a
#: ci certification of each is in the report of issue #25).
CONTROL_CTX = make_context("dev", seed=0)
#: What a normalizer control is held to here: the properties whose cases the value domain widens
#: (the rest of a certification is the same for a control as for any correct softmax).
NORMALIZER_CONTROL = ("finite", "simplex", "shift_invariant", "order_preserving",
                      "matches_reference")
#: What an attention control is held to here (half precision included: Hugging Face's eager
#: attention rounds its float32 weights to the input dtype).
ATTENTION_CONTROL = ("attn_reference", "attn_additive_mask", "attn_low_precision")


@functools.cache
def _public(path: Path) -> list[str]:
    """The public functions and module-level objects a fixture file defines."""
    tree = ast.parse(path.read_text())
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
             and not n.name.startswith("_")]
    names += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name) and not t.id.startswith("_") and not t.id.isupper()]
    return names


def test_every_planted_fixture_is_in_the_zoo():
    registered = {(e.file, e.attr) for e in ZOO}
    files = sorted({p for pattern in COVERED for p in FIXTURES.glob(pattern)})
    assert len(files) >= 9, files
    missing = [f"{p.name}:{name}" for p in files for name in _public(p)
               if (p.name, name) not in registered]
    assert not missing, f"planted fixtures missing from tests/zoo.py: {missing}"
    assert len(registered) == len(ZOO), "an entry is registered twice"


def test_every_entry_is_run_by_the_test_it_names():
    known = {*PROPERTIES, *ATTENTION_PROPERTIES, "certified", "probe"}
    for e in ZOO:
        assert e.expect in known, e
        assert (FIXTURES / e.file).is_file() and e.attr in _public(FIXTURES / e.file), e
        if e.run_by == SELF:
            continue
        source = (HERE / e.run_by).read_text()
        if (e.attr, e.expect) in _tables_drawn_by(source):
            continue  # the test's table is the zoo's own
        assert re.search(rf"\b{re.escape(e.attr)}\b", source), f"{e.run_by} never runs {e}"
        if e.expect not in ("certified", "probe") and e.kind == "attention":
            assert e.expect in source, f"{e.run_by} never checks {e.expect} ({e.attr})"


def _tables_drawn_by(source: str) -> set[tuple[str, str]]:
    """The ``(attr, expected property)`` rows of the zoo's tables a test file imports."""
    out: set[tuple[str, str]] = set()
    for line in re.findall(r"^from zoo import (.+)$", source, flags=re.M):
        for name in (n.strip() for n in line.split(",")):
            out.update(TABLES.get(name, ()))
    return out


def _normalizer(e: Entry, ctx):
    spec = load_target(e.target)
    spec, _ = with_reference(spec, None, ctx)
    return spec


def _ctx(e: Entry, ctx=CTX):
    return fix_reference(ctx, e.reference) if e.reference else ctx


DEFECTS = [e for e in ZOO if e.run_by == SELF and e.expect not in ("certified", "probe")]
CONTROLS = [e for e in ZOO if e.run_by == SELF and e.expect == "certified"]


@pytest.mark.slow  # a ci certification per defect
@pytest.mark.parametrize("entry", DEFECTS, ids=[e.attr for e in DEFECTS])
def test_zoo_defect_is_caught_by_the_ci_profile(entry):
    ctx = _ctx(entry)
    if entry.kind == "attention":
        spec = lift(load_attention(entry.target))
        res = run_property(ATTENTION_PROPERTIES[entry.expect], spec, ctx)
    else:
        res = run_property(PROPERTIES[entry.expect], _normalizer(entry, ctx), ctx)
    assert res.status in ("violated", "error"), (entry.attr, entry.expect, res.status)


@pytest.mark.slow  # a certification per control
@pytest.mark.parametrize("entry", CONTROLS, ids=[e.attr for e in CONTROLS])
def test_zoo_control_is_certified_where_the_domain_is_wide(entry):
    ctx = _ctx(entry, CONTROL_CTX)
    if entry.kind == "attention":
        spec = lift(load_attention(entry.target))
        checks = [(ATTENTION_PROPERTIES[p], p) for p in ATTENTION_CONTROL]
    else:
        spec = _normalizer(entry, ctx).with_claims((*NORMALIZER_CONTROL,))
        checks = [(PROPERTIES[p], p) for p in NORMALIZER_CONTROL]
    bad = {}
    for prop, name in checks:
        res = run_property(prop, spec, ctx)
        if res.status not in ("holds", "not_applicable"):
            bad[name] = (res.status, res.message)
    assert not bad, f"{entry.attr}: {bad}"
