"""Long campaigns on HypoFuzz (:mod:`attnverify.fuzz`, ``properties/test_fuzz.py``).

The end-to-end test runs ``hypothesis fuzz`` for real, as a user would, against a planted defect
(``tests/fixtures/planted_fuzz.py``: a softmax whose rows of 17 to 31 attended keys do not sum
to 1, which only ``simplex`` sees) that certify's ci profile with its fixed seed does not meet:
HypoFuzz starts, finds it, and leaves it in a directory database, from which ``certify
--database`` replays it (exit 1, a counterexample row of 17–31 attended keys) while the same
certify without the database passes. HypoFuzz is not seeded: the
test waits for the shrunk failure to reach the database (tens of seconds on a loaded machine,
most of it the start-up) and stops the campaign at once; :data:`FIND_WITHIN_S` only bounds a
campaign that finds nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import hypothesis
import pytest
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from attnverify.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "properties" / "test_fuzz.py"
PLANTED = f"{ROOT / 'tests' / 'fixtures' / 'planted_fuzz.py'}:tile_softmax"
#: The longest the campaign may take to file the shrunk failure (it takes seconds).
FIND_WITHIN_S = 240.0


def _key(target: str, prop_id: str = "simplex", dtypes: str = "float64") -> bytes:
    from attnverify.certify import database_key_of, make_context
    from attnverify.checks import PROPERTIES
    from attnverify.registry import load_target

    return database_key_of(PROPERTIES[prop_id], load_target(target),
                           make_context("ci", dtypes=dtypes))


def _attended(counterexample: dict) -> int:
    """The most attended (not -inf) keys of a row of a counterexample's scores."""
    rows = counterexample["scores"]
    rows = rows if isinstance(rows[0], list) else [rows]
    return max(sum(v != "-inf" for v in row) for row in rows)


def _fuzz_env(database: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNVERIFY_")}
    env.update(ATTNVERIFY_FUZZ_TARGET=PLANTED, ATTNVERIFY_FUZZ_DATABASE=str(database),
               ATTNVERIFY_FUZZ_DTYPES="float64", ATTNVERIFY_FUZZ_PROPERTIES="simplex",
               ATTNVERIFY_PROFILE="ci", **extra)
    return env


def _certify(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNVERIFY_")}
    return subprocess.run([sys.executable, "-m", "attnverify", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(autouse=True)
def _default_profile():
    """The entry makes its database Hypothesis's default (HypoFuzz wants that): give the default
    back after a test that builds the entry here."""
    name = hypothesis.settings.get_current_profile_name()
    yield
    hypothesis.settings.load_profile(name)


def _stop(proc: subprocess.Popen) -> None:
    """Stop the campaign: its process group (the hub and its fuzz workers; each worker's
    attnverify zygote exits when its worker's socket closes)."""
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.slow  # a real campaign: its start-up (two processes importing torch) takes seconds
def test_hypofuzz_campaign_finds_the_planted_defect_and_certify_replays_it(tmp_path, capsys):
    pytest.importorskip("hypofuzz", reason="hypofuzz is not installed (pip install "
                        "'attnverify[fuzz]'): the HypoFuzz campaign cannot run")
    database = tmp_path / "db"
    key = _key(PLANTED)
    log = (tmp_path / "fuzz.log").open("w")
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from hypothesis.extra.cli import main; "
         "sys.exit(main())", "fuzz", "--no-dashboard", "-n", "1", "--",
         str(ENTRY), "-p", "no:cacheprovider"],
        cwd=tmp_path, env=_fuzz_env(database), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    found: list[bytes] = []
    try:
        while time.monotonic() - start < FIND_WITHIN_S and proc.poll() is None:
            time.sleep(0.5)
            if database.exists():
                found = list(DirectoryBasedExampleDatabase(database).fetch(key))
                if found:
                    break
    finally:
        _stop(proc)
        log.close()
    elapsed = time.monotonic() - start
    text = (tmp_path / "fuzz.log").read_text()
    assert "using 1 process to fuzz 1 test" in text, text[-3000:]
    assert found, f"no failure filed in {elapsed:.0f}s; the campaign said:\n{text[-3000:]}"

    # certify (the ci profile, its fixed seed) replays it from the database: exit 1 on the
    # simplex property, a row of 17 to 31 attended keys. Both certify runs are the command line
    # in a process of its own, as a user runs it (what Hypothesis draws can depend on the
    # modules loaded in the process).
    args = ["certify", PLANTED, "--dtypes", "float64", "--profile", "ci", "--quiet"]
    cert = tmp_path / "with.json"
    done = _certify(tmp_path, *args, "--database", str(database), "--json", str(cert))
    assert done.returncode == 1, done.stdout + done.stderr
    target = json.loads(cert.read_text())["targets"][0]
    bad = {r["property"]: r for r in target["results"] if r["status"] == "violated"}
    assert set(bad) == {"simplex"}, bad
    assert 17 <= _attended(bad["simplex"]["counterexample"]) <= 31
    assert "row sum" in bad["simplex"]["message"]

    # ... while the same certify without the database does not meet the defect: the replay made
    # the failure
    plain = tmp_path / "without.json"
    done = _certify(tmp_path, *args, "--json", str(plain))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(plain.read_text())["targets"][0]["verdict"] == "certified"


def test_entry_without_a_target_is_one_skipped_test():
    from attnverify.fuzz import SKIP_REASON, entry_tests

    tests = entry_tests({})
    assert list(tests) == ["test_fuzz_entry"]
    (mark,) = [m for m in tests["test_fuzz_entry"].pytestmark if m.name == "skip"]
    assert mark.kwargs["reason"] == SKIP_REASON


@pytest.mark.parametrize("env, fragment", [
    ({"ATTNVERIFY_FUZZ_DATABASE": ""}, "ATTNVERIFY_FUZZ_DATABASE is not set"),
    ({"ATTNVERIFY_FUZZ_DATABASE": "/etc/passwd"}, "is not a directory"),
    ({"ATTNVERIFY_FUZZ_DTYPES": "float7"}, "unknown dtype 'float7'"),
    ({"ATTNVERIFY_FUZZ_PROPERTIES": "simplex,nosuch"}, "'nosuch' is not among"),
    ({"ATTNVERIFY_FUZZ_CLAIMS": "nosuch"}, "unknown property id 'nosuch'"),
])
def test_entry_bad_configuration_is_a_usage_error(tmp_path, env, fragment):
    from attnverify.fuzz import entry_tests

    environ = {"ATTNVERIFY_FUZZ_TARGET": "softmax",
               "ATTNVERIFY_FUZZ_DATABASE": str(tmp_path / "db"), **env}
    with pytest.raises(pytest.UsageError, match="attnverify fuzz: ") as info:
        entry_tests(environ)
    assert fragment in str(info.value)


def test_unit_keys_map_a_tests_digest_to_its_unit_key_and_back():
    """HypoFuzz files a test's entries under the digest of its function salted with the pytest
    node id; UnitKeys files them under the unit's key, and tells changes with the digest."""
    from hypothesis import given
    from hypothesis import strategies as st
    from hypothesis.internal.reflection import function_digest

    from attnverify.fuzz import UnitKeys

    @given(st.integers())
    def one(x):
        pass

    @given(st.integers())
    def two(x):
        pass

    store = InMemoryExampleDatabase()
    keyed = UnitKeys(store)
    keyed.add(one, b"attnverify/certify/one")
    keyed.add(two, b"attnverify/certify/two")
    one.hypothesis.inner_test._hypothesis_internal_add_digest = b"tests/x.py::one"  # HypoFuzz's
    digest = function_digest(one.hypothesis.inner_test)
    events = []
    keyed.add_listener(events.append)
    keyed.save(digest, b"failure")
    keyed.save(digest + b".hypofuzz.corpus", b"c")
    keyed.save(b"hypofuzz.worker_uuids", b"u")
    assert list(store.fetch(b"attnverify/certify/one")) == [b"failure"]
    assert list(store.fetch(b"attnverify/certify/one.hypofuzz.corpus")) == [b"c"]
    assert list(store.fetch(b"hypofuzz.worker_uuids")) == [b"u"]  # not a test's: unchanged
    assert list(keyed.fetch(digest)) == [b"failure"]
    assert ("save", (digest, b"failure")) in events
    keyed.move(digest, digest + b".secondary", b"failure")
    assert list(store.fetch(b"attnverify/certify/one.secondary")) == [b"failure"]
    assert not list(store.fetch(b"attnverify/certify/two"))


def test_falsify_strata_entry_files_its_witness_where_falsify_replays_it(tmp_path, capsys):
    """The falsify entry: one test per stratum of falsify's search, keyed as ``falsify
    --database`` keys the stratum's corpus; a case that breaks the bound fails the test and is
    kept as a witness that falsify's replay phase meets first."""
    from attnverify.fuzz import Falsified, falsify_tests

    bound = "max_weight <= 0.999"  # false on every one-key row (its weight is 1)
    database = tmp_path / "db"
    tests = falsify_tests({"ATTNVERIFY_FUZZ_TARGET": "softmax", "ATTNVERIFY_FUZZ_DATABASE":
                           str(database), "ATTNVERIFY_FUZZ_EXPRESSION": bound,
                           "ATTNVERIFY_FUZZ_MAX_LENGTH": "256"})
    assert {"test_falsify__L_1", "test_falsify__L_9_32", "test_falsify__L_17_255_masked"} <= \
        set(tests)
    test = tests["test_falsify__L_1"]
    keyed = test._hypothesis_internal_use_settings.database
    hypothesis.seed(0)(test)  # deterministic here; @seed drops the database, given back below
    test._hypothesis_internal_use_settings = hypothesis.settings(
        test._hypothesis_internal_use_settings, database=keyed)
    with pytest.raises(Falsified, match="max_weight <= 0.999 fails"):
        test()
    assert list(DirectoryBasedExampleDatabase(database).fetch(
        test._hypothesis_internal_database_key)), "the stratum's failure is not filed"

    out_json = tmp_path / "falsify.json"
    code = main(["falsify", "softmax", bound, "--max-length", "256", "--database", str(database),
                 "--json", str(out_json)])
    capsys.readouterr()
    assert code == 1
    data = json.loads(out_json.read_text())
    assert data["database"]["witness_replayed"] is True
    assert data["witness"]["L"] == 1


def test_falsify_entry_keys_are_the_keys_falsify_fills(tmp_path, capsys):
    """Every stratum test's key is one ``falsify --database`` itself files that stratum's
    Hypothesis corpus under (a bound that holds: every stratum searched, its Pareto front
    kept)."""
    from attnverify.fuzz import falsify_tests

    database = tmp_path / "db"
    # a true bound its quantities' ranges do not decide (max_weight <= 1 needs no search now)
    code = main(["falsify", "softmax", "max_weight >= 1/L", "--profile", "dev", "--max-length",
                 "64", "--database", str(database)])
    capsys.readouterr()
    assert code == 0
    stored = set(DirectoryBasedExampleDatabase(database).fetch(
        DirectoryBasedExampleDatabase(database)._metakeys_name))
    tests = falsify_tests({"ATTNVERIFY_FUZZ_TARGET": "softmax", "ATTNVERIFY_FUZZ_DATABASE":
                           str(tmp_path / "other"), "ATTNVERIFY_FUZZ_EXPRESSION":
                           "max_weight >= 1/L", "ATTNVERIFY_FUZZ_MAX_LENGTH": "64"})
    keys = {name: t._hypothesis_internal_database_key for name, t in tests.items()}
    assert len(keys) == 10  # L = 1, 2, 3, 4-5, 6-8, 9-32, 33-64; masked 1-3, 4-16, 17-63
    missing = [name for name, k in keys.items() if k + b".pareto" not in stored]
    assert not missing, missing


@pytest.mark.slow  # the target planned in a worker, then two certify runs of the ci profile
def test_certify_database_replays_what_a_unit_test_filed(tmp_path, capsys):
    """certify --database and the entry share keys: the entry's simplex test, run here under
    plain Hypothesis with a fixed seed, files a failure (a row of 17-31 attended keys); certify
    (ci, seed 0), which does not meet it alone, replays it from the database and fails on it."""
    from attnverify.fuzz import certify_tests

    database = tmp_path / "db"
    tests = certify_tests({"ATTNVERIFY_FUZZ_TARGET": PLANTED, "ATTNVERIFY_FUZZ_DATABASE":
                           str(database), "ATTNVERIFY_FUZZ_DTYPES": "float64",
                           "ATTNVERIFY_FUZZ_PROPERTIES": "simplex"})
    assert list(tests) == ["test_simplex__float64"]
    test = tests["test_simplex__float64"]
    assert test._hypothesis_internal_database_key == _key(PLANTED)
    keyed = test._hypothesis_internal_use_settings.database
    hypothesis.seed(0)(test)  # deterministic here; @seed drops the database, given back below
    test._hypothesis_internal_use_settings = hypothesis.settings(
        test._hypothesis_internal_use_settings, database=keyed, max_examples=1000)
    with pytest.raises(Exception, match="row sum"):
        test()
    assert list(DirectoryBasedExampleDatabase(database).fetch(_key(PLANTED)))

    code = main(["certify", PLANTED, "--dtypes", "float64", "--profile", "ci", "--quiet",
                 "--database", str(database)])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out, out  # certify alone passes: the campaign test shows it


@pytest.mark.parametrize("extra, fragment", [
    (["--database", "/etc/passwd"], "--database: /etc/passwd is not a directory"),
    (["--database", "redis://127.0.0.1:0/0"], "port 0"),
    (["--attention", "sdpa", "--database", "db"], "--database applies to normalizer"),
])
def test_certify_database_bad_input_is_exit_2(capsys, extra, fragment):
    code = main(["certify", "softmax", "--profile", "dev", *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
