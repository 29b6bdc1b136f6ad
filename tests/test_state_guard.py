"""The worker's state guard (:class:`attnverify.worker.StateGuard`) on its own: what a call
changes is found at that call and undone, whether the guard compares every watched name or
skips that comparison because no watched dictionary was written (issue #27: the per-call cost
behind the process boundary)."""

from __future__ import annotations

import builtins
import sys

import pytest
import torch
import torch.nn.functional

from attnverify import cli, worker

FAST = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] <= (3, 13)


@pytest.fixture(params=["tags", "full"])
def guard(request, monkeypatch):
    """A guard with the dictionaries' version tags (where this Python has them) and one that
    compares every name at every call."""
    if request.param == "full":
        monkeypatch.setattr(worker, "_version_reader", lambda dicts: None)
    elif not FAST:
        pytest.skip("no dictionary version tags on this Python")
    return worker.StateGuard()


def _call(guard, change) -> list[str]:
    before = guard.snapshot()
    change()
    return guard.check(before)


@pytest.mark.skipif(not FAST, reason="no dictionary version tags on this Python")
def test_the_version_tags_are_read_here():
    guard = worker.StateGuard()
    assert guard.versions is not None
    tags = guard.versions()
    assert guard.versions() == tags  # reading changes nothing
    torch.nn.functional.attnverify_probe = 1  # an addition is a write (not a change: see below)
    try:
        assert guard.versions() != tags
    finally:
        del torch.nn.functional.attnverify_probe


@pytest.mark.skipif(not FAST, reason="no dictionary version tags on this Python")
def test_a_call_that_writes_no_watched_dictionary_compares_no_name(monkeypatch):
    guard = worker.StateGuard()
    compared = []
    monkeypatch.setattr(guard, "_namespace", lambda *a: compared.append(a[0]) or [])
    assert _call(guard, lambda: torch.softmax(torch.ones(3), -1)) == []
    assert compared == []
    torch.nn.functional.attnverify_probe = 1
    try:
        assert _call(guard, lambda: None) == []  # no write during this call
        assert compared == []
        assert _call(guard, lambda: delattr(torch.nn.functional, "attnverify_probe")) == []
        assert "torch.nn.functional" in compared  # a write: every name compared
    finally:
        if hasattr(torch.nn.functional, "attnverify_probe"):
            del torch.nn.functional.attnverify_probe


def _rebind(owner, name, value):
    return lambda: setattr(owner, name, value)


@pytest.mark.parametrize("owner,name,label", [
    (torch, "exp", "torch.exp"),
    (torch.nn.functional, "softmax", "torch.nn.functional.softmax"),
    (torch.special, "expit", "torch.special.expit"),
    (torch.autograd, "grad", "torch.autograd.grad"),
    (torch.Tensor, "softmax", "torch.Tensor.softmax"),
    (builtins, "sorted", "builtins.sorted"),
])
def test_a_patch_is_found_at_its_call_and_undone(guard, owner, name, label):
    original = vars(owner).get(name)
    had = name in vars(owner)
    try:
        changes = _call(guard, _rebind(owner, name, lambda *a, **k: None))
        assert any(c.startswith(label) and "replaced" in c for c in changes), changes
        assert (vars(owner).get(name) is original) if had else name not in vars(owner)
        assert _call(guard, lambda: None) == []  # undone: the next call is clean
    finally:
        if had:
            setattr(owner, name, original)
        elif name in vars(owner):
            delattr(owner, name)


def test_a_deleted_name_is_found_and_restored(guard):
    original = torch.special.expit
    try:
        changes = _call(guard, lambda: delattr(torch.special, "expit"))
        assert "torch.special.expit was replaced" in changes
        assert torch.special.expit is original
    finally:
        torch.special.expit = original


def test_a_new_name_is_no_change(guard):
    try:
        assert _call(guard, _rebind(torch.linalg, "attnverify_probe", 1)) == []
    finally:
        del torch.linalg.attnverify_probe


def test_flush_to_zero_is_found_and_undone(guard):
    assert not worker._flushes_denormals()
    changes = _call(guard, lambda: torch.set_flush_denormal(True))
    assert any(c.startswith("flush-to-zero of denormals changed") for c in changes), changes
    assert not worker._flushes_denormals()
    if torch.set_flush_denormal(True):  # where the CPU has the mode: the probe sees it
        try:
            assert worker._flushes_denormals()
        finally:
            torch.set_flush_denormal(False)


def test_a_flag_is_found_at_every_call(guard):
    threads = torch.get_num_threads()
    changes = _call(guard, lambda: torch.set_num_threads(threads + 1))
    assert any(c.startswith("thread count changed") for c in changes), changes
    assert torch.get_num_threads() == threads


def test_a_command_line_run_loads_no_hypothesis_plugin(monkeypatch):
    seen = {}

    def fake(argv, *_):
        seen.update(plugins=cli.os.environ.get(cli.NO_PLUGINS))
        return 0

    monkeypatch.delenv(cli.NO_PLUGINS, raising=False)
    monkeypatch.setattr(cli, "_main", fake)
    assert cli.main([]) == 0
    assert seen["plugins"] == "1"
    assert cli.NO_PLUGINS not in cli.os.environ  # for the run only
    monkeypatch.setenv(cli.NO_PLUGINS, "")  # the user's word stands
    cli.main([])
    assert seen["plugins"] == ""
