"""The text the model reads: loading, Project Gutenberg stripping, and token windows.

Without ``--text`` the model check reads the excerpt of *War and Peace* shipped inside the
package (``attnverify/empirical/data/``, whose README states its source, extent, checksum and
licence). ``--text`` takes any UTF-8 file, plain or compressed (``.xz``, ``.gz``).
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import hashlib
import lzma
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from attnverify.errors import UsageError

#: The packaged default text, under ``attnverify/empirical/data/``.
DEFAULT_TEXT_NAME = "war_and_peace_excerpt.txt.xz"
_START = re.compile(r"^\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG", re.IGNORECASE)
_END = re.compile(r"^\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG", re.IGNORECASE)
_HEADING = re.compile(r"^(BOOK|PART|VOLUME|CHAPTER)\b")
_DECOMPRESS = {".xz": lzma.decompress, ".gz": gzip.decompress}
_RESOURCE_FILES = contextlib.ExitStack()  # extracted copies when installed as a zip
atexit.register(_RESOURCE_FILES.close)


@dataclass(frozen=True)
class Text:
    """The prose the model reads, where it came from and its checksum (of the file's bytes,
    after decompression for a compressed file)."""

    path: Path
    prose: str
    sha256: str
    first_line: int  # 1-based line of the file where the prose starts


def find_default_text() -> Path | None:
    """The path of the packaged default text, or None when the installation lacks it."""
    resource = resources.files("attnverify.empirical") / "data" / DEFAULT_TEXT_NAME
    if not resource.is_file():
        return None
    if isinstance(resource, Path):
        return resource
    return Path(_RESOURCE_FILES.enter_context(resources.as_file(resource)))


def resolve_text_path(text: Path | None) -> Path:
    """``--text`` as given, or the packaged default text."""
    if text is not None:
        return Path(text)
    found = find_default_text()
    if found is None:
        raise UsageError(
            f"no --text given and the packaged default text ({DEFAULT_TEXT_NAME}) is missing from "
            "this installation: pass --text PATH to a UTF-8 text file, or reinstall attnverify"
        )
    return found


def load_text(path: Path) -> Text:
    """Read a UTF-8 file (BOM allowed; ``.xz`` and ``.gz`` are decompressed) and keep its prose:
    a Project Gutenberg header, table of contents and license are dropped (see
    :func:`gutenberg_prose`)."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        raise UsageError(f"--text {str(path)!r} is not a regular file (a device or a pipe)")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"text file not found: {str(path)!r}") from None
    except IsADirectoryError:
        raise UsageError(f"--text {str(path)!r} is a directory, not a text file") from None
    except OSError as exc:
        raise UsageError(f"cannot read text file {str(path)!r}: {exc.strerror}") from None
    raw = _decompressed(path, raw)
    try:
        decoded = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"text file {str(path)!r} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}): convert it, e.g. iconv -f LATIN1 -t UTF-8"
        ) from None
    prose, first_line = gutenberg_prose(decoded)
    if not prose.strip():
        raise UsageError(f"text file {str(path)!r} holds no prose")
    digest = hashlib.sha256(raw).hexdigest()
    return Text(path=path, prose=prose, sha256=digest, first_line=first_line)


def _decompressed(path: Path, raw: bytes) -> bytes:
    decompress = _DECOMPRESS.get(path.suffix.lower())
    if decompress is None:
        return raw
    try:
        return decompress(raw)
    except (lzma.LZMAError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise UsageError(
            f"text file {str(path)!r} is not a valid {path.suffix[1:]} file: {exc}"
        ) from None


def gutenberg_prose(text: str) -> tuple[str, int]:
    """The prose of a Project Gutenberg e-book and the 1-based line where it starts.

    [choice] Everything up to the ``*** START OF … PROJECT GUTENBERG`` line and from the
    ``*** END OF …`` line on is dropped. A table of contents is skipped by starting at the
    *second* occurrence of the first heading line (``BOOK``/``PART``/``VOLUME``/``CHAPTER``):
    for War and Peace that is ``BOOK ONE: 1805`` on line 836. Text without the markers is kept
    whole.
    """
    lines = text.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if _START.match(line)), 0)
    end = next((i for i in range(start, len(lines)) if _END.match(lines[i])), len(lines))
    if start:
        start = _skip_contents(lines, start, end)
    return "\n".join(lines[start:end]).strip("\n"), start + 1


def _skip_contents(lines: list[str], start: int, end: int) -> int:
    first = next((i for i in range(start, end) if _HEADING.match(lines[i].strip())), None)
    if first is None:
        return start
    heading = lines[first].strip()
    again = next((i for i in range(first + 1, end) if lines[i].strip() == heading), None)
    return first if again is None else again


def token_windows(
    text: Text, tokenize: Callable[[str], list[int]], length: int, count: int
) -> list[list[int]]:
    """``count`` consecutive, non-overlapping windows of ``length`` tokens from the prose start.

    Only as much prose as needed is tokenized (doubling the slice until it is enough).
    """
    need = length * count
    chars = need * 6
    while True:
        ids = tokenize(text.prose[:chars])
        if len(ids) > need or chars >= len(text.prose):
            break
        chars *= 2
    if len(ids) < need:
        raise UsageError(
            f"text {str(text.path)!r} has only {len(ids)} tokens of prose; {count} window(s) of "
            f"{length} tokens need {need}: pass a longer --text, fewer --windows or a smaller "
            "--max-length"
        )
    return [ids[i * length : (i + 1) * length] for i in range(count)]
