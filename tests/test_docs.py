"""The documents in docs/ exist, name only things that exist, and nothing user-facing points
outside the repository (a clone or a pip install has no ``../shared``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnverify import bounds
from attnverify.checks import PROPERTIES
from attnverify.normalizers import BUILTINS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SPEC_DOCS = ("THEORY.md", "NORMALIZERS.md", "INTERFACES.md")

#: What users get: these paths must not depend on the team's working material beside the repo.
USER_FACING = ("README.md", "docs", "attnverify", "benchmarks", "properties", "pyproject.toml",
               "tox.ini", "constraints.txt", ".ci", "asv.conf.json")
TEXT_SUFFIXES = {".py", ".md", ".c", ".toml", ".ini", ".txt", ".json", ".yml", ".yaml", ".cfg", ""}
#: Records of past runs, kept as measured: the path a run was given is data, not a pointer to
#: follow (the text's sha256 beside it identifies the file).
RECORDS = {"docs/empirical/smollm2-135m/results.json"}
OUTSIDE = re.compile(r"\.\./shared|shared/data|shared/spec|/work/shared")
#: A bare reference to a spec document (not ``docs/THEORY.md``), or to STYLE.md, which is not in
#: the repository at all.
BARE_SPEC = re.compile(r"(?<![\w/.-])(THEORY|NORMALIZERS|INTERFACES)\.md|STYLE\.md")


def _read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _user_facing_files():
    for entry in USER_FACING:
        path = ROOT / entry
        if path.is_file():
            yield path
        elif path.is_dir():
            for f in sorted(path.rglob("*")):
                if (f.is_file() and f.suffix in TEXT_SUFFIXES and "__pycache__" not in f.parts
                        and not f.name.endswith(".egg-info")):
                    yield f


@pytest.mark.parametrize("name", SPEC_DOCS)
def test_spec_documents_ship_in_docs(name):
    assert len(_read(name)) > 1000, f"docs/{name} is missing or nearly empty"


def test_every_property_id_is_documented():
    text = _read("INTERFACES.md") + _read("THEORY.md")
    missing = [pid for pid in PROPERTIES if f"`{pid}`" not in text]
    assert not missing, f"property ids in attnverify.checks.PROPERTIES but in neither " \
                        f"docs/INTERFACES.md nor docs/THEORY.md: {missing}"


def test_every_attention_property_and_kernel_is_documented():
    props = pytest.importorskip("attnverify.attention.properties")
    kernels = pytest.importorskip("attnverify.attention.kernels")
    text = _read("INTERFACES.md")
    ids = list(props.ATTENTION_PROPERTIES)
    ids += [k for k in kernels.builtins() if not k.startswith("eager_")]
    missing = [i for i in ids if f"`{i}`" not in text]
    assert not missing, f"attention ids missing from docs/INTERFACES.md: {missing}"


def test_every_builtin_is_in_the_normalizer_table():
    text = _read("NORMALIZERS.md")
    missing = [nid for nid in BUILTINS if f"| `{nid}` |" not in text and f"`{nid}`" not in text]
    assert not missing, f"built-ins missing from docs/NORMALIZERS.md: {missing}"


def test_theory_names_only_real_bounds_tests_and_properties():
    text = _read("THEORY.md")
    named_bounds = set(re.findall(r"`bounds\.(\w+)`", text))
    named_tests = set(re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", text))
    named_props = set()
    for line in re.findall(r"^- property: (.*)$", text, flags=re.M):
        named_props.update(re.findall(r"`(\w+)`", line))
    assert len(named_bounds) >= 30 and len(named_tests) >= 30 and len(named_props) >= 15
    bad_bounds = sorted(b for b in named_bounds if not callable(getattr(bounds, b, None)))
    bad_tests = sorted(
        f"{path}::{name}" for path, name in named_tests
        if not (ROOT / path).is_file()
        or not re.search(rf"^def {name}\(", (ROOT / path).read_text(), flags=re.M)
    )
    bad_props = sorted(p for p in named_props if p not in PROPERTIES)
    assert not (bad_bounds or bad_tests or bad_props), (
        f"docs/THEORY.md names what does not exist: bounds {bad_bounds}, tests {bad_tests}, "
        f"properties {bad_props}"
    )


def test_every_paper_property_is_placed_in_the_theory():
    """Each paper claim (a property the papers state) has a section with its tag."""
    text = _read("THEORY.md")
    placed = set()
    for line in re.findall(r"^- property: (.*)$", text, flags=re.M):
        placed.update(re.findall(r"`(\w+)`", line))
    paper = [pid for pid in PROPERTIES if pid.startswith(
        ("lemma", "cor", "thm", "jacobian_spectral", "fd_", "gpam"))]
    missing = [pid for pid in paper if pid not in placed]
    assert not missing, f"paper claims without a '- property:' line in docs/THEORY.md: {missing}"
    for tag in ("stated", "derived", "choice", "false"):
        assert f"**{tag}**" in text


def test_theory_table_lists_every_claims_row_with_its_verdict():
    from attnverify.claims import _rows

    text = _read("THEORY.md")
    wrong = []
    for row, _run in _rows():
        line = re.search(rf"^\| {re.escape(row.claim)} \| ([^|]+) \| (\w+) \|", text, flags=re.M)
        if not line or (line.group(1).strip(), line.group(2)) != (row.checked_on, row.expected):
            wrong.append(f"{row.claim!r} ({row.checked_on}, {row.expected})")
    assert not wrong, f"rows of `attnverify claims` missing or different in docs/THEORY.md §7: " \
                      f"{wrong}"


def test_nothing_user_facing_points_outside_the_repository():
    offenders = []
    for f in _user_facing_files():
        text = f.read_text(encoding="utf-8", errors="replace")
        rel = f.relative_to(ROOT)
        if rel.as_posix() in RECORDS:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()[:100]}")
            # inside docs/ a bare THEORY.md is a relative link to docs/THEORY.md
            elif rel.parts[0] != "docs" and BARE_SPEC.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()[:100]}")
            elif rel.parts[0] == "docs" and "STYLE.md" in line:
                offenders.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not offenders, (
        "user-facing files refer to material outside the repository (use docs/THEORY.md, "
        "docs/NORMALIZERS.md, docs/INTERFACES.md):\n" + "\n".join(offenders)
    )


def test_the_check_catches_a_bare_reference(tmp_path):
    assert BARE_SPEC.search("match THEORY.md §7") and BARE_SPEC.search("(INTERFACES.md)")
    assert BARE_SPEC.search("see STYLE.md")
    assert not BARE_SPEC.search("match docs/THEORY.md §7")
    assert OUTSIDE.search("`../shared/data/war_and_peace.txt`")


def test_falsify_limits_in_the_contract_match_the_parser():
    from attnverify import expr

    text = " ".join(_read("INTERFACES.md").split())
    assert f"longer than {expr.MAX_LENGTH} characters" in text
    assert f"nested deeper than {expr.MAX_DEPTH} levels" in text


def test_every_plugin_option_and_its_variable_are_documented():
    from attnverify import pytest_plugin

    text = _read("INTERFACES.md")
    missing = [f"--attnverify-{name} ({env})" for name, env, _help in pytest_plugin._OPTIONS
               if f"`--attnverify-{name}`" not in text or f"`{env}`" not in text]
    assert not missing, f"pytest plugin options missing from docs/INTERFACES.md: {missing}"
