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


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


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


def test_every_attnverify_command_exists_with_its_options():
    parser = _parser()
    commands = _subparsers(parser)
    used = [argv for _job, argv in _commands(_workflow()) if argv[0] == "attnverify"]
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


def test_every_file_the_workflow_reads_ships_as_a_template():
    text = WORKFLOW.read_text(encoding="utf-8")
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
