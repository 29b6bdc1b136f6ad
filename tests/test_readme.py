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
