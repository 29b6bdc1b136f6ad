"""Safe, atomic file writes: a temporary file in the target's directory, fsync, then a rename.

An interrupted write never leaves a partial file where a good one was. Outputs go only to regular
files or new paths (:func:`check_output_path`): a device, directory, FIFO or socket, anything
under ``/proc``, ``/sys`` or ``/dev``, and a read-only file are refused before any work; a
symlink is written through (the rename replaces the file it points to, never the link). Used by
the certificates (:mod:`attnverify.report`) and the model check's results and checkpoints.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from attnverify.errors import UsageError

#: Pseudo file systems no output may go to.
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")


def resolve(path) -> Path:
    """The file a write to ``path`` lands in: symlinks followed, relative paths made absolute."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def check_output_path(path, option: str = "output") -> Path:
    """Refuse (a :class:`UsageError` naming ``option``) any path but a writable regular file or
    a new file in a writable directory; return the resolved path the write will replace."""
    text = os.fspath(path)
    if not text or "\x00" in text:
        raise UsageError(f"{option}: {text!r} is not a usable file name")
    where = f"cannot write {option} {text!r}"
    real = resolve(text)
    for root in FORBIDDEN_ROOTS:
        if real == Path(root) or Path(root) in real.parents:
            raise UsageError(f"{where}: {root} is not a place for results")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{where}: it is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where}: it is not a regular file (a device, FIFO or socket)")
        if not st.st_mode & 0o222 or not os.access(real, os.W_OK):
            raise UsageError(f"{where}: the file is read-only")
    directory = real.parent
    if not directory.is_dir():
        raise UsageError(f"{where}: directory {str(directory)!r} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: directory {str(directory)!r} is not writable")
    return real


def check_output_paths(paths: Mapping[str, object]) -> None:
    """:func:`check_output_path` for every ``option -> path`` given (``None`` skipped), and no two
    options naming the same file, however spelled (symlinks and relative paths resolved)."""
    seen: dict[Path, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        real = check_output_path(path, option)
        if real in seen:
            raise UsageError(f"{seen[real]} and {option} name the same file {str(real)!r}: "
                             "give each output its own path")
        seen[real] = option


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file beside the target, fsync, rename).

    A symlink is followed, so the file it points to is replaced and the link stays; a path that
    is not a regular file is refused (:class:`UsageError`)."""
    real = resolve(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(f"cannot write {str(path)!r}: it is not a regular file")
    real.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp makes 0600: keep an existing file's mode, else the usual one
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
