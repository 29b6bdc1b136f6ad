"""The falsify battery's cases sent to the worker several at a time (issue #27, target 4).

The battery's rows do not depend on the target's answers, so behind the process boundary the
weights of the next few cases are computed in one ``calls`` request
(:func:`attnverify.falsify_search.prefetch`). These tests check that this changes nothing a search
evaluates or reports (the same evaluations, in the same order, with the same values; a false
bound found at the same evaluation with the same witness), that it does take fewer requests,
and that a request that fails is done again one case at a time, so the error names its case.
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import torch

from attnverify import falsify_search as FS
from attnverify import remote
from attnverify.falsify import falsify, make_search
from attnverify.isolation import falsify_isolated
from attnverify.quantities import weights_many
from attnverify.registry import load_target
from attnverify.runconfig import make_context

TRUE = "max_weight <= exp(2*a/T)/L"  # Lemma 1: holds on every row
#: False, but only on rows of many keys: met in the battery well after its first cases.
LATE = "max_weight*L <= 1 + 4*a/T"
BATCH_MAX = FS.BATCH_MAX


def ctx(evaluations: int, max_length: int = 256):
    base = make_context("ci", seed=0, max_length=max_length)
    return dataclasses.replace(base, falsify_evaluations=evaluations)


@pytest.fixture
def softmax_proxy():
    spec = remote.open_normalizer("softmax", {}, make_context("ci"))
    try:
        yield spec
    finally:
        remote.shutdown()


def _battery(spec, text: str, context, monkeypatch, *, batched: bool):
    """Every evaluation of the battery of ``text`` on ``spec`` (case, values, sides, margin) and
    the requests it took."""
    monkeypatch.setattr(FS, "BATCH_MAX", BATCH_MAX if batched else 1)
    seen = []
    real = FS.evaluate

    def spy(*args, **kwargs):
        ev = real(*args, **kwargs)
        seen.append((ev.case.scores.tolist(), ev.case.temperature, ev.case.kind, ev.values,
                     ev.lhs, ev.rhs, ev.margin, ev.fails))
        return ev

    monkeypatch.setattr(FS, "evaluate", spy)
    from attnverify.expr import parse_inequality

    search = make_search(spec, parse_inequality(text), context)
    channel = remote.channel_of(spec)
    before = channel.monitor.calls
    search.begin("battery", FS.BATTERY_SHARE)
    try:
        FS.run_battery(search)
    except (FS._Spent, FS._Crossed):
        pass
    monkeypatch.setattr(FS, "evaluate", real)
    return seen, channel.monitor.calls - before, search


def test_battery_weights_in_batches_equal_the_one_at_a_time_values(softmax_proxy, monkeypatch):
    one, one_requests, _ = _battery(softmax_proxy, TRUE, ctx(400), monkeypatch, batched=False)
    many, many_requests, search = _battery(softmax_proxy, TRUE, ctx(400), monkeypatch,
                                           batched=True)
    assert len(one) == search.evaluations == 160  # the battery's share of 400
    assert many == one  # the same cases, in the same order, with the same values
    # temperatures differ between the cases of one request: each call got its own
    assert len({t for _, t, *_ in many}) > 3
    assert one_requests == len(one)
    assert many_requests <= len(one) // 8


def test_an_in_process_normalizer_is_called_one_case_at_a_time():
    spec = load_target("softmax")
    assert weights_many(spec, [(torch.zeros(3, dtype=torch.float64), 1.0)] * 2) is None


def test_a_false_bound_is_found_at_the_same_evaluation_with_the_same_witness(softmax_proxy,
                                                                             monkeypatch):
    context = ctx(3000)
    here = falsify(load_target("softmax"), LATE, context)
    there = falsify(softmax_proxy, LATE, context)
    monkeypatch.setattr(FS, "BATCH_MAX", 1)
    single = falsify(softmax_proxy, LATE, context)
    assert here.falsified and here.search.first_witness_phase == "battery"
    # requests of 1, 2 and 4 cases first: the witness lies inside a request of 8 cases
    assert 7 < here.search.first_witness_evaluation < 15
    for res in (there, single):
        assert res.search.first_witness_evaluation == here.search.first_witness_evaluation
        assert res.search.first_witness.case.scores.tolist() == \
            here.search.first_witness.case.scores.tolist()
        assert res.witness.case.scores.tolist() == here.witness.case.scores.tolist()
        assert res.witness.values == here.witness.values
        assert res.examples == here.examples


RAISES_ON_LONG_ROWS = textwrap.dedent("""
    import torch

    def norm(scores, dim=-1, temperature=1.0):
        if scores.shape[dim] > 200:
            raise ValueError(f"no row of {scores.shape[dim]} keys")
        return torch.softmax(scores / temperature, dim=dim)
""")


def _batched_and_one_at_a_time(tmp_path, monkeypatch, source: str):
    """The search's end (message, case) on the target ``source``, which must be the same with
    batched requests and with one request per case."""
    path = tmp_path / "failing_long.py"
    path.write_text(source)
    got = {}
    for batched in (True, False):
        monkeypatch.setattr(FS, "BATCH_MAX", BATCH_MAX if batched else 1)
        got[batched] = falsify_isolated(f"{path}:norm", {}, TRUE, ctx(400))
    assert got[True] == got[False]
    return got[True]


def test_a_request_that_fails_is_done_again_a_case_at_a_time(tmp_path, monkeypatch):
    """The target raises on one case of a request: the search stops on that very case, as it
    does with one request per case."""
    message, case, _ = _batched_and_one_at_a_time(tmp_path, monkeypatch, RAISES_ON_LONG_ROWS)
    assert "ValueError" in message and "no row of" in message
    assert case is not None and case["L"] > 200


def _whole_search(spec, monkeypatch, *, batched: bool):
    """Every evaluation of a short search of :data:`TRUE` on ``spec``, the requests its polish
    took, and the polish's evaluations."""
    monkeypatch.setattr(FS, "BATCH_MAX", BATCH_MAX if batched else 1)
    seen, calls = [], {}
    real_evaluate, real_begin = FS.evaluate, FS.Search.begin

    def spy(*args, **kwargs):
        ev = real_evaluate(*args, **kwargs)
        seen.append((ev.case.scores.tolist(), ev.case.temperature, ev.values, ev.margin))
        return ev

    def begin(search, phase, share=None):
        calls[phase] = remote.channel_of(spec).monitor.calls
        return real_begin(search, phase, share)

    monkeypatch.setattr(FS, "evaluate", spy)
    monkeypatch.setattr(FS.Search, "begin", begin)
    try:
        res = falsify(spec, TRUE, ctx(300, max_length=64))
    finally:
        monkeypatch.setattr(FS, "evaluate", real_evaluate)
        monkeypatch.setattr(FS.Search, "begin", real_begin)
    assert not res.falsified
    polish = remote.channel_of(spec).monitor.calls - calls["polish"]
    return seen, polish, res.search.by_phase["polish"]


def test_the_polish_simplex_in_one_request_equals_the_one_at_a_time_values(softmax_proxy,
                                                                          monkeypatch):
    """Each polish start's simplex (Nelder–Mead evaluates its points first) is computed in one
    request: the same evaluations with the same values as one request per point, and fewer
    requests in the polish."""
    one, one_polish, evaluations = _whole_search(softmax_proxy, monkeypatch, batched=False)
    many, many_polish, _ = _whole_search(softmax_proxy, monkeypatch, batched=True)
    assert evaluations > 50
    assert many == one
    assert one_polish == evaluations
    assert many_polish < 0.8 * one_polish


DIES_ON_LONG_ROWS = textwrap.dedent("""
    import os

    import torch

    def norm(scores, dim=-1, temperature=1.0):
        if scores.shape[dim] > 200:
            os._exit(3)
        return torch.softmax(scores / temperature, dim=dim)
""")


def test_a_worker_that_dies_in_a_request_is_reported_on_its_own_case(tmp_path, monkeypatch):
    """The worker dies on one case of a request of several: the request is done again a case
    at a time in a fresh worker, and the search stops on that case, as with one request per
    case."""
    message, case, _ = _batched_and_one_at_a_time(tmp_path, monkeypatch, DIES_ON_LONG_ROWS)
    assert "status 3" in message or "exit" in message, message
    assert case is not None and case["L"] > 200
