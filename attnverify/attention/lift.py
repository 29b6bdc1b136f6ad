"""An attention kernel as a normalizer ``S ↦ α``, so that every normalizer property applies.

For scores ``S`` ``[rows, L]`` (``-inf`` = masked key) the kernel is called with

- ``query = S`` with masked entries set to 0, ``key = I_L`` and ``scale = 1``: the scores it forms,
  ``scale·Q·Kᵀ = S``, are exact in any precision (each is one product by 1 plus zeros);
- ``attn_mask`` = ``S ≠ -inf`` (boolean, "may attend"): masked keys travel in the mask, never as
  ``-inf`` inside ``Q`` (``-inf · 0`` would be NaN in ``Q·Kᵀ``);
- ``value = I_L``: the output ``α · I`` *is* the weight matrix.

The rows become the queries of one ``[1, 1, rows, L]`` call. ``K = I`` needs head dimension
``d = L``, so a kernel with ``max_head_dim`` is lifted only on rows up to that length; longer rows
are checked by the attention-level properties on generated ``Q``, ``K``, ``V``.

Long rows, few of them (``L ≥`` :data:`TRANSPOSED_FROM` and fewer rows than keys), go the other
way round: ``query = I_rows``, ``key = Sᵀ`` (masked entries 0), so ``scale·Q·Kᵀ = S`` as exactly,
with ``d = rows``. The weights are the same; the kernel is spared a dense ``L × L`` key (and the
copies of it a backward keeps: 128 MiB in float64 at ``L = 4096``). The scores then move in the
keys: their gradient flows through ``key``.
"""

from __future__ import annotations

import dataclasses

import torch

from attnverify import wire
from attnverify.attention.loader import load_attention
from attnverify.attention.spec import AttentionSpec
from attnverify.errors import TargetError
from attnverify.registry import NormalizerSpec, builtins
from attnverify.spec import SPACE_CLAIMS

NEG_INF = float("-inf")

#: Normalizer claims that carry over to a lifted kernel (the paper claims are the normalizer's).
LIFTED_CLAIMS = ("simplex", "sub_simplex", "nonnegative", "affine_sum", "shift_invariant",
                 "order_preserving", "fully_masked_row")

#: Rows at least this long, fewer of them than keys, are lifted with ``Q = I``, ``K = Sᵀ``.
TRANSPOSED_FROM = 1024


class Lifted:
    """``fn(scores, dim=-1)`` calling the attention kernel; ``.attention`` is its spec."""

    def __init__(self, attention: AttentionSpec):
        self.attention = attention
        self.__name__ = attention.id
        self.__doc__ = (f"{attention.id} lifted to a normalizer (Q = S, K = V = I, scale = 1; long "
                        "rows Q = I, K = Sᵀ)")

    def __call__(self, scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
        q, k, v, mask = self._arguments(scores, dim)
        out = self.attention(q, k, v, attn_mask=mask, scale=1.0)
        return self._weights(out, scores, dim)

    @property
    def many(self):
        """The lifted kernel on several inputs in one request, where the kernel runs behind the
        process boundary (its proxy offers ``many``); ``None`` elsewhere (one call each)."""
        batch = getattr(self.attention.fn, "many", None)
        if batch is None:
            return None

        def many(inputs: list, dim: int = -1, *, reuse: dict | None = None) -> list:
            calls = []
            for i, scores in enumerate(inputs):
                try:
                    q, k, v, mask = self._arguments(scores, dim)
                except Exception as exc:
                    exc.index = i  # the input that raised (checks.base.call_many)
                    raise
                calls.append((q, k, v, {**self.attention.params, "attn_mask": mask,
                                        "is_causal": False, "scale": 1.0}))
            outs = batch(calls, reuse=reuse)
            return [self._weights(out, scores, dim) for out, scores in zip(outs, inputs)]

        return many

    def _arguments(self, scores: torch.Tensor, dim: int):
        """``(q, k, v, attn_mask)`` of the call that gives the weights of ``scores``: ``Q = S``,
        ``K = V = I``, or for long rows, fewer than their keys, ``Q = I``, ``K = Sᵀ``, ``V = I``."""
        z = scores.movedim(dim, -1)
        length = z.shape[-1]
        rows = z.reshape(1, 1, -1, length)
        transposed = length >= TRANSPOSED_FROM and 0 < rows.shape[-2] < length
        d = rows.shape[-2] if transposed else length
        limit = self.attention.max_head_dim
        if limit is not None and d > limit:
            raise ValueError(f"{self.attention.id}: the lifting of {rows.shape[-2]} rows of "
                             f"length {length} needs head dimension {d}, more than it takes "
                             f"({limit})")
        masked = rows == NEG_INF
        moving = rows.masked_fill(masked, 0.0)
        eye = self._eye(length, scores)
        mask = ~masked if bool(masked.any()) else None
        if transposed:
            return self._eye(d, scores), moving.transpose(-2, -1).contiguous(), eye, mask
        return moving, eye, eye, mask

    def _eye(self, n: int, scores: torch.Tensor) -> torch.Tensor:
        """``I_n`` as ``[1, 1, n, n]``: built once where the kernel gets a copy."""
        if getattr(self.attention.fn, "copies_inputs", False) and scores.device.type == "cpu":
            return _identity(n, scores.dtype)
        return torch.eye(n, dtype=scores.dtype, device=scores.device)[None, None]

    @staticmethod
    def _weights(out: torch.Tensor, scores: torch.Tensor, dim: int) -> torch.Tensor:
        return out.reshape(scores.movedim(dim, -1).shape).movedim(-1, dim)


#: The identities built here, kept while their pages fit :data:`attnverify.wire.KEEP_EYES`.
_IDENTITIES = wire.Identities(wire.KEEP_EYES)


def _identity(length: int, dtype: torch.dtype) -> torch.Tensor:
    """``I_L`` as ``[1, 1, L, L]`` on the CPU, built once per length and dtype while it is kept
    (:data:`_IDENTITIES`), for a kernel behind the process boundary; marked constant with the
    recipe ``"eye"`` (:func:`attnverify.wire.constant`), so that its bytes never cross: the
    worker builds its own read-only identity (:class:`attnverify.wire.Recipe`). On pages of its
    own where it can (:func:`attnverify.wire.eye_pages`: only the diagonal's pages are
    allocated, so the largest, ``L = 4097`` in float64, holds 16 MB, not 134 MB). Never handed
    to a kernel in this process, which could write into it. Built outside any torch.func
    transform the first call may run under (a cached wrapper of ``torch.func.jvp`` would
    outlive it): a plain tensor, a constant of the transformed function."""
    key = (length, dtype)
    eye = _IDENTITIES.get(key)
    if eye is not None:
        return eye
    with torch._C._DisableFuncTorch():  # private, but what torch.func itself uses to do so
        base = wire.eye_pages(length, dtype, readonly=False)
        if base is None:
            base = torch.eye(length, dtype=dtype)
            resident = base.nbytes
        else:
            resident = wire.eye_resident(length, base.element_size())
        return _IDENTITIES.put(key, wire.constant(base[None, None], recipe="eye"), resident)


def lifted_claims(attention: AttentionSpec) -> tuple[str, ...]:
    """The normalizer claims of a lifted kernel: those of its built-in normalizer that carry
    over, or the claims its space implies."""

    norm = builtins().get(attention.normalizer)
    own = norm.claims if norm is not None else SPACE_CLAIMS.get(attention.space, ())
    return tuple(c for c in own if c in LIFTED_CLAIMS)


def lift(attention: AttentionSpec) -> NormalizerSpec:
    """The :class:`NormalizerSpec` of ``attention`` (no parameters: the kernel keeps its own)."""
    spec = NormalizerSpec(
        id=attention.id,
        fn=Lifted(attention),
        params={},
        claims=lifted_claims(attention),
        space=attention.space,
        source=attention.source,
        description=f"{attention.id} lifted (Q = S, K = V = I; long rows Q = I, K = Sᵀ)",
    )
    return dataclasses.replace(spec, target=normalizer_target(attention))


def __getattr__(name: str) -> NormalizerSpec:
    """``attnverify.attention.lift:TARGET`` loads the lifted kernel as a normalizer target (the
    repro lines of the lifted properties use it); ``~`` stands for ``:`` inside TARGET."""
    if name.startswith("__"):
        raise AttributeError(name)

    try:
        return lift(load_attention(name.replace("~", ":")))
    except TargetError as exc:
        raise AttributeError(f"{name}: {exc}") from None


def normalizer_target(attention: AttentionSpec) -> str:
    """The normalizer target string of the lifted kernel (for ``load_target``)."""
    return "attnverify.attention.lift:" + (attention.target or attention.id).replace(":", "~")
