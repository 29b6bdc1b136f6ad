"""No import cycles among attnverify's modules, and every package is in pyproject.toml.

What counts as an import: every ``import`` and ``from ... import`` statement anywhere in a
module, at module level or inside a function (a lazy import is still a dependency; hiding a
cycle behind one is what this test exists to stop). ``from pkg import name`` depends on the
submodule ``pkg.name`` when ``name`` is a submodule (``.py``, a package or a C extension), and on
``pkg`` itself otherwise. Importing a submodule also runs its parent packages' ``__init__``, but
that implicit edge is not counted: a package's ``__init__`` importing its own submodules is
the normal layout, not a cycle. ``properties/`` is read as ``attnverify.properties``, as it is
installed.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Source folders and the package each one installs as (pyproject.toml's package-dir).
SOURCES = {ROOT / "attnverify": "attnverify", ROOT / "properties": "attnverify.properties"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for base, package in SOURCES.items():
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _extensions() -> set[str]:
    """C extension modules (built or not), named from their ``.c`` sources."""
    out = set()
    for base, package in SOURCES.items():
        for path in base.rglob("*.c"):
            parts = path.relative_to(base).with_suffix("").parts
            out.add(".".join([package, *parts]))
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the attnverify modules it imports (see the module docstring for the rules)."""
    mods = _modules()
    known = set(mods) | _extensions()

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
                targets.update(subs)
                if len(subs) < len(node.names):
                    targets.add(module)
        graph[name] = {
            t
            for t in map(owner, (t for t in targets if t.split(".")[0] == "attnverify"))
            if t and t != name and t in mods
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 30 and "attnverify.properties.test_properties" in graph
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_lazy_imports_count(tmp_path, monkeypatch):
    """A function-level import is an edge: the registry <-> normalizers cycle would be caught."""
    pkg = tmp_path / "attnverify"
    (pkg / "normalizers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "registry.py").write_text(
        "def builtins():\n    from attnverify.normalizers import BUILTINS\n    return BUILTINS\n"
    )
    (pkg / "normalizers" / "__init__.py").write_text(
        "from attnverify.registry import builtins\nfrom . import _fused\nBUILTINS = {}\n"
    )
    (pkg / "normalizers" / "_fused.c").write_text("")
    monkeypatch.setitem(SOURCES, pkg, "attnverify")
    for base in [b for b in SOURCES if b != pkg]:
        monkeypatch.delitem(SOURCES, base)
    graph = import_graph()
    assert graph["attnverify.normalizers"] == {"attnverify.registry"}
    assert cycles(graph) == [["attnverify.normalizers", "attnverify.registry"]]


def test_every_package_is_installed():
    """pyproject.toml lists its packages (properties/ is mapped in); none may be forgotten."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^\[tool\.setuptools\]\s*\npackages\s*=\s*\[(.*?)\]", text, re.S | re.M)
    assert block, "pyproject.toml: [tool.setuptools] packages = [...] not found"
    listed = set(re.findall(r'"([\w.]+)"', block.group(1)))
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert listed == packages
    assert re.search(r'^"attnverify\.properties"\s*=\s*"properties"', text, re.M)


def test_package_and_plugin_import_without_torch():
    """The plugin is auto-loaded in every adopter's pytest run: importing it (or the package's
    public names other than the attention records) must not import torch."""
    code = ("import sys, attnverify, attnverify.pytest_plugin; "
            "from attnverify import Kernel, NormalizerSpec, load_target, normalizer_spec; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from attnverify import attention_spec; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


#: What may keep an import inside a function (docs/ARCHITECTURE.md, "Rules the layout keeps"):
#: the comment on the import's first line starts with one of these (after a ``noqa: CODE -``).
REASONS = (
    "dispatch",  # a subcommand's module, imported when the command is dispatched
    "optional dependency",  # an extra: triton, transformers, redis, matplotlib, pytest, ...
    "torch-free",  # a module that must import without torch (the package, plugin, parser)
    "worker",  # what the worker process loads late (the zygote imports torch after it)
    "heavy",  # a costly import (torch._dynamo, scipy.optimize) that one path alone needs
    "cycle:",  # a cycle that moving code cannot break, named
    "side effect",  # imported for what importing it does, not for a name
)


def _reason(comment: str) -> bool:
    text = re.sub(r"^noqa(:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*)?\s*(-\s*)?", "", comment.strip())
    return text.lower().startswith(REASONS)


def function_level_imports(source: str) -> list[tuple[int, str]]:
    """``(line, comment)`` of every import inside a function: the comment on its first line,
    else a comment line right above it (where the import fills its line); ``""`` when none."""
    lines = source.splitlines()
    out = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line = lines[node.lineno - 1]
                    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                    comment = line.split("#", 1)[1] if "#" in line else \
                        above[1:] if above.startswith("#") else ""
                    out.append((node.lineno, comment))
    return sorted(set(out))


def test_function_level_imports_name_their_reason():
    """Imports go at the top of a module; one inside a function says why on its line."""
    bare = [
        f"{path.relative_to(ROOT)}:{line}: {comment.strip() or '(no comment)'}"
        for path in sorted((ROOT / "attnverify").rglob("*.py"))
        for line, comment in function_level_imports(path.read_text(encoding="utf-8"))
        if not _reason(comment)
    ]
    assert bare == [], (
        f"{len(bare)} function-level imports without a reason ({', '.join(REASONS)}); "
        "move them to the top of the module:\n" + "\n".join(bare)
    )


def test_the_reason_check_by_hand():
    source = (
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    from attnverify import report  # dispatch: imports torch\n"
        "    import triton  # optional dependency (attnverify[triton])\n"
        "    import torch._decomp  # noqa: F401 - side effect: registers the decompositions\n"
        "    class C:\n"
        "        def g(self):\n"
        "            from attnverify import certify  # because\n"
        "            # heavy: scipy.optimize, only the polish step\n"
        "            from scipy.optimize import minimize\n"
        "            import numpy  # noqa: F401\n"
    )
    found = function_level_imports(source)
    assert [line for line, _ in found] == [3, 4, 5, 6, 9, 11, 12]
    assert [_reason(c) for _, c in found] == [False, True, True, True, False, True, False]


def test_the_parser_imports_no_torch():
    """``attnverify --help`` (and any usage error) builds the whole parser: no torch, no
    Hypothesis, no numpy on that path; each subcommand imports them when it is dispatched."""
    code = ("import sys, attnverify.cli; attnverify.cli.build_parser(); "
            "heavy = sorted({'torch', 'hypothesis', 'numpy', 'scipy'} & set(sys.modules)); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
