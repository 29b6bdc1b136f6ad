"""One loader for attention targets: a built-in id (:mod:`attnverify.attention.kernels`),
``package.module:attr`` or ``path/to/file.py:attr``, where ``attr`` is a plain callable with SDPA's
signature or an :class:`AttentionSpec` built with :func:`attention_spec`.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping
from typing import Any

from attnverify import registry
from attnverify.attention.kernels import builtins
from attnverify.attention.spec import AttentionSpec, attention_spec
from attnverify.errors import TargetError, UsageError
from attnverify.registry import _import_file, _import_module

SDPA_ARGS = ("attn_mask", "is_causal", "scale")


def builtin_ids() -> list[str]:
    return list(builtins())


def load_attention(target: str, params: Mapping[str, Any] | None = None) -> AttentionSpec:
    """Resolve an attention target string; :class:`TargetError` (one line) when it cannot be."""
    target = target.strip()
    spec = _resolve(target)
    spec = dataclasses.replace(spec, target=target)
    if params:
        unknown = sorted(set(params) - set(spec.params) - {"enable_gqa"})
        bad = [name for name in unknown if not _takes(spec.fn, name)]
        if bad:
            known = ", ".join(sorted(spec.params)) or "none"
            raise UsageError(f"attention target {spec.id!r} has no parameter {bad[0]!r} "
                             f"(parameters: {known})")
        spec = spec.with_params(**params)
    return spec


def _resolve(target: str) -> AttentionSpec:
    table = builtins()
    if not target:
        raise TargetError("empty attention target: expected a built-in id, module:attr or "
                          "file.py:attr")
    if target in table:
        return table[target]
    if ":" not in target:
        raise TargetError(f"unknown attention target {target!r}: expected a built-in id "
                          f"({', '.join(table)}), package.module:attr or path/to/file.py:attr")
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise TargetError(f"attention target {target!r}: expected MODULE:ATTR or FILE.py:ATTR")
    if where.endswith(".py") or os.sep in where or "/" in where:
        module, source = _import_file(where), f"file {where}:{attr}"
    else:
        module, source = _import_module(where), f"module {where}:{attr}"
    if not hasattr(module, attr):
        raise TargetError(f"no attribute {attr!r} in {where!r}")
    obj = getattr(module, attr)
    if isinstance(obj, AttentionSpec):
        return dataclasses.replace(obj, source=source)
    if not callable(obj):
        raise TargetError(f"{source} is not callable (got {type(obj).__name__})")
    _check_signature(obj, source)
    return dataclasses.replace(attention_spec(obj, id=attr, gqa=_takes(obj, "enable_gqa")),
                               source=source)


def _takes(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check_signature(fn, source: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust the caller
    missing = [a for a in SDPA_ARGS if not _takes(fn, a)]
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  or p.kind is p.VAR_POSITIONAL]
    if missing or len(positional) < 3:
        raise TargetError(f"{source} does not have SDPA's signature f(query, key, value, "
                          f"attn_mask=None, is_causal=False, scale=None)"
                          + (f": no {missing[0]!r} parameter" if missing else ""))


def reference_problem(normalizer: str, score_mod: str | None, reference: str) -> str:
    """Why a reference the kernel declares cannot be used, in words (``""``: it can).

    The rule: a declared reference is code-under-test input, so it may only name a built-in
    that computes what the kernel declares it computes: its normalizer id, or a built-in
    attention target with the same normalizer and score modification. Anything else (another
    normalizer, a module of the target's own) would let the kernel choose what it is compared
    with; ``--reference`` is how the person running the check compares with something else."""
    if not reference:
        return ""

    if reference in registry.builtin_ids():
        same, what = reference == normalizer, f"the normalizer {reference!r}"
    elif reference in builtins():
        other = builtins()[reference]
        same = other.normalizer == normalizer and other.score_mod == score_mod
        what = (f"the attention target {reference!r} (normalizer {other.normalizer!r}, "
                f"score_mod {other.score_mod!r})")
    else:
        return (f"reference={reference!r} is not a built-in normalizer or attention id: a "
                "kernel may declare only a built-in reference (give --reference to compare "
                "with another)")
    if same:
        return ""
    return (f"reference={reference!r} contradicts normalizer={normalizer!r}"
            f"{f', score_mod={score_mod!r}' if score_mod else ''}: {what} computes something "
            "else, and a kernel may not choose what it is compared with (give --reference to "
            "compare with another)")
