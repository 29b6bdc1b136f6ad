"""One record type for a normalizer and one loader for every kind of target.

A *target* (INTERFACES.md) is a built-in id, ``package.module:attr``, ``path/to/file.py:attr``
or a name registered under the entry-point group ``attnverify.normalizers``. ``attr`` is a
plain callable ``fn(scores, dim=-1, **params)`` or a :class:`NormalizerSpec`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from attnverify.errors import TargetError, UsageError

ENTRY_POINT_GROUP = "attnverify.normalizers"

#: Output spaces a normalizer may declare (NORMALIZERS.md, "space").
SPACES = ("simplex", "sub_simplex", "nonnegative", "affine", "any")

#: Claim ids implied by each space, used when a spec gives a space but no claims.
SPACE_CLAIMS = {
    "simplex": ("simplex",),
    "sub_simplex": ("sub_simplex",),
    "nonnegative": ("nonnegative",),
    "affine": ("affine_sum",),
    "any": (),
}


@dataclass(frozen=True)
class Kernel:
    """``F`` and ``F'`` of the general normalizer ``α_i = F(l_i) / Σ_j F(l_j)`` (THEORY.md §1).

    ``F(l, T)`` must be smooth and strictly positive on finite ``l`` and must not depend on the
    row length; Lemma 1 and Lemma 2 apply only to normalizers that declare a kernel.
    """

    F: Callable[[Any, float], Any]
    dF: Callable[[Any, float], Any]
    formula: str = ""


@dataclass(frozen=True)
class NormalizerSpec:
    """A normalizer under test: the function, its parameters, what it claims, where it is from.

    ``fn(scores, dim=-1, **params)`` maps scores (``-inf`` = masked key) to weights of the same
    shape. ``params`` holds every parameter with its default; ``temperature`` among them means the
    temperature-dependent properties apply. ``claims`` are non-universal property ids
    (INTERFACES.md); the universal ones are always checked.
    """

    id: str
    fn: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    claims: tuple[str, ...] = ("simplex",)
    space: str = "simplex"
    citation: str = ""
    source: str = "builtin"
    kernel: Kernel | None = None
    length_aware: bool = False
    description: str = ""
    #: The target string that loads this spec (set by :func:`load_target`), for repro lines.
    target: str = ""

    def __post_init__(self) -> None:
        if self.space not in SPACES:
            raise TargetError(
                f"normalizer {self.id!r}: space={self.space!r} is not one of {', '.join(SPACES)}"
            )
        if not callable(self.fn):
            raise TargetError(f"normalizer {self.id!r}: fn is not callable")
        object.__setattr__(self, "claims", tuple(self.claims))
        object.__setattr__(self, "params", dict(self.params))

    def __call__(self, scores, dim: int = -1, **overrides):
        return self.fn(scores, dim=dim, **{**self.params, **overrides})

    @property
    def takes_temperature(self) -> bool:
        return "temperature" in self.params

    def with_params(self, **params: Any) -> NormalizerSpec:
        """A copy with some parameters replaced; unknown names are a usage error."""
        unknown = sorted(set(params) - set(self.params))
        if unknown and not _accepts_var_keywords(self.fn):
            known = ", ".join(sorted(self.params)) or "none"
            raise UsageError(
                f"normalizer {self.id!r} has no parameter {unknown[0]!r} (parameters: {known})"
            )
        return dataclasses.replace(self, params={**self.params, **params})

    def with_claims(self, claims) -> NormalizerSpec:
        return dataclasses.replace(self, claims=tuple(claims))


def normalizer_spec(
    fn: Callable[..., Any],
    *,
    id: str | None = None,
    params: Mapping[str, Any] | None = None,
    claims: tuple[str, ...] | list[str] | None = None,
    space: str = "simplex",
    citation: str = "",
    kernel: Kernel | None = None,
    length_aware: bool = False,
    description: str = "",
) -> NormalizerSpec:
    """Public constructor for a spec object that declares its claims (INTERFACES.md).

    ``params`` defaults to the keyword defaults of ``fn``'s signature; ``claims`` defaults to
    the claims implied by ``space``.
    """
    if not callable(fn):
        raise TargetError(f"normalizer {id or fn!r}: fn is not callable")
    return NormalizerSpec(
        id=id or getattr(fn, "__name__", "normalizer"),
        fn=fn,
        params=_signature_params(fn) if params is None else dict(params),
        claims=SPACE_CLAIMS[space] if claims is None and space in SPACE_CLAIMS else (claims or ()),
        space=space,
        citation=citation,
        kernel=kernel,
        length_aware=length_aware,
        description=description or _first_doc_line(fn),
    )


# --------------------------------------------------------------------------------------------
# Built-ins


def builtins() -> dict[str, NormalizerSpec]:
    """Every built-in normalizer, by id, in NORMALIZERS.md order."""
    from attnverify.normalizers import BUILTINS

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
    return spec.with_params(**params) if params else spec


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
        raise TargetError(f"module {name!r} not found ({_one_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001
        raise TargetError(f"importing module {name!r} failed: {_one_line(exc)}") from None


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
    except Exception as exc:  # noqa: BLE001
        sys.modules.pop(mod_name, None)
        raise TargetError(f"importing file {path!r} failed: {_one_line(exc)}") from None
    return module


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


def _signature_params(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    skip = {"scores", "dim", "x", "input", "logits", "z"}
    out = {}
    for name, p in sig.parameters.items():
        if name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is not inspect.Parameter.empty:
            out[name] = p.default
    return out


def _accepts_var_keywords(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def _first_doc_line(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


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
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw
