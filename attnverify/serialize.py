"""One way to write numbers, tensors and cases as JSON, and the one repro builder.

**Numbers.** A finite float is a JSON number; a non-finite one is one of the strings ``"inf"``,
``"-inf"``, ``"nan"`` — everywhere: certificates (``worst_ratio`` included; schema_version 1
wrote ``1e308`` there until this module existed), falsify results, the claims audit and repro
cases. :func:`number` writes, :func:`read_number` reads.

**Tensors.** Up to :data:`MAX_LIST` entries: nested lists of numbers (exact: every float16,
bfloat16 and float32 value is a float64, and ``repr`` round-trips). Larger: ``{"dtype", "shape",
"b64"}``, the raw little-endian bytes in the tensor's own dtype, zlib-compressed, base64.
:func:`encode_tensor` / :func:`decode_tensor`.

**Cases.** A case (a named tuple of :mod:`attnverify.checks.cases`) is a JSON object with its
fields, ``"case"`` (the type name), ``"dtype"`` and ``"shape"`` of the scores (the ``[R, L]``
rows), ``"device"`` when not the CPU, and ``"params"`` (the normalizer's parameters):
:func:`encode_case` / :func:`decode_case`. Its ``"layout"`` says how the rows were given to the
normalizer: ``"sizes"``, ``"strides"``, ``"storage_offset"`` and ``"dim"`` of the tensor it got,
the ``"order"``, ``"step"`` and ``"expand"`` they come from, its ``"kinds"`` and ``"text"`` (plain
words); decoding rebuilds those strides exactly (:class:`attnverify.strategies.layouts.Layout`).
A field missing from an older case takes its default (``layout``: the contiguous block).

**Repro.** :func:`repro_command` is the single builder of the one-line repro printed by certify,
falsify, claims, the report and the pytest suite: ``attnverify repro TARGET --property ID --case
'JSON'`` (or ``--inequality "LHS <= RHS"``), shell-quoted so that it can be pasted as is. The case
is inline; a case whose JSON exceeds :data:`MAX_INLINE_CHARS` (beyond what one shell argument
safely holds) is written to a file under the system's temporary directory and named instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import shlex
import tempfile
import zlib
from pathlib import Path
from typing import Any

import torch

from attnverify.atomic import write_text_atomic
from attnverify.errors import UsageError

#: Tensors with at most this many entries are written as nested lists, larger ones as bytes.
MAX_LIST = 4096
#: Longest inline ``--case`` argument (Linux caps one argument at 128 KiB).
MAX_INLINE_CHARS = 100_000

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def number(value: float) -> float | str:
    """A float as JSON: itself when finite, else ``"inf"`` / ``"-inf"`` / ``"nan"``."""
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def read_number(value: Any) -> float:
    """Inverse of :func:`number`."""
    if isinstance(value, str):
        if value not in NON_FINITE:
            raise UsageError(f"bad number {value!r}: expected a number, 'inf', '-inf' or 'nan'")
        return NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"bad number {value!r}")
    return float(value)


def jsonable(value: Any) -> Any:
    """Any result value as plain JSON data (numbers by :func:`number`, tensors encoded)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return number(value)
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.Tensor):
        return encode_tensor(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return str(value)


# --------------------------------------------------------------------------------------------
# Tensors


def encode_tensor(t: torch.Tensor, *, as_list: bool | None = None) -> Any:
    """Nested lists (≤ :data:`MAX_LIST` entries, 2-D at most: rows × the rest) or bytes."""
    t = t.detach().cpu()
    if as_list is None:
        as_list = t.numel() <= MAX_LIST
    if as_list:
        values = t.to(torch.float64)
        values = values if t.dim() <= 1 else values.reshape(t.shape[0], -1)
        return jsonable(values.tolist())
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return {"dtype": dtype_name(t.dtype), "shape": list(t.shape),
            "b64": base64.b64encode(zlib.compress(raw, 9)).decode("ascii")}


def decode_tensor(data: Any, dtype: torch.dtype = torch.float64, shape=None) -> torch.Tensor:
    """Inverse of :func:`encode_tensor`; a list takes ``dtype`` and ``shape`` (if given)."""
    if isinstance(data, dict):
        try:
            dtype = _dtype(data["dtype"])
            raw = bytearray(zlib.decompress(base64.b64decode(data["b64"])))
            out = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(data["shape"])
        except (KeyError, ValueError, RuntimeError, zlib.error) as exc:
            raise UsageError(f"bad tensor in the case: {exc}") from None
        return out.clone()
    if not isinstance(data, list):
        raise UsageError(f"bad tensor in the case: expected a list, got {type(data).__name__}")
    try:
        out = torch.tensor(_numbers(data), dtype=torch.float64).to(dtype)
        return out.reshape(shape) if shape is not None else out
    except (ValueError, RuntimeError, TypeError) as exc:
        raise UsageError(f"bad tensor in the case: {exc}") from None


def _numbers(data):
    return [_numbers(v) for v in data] if isinstance(data, list) else read_number(data)


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {name!r} in the case: expected {', '.join(DTYPES)}")
    return DTYPES[name]


# --------------------------------------------------------------------------------------------
# Cases


def encode_case(case: Any, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """A case named tuple as JSON: its fields, its type, the scores' dtype and shape, params."""
    out: dict[str, Any] = {"case": type(case).__name__}
    scores = getattr(case, "scores", None)
    for name, value in case._asdict().items():
        if name == "layout" and value is not None and hasattr(value, "to_json"):
            if isinstance(scores, torch.Tensor) and scores.dim() == 2:
                value = value.fit(*scores.shape)  # the layout the rows were given in
            out[name] = value.to_json()
        elif isinstance(value, torch.Tensor):
            out[name] = encode_tensor(value)
            if name == "scores":
                out["dtype"] = dtype_name(value.dtype)
                out["shape"] = list(value.shape)
                if value.device.type != "cpu":
                    out["device"] = str(value.device)
            elif value.dtype != torch.float64 and isinstance(out[name], list):
                out[name] = encode_tensor(value, as_list=False)
        else:
            out[name] = jsonable(value)
    out["params"] = {k: jsonable(v) for k, v in (params or {}).items() if _simple(v)}
    return out


def decode_case(data: dict[str, Any], types: dict[str, type]) -> Any:
    """Inverse of :func:`encode_case` for the named tuple types ``types`` (by name)."""
    if not isinstance(data, dict) or data.get("case") not in types:
        known = ", ".join(types)
        raise UsageError(f"the case must be a JSON object with \"case\" one of {known}")
    cls = types[data["case"]]
    device = _device(data.get("device", "cpu"))
    values = {}
    defaults = getattr(cls, "_field_defaults", {})
    for name in cls._fields:
        if name not in data and name in defaults:
            values[name] = defaults[name]
            continue
        if name not in data:
            raise UsageError(f"the {cls.__name__} case has no field {name!r}")
        value = _decode_field(name, data[name], data)
        values[name] = value.to(device) if isinstance(value, torch.Tensor) else value
    return cls(**values)


def _device(name: Any) -> torch.device:
    """The case's device (``"device"``, default cpu); one this machine lacks is a usage error."""
    try:
        device = torch.device(str(name))
    except RuntimeError:
        raise UsageError(f"unknown device {name!r} in the case") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"the case ran on {name}, but torch sees no CUDA device here")
    return device


def _decode_field(name: str, value: Any, data: dict[str, Any]) -> Any:
    if name == "layout":
        return None if value is None else _layout(value, data)
    if name == "scores":
        return decode_tensor(value, _dtype(data.get("dtype", "float64")), data.get("shape"))
    if isinstance(value, dict) or (isinstance(value, list) and name not in ("perm",)):
        return decode_tensor(value)
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    return value


def _layout(value: Any, data: dict[str, Any]):
    """The case's layout, checked against its scores (a usage error naming what is wrong)."""
    from attnverify.strategies.layouts import Layout  # heavy: Hypothesis, only a layout

    try:
        layout = Layout.from_json(value)
    except ValueError as exc:
        raise UsageError(f"bad layout in the case: {exc}") from None
    shape = data.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2):
        raise UsageError(f"bad layout in the case: its scores must be rows [R, L], not shape "
                         f"{shape!r}")
    if (layout.rows, layout.length) != tuple(shape):
        raise UsageError(f"bad layout in the case: it gives {layout.rows} rows of "
                         f"{layout.length}, but the scores have shape {shape}")
    return layout


def read_case(text: str) -> dict[str, Any]:
    """``--case``: inline JSON (starts with ``{``) or the path of a JSON file."""
    text = text.strip()
    if not text.startswith("{"):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise UsageError(f"--case: cannot read {text!r}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--case: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise UsageError("--case: expected a JSON object")
    return data


def _simple(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


# --------------------------------------------------------------------------------------------
# The repro line


def repro_command(target: str, case: dict[str, Any], *, property: str | None = None,
                  inequality: str | None = None, reference: str | None = None,
                  seed: int = 0, attention: bool = False) -> str:
    """The one-line shell command that re-checks ``property`` (or ``inequality``) on ``case``.

    Exits 1 with the violation message while the normalizer fails there, 0 once it is fixed.
    ``seed``: the run's seed, written (``--seed S``) unless it is 0, so that a line from a run
    with ``--seed random`` says which seed found it. ``attention``: ``target`` is an attention
    kernel (``--attention``).
    """
    parts = ["attnverify", "repro", target]
    if attention:
        parts.append("--attention")
    if property is not None:
        parts += ["--property", property]
    if inequality is not None:
        parts += ["--inequality", inequality]
    if reference is not None:
        parts += ["--reference", reference]
    if seed:
        parts += ["--seed", str(int(seed))]
    text = json.dumps(case, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_INLINE_CHARS:
        text = str(_write_case_file(text))
    parts += ["--case", text]
    return " ".join(shlex.quote(p) for p in parts)


def _write_case_file(text: str) -> Path:
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / "attnverify-repro" / f"case-{digest}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text + "\n")
    return path
