"""Defects of attention kernels that need more than one call (issue #25, item 5): a failure that a
fresh worker does not reproduce from its case alone is reported with the earlier calls it needs,
lifted or attention-level alike, shrunk to the fewest, and its repro line (``attnverify repro
TARGET --attention``) replays them in order in one fresh worker and fails the same way (exit 1).
Each planted kernel (tests/fixtures/planted_attention_sequence.py) on the dev profile at the
default seed; a kernel that keeps a legitimate per-shape cache (a causal mask) holds."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from attnverify import cli, remote, sequence
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.attention.run import lifted_spec
from attnverify.certify import make_context, run_property
from attnverify.checks import PROPERTIES
from attnverify.checks.base import Violation

FILE = str(Path(__file__).parent / "fixtures" / "planted_attention_sequence.py")
DEV = make_context("dev", seed=0)
_V = Violation("again", observed=1.0, bound=0.0, ratio=float("inf"))


@pytest.fixture(autouse=True)
def _workers_closed():
    yield
    remote.shutdown()


def _spec(attr: str):
    return lifted_spec(remote.open_attention(f"{FILE}:{attr}", {}, DEV))


def run_line(capsys, line: str) -> tuple[int, str]:
    argv = shlex.split(line)
    assert argv[:2] == ["attnverify", "repro"] and "--attention" in argv, line
    capsys.readouterr()
    code = cli.main(argv[1:])
    return code, capsys.readouterr().out


def _case_of(line: str) -> tuple[list[str], int, dict]:
    argv = shlex.split(line)
    i = argv.index("--case")
    text = argv[i + 1]
    return argv, i, json.loads(text if text.startswith("{") else Path(text).read_text())


def without_sequence(line: str) -> str:
    argv, i, data = _case_of(line)
    data.pop("sequence")
    argv[i + 1] = json.dumps(data)
    return shlex.join(argv)


@pytest.mark.parametrize("attr, prop_id, needle, most", [
    # an output workspace per shape: the second call of a shape writes into the first's output
    ("workspace_attention", "shape", "shares its storage with the output of an earlier call", 1),
    # ... and on an attention-level property: a violation, as for rows (not "raised Refused")
    ("workspace_attention", "attn_bool_mask", "shares its storage with the output of an earlier "
     "call", 1),
    # right for 40 calls, then drifting: 40 calls of the cheapest case, no more
    ("autotuned_attention", "attn_reference", "float64 eager reference", 40),
    # the log-sum-exp of the first input of a shape reused for the next: one earlier call
    ("shape_cache_attention", "attn_reference", "float64 eager reference", 1),
])
@pytest.mark.slow  # searches with fresh workers, then repro runs
def test_an_attention_defect_across_calls_is_reported_with_its_sequence_and_reproduces(
        attr, prop_id, needle, most, capsys):
    prop = PROPERTIES.get(prop_id) or ATTENTION_PROPERTIES[prop_id]
    res = run_property(prop, _spec(attr), DEV)
    assert res.status == "violated", res.message
    assert needle in res.message
    ce = res.counterexample
    assert ce.get("reproduces", True) is True
    steps = ce["sequence"]
    assert 1 <= len(steps) <= most, [s["property"] for s in steps]
    for step in steps:  # an attention case travels as its recipe, a lifted one as its rows
        assert ("recipe" in step) == (step["property"] in ATTENTION_PROPERTIES), step
    _, _, data = _case_of(ce["repro"])
    if prop_id in ATTENTION_PROPERTIES:
        assert data["case"] == "AttnCase" and data["recipe"] == ce["recipe"]
    code, out = run_line(capsys, ce["repro"])
    assert code == 1, out
    assert f"replaying {len(steps)} earlier call" in out and needle in out
    # the case alone, in a fresh worker, holds: the sequence is what it needs
    code, out = run_line(capsys, without_sequence(ce["repro"]))
    assert code == 0 and "holds" in out, out


def test_a_legitimate_per_shape_cache_holds():
    """A causal mask cached by shape is a constant of the shape: no property fails, and none
    reports a sequence."""
    spec = _spec("cached_mask_attention")
    bad = {}
    for prop_id in ("attn_causal", "attn_reference", "attn_bool_mask"):
        res = run_property(ATTENTION_PROPERTIES[prop_id], spec, DEV)
        if res.status not in ("holds", "not_applicable"):
            bad[prop_id] = res.message
    for prop_id in ("shape", "simplex"):
        res = run_property(PROPERTIES[prop_id], spec, DEV)
        if res.status != "holds":
            bad[prop_id] = res.message
    assert not bad, bad


class _Fake(sequence._Search):
    """A search whose replay is a rule on the steps (no worker): it fails when every step of
    ``needed`` is among the steps replayed."""

    def __init__(self, needed):
        self.needed, self.attempts = needed, 0
        self.tried: list[int] = []

    def fails(self, steps):
        self.attempts += 1
        self.tried.append(len(steps))
        return _V if all(s in steps for s in self.needed) \
            else None


def test_the_fewest_steps_are_found_among_many_in_few_attempts():
    """The one earlier call a failure needs, 17th of 40 (a stale cache primed by one call of
    the shape): found alone, in far fewer attempts than dropping steps one at a time."""
    steps = [sequence.Step("attn_reference", "check", i) for i in range(40)]
    search = _Fake([steps[17]])
    best, _ = search.fewest(steps[17:], _V)
    assert best == [steps[17]]
    assert search.attempts <= 12, search.tried
    search = _Fake([steps[3], steps[30]])  # two calls needed: both kept, nothing else
    best, _ = search.fewest(list(steps), _V)
    assert best == [steps[3], steps[30]]


def test_a_run_of_one_repeated_step_is_not_shrunk_call_by_call():
    """40 calls of one case (a drift that counts calls): each shorter run is tried once."""
    step = sequence.Step("attn_reference", "check", 0)
    search = _Fake([])
    search.fails = lambda steps: (search.tried.append(len(steps)) or
                                  (_V if len(steps) >= 40
                                   else None))
    best, _ = search.fewest([step] * 40, _V)
    assert len(best) == 40
    assert len(search.tried) == len(set(search.tried)) <= 7, search.tried


@pytest.mark.parametrize("argv, needle", [
    (["--inequality", "max_weight <= 1"], "--attention re-checks a property"),
    (["--property", "attn_nope"], "unknown property id 'attn_nope'"),
    (["--property", "attn_reference", "--case", json.dumps({"case": "AttnCase"})],
     "needs its \"recipe\""),
    (["--property", "attn_reference", "--case", json.dumps(
        {"case": "AttnCase", "recipe": {"b": 1},
         "sequence": [{"property": "attn_reference", "recipe": {"b": "two"}}]})],
     "sequence entry 0: bad attention recipe"),
    (["--property", "attn_reference", "--case", json.dumps(
        {"case": "AttnCase", "recipe": {"b": 1},
         "sequence": [{"property": "nope", "recipe": {}}]})],
     "sequence entry 0: unknown property 'nope'"),
])
def test_bad_input_to_an_attention_repro_is_a_usage_error(argv, needle, capsys):
    if "--case" not in argv:
        argv = [*argv, "--case", json.dumps({"case": "AttnCase", "recipe": {}})]
    code = cli.main(["repro", f"{FILE}:shape_cache_attention", "--attention", *argv])
    assert code == 2
    assert needle in capsys.readouterr().err


def test_the_console_names_the_shape_of_an_attention_call():
    from attnverify.report import sequence_text

    step = {"property": "attn_reference", "how": "check",
            "recipe": {"b": 1, "h": 2, "l_q": 3, "l_k": 4}}
    text = sequence_text([step] * 40)
    assert "40 × attn_reference on [1, 2, 3, 4]" in text
