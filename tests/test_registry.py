"""The loader for every kind of target, and every bad-target message."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from attnverify.errors import TargetError, UsageError
from attnverify.registry import (
    NormalizerSpec,
    builtin_ids,
    load_target,
    normalizer_spec,
    parse_params,
)

FIXTURES = Path(__file__).parent / "fixtures"
USER_FILE = str(FIXTURES / "user_normalizers.py")


def test_builtin_ids_are_the_twelve():
    assert builtin_ids() == [
        "softmax", "sparsemax", "entmax15", "entmax_alpha", "ssmax", "sa_softmax",
        "sigmoid", "softpick", "stablemax", "softmax1", "relu_norm", "dagpam", "softmax_fused",
    ]


def test_builtin_spec_fields():
    spec = load_target("softmax")
    assert spec.space == "simplex" and spec.takes_temperature and spec.kernel is not None
    assert "simplex" in spec.claims and spec.citation
    assert spec.description.startswith("Softmax with temperature")


def test_file_target_plain_callable():
    spec = load_target(f"{USER_FILE}:plain")
    assert spec.id == "plain" and spec.claims == ("simplex",)
    assert spec.params == {"temperature": 1.0} and spec.takes_temperature
    assert spec.source.startswith("file ")
    x = torch.randn(3, 4)
    torch.testing.assert_close(spec(x, temperature=2.0), torch.softmax(x / 2, -1))


def test_file_target_spec_object():
    spec = load_target(f"{USER_FILE}:spec")
    assert spec.id == "user_softmax" and spec.claims == ("simplex", "shift_invariant")


def test_module_target(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    spec = load_target("user_normalizers:no_temperature")
    assert not spec.takes_temperature and spec.source == "module user_normalizers:no_temperature"


def test_entry_point_target(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    ep = metadata.EntryPoint("mine", "user_normalizers:plain", "attnverify.normalizers")
    monkeypatch.setattr("attnverify.registry._entry_points", lambda: {"mine": ep})
    spec = load_target("mine")
    assert spec.id == "mine" and spec.source == "entry point user_normalizers:plain"


def test_params_applied_and_unknown_rejected():
    spec = load_target("entmax_alpha", {"alpha": 2.0})
    assert spec.params["alpha"] == 2.0
    with pytest.raises(UsageError, match="has no parameter 'beta'.*alpha, temperature"):
        load_target("entmax_alpha", {"beta": 1})


@pytest.mark.parametrize(
    "target, message",
    [
        ("nosuch", "unknown target 'nosuch': expected a built-in id"),
        ("", "empty target"),
        ("no_such_module_xyz:fn", "module 'no_such_module_xyz' not found"),
        ("json:nosuchattr", "no attribute 'nosuchattr' in module 'json'"),
        ("missing/file.py:fn", "file not found: 'missing/file.py'"),
        (f"{USER_FILE}:NOT_CALLABLE", "is not callable (got int)"),
        (f"{USER_FILE}:nope", "no attribute 'nope' in file"),
        (f"{FIXTURES / 'broken_import.py'}:fn", "RuntimeError: boom at import"),
        (":fn", "expected MODULE:ATTR or FILE.py:ATTR"),
    ],
)
def test_bad_targets_have_one_line_messages(target, message):
    with pytest.raises(TargetError) as info:
        load_target(target)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_spec_validation():
    with pytest.raises(TargetError, match="space='cube'"):
        NormalizerSpec(id="x", fn=lambda s, dim=-1: s, space="cube")
    with pytest.raises(TargetError, match="not callable"):
        normalizer_spec(3, id="x")


def test_parse_params():
    assert parse_params("alpha=1.5,temperature=2,flag=true,bias=none,name=x") == {
        "alpha": 1.5, "temperature": 2, "flag": True, "bias": None, "name": "x",
    }
    assert parse_params("") == {}
    with pytest.raises(UsageError, match="expected NAME=VALUE"):
        parse_params("alpha")


def test_cli_list_shows_all_twelve(capsys):
    from attnverify.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in builtin_ids():
        assert f"\n{name} " in out


def test_cli_unknown_command_is_exit_2(capsys):
    from attnverify.cli import main

    assert main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnverify: error:") and err.count("\n") == 1


def test_file_module_cleanup_on_failure():
    with pytest.raises(TargetError):
        load_target(f"{FIXTURES / 'broken_import.py'}:fn")
    assert "attnverify_target_broken_import" not in sys.modules


def test_spec_remembers_the_target_that_loads_it(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    ep = metadata.EntryPoint("mine", "user_normalizers:plain", "attnverify.normalizers")
    monkeypatch.setattr("attnverify.registry._entry_points", lambda: {"mine": ep})
    for target in ("softmax", "mine", "user_normalizers:plain", f"{USER_FILE}:spec"):
        assert load_target(target).target == target
