"""One record type for a normalizer and one loader for every kind of target.

A *target* (docs/INTERFACES.md) is a built-in id, ``package.module:attr``, ``path/to/file.py:attr``
or a name registered under the entry-point group ``attnverify.normalizers``. ``attr`` is a
plain callable ``fn(scores, dim=-1, **params)`` or a :class:`NormalizerSpec`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from attnverify.errors import TargetError, TargetImportFailed, UsageError

# The record types live in attnverify.spec; they are re-exported here so that
# ``from attnverify.registry import NormalizerSpec`` keeps working.
from attnverify.spec import (  # noqa: F401 - re-exports
    SPACE_CLAIMS,
    SPACES,
    Kernel,
    NormalizerSpec,
    _accepts_var_keywords,
    _first_doc_line,
    _signature_params,
    normalizer_spec,
)

ENTRY_POINT_GROUP = "attnverify.normalizers"

# --------------------------------------------------------------------------------------------
# Built-ins


def builtins() -> dict[str, NormalizerSpec]:
    """Every built-in normalizer, by id, in docs/NORMALIZERS.md order.

    Imported here, not at module level, so that importing the registry (the loader) does not
    import torch and the built-ins; ``attnverify.normalizers`` imports only
    :mod:`attnverify.spec`, never this module, so there is no cycle.
    """
    from attnverify.normalizers import BUILTINS  # torch-free: the package imports without torch

    return dict(BUILTINS)


def builtin_ids() -> list[str]:
    return list(builtins())


# --------------------------------------------------------------------------------------------
# The loader


def load_target(target: str, params: Mapping[str, Any] | None = None) -> NormalizerSpec:
    """Resolve a target string to a :class:`NormalizerSpec`, with ``params`` applied.

    Raises :class:`TargetError` with a one-line message saying what was expected.
    """
    spec = dataclasses.replace(_resolve(target.strip()), target=target.strip())
    if not params:
        return spec
    validate_params(spec, params)
    return spec.with_params(**params)


def _resolve(target: str) -> NormalizerSpec:
    if not target:
        raise TargetError("empty target: expected a built-in id, module:attr or file.py:attr")
    table = builtins()
    if target in table:
        return table[target]
    entry = _entry_points().get(target)
    if entry is not None:
        try:
            obj = entry.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is the target's fault
            raise TargetError(
                f"entry point {target!r} ({entry.value}) failed to load: {_one_line(exc)}"
            ) from None
        return _as_spec(obj, target, source=f"entry point {entry.value}")
    if ":" not in target:
        known = ", ".join(table)
        raise TargetError(
            f"unknown target {target!r}: expected a built-in id ({known}), "
            "package.module:attr, path/to/file.py:attr or an entry point name"
        )
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise TargetError(f"target {target!r}: expected MODULE:ATTR or FILE.py:ATTR")
    if where.endswith(".py") or os.sep in where or "/" in where:
        module = _import_file(where)
        source = f"file {where}"
    else:
        module = _import_module(where)
        source = f"module {where}"
    if not hasattr(module, attr):
        raise TargetError(f"no attribute {attr!r} in {source.split()[0]} {where!r}")
    return _as_spec(getattr(module, attr), attr, source=f"{source}:{attr}")


def _as_spec(obj: Any, name: str, source: str) -> NormalizerSpec:
    if isinstance(obj, NormalizerSpec):
        return dataclasses.replace(obj, source=source)
    if not callable(obj):
        raise TargetError(f"{source} is not callable (got {type(obj).__name__})")
    spec = normalizer_spec(obj, id=name)
    return dataclasses.replace(spec, source=source)


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name or name.startswith(f"{exc.name}."):  # the target itself is missing
            raise TargetError(f"module {name!r} not found ({_one_line(exc)})") from None
        _missing_extra(exc, f"module {name!r}")
        raise TargetImportFailed(f"importing module {name!r} failed: {_one_line(exc)}") from None
    except UsageError:  # a declaration refused by attnverify's own API at import: bad input
        raise
    except Exception as exc:  # noqa: BLE001 - the target's own code raised
        raise TargetImportFailed(f"importing module {name!r} failed: {_one_line(exc)}") from None


def _import_file(path: str):
    if not os.path.isfile(path):
        raise TargetError(f"file not found: {path!r}")
    mod_name = "attnverify_target_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except UsageError:  # a declaration refused by attnverify's own API at import: bad input
        sys.modules.pop(mod_name, None)
        raise
    except Exception as exc:  # noqa: BLE001 - the target's own code raised
        sys.modules.pop(mod_name, None)
        _missing_extra(exc, f"file {path!r}")
        raise TargetImportFailed(f"importing file {path!r} failed: {_one_line(exc)}") from None
    return module


#: Optional dependencies a target may import, by top-level module: the extra that installs each.
EXTRAS = {"triton": "triton"}


def _missing_extra(exc: BaseException, what: str) -> None:
    """A target importing an optional dependency attnverify has an extra for, not installed
    here: a usage error (exit 2) naming the extra, not a failure of the target."""
    name = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    extra = EXTRAS.get(str(name or "").partition(".")[0])
    if extra is not None:
        raise TargetError(f"{what} imports {name}, which is not installed here: "
                          f"pip install 'attnverify[{extra}]'") from None


def _entry_points() -> dict[str, metadata.EntryPoint]:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - a broken distribution must not break the loader
        return {}
    return {ep.name: ep for ep in eps}


def entry_point_names() -> list[str]:
    return sorted(_entry_points())


# --------------------------------------------------------------------------------------------
# Helpers


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0] if text else type(exc).__name__


def parse_params(text: str | None) -> dict[str, Any]:
    """Parse ``k=v,k=v`` (the ``--params`` flag): numbers, booleans, ``none`` or strings."""
    if not text:
        return {}
    out: dict[str, Any] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"bad --params entry {item!r}: expected NAME=VALUE")
        out[key] = _parse_value(raw)
    return out


def _parse_value(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    if not raw.isascii() or len(raw) > 100:  # int('١') is 1 in Python: ASCII numbers only
        return raw
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


#: Ranges of the parameters the built-ins share, by name: (what is expected, test). Every float
#: given must be finite, whatever its name.
PARAM_RULES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "temperature": ("a positive finite number", lambda v: v > 0),
    "alpha": ("a finite number >= 1", lambda v: v >= 1),
    "lam": ("a finite number >= 0", lambda v: v >= 0),
    "s": ("a positive finite number", lambda v: v > 0),
    "eps": ("a positive finite number", lambda v: v > 0),
    "bias": ("a finite number or none", lambda v: True),
}
#: Parameters that accept ``none``.
NONE_ALLOWED = frozenset({"bias"})


def validate_params(spec: NormalizerSpec, params: Mapping[str, Any]) -> None:
    """Type- and range-check ``params`` (from ``--params``) for ``spec``: a usage error naming
    the parameter for a value of the wrong type (a string where the default is a number), out of
    :data:`PARAM_RULES`' range, NaN or infinite, or refused by the spec's own ``param_checks``."""
    checks = getattr(spec, "param_checks", None) or {}
    for name, value in params.items():
        where = f"--params {name}={value!r}"
        default = spec.params.get(name)
        rule = PARAM_RULES.get(name)
        numeric = rule is not None or (isinstance(default, (int, float))
                                       and not isinstance(default, bool))
        if value is None and (name in NONE_ALLOWED or default is None):
            pass
        elif numeric:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                expected = rule[0] if rule else "a number"
                raise UsageError(f"{where}: {name} must be {expected}")
            if not math.isfinite(value) or (rule is not None and not rule[1](value)):
                expected = rule[0] if rule else "a finite number"
                raise UsageError(f"{where}: {name} must be {expected}")
        elif isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{where}: {name} must be finite")
        elif isinstance(default, bool) and not isinstance(value, bool):
            raise UsageError(f"{where}: {name} must be true or false")
        check = checks.get(name)
        problem = check(value) if check is not None else None
        if problem:
            raise UsageError(f"{where}: {name} must be {problem}")
