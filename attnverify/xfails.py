"""Expected failures: a file of test-id patterns, one a line, ``#`` comments.

A test id is ``<target>::<property>`` (e.g. ``sparsemax::jacobian_spectral_half``). Each line of
an xfails file is ``TARGET::PROPERTY``, where each side is a name or a shell-style pattern
(``*`` any run of characters, ``?`` one character, ``[abc]`` one of a set), matched against the
whole side, case-sensitively: ``sparsemax::jacobian_spectral_half``, ``sparsemax::*``,
``*::thm1_fixed_distance``, ``entmax*::jacobian_*``. The target side matches the target as
given or its attribute name (``my_softmax`` for ``path/norms.py:my_softmax``). A failing result
whose id an entry matches is expected and does not fail the run, so CI can gate on regressions
only.

Entries are strict, because a loose one hides real failures: a line without ``::``, with an empty
side, or with nothing but wildcards on both sides (``*::*``); an entry that matches no test id of
the run; and one that matches every test id of a run over more than one target are usage errors
(exit 2, the line quoted). An entry that matches only results that now hold is warned about (the
entry can be removed).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

from attnverify.errors import UsageError

#: Largest xfails file read (bytes); beyond it the file is a usage error.
MAX_BYTES = 1_000_000


class Entry(str):
    """One pattern of an xfails file, remembering where it came from."""

    where: str = ""


def load_xfails(path: str) -> list[Entry]:
    """The entries of the file at ``path``; a syntax error names the file and line."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read xfails file {path!r}: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise UsageError(f"xfails file {path!r} is larger than {MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"xfails file {path!r} is not UTF-8 text (byte {exc.start})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        pattern = line.split("#", 1)[0].strip()
        if pattern:
            entry = Entry(pattern)
            entry.where = f"{path}:{number}"
            check_syntax(entry)
            entries.append(entry)
    return entries


def _located(entry: str) -> str:
    where = getattr(entry, "where", "")
    return f"xfails entry {str(entry)!r}" + (f" ({where})" if where else "")


def check_syntax(entry: str) -> None:
    target, sep, prop = entry.partition("::")
    if not sep or not target.strip() or not prop.strip():
        raise UsageError(f"{_located(entry)}: expected TARGET::PROPERTY (patterns with * ? [] "
                         "allowed on each side)")
    if set(target) <= {"*", "?"} and set(prop) <= {"*", "?"}:
        raise UsageError(f"{_located(entry)} matches every test id: name a target or a property")


def test_id(target: str, prop: str) -> str:
    return f"{target}::{prop}"


test_id.__test__ = False  # not a pytest test, whatever the importing module is called


def matches(entry: str, tid: str) -> bool:
    """Whether the pattern ``entry`` names the test id ``tid`` (each side matched whole)."""
    target, _, prop = entry.partition("::")
    tid_target, _, tid_prop = tid.rpartition("::")
    names = (tid_target, tid_target.rpartition(":")[2])  # as given, or its attribute name
    return fnmatchcase(tid_prop, prop) and any(fnmatchcase(n, target) for n in names)


def check_entries(entries: Iterable[str], ids: Iterable[str]) -> None:
    """Usage error for an entry that matches no id, or every id of a run of more than one (one
    target's ``name::*`` included: it would hide every failure the run can report)."""
    ids = list(ids)
    for entry in entries:
        check_syntax(entry)
        hits = sum(matches(entry, tid) for tid in ids)
        if not hits:
            raise UsageError(f"{_located(entry)} matches no test id of this run (ids look like "
                             f"{ids[0] if ids else 'softmax::simplex'!r})")
        if hits == len(ids) and len(ids) > 1:
            raise UsageError(f"{_located(entry)} matches every test id of this run: it would "
                             "hide every failure")


def apply_xfails(data: dict[str, Any], entries: list[str], warn=None) -> int:
    """Mark expected failures in ``data`` (``"xfail": true``); return the exit code (0 or 1)."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    used: dict[str, list[str]] = {e: [] for e in entries}
    unexpected = False
    for target in data["targets"]:
        target_failed = False
        for r in target["results"]:
            tid = test_id(target["target"], r["property"])
            hits = [e for e in entries if matches(e, tid)]
            for e in hits:
                used[e].append(r["status"])
            failing = r["claimed"] and r["status"] in ("violated", "error")
            if failing and hits:
                r["xfail"] = True
            elif failing:
                target_failed = True
        target["verdict_with_xfails"] = ("failed" if target_failed else
                                         "not_checked" if target["verdict"] == "not_checked"
                                         else "certified")
        unexpected |= target_failed
    for entry, statuses in used.items():
        if not statuses:
            warn(f"xfail entry {str(entry)!r} matches no test id")
        elif all(s == "holds" for s in statuses):
            warn(f"xfail entry {str(entry)!r} now passes (XPASS): remove it")
    return 1 if unexpected else 0
