"""The record type of an attention kernel under test, and its public constructor.

An attention target has SDPA's signature ``f(query, key, value, attn_mask=None,
is_causal=False, scale=None)`` on ``[batch, heads, L, d]`` tensors: ``attn_mask`` is boolean
(``True`` = may attend, SDPA's convention) or additive (added to the scores), broadcastable to
``[batch, heads, L_q, L_k]``; ``is_causal`` is top-left aligned (query ``i`` sees keys
``j ≤ i``, whatever ``L_q`` and ``L_k``); ``scale`` defaults to ``1/√d``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from attnverify.errors import TargetError

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
    - ``reference``: what the outputs are compared with (see the field).
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
    description: str = ""
    source: str = "builtin"
    target: str = ""

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
    normalizer: str = "softmax",
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
    reference and the lifted claims follow from it); ``claims`` replaces the claims of the
    lifted normalizer and may name attention property ids (``attnverify properties``).
    """
    from attnverify.registry import builtins

    table = builtins()
    if normalizer not in table:
        raise TargetError(f"attention target {id or fn!r}: normalizer={normalizer!r} is not a "
                          f"built-in id ({', '.join(table)})")
    return AttentionSpec(
        id=id or getattr(fn, "__name__", "attention"),
        fn=fn,
        params=dict(params or {}),
        normalizer=normalizer,
        space=space or table[normalizer].space,
        claims=None if claims is None else tuple(claims),
        score_mod=score_mod,
        gqa=gqa,
        dtypes=tuple(dtypes),
        max_head_dim=max_head_dim,
        differentiable=differentiable,
        description=description or (fn.__doc__ or "").strip().split("\n")[0],
        compile_s=float(compile_s),
    )
