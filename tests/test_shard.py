"""Shards and merge (issue #19): units, the partition, partial certificates, ``attnverify merge``.

The central check: a run split into shards and merged gives the unsharded run's certificate,
result for result (status, examples, worst ratio, counterexample, message, coverage, units), under
the same seed; only timings and process ids differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnverify import shard as S
from attnverify.cli import main
from attnverify.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
PLANTED = str(FIXTURES / "planted.py")
#: A small, fast run with a failing target, so that counterexamples take part.
RUN = ["softmax", f"{PLANTED}:positional_softmax", "--profile", "dev", "--max-examples", "6",
       "--dtypes", "float32,float64,bfloat16", "--claims", "simplex,matches_reference",
       "--quiet"]


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def usage(code, err, fragment):
    assert code == 2, err
    assert err.startswith("attnverify: error:") and err.count("\n") == 1, err
    assert fragment in err and "Traceback" not in err


# --------------------------------------------------------------------------------------------
# K/N and the partition, by hand


@pytest.mark.parametrize("text, expected", [("1/1", (1, 1)), ("2/3", (2, 3)), (" 3 / 3 ", (3, 3)),
                                            ("", None), (None, None)])
def test_parse_shard_accepts_k_of_n(text, expected):
    assert S.parse_shard(text) == expected


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "0/0", "a/b", "1/2/3", "1", "-1/2",
                                  "1.0/2", "１/2", "1/10001"])
def test_parse_shard_refuses_anything_else(text):
    with pytest.raises(UsageError, match="--shard"):
        S.parse_shard(text)


def test_partition_is_longest_processing_time_first(monkeypatch):
    # costs 5 4 3 3 2 2 1 over 2 shards, by hand: 5→1, 4→2, 3→2 (4<5), 3→1 (7=8? no: 5<7) …
    costs = {"a": 5, "b": 4, "c": 3, "d": 3, "e": 2, "f": 2, "g": 1}
    monkeypatch.setattr(S, "cost", lambda uid: costs[uid])
    # a:5→1 (loads 5,0); b:4→2 (5,4); c:3→2 (5,7); d:3→1 (8,7); e:2→2 (8,9); f:2→1 (10,9);
    # g:1→2 (10,10)
    assert S.partition(list("abcdefg"), 2) == [1, 2, 2, 1, 2, 1, 2]
    # ties go to the lowest shard and the earlier unit: equal costs round-robin
    monkeypatch.setattr(S, "cost", lambda uid: 1.0)
    assert S.partition(list("abcde"), 3) == [1, 2, 3, 1, 2]
    assert S.partition(list("ab"), 4) == [1, 2]  # shards 3 and 4 get nothing


def test_partition_is_a_pure_balanced_function_of_the_units():
    units = [S.unit_id(t, p, d, "cpu") for t in ("softmax", "sparsemax", "mine.py:f")
             for p in ("shape", "gradient", "matches_reference", "no_side_effects")
             for d in ("float32", "float64")]
    first = S.partition(units, 4)
    assert first == S.partition(list(units), 4)
    assert sorted(set(first)) == [1, 2, 3, 4]
    loads = S.loads(dict(zip(units, first)), 4)
    assert max(loads) - min(loads) <= max(S.cost(u) for u in units) + 1e-9
    shards = [S.make_shard(k, 4, units) for k in (1, 2, 3, 4)]
    together = [u for s in shards for u in s.units]
    assert sorted(together) == sorted(units) and len(set(together)) == len(units)
    with pytest.raises(ValueError):
        S.make_shard(1, 2, units + units[:1])


def test_costs_cover_every_unit_of_the_builtins():
    """Every unit a default run of the built-ins plans has a measured ci cost of its own."""
    from attnverify.certify import make_context, plan
    from attnverify.registry import builtin_ids, load_target
    from attnverify.shard_costs import BY_PROPERTY, BY_UNIT

    ctx = make_context("ci", dtypes="float32,float64,bfloat16,float16")
    missing = []
    for name in builtin_ids():
        spec = load_target(name)
        for prop in plan(spec, None, ctx)[1]:
            for d in prop.unit_dtypes(spec, ctx):
                key = f"{name}::{prop.id}::{S.dtype_name(d)}"
                if key not in BY_UNIT:
                    missing.append(key)
                assert S.cost(S.unit_id(name, prop.id, S.dtype_name(d), "cpu")) > 0
    assert not missing, f"no ci cost for {missing[:5]}…: run benchmarks/shard_costs.py"
    assert all(v > 0 for v in BY_PROPERTY.values())
    # a target nobody measured costs what the property costs the built-ins (their median)
    assert S.cost("mine.py:f::gradient::float64::cpu") == BY_PROPERTY["gradient::float64"]


# --------------------------------------------------------------------------------------------
# The command line


@pytest.mark.parametrize("spec", ["0/2", "3/2", "x/2", "1/2/3"])
def test_bad_shard_is_exit_2_and_nothing_written(capsys, tmp_path, spec):
    out = tmp_path / "part.json"
    code, _, err = cli(capsys, "certify", "softmax", "--shard", spec, "--json", out)
    usage(code, err, "--shard")
    assert not out.exists()


def test_shard_refuses_a_random_seed_and_xfails(capsys, tmp_path):
    code, _, err = cli(capsys, "certify", "softmax", "--shard", "1/2", "--seed", "random")
    usage(code, err, "same seed")
    xf = tmp_path / "xf.txt"
    xf.write_text("softmax::shape\n")
    code, _, err = cli(capsys, "certify", "softmax", "--shard", "1/2", "--xfails", xf)
    usage(code, err, "attnverify merge")


def _comparable(cert: dict) -> list:
    """The targets of a certificate without what legitimately differs between runs: seconds and
    process ids."""
    out = []
    for t in cert["targets"]:
        t = {k: v for k, v in t.items() if k != "worker_pids"}
        t["results"] = [{**{k: v for k, v in r.items() if k != "elapsed_s"},
                         "units": [{k: v for k, v in u.items() if k != "elapsed_s"}
                                   for u in r["units"]]} for r in t["results"]]
        out.append(t)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One unsharded run and the same run in three shards (subprocess-free, one per call)."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("shards")
    codes = {}
    for name, extra in [("all", []), *[(f"p{k}", ["--shard", f"{k}/3"]) for k in (1, 2, 3)]]:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            codes[name] = main(["certify", *RUN, *extra, "--json", str(tmp / f"{name}.json")])
    return tmp, codes


def test_a_sharded_run_merges_into_the_unsharded_certificate(capsys, runs):
    tmp, codes = runs
    assert codes["all"] == 1  # positional_softmax fails
    parts = [json.loads((tmp / f"p{k}.json").read_text()) for k in (1, 2, 3)]
    plan = parts[0]["shard"]["plan"]
    assert all(p["shard"]["plan"] == plan for p in parts)
    ran = [u for p in parts for u in p["shard"]["units"]]
    assert sorted(ran) == sorted(plan) and len(ran) == len(set(ran))
    assert "softmax::dtype_agreement::bfloat16::cpu" in plan
    assert "softmax::gradient::float64::cpu" in plan
    assert "softmax::gradient::float32::cpu" in plan  # float32 derivatives checked too
    for p in parts:  # a partial certificate never reads certified
        assert all(t["verdict"] in ("not_checked", "failed") for t in p["targets"])

    merged = tmp / "merged.json"
    md = tmp / "merged.md"
    code, out, err = cli(capsys, "merge", *(tmp / f"p{k}.json" for k in (3, 1, 2)),
                         "--json", merged, "--markdown", md)
    assert code == 1, err  # as certify: a claimed property failed
    whole = json.loads((tmp / "all.json").read_text())
    got = json.loads(merged.read_text())
    assert _comparable(got) == _comparable(whole)
    for key in ("schema_version", "attnverify_version", "torch_version", "profile", "seed",
                "dtypes", "device", "max_examples"):
        assert got[key] == whole[key]
    assert got["missing_shards"] == [] and [m["shard"] for m in got["merged_from"]] == \
        ["1/3", "2/3", "3/3"]
    verdicts = {t["target"]: t["verdict"] for t in got["targets"]}
    assert verdicts["softmax"] == "certified" and "failed" in verdicts.values()
    failing = [r for t in got["targets"] for r in t["results"] if r["status"] == "violated"]
    assert failing and all(r["counterexample"]["repro"].startswith("attnverify repro")
                           for r in failing)
    assert "CERTIFIED" in out and md.read_text().startswith("# attnverify certificate")


def test_a_missing_shard_leaves_its_units_not_checked(capsys, runs):
    tmp, _ = runs
    merged = tmp / "two.json"
    code, _, err = cli(capsys, "merge", tmp / "p1.json", tmp / "p3.json", "--json", merged)
    assert code == 1 and "2/3 missing" in err
    got = json.loads(merged.read_text())
    assert got["missing_shards"] == ["2/3"]
    softmax = next(t for t in got["targets"] if t["target"] == "softmax")
    assert softmax["verdict"] == "not_checked"  # never certified on work that did not run
    unrun = [r for r in softmax["results"] if r["status"] == "not_checked"]
    assert unrun and all("2/3" in r["message"] for r in unrun)
    plan = json.loads((tmp / "p2.json").read_text())["shard"]["units"]
    assert {f"softmax::{r['property']}" for r in unrun} == \
        {u.rsplit("::", 2)[0] for u in plan if u.startswith("softmax::")}


def test_a_part_of_a_stopped_run_merges_with_its_unfinished_units_not_checked(capsys, runs):
    """A shard stopped part-way (``certify --shard`` under SIGTERM) writes the units it
    finished and ``interrupted``: the merge keeps those, leaves the others ``not_checked``
    saying so, says ``interrupted`` too and is exit 1 (incomplete)."""
    tmp, _ = runs
    part = json.loads((tmp / "p2.json").read_text())
    part["interrupted"] = "SIGTERM"
    dropped = set()
    for t in part["targets"]:
        for r in t["results"]:
            for u in r["units"]:
                if u.get("result") and len(dropped) < 3:
                    dropped.add(f"{t['target']}: {r['property']}")
                    u.pop("result")
                    u["status"] = "not_checked"
    assert dropped
    merged = tmp / "stopped.json"
    code, _, err = cli(capsys, "merge", tmp / "p1.json", _write(tmp / "p2s.json", part),
                       tmp / "p3.json", "--json", merged)
    assert code == 1 and "interrupted" not in err and "terminated (SIGTERM)" in err, err
    got = json.loads(merged.read_text())
    assert got["interrupted"] == "SIGTERM" and got["missing_shards"] == []
    unrun = {f"{t['target']}: {r['property']}": r for t in got["targets"]
             for r in t["results"] if r["status"] == "not_checked"}
    assert dropped <= set(unrun)
    assert all(r["message"].endswith("did not finish: the run was terminated (SIGTERM)")
               for r in unrun.values())


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d.update(seed=1), "differ in seed"),
    (lambda d: d.update(torch_version="0.0"), "differ in torch_version"),
    (lambda d: d.update(attnverify_version="0.0"), "differ in attnverify_version"),
    (lambda d: d.update(profile="ci"), "differ in profile"),
    (lambda d: d["targets"].pop(), "different targets"),
    (lambda d: d["targets"][0].update(claims=["simplex"]), "claims"),
    (lambda d: d["shard"].update(count=4), "shard of 4"),
])
def test_parts_of_different_runs_are_refused(capsys, runs, change, fragment):
    tmp, _ = runs
    other = json.loads((tmp / "p2.json").read_text())
    change(other)
    bad = _write(tmp / "other.json", other)
    out = tmp / "never.json"
    code, _, err = cli(capsys, "merge", tmp / "p1.json", bad, "--json", out)
    usage(code, err, fragment)
    assert not out.exists()


def test_overlapping_or_foreign_parts_are_refused(capsys, runs, tmp_path):
    tmp, _ = runs
    out = tmp_path / "never.json"
    code, _, err = cli(capsys, "merge", tmp / "p1.json", tmp / "p1.json", "--json", out)
    usage(code, err, "overlapping shards")
    code, _, err = cli(capsys, "merge", tmp / "p1.json", tmp / "all.json", "--json", out)
    usage(code, err, "not a partial certificate")
    (tmp_path / "bad.json").write_text("{")
    code, _, err = cli(capsys, "merge", tmp_path / "bad.json", "--json", out)
    usage(code, err, "not JSON")
    code, _, err = cli(capsys, "merge", tmp_path / "absent.json", "--json", out)
    usage(code, err, "cannot read")
    lying = json.loads((tmp / "p1.json").read_text())
    lying["shard"]["units"] = lying["shard"]["units"][:-1]  # claims fewer units than it owns
    code, _, err = cli(capsys, "merge", _write(tmp_path / "lying.json", lying), "--json", out)
    usage(code, err, "not those its plan gives")
    assert not out.exists()


def test_merge_applies_xfails_after_merging(capsys, runs, tmp_path):
    tmp, _ = runs
    xf = tmp_path / "xfails.txt"
    xf.write_text("*positional_softmax::*\n")
    code, _, err = cli(capsys, "merge", *(tmp / f"p{k}.json" for k in (1, 2, 3)),
                       "--xfails", xf, "--quiet")
    assert code == 0, err
    xf.write_text("nothing::here\n")
    code, _, err = cli(capsys, "merge", *(tmp / f"p{k}.json" for k in (1, 2, 3)), "--xfails", xf)
    usage(code, err, "nothing::here")


# --------------------------------------------------------------------------------------------
# Side effects seen by another shard's worker


TAMPERER = '''
import torch

def norm(scores, dim=-1):
    out = torch.softmax(scores, dim)
    if scores.numel() >= 12000:  # only the many-row battery cases of the first unit
        torch.set_default_dtype(torch.float64)
    return out
'''


def test_a_side_effect_in_any_shard_fails_the_merged_no_side_effects(capsys, tmp_path):
    src = tmp_path / "tamper.py"
    src.write_text(TAMPERER)
    args = ["certify", f"{src}:norm", "--profile", "dev", "--max-examples", "4", "--quiet",
            "--claims", ""]
    code, _, _ = cli(capsys, *args, "--json", tmp_path / "all.json")
    whole = json.loads((tmp_path / "all.json").read_text())
    status = {r["property"]: r["status"] for r in whole["targets"][0]["results"]}
    assert code == 1 and status["no_side_effects"] == "violated"
    for k in (1, 2, 3, 4):
        cli(capsys, *args, "--shard", f"{k}/4", "--json", tmp_path / f"p{k}.json")
    parts = [json.loads((tmp_path / f"p{k}.json").read_text()) for k in (1, 2, 3, 4)]
    assert any(p["targets"][0]["side_effects"] for p in parts)
    code, _, _ = cli(capsys, "merge", *(tmp_path / f"p{k}.json" for k in (1, 2, 3, 4)),
                     "--json", tmp_path / "merged.json")
    merged = json.loads((tmp_path / "merged.json").read_text())
    got = {r["property"]: r for r in merged["targets"][0]["results"]}
    assert code == 1 and got["no_side_effects"]["status"] == "violated"
    assert "default dtype" in got["no_side_effects"]["message"]
    assert merged["targets"][0]["verdict"] == whole["targets"][0]["verdict"] == "failed"


def test_a_side_effect_recorded_by_a_shard_without_the_property_fails_it(capsys, runs, tmp_path):
    """A shard whose worker saw a side effect while running other units records it; the merge
    fails no_side_effects on it even though every no_side_effects unit held where it ran."""
    tmp, _ = runs
    parts = [json.loads((tmp / f"p{k}.json").read_text()) for k in (1, 2, 3)]
    plan = parts[0]["shard"]["plan"]
    owners = {plan[u] for u in plan if u.startswith("softmax::no_side_effects::")}
    other = next(k for k in (1, 2, 3) if k not in owners) if len(owners) < 3 else 1
    case = {"case": "RowCase", "scores": [[0.5, -1.0, 2.0]], "temperature": None,
            "kind": "gaussian", "seed": 1, "dtype": "float32", "shape": [1, 3], "params": {}}
    parts[other - 1]["targets"][0]["side_effects"] = [
        {"what": "the default dtype changed from torch.float32 to torch.float64", "op": "call",
         "call": 17, "case": case}]
    paths = [_write(tmp_path / f"q{k}.json", p) for k, p in zip((1, 2, 3), parts)]
    out = tmp_path / "merged.json"
    code, _, _ = cli(capsys, "merge", *paths, "--json", out)
    got = {r["property"]: r for r in json.loads(out.read_text())["targets"][0]["results"]}
    nse = got["no_side_effects"]
    assert code == 1 and nse["status"] == "violated"
    assert all(u["status"] == "holds" for u in nse["units"])  # its own units held
    assert f"shard {other}/3" in nse["message"] and "default dtype" in nse["message"]
    assert nse["counterexample"]["scores"] == [[0.5, -1.0, 2.0]]
    assert nse["counterexample"]["repro"].startswith("attnverify repro softmax --property "
                                                     "no_side_effects")


# --------------------------------------------------------------------------------------------
# The same seed draws the same cases in every process


#: A user's module full of numbers in the ranges the cases draw from (temperatures, scales,
#: lengths, row counts, seeds).
CONSTANTS = "VALUES = [" + ", ".join(f"{i * 0.033 + 1e-3:.6g}, {3 + 7 * i}" for i in
                                     range(300)) + "]\n"


def _draws(tmp_path, guard, label: str) -> tuple[list, list]:
    """What a seeded Hypothesis run draws before and after a local module full of numbers is
    imported, under ``guard``."""
    import importlib
    import sys

    from hypothesis import given, seed, settings
    from hypothesis import strategies as st

    def run():
        seen = []

        @seed(7)
        @settings(max_examples=40, database=None, derandomize=False)
        @given(st.lists(st.integers(0, 3000), min_size=30, max_size=30))
        def body(values):
            seen.append(values)

        with guard():
            body()
        return seen

    before = run()
    folder = tmp_path / "userpkg"
    folder.mkdir(exist_ok=True)
    name = f"constants_mod_{label}"
    (folder / f"{name}.py").write_text(CONSTANTS)
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module(name)
        return before, run()
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


@pytest.mark.local_constants
def test_the_cases_do_not_depend_on_the_modules_loaded(tmp_path):
    """Hypothesis mixes constants from the source of the local modules loaded in the process
    into its draws; a shard, an unsharded run and a pytest session load different ones.
    attnverify's searches run without that pool (runconfig.seeded_generation): the same seed
    draws the same values whatever was imported. Without it they would not."""
    import contextlib

    from attnverify.runconfig import seeded_generation

    before, after = _draws(tmp_path, seeded_generation, "guarded")
    assert before == after
    before, after = _draws(tmp_path, contextlib.nullcontext, "plain")
    assert before != after, "Hypothesis no longer mixes in local constants: the guard is moot"


def _global_draws(context) -> list[float]:
    """``random.random()`` at the start of each of five examples of a search run in
    ``context``."""
    import random

    from hypothesis import given, settings
    from hypothesis import strategies as st

    seen: list[float] = []

    @settings(max_examples=5, database=None, derandomize=True)
    @given(st.integers(0, 10**6))
    def search(_):
        seen.append(random.random())

    with context:
        search()
    return seen


def test_a_search_behind_the_boundary_leaves_the_global_generators_alone():
    """Hypothesis seeds the global generators before every example (the same first draw each
    time); runconfig.unseeded_globals takes them out of its care for a search whose targets run
    in a worker, and hands them back after."""
    from hypothesis.internal import entropy

    from attnverify.runconfig import unseeded_globals

    seeded = _global_draws(unseeded_globals(False))
    assert len(set(seeded)) == 1, seeded
    before = dict(entropy.RANDOMS_TO_MANAGE.data)  # numpy's among them, once a search ran
    free = _global_draws(unseeded_globals(True))
    assert len(set(free)) == len(free), free
    assert dict(entropy.RANDOMS_TO_MANAGE.data) == before
    assert len(set(_global_draws(unseeded_globals(False)))) == 1
