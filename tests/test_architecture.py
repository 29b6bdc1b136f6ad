"""docs/ARCHITECTURE.md stays true: every module under attnverify/ is listed, and every path it
names exists.

A module is listed by a table row ``| `name.py` | … |`` under the heading of its package
(``### `attnverify/checks/```). ``__init__.py`` and ``__main__.py`` may be listed but need not be:
the package's own heading covers them. Every other backticked path in the document
(``attnverify/…``, ``tests/…``, ``docs/…``, ``benchmarks/…``, ``properties/…``) must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE = ROOT / "attnverify"
MODULE_SUFFIXES = (".py", ".c")
OPTIONAL = {"__init__.py", "__main__.py"}
ROOTS = ("attnverify/", "tests/", "docs/", "benchmarks/", "properties/", ".ci/")


def _modules() -> set[str]:
    """Every module file under attnverify/, as a repository-relative path."""
    return {
        f.relative_to(ROOT).as_posix()
        for f in PACKAGE.rglob("*")
        if f.is_file() and f.suffix in MODULE_SUFFIXES and "__pycache__" not in f.parts
        and f.name not in OPTIONAL
    }


def _listed(text: str) -> tuple[set[str], set[str]]:
    """``(rows, mentioned)``: paths of the table rows (resolved against their package heading)
    and every other backticked repository path in the document."""
    rows, heading = set(), None
    for line in text.splitlines():
        head = re.match(r"^#+\s+`([^`]+/)`\s*$", line)
        if head:
            heading = head.group(1)
            continue
        if line.startswith("#"):
            heading = None
        row = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
        if row and heading:
            rows.add(heading + row.group(1))
        elif row:
            rows.add(row.group(1))
    mentioned = {m for m in re.findall(r"`([^`\s]+)`", text) if m.startswith(ROOTS)}
    return rows, mentioned


def test_every_module_is_listed_and_every_listed_path_exists():
    rows, mentioned = _listed(DOC.read_text(encoding="utf-8"))
    missing = sorted(_modules() - rows)
    stale = sorted(p for p in rows | mentioned if not (ROOT / p.rstrip("/")).exists())
    assert not (missing or stale), (
        "docs/ARCHITECTURE.md is out of date.\n"
        f"  modules not listed (add a row under the package's heading): {missing}\n"
        f"  listed paths that do not exist: {stale}"
    )


def test_the_parser_resolves_rows_against_their_heading():
    text = "### `attnverify/checks/`\n\n| module | role |\n| `base.py` | x |\n\n## Other\n" \
           "| `constraints.txt` | y |\nsee `tests/test_nope.py`"
    rows, mentioned = _listed(text)
    assert rows == {"attnverify/checks/base.py", "constraints.txt"}
    assert mentioned == {"attnverify/checks/", "tests/test_nope.py"}
