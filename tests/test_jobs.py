"""``certify --jobs N`` (issue #27): the units on N checker processes over the shard and merge
machinery give the serial run's certificate, apart from seconds and process ids."""

from __future__ import annotations

import json

import pytest

from attnverify import jobs
from attnverify.cli import main

RUN = ["softmax", "sparsemax", "--profile", "dev", "--max-examples", "3", "--claims", "", "--quiet"]


def _comparable(cert: dict) -> dict:
    cert = json.loads(json.dumps(cert))
    cert.pop("checker_pid")
    for t in cert["targets"]:
        t.pop("worker_pids")
        for r in t["results"]:
            r.pop("elapsed_s")
            for u in r["units"]:
                u.pop("elapsed_s")
    return cert


@pytest.mark.slow  # two whole certifications
def test_two_jobs_write_the_serial_certificate(capsys, tmp_path):
    paths = {}
    for n in (1, 2):
        paths[n] = tmp_path / f"jobs{n}.json"
        code = main(["certify", *RUN, "--jobs", str(n), "--json", str(paths[n]),
                     "--markdown", str(tmp_path / f"jobs{n}.md")])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out.count("CERTIFIED") == 2 and "Traceback" not in err
    serial, parallel = (json.loads(paths[n].read_text()) for n in (1, 2))
    assert list(serial) == list(parallel)  # the same keys in the same order
    assert "merged_from" not in parallel and "shard" not in parallel
    assert _comparable(serial) == _comparable(parallel)
    # the units ran in other processes: their workers are not the serial run's
    assert set(serial["targets"][0]["worker_pids"]).isdisjoint(
        parallel["targets"][0]["worker_pids"])


def test_each_job_runs_the_same_command_as_one_shard():
    argv = ["certify", "a", "b", "--json=x.json", "--quiet", "--jobs", "4", "--seed", "random",
            "--xfails", "f", "--profile", "ci"]
    assert jobs.job_argv(argv, 2, 3, 7, "/p/2.json", quiet=True) == [
        "certify", "a", "b", "--profile", "ci", "--shard", "2/3", "--seed", "7",
        "--json", "/p/2.json", "--jobs", "1", "--quiet"]


@pytest.mark.parametrize("argv, fragment", [
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "many"], "--jobs"),
    (["--jobs", "2", "--shard", "1/2"], "--jobs 2 with --shard"),
    (["--jobs", "2", "--no-isolation"], "--jobs 2 with --no-isolation"),
])
def test_bad_jobs_are_exit_2(capsys, argv, fragment):
    code = main(["certify", "softmax", "sparsemax", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and fragment in err and err.count("\n") == 1, err


def test_the_default_is_the_cores_at_most_one_per_target(monkeypatch):
    class Args:
        jobs = shard = database = attention = None
        no_isolation = False
        argv = ["certify"]

    monkeypatch.delenv(jobs.JOBS_ENV, raising=False)
    monkeypatch.setattr(jobs, "cores", lambda: 2)
    assert jobs.job_count(Args, ["softmax"]) == 1
    assert jobs.job_count(Args, ["softmax", "sparsemax", "entmax15"]) == 2
    monkeypatch.setenv(jobs.JOBS_ENV, "1")
    assert jobs.job_count(Args, ["softmax", "sparsemax"]) == 1
    Args.database = "dir"
    monkeypatch.delenv(jobs.JOBS_ENV)
    assert jobs.job_count(Args, ["softmax", "sparsemax"]) == 1
