"""The worker's history of examples (``remote.History``) keeps an attention case by its recipe
and builds it again, the same tensors, only when a failure's earlier calls are searched; the
entries it keeps, and the trailing entries of the failing case itself that the search leaves
out, are the same as when it kept the cases whole."""

from __future__ import annotations

import torch

from attnverify import heartbeat, remote, sequence
from attnverify.attention import cases as AC
from attnverify.checks.cases import RowCase


def _recipe(seed: int, **more) -> dict:
    return {**AC.recipe(), "b": 2, "h": 4, "h_kv": 2, "l_q": 5, "l_k": 7, "d": 8,
            "mask": "bool", "seed": seed, **more}


def _note(history, case, prop="attn_reference", how="check"):
    heartbeat.example_started(case, sequence.step_of(prop, how))
    try:
        history.note()
    finally:
        heartbeat.example_finished()


def test_an_attention_case_is_kept_by_its_recipe_and_built_again_the_same():
    history = remote.History()
    cases = [AC.build(_recipe(seed, layout=layout))
             for seed, layout in ((1, "bhld"), (2, "hf"), (3, "cache"), (4, "qkv"))]
    for case in cases:
        _note(history, case)
    assert all(isinstance(e[1], remote.ByRecipe) for e in history.entries)
    assert history.bytes == sum(remote.case_bytes(c) for c in cases)  # counted as before
    for (step, got, calls), case in zip(history.snapshot(), cases):
        assert step == ("attn_reference", "check") and calls == 1
        assert got.recipe is case.recipe
        for a, b in ((got.q, case.q), (got.k, case.k), (got.v, case.v),
                     (got.attn_mask, case.attn_mask)):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a, b) and a.stride() == b.stride()
                assert a.storage_offset() == b.storage_offset() and a.dtype == b.dtype
        assert (got.is_causal, got.scale, got.enable_gqa) == (case.is_causal, case.scale,
                                                              case.enable_gqa)


def test_other_cases_are_kept_whole():
    history = remote.History()
    row = RowCase(torch.randn(3, 5), 1.0, "gaussian", 7, None)
    _note(history, row, "simplex")
    (entry,) = history.entries
    assert entry[1] is row


def test_the_failing_case_itself_is_left_out_of_its_earlier_calls(monkeypatch):
    """The trailing entries on the failing case (the failure, its confirmation) are not earlier
    calls; an earlier example of equal recipe but another case object is one."""
    history = remote.History()
    earlier, twin, failing = (AC.build(_recipe(s)) for s in (5, 9, 9))
    for case, how in ((earlier, "check"), (twin, "check"), (failing, "check"),
                      (failing, "recheck")):
        _note(history, case, how=how)

    class Monitor:
        pass

    monitor = Monitor()
    monitor.history = history
    monkeypatch.setattr(sequence, "monitor_of", lambda spec: monitor)
    steps = sequence.history(None, failing)
    assert [s.case.recipe for s in steps] == [earlier.recipe, twin.recipe]
    assert steps[1].case.recipe is twin.recipe and steps[1].case.recipe == failing.recipe
