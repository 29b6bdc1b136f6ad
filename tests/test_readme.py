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
        row = re.search(rf"^\| `{name}` \| (\d+) \| (\d+) \|", README, flags=re.M)
        assert row, f"profile {name} missing from README"
        assert int(row.group(1)) == limits["max_examples"]
        assert int(row.group(2)) == limits["max_length"]


def test_universal_properties_listed():
    universal = [p.id for p in PROPERTIES.values() if p.universal and p.id != "dtype_agreement"]
    for pid in universal:
        assert f"`{pid}`" in README


def test_torch_pin_matches_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    pin = re.search(r'"torch==([\d.]+)"', pyproject).group(1)
    assert f"torch=={pin}" in README
