"""The record type of an attention kernel under test, and its public constructor.

An attention target has SDPA's signature ``f(query, key, value, attn_mask=None,
is_causal=False, scale=None)`` on ``[batch, heads, L, d]`` tensors: ``attn_mask`` is boolean
(``True`` = may attend, SDPA's convention) or additive (added to the scores), broadcastable to
``[batch, heads, L_q, L_k]``; ``is_causal`` is top-left aligned (query ``i`` sees keys
``j ≤ i``, whatever ``L_q`` and ``L_k``); ``scale`` defaults to ``1/√d``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from attnverify.attention.mods import MODS
from attnverify.errors import TargetError
from attnverify.registry import builtin_ids, builtins
from attnverify.spec import SPACES

ALL_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class AttentionSpec:
    """An attention kernel under test: the function, what it supports, what it claims.

    - ``fn(q, k, v, attn_mask=None, is_causal=False, scale=None, **params)``;
    - ``normalizer``: the built-in normalizer id the kernel computes (``softmax`` for SDPA), which
      picks the float64 reference (:func:`attnverify.attention.reference.eager`) and the claims of
      the lifted normalizer; ``space`` its output space;
    - ``score_mod``: a named score modification the kernel applies itself (``causal``,
      ``sliding_window``, ``alibi``, ``softcap``; see :mod:`attnverify.attention.mods`), applied to
      the reference too; the lifted (``V = I``) properties need ``None``;
    - ``gqa``: the kernel accepts ``enable_gqa=True`` (fewer key/value heads);
    - ``dtypes``: the dtypes it takes; ``max_head_dim``: the largest ``d`` (``None``: any), which
      caps the rows the lifting can reach (``K = I`` needs ``d = L``);
    - ``differentiable``: gradients w.r.t. ``q``, ``k``, ``v`` are checked;
    - ``unavailable``: why the kernel cannot run here (no CUDA, …), or ``""``;
    - ``compile_s``: seconds an example may take on top of the per-example time limit because
      the kernel compiles on first use (``torch.compile``, a Triton JIT): the worker's time
      limit for this kernel is ``--timeout`` plus this;
    - ``reference``: what the outputs are compared with (see the field); ``reference_by``: who
      named it (``"target"``: the kernel's own declaration, ``"option"``: ``--reference``;
      ``""``: none, the eager reference of ``normalizer``), set by the checker;
    - ``normalizer_declared``: whether the kernel named its ``normalizer`` (``False``: a plain
      function that declared nothing, checked as softmax attention, SDPA's, by assumption).
    """

    id: str
    fn: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    normalizer: str = "softmax"
    space: str = "simplex"
    claims: tuple[str, ...] | None = None
    score_mod: str | None = None
    gqa: bool = False
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    max_head_dim: int | None = None
    differentiable: bool = True
    unavailable: str = ""
    compile_s: float = 0.0
    #: ``--reference``: an attention target or a normalizer id compared with instead of the
    #: float64 eager reference of ``normalizer`` (``""``: that one).
    reference: str = ""
    reference_by: str = ""
    description: str = ""
    source: str = "builtin"
    target: str = ""
    normalizer_declared: bool = True

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TargetError(f"attention target {self.id!r}: fn is not callable")
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "dtypes", tuple(self.dtypes))

    def __call__(self, q, k, v, attn_mask=None, is_causal=False, scale=None, **kw):
        extra = {**self.params, **kw}
        if kw.get("enable_gqa") is False:
            extra.pop("enable_gqa")
        return self.fn(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, **extra)

    def with_params(self, **params: Any) -> AttentionSpec:
        return dataclasses.replace(self, params={**self.params, **params})

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in self.dtypes


def attention_spec(
    fn: Callable[..., Any],
    *,
    id: str | None = None,
    params: Mapping[str, Any] | None = None,
    normalizer: str | None = None,
    space: str | None = None,
    claims: tuple[str, ...] | list[str] | None = None,
    score_mod: str | None = None,
    gqa: bool = False,
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES,
    max_head_dim: int | None = None,
    differentiable: bool = True,
    description: str = "",
    compile_s: float = 0.0,
) -> AttentionSpec:
    """Public constructor of an attention target (``attnverify certify --attention``).

    ``fn`` has SDPA's signature. ``normalizer`` names the built-in normalizer it computes (the
    reference and the lifted claims follow from it; not given: ``softmax``, SDPA's, recorded as
    assumed rather than declared); ``claims`` replaces the claims of the lifted normalizer and may
    name attention property ids (``attnverify properties``).
    """

    declared = normalizer is not None
    normalizer = "softmax" if normalizer is None else normalizer
    name = id or getattr(fn, "__name__", "attention")
    table = builtins()
    if not callable(fn):
        raise TargetError(f"attention target {name!r}: fn is not callable")
    if normalizer not in table:
        raise TargetError(f"attention target {name!r}: normalizer={normalizer!r} is not a "
                          f"built-in id ({', '.join(table)})")
    if isinstance(dtypes, (tuple, list)) and not all(d in ALL_DTYPES for d in dtypes):
        raise TargetError(f"attention target {name!r}: dtypes={tuple(dtypes)!r} must be torch "
                          f"dtypes among {', '.join(dtype_names(ALL_DTYPES))}")
    values = {"id": name, "params": dict(params or {}), "normalizer": normalizer,
              "space": space or table[normalizer].space,
              "claims": None if claims is None else list(claims), "score_mod": score_mod,
              "gqa": gqa, "dtypes": dtype_names(dtypes) if isinstance(dtypes, (tuple, list))
              else dtypes, "max_head_dim": max_head_dim, "differentiable": differentiable,
              "unavailable": "", "compile_s": compile_s, "reference": "", "reference_by": "",
              "description": description, "source": "builtin", "target": "",
              "normalizer_declared": declared}
    problem = description_problem(values) or unknown_name(values)
    if problem:
        raise TargetError(f"attention target {name!r}: {problem}")
    return AttentionSpec(
        id=name,
        fn=fn,
        params=dict(params or {}),
        normalizer=normalizer,
        space=values["space"],
        claims=None if claims is None else tuple(claims),
        score_mod=score_mod,
        gqa=gqa,
        dtypes=tuple(dtypes),
        max_head_dim=max_head_dim,
        differentiable=differentiable,
        description=description or (fn.__doc__ or "").strip().split("\n")[0],
        compile_s=float(compile_s),
        normalizer_declared=declared,
    )


# --------------------------------------------------------------------------------------------
# What a description may hold (checked in attention_spec() and on every worker's description)

DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
#: Longest string a description field may hold.
MAX_TEXT = 10_000
#: Most seconds ``compile_s`` may add to the per-example time limit.
MAX_COMPILE_S = 3600.0


def dtype_names(dtypes) -> list[str]:
    return [str(d).removeprefix("torch.") for d in dtypes]


def _text(v) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: Every field of an attention target's description (plain data): what it must be, in words,
#: and the test.
FIELDS = {
    "id": ("a non-empty string", lambda v: _text(v) and bool(v.strip())),
    "params": ("an object whose keys are strings",
               lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v)),
    "normalizer": ("a normalizer id (a string)", lambda v: _text(v) and bool(v)),
    "space": (f"one of {', '.join(SPACES)}", lambda v: v in SPACES),
    "claims": ("null or a list of property ids (strings)",
               lambda v: v is None or (isinstance(v, (list, tuple))
                                       and all(_text(c) for c in v))),
    "score_mod": ("null or a score modification id (a string)",
                  lambda v: v is None or (_text(v) and bool(v))),
    "gqa": ("true or false", lambda v: isinstance(v, bool)),
    "dtypes": (f"a non-empty list of distinct dtype names among {', '.join(DTYPE_NAMES)}",
               lambda v: isinstance(v, (list, tuple)) and 0 < len(v) == len(set(map(str, v)))
               and all(d in DTYPE_NAMES for d in v)),
    "max_head_dim": ("null or an integer ≥ 1",
                     lambda v: v is None or (type(v) is int and v >= 1)),
    "differentiable": ("true or false", lambda v: isinstance(v, bool)),
    "unavailable": ("a string", _text),
    "compile_s": (f"a number of seconds from 0 to {MAX_COMPILE_S:g}",
                  lambda v: _number(v) and 0 <= v <= MAX_COMPILE_S),
    "reference": ("a string", _text),
    "reference_by": ("a string", _text),
    "description": ("a string", _text),
    "source": ("a string", _text),
    "target": ("a string", _text),
    "normalizer_declared": ("true or false", lambda v: isinstance(v, bool)),
}


def description_problem(d: Mapping[str, Any]) -> str:
    """What is wrong with the types and ranges of an attention target's description ``d``
    (plain data: dtypes by name), in words; ``""`` when nothing."""
    for name, (want, ok) in FIELDS.items():
        if name not in d:
            return f"no {name!r} in its description"
        value = d[name]
        try:
            good = bool(ok(value))
        except Exception:  # noqa: BLE001 - a value the test cannot even look at
            good = False
        if not good:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            return f"{name}={shown} (expected {want})"
    return ""


def unknown_name(d: Mapping[str, Any]) -> str:
    """An unknown normalizer or score modification named by ``d``, in words; ``""`` when
    none (the names only: call after :func:`description_problem`)."""

    if d.get("normalizer") not in builtin_ids():
        return (f"normalizer={d.get('normalizer')!r} is not a built-in normalizer id "
                "(attnverify list)")
    mod = d.get("score_mod")
    if mod is not None and mod not in MODS:
        return f"score_mod={mod!r} is not a score modification ({', '.join(MODS)})"
    return ""
