"""``attnverify falsify`` on the command line (issue #18): the budget options, the report of how
hard the search looked (console table and JSON), and the repro of the shrunk witness."""

from __future__ import annotations

import json
import shlex

import pytest

from attnverify.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, fragment", [
    (["--budget", "0"], "--budget: must be a positive number of seconds"),
    (["--budget", "-3"], "--budget: must be a positive number of seconds"),
    (["--budget", "nan"], "--budget: must be a positive number of seconds"),
    (["--budget", "inf"], "--budget: must be a positive number of seconds"),
    (["--budget", "soon"], "--budget: expects a number of seconds, got 'soon'"),
    (["--budget", "1e9"], "up to 86400"),
    (["--max-length", "0"], "--max-length: must be between 1 and 1048576, got 0"),
    (["--max-length", "2000000"], "--max-length: must be between 1 and 1048576"),
    (["--max-length", "8.5"], "--max-length: expects an integer, got '8.5'"),
    (["--max-length", "١٢"], "--max-length: expects an integer"),
    (["--max-examples", "0"], "--max-examples"),
])
def test_bad_budget_options_are_exit_2_one_line(capsys, argv, fragment):
    code, out, err = run(capsys, "falsify", "softmax", "max_weight <= 1", *argv)
    assert code == 2 and out == ""
    assert err.startswith("attnverify: error:") and err.count("\n") == 1, err
    assert fragment in err and "Traceback" not in err


def test_the_report_says_how_hard_the_search_looked(capsys, tmp_path):
    path = tmp_path / "f.json"
    code, out, _ = run(capsys, "falsify", "softmax", "max_weight <= exp(2*a/T)/L", "--profile",
                       "dev", "--max-examples", "150", "--max-length", "32", "--budget", "500",
                       "--no-isolation", "--json", str(path))
    assert code == 0, out
    assert out.startswith("not falsified") and "(150 evaluations" in out
    assert "search: 150 of 150 evaluations (battery " in out and "evaluations spent" in out
    assert "stratum" in out and "best ratio" in out and "  L=3 " in out
    data = json.loads(path.read_text())
    search = data["search"]
    assert data["examples"] == search["evaluations"] == 150
    assert search["budget"] == {"evaluations": 150, "seconds": 500.0, "max_length": 32}
    assert sum(search["phases"].values()) == 150 and search["stopped"] == "budget"
    strata = {s["stratum"]: s for s in search["strata"]}
    assert {"L=1", "L=2", "L=3", "L=4-5", "L=6-8", "L=9-32", "L=1-3 masked"} <= set(strata)
    assert sum(s["evaluations"] for s in strata.values()) == 150
    assert all(s["L_max"] <= 32 for s in strata.values())
    assert strata["L=3"]["best_ratio"] <= 1
    assert search["first_witness"] is None
    assert "--max-examples 150 --budget 500 --max-length 32" in data["rerun"]


def test_a_falsified_bound_reports_where_the_witness_was_met_and_its_repro_fails(capsys,
                                                                                 tmp_path):
    path = tmp_path / "f.json"
    code, out, _ = run(capsys, "falsify", "sparsemax", "max_weight <= 1/L + a/T", "--profile",
                       "ci", "--no-isolation", "--json", str(path))
    assert code == 1, out
    assert "minimal witness: L=3" in out and "first met by the battery at evaluation" in out
    assert "stopped at the first witness" in out
    data = json.loads(path.read_text())
    first = data["search"]["first_witness"]
    assert first["phase"] == "battery" and first["evaluation"] == data["examples"]
    assert data["witness"]["L"] == 3 and data["search"]["shrink_evaluations"] > 0
    assert data["worst_ratio"] >= data["witness"]["ratio"]
    argv = shlex.split(data["repro"])
    assert argv[:2] == ["attnverify", "repro"]
    code, out, _ = run(capsys, *argv[1:])
    assert code == 1 and out.startswith("FALSIFIED: sparsemax")


def test_the_contract_states_the_budgets_strata_and_functions_the_code_has():
    from pathlib import Path

    from attnverify import expr
    from attnverify.falsify_search import strata
    from attnverify.runconfig import FALSIFY_BUDGETS

    text = " ".join((Path(__file__).parents[1] / "docs" / "INTERFACES.md").read_text().split())
    evaluations = ", ".join(f"{k} {v['evaluations']:g}" for k, v in FALSIFY_BUDGETS.items())
    seconds = ", ".join(f"{k} {v['seconds']:g}" for k, v in FALSIFY_BUDGETS.items())
    assert f"Default per profile: {evaluations}." in text
    assert f"(default {seconds}:" in text
    assert f"`{' '.join(expr.FUNCTIONS)}`" in text
    assert f"the constants `{'` and `'.join(expr.CONSTANTS)}`" in text
    bands = [s.name.removeprefix("L=").replace("-", "–") for s in strata(4096) if not s.masked]
    assert f"(L = {', '.join(bands[:7])}, …" in text


RAISES_ON_FOUR_KEYS = '''import torch


def helper(scores):
    if scores.shape[-1] >= 4:
        raise ValueError("no rows of four keys here")
    return torch.softmax(scores, -1)


def norm(scores, dim=-1):
    return helper(scores)
'''


@pytest.mark.parametrize("isolation", [[], ["--no-isolation"]])
def test_a_target_that_raises_stops_the_search_and_traceback_shows_where(capsys, tmp_path,
                                                                          isolation):
    """A target that raises stops the search (exit 1) on the input in flight; the report points
    to --traceback, and --traceback prints the target's own frames (its file, its line, the
    error), none of attnverify's; behind the process boundary and in this process alike."""
    path = tmp_path / "raising.py"
    path.write_text(RAISES_ON_FOUR_KEYS)
    argv = ["falsify", f"{path}:norm", "max_weight <= 1", "--profile", "dev", "--seed", "0",
            *isolation]
    code, out, _ = run(capsys, *argv)
    assert code == 1 and out.startswith("error: the search stopped"), out
    assert "no rows of four keys here" in out
    assert "(--traceback shows where in its code)" in out and "raising.py" not in out
    code, out, _ = run(capsys, *argv, "--traceback")
    assert code == 1 and "(--traceback shows" not in out, out
    lines = out.splitlines()
    at = lines.index("  traceback (the target's own frames, most recent call last):")
    shown = "\n".join(lines[at + 1:])
    assert "raising.py" in shown and "in helper" in shown and "in norm" in shown
    assert 'raise ValueError("no rows of four keys here")' in shown
    assert "ValueError: no rows of four keys here" in shown
    assert "attnverify" not in shown.replace(str(tmp_path), "")


@pytest.mark.parametrize("isolation", [[], ["--no-isolation"]], ids=["isolated", "in-process"])
def test_a_stop_that_hypothesis_turns_into_an_error_stops_the_search(capsys, monkeypatch,
                                                                      isolation):
    """Ctrl-C landing in Hypothesis before its engine began came out as Hypothesis's own
    ``AssertionError``: the search reported that the code under test raised it (isolated) or
    that the search stopped on it, a verdict on the target for a signal. It is a stop: exit
    130, one line."""
    import signal

    from hypothesis.internal.conjecture import engine

    made = []
    original = engine.ConjectureRunner.__init__

    def interrupted_here(self, *args, **kwargs):
        made.append(True)
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the handler runs in here
            pass
        original(self, *args, **kwargs)

    monkeypatch.setattr(engine.ConjectureRunner, "__init__", interrupted_here)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a command
    try:
        code, out, err = run(capsys, "falsify", "softmax", "max_weight <= exp(2*a/T)/L",
                             "--profile", "dev", *isolation)
    finally:
        signal.signal(signal.SIGINT, before)
    assert made, "no search ran"
    assert code == 130, (out, err)
    assert err.strip().splitlines()[-1].startswith("attnverify: interrupted"), err
    assert "AssertionError" not in out + err and "Traceback" not in err
