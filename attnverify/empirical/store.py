"""Atomic writes and per-experiment checkpoints for ``attnverify empirical``.

Every file is written to a temporary file in the same directory and moved into place with
``os.replace``, so an interrupted run never leaves a partial file where a good one was.
A checkpoint records the run's *fingerprint* (everything that changes the numbers) and the
sha256 of its result; ``--resume`` reuses a checkpoint only when its fingerprint matches the
current run. [choice] A checkpoint that cannot be read, is not a checkpoint, or whose result does
not match its checksum (truncated, edited, wrong schema) is ignored with a one-line warning on
stderr and its experiment recomputed: a damaged file costs time, never a wrong or failed run.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnverify.atomic import write_text_atomic

CHECKPOINT_DIR = "checkpoints"


#: Significant digits kept for floats in JSON (measurements, not exact arithmetic).
DIGITS = 6


def to_jsonable(obj: Any) -> Any:
    """Plain JSON values: tensors and arrays become lists, floats keep ``DIGITS`` significant
    digits, non-finite floats become null."""
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return to_jsonable(obj.tolist())
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return float(f"{obj:.{DIGITS}g}") if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def dumps(obj: Any) -> str:
    """JSON with nested objects indented and every list of scalars on one line."""
    return _dump(to_jsonable(obj), 0)


def _dump(obj: Any, depth: int) -> str:
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_dump(v, depth + 1)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [inner + _dump(v, depth + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, dumps(obj) + "\n")


def fingerprint(settings: dict[str, Any]) -> str:
    """A short stable hash of the settings that determine an experiment's numbers."""
    blob = json.dumps(to_jsonable(settings), sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def result_digest(result: Any) -> str:
    """sha256 of a result as stored (JSON values, sorted keys), so a reloaded result matches."""
    blob = json.dumps(to_jsonable(result), sort_keys=True, allow_nan=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _warn_stderr(message: str) -> None:
    print(f"attnverify empirical: warning: {message}", file=sys.stderr)


class CheckpointStore:
    """One JSON file per finished experiment under ``OUT/checkpoints/``."""

    def __init__(self, out_dir: Path, warn: Callable[[str], None] = _warn_stderr) -> None:
        self.dir = Path(out_dir) / CHECKPOINT_DIR
        self.warn = warn

    def path(self, experiment: str) -> Path:
        return self.dir / f"{experiment}.json"

    def load(self, experiment: str, print_: str) -> dict[str, Any] | None:
        """The stored result of ``experiment`` if it was made with fingerprint ``print_``;
        None when there is none, it was made with other settings, or it is damaged (warned)."""
        path = self.path(experiment)
        if not (path.exists() or path.is_symlink()):
            return None
        if not path.is_file():
            return self._ignore(path, "not a regular file")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSON errors included
            return self._ignore(path, f"unreadable: {type(exc).__name__}")
        if not isinstance(data, dict) or not isinstance(data.get("fingerprint"), str):
            return self._ignore(path, "not a checkpoint")
        if data["fingerprint"] != print_:
            return None  # made with other settings: recomputed, nothing is wrong
        result = data.get("result")
        if not isinstance(result, dict) or data.get("sha256") != result_digest(result):
            return self._ignore(path, "its result does not match its checksum")
        return result

    def _ignore(self, path: Path, why: str) -> None:
        self.warn(f"ignoring checkpoint {str(path)!r} ({why}); recomputing it")
        return None

    def save(self, experiment: str, print_: str, result: dict[str, Any]) -> None:
        write_json_atomic(self.path(experiment), {
            "fingerprint": print_, "sha256": result_digest(result), "result": result,
        })
