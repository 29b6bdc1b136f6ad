"""The record types of a normalizer under test: :class:`NormalizerSpec`, :class:`Kernel`.

They live here, apart from the loader in :mod:`attnverify.registry`, so that the built-ins in
:mod:`attnverify.normalizers` can build their specs without importing the loader (which imports
the built-ins): ``normalizers`` -> ``spec`` and ``registry`` -> ``normalizers`` + ``spec``.
``attnverify.registry`` re-exports every public name defined here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnverify.errors import TargetError, UsageError

#: Output spaces a normalizer may declare (docs/NORMALIZERS.md, "space").
SPACES = ("simplex", "sub_simplex", "nonnegative", "affine", "any")

#: Memory layouts a normalizer may declare it takes (``normalizer_spec(layouts=...)``), simplest
#: first; :mod:`attnverify.strategies.layouts` builds them.
LAYOUT_KINDS = ("contiguous", "offset", "transposed", "permuted", "strided", "expanded")
#: Axes a normalizer may declare it normalises (``normalizer_spec(dims=...)``), counted from the
#: end: ``-1`` is the last axis.
LAYOUT_AXES = (-1, -2, -3, -4)

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
    """``F`` and ``F'`` of the general normalizer ``α_i = F(l_i) / Σ_j F(l_j)`` (docs/THEORY.md §1).

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
    (docs/INTERFACES.md); the universal ones are always checked.
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
    #: What ``matches_reference`` compares with (evaluated in float64): a callable
    #: ``ref(scores, dim=-1, **params)``, a :class:`NormalizerSpec` or a target string.
    #: ``None`` with a ``kernel`` means the kernel's general form.
    reference: Any = None
    #: Validators of its own parameters, ``name -> check(value)``: ``check`` returns ``None``
    #: when the value is acceptable, else what is expected ("a number in (0, 1)"); applied to
    #: ``--params`` (:func:`attnverify.registry.validate_params`) on top of the shared rules.
    param_checks: Mapping[str, Callable[[Any], str | None]] = field(default_factory=dict)
    #: Declared restrictions: the memory layouts it takes (:data:`LAYOUT_KINDS`; ``None``: every
    #: one) and the axes it normalises, counted from the end (``(-1,)``: the last axis only;
    #: ``None``: any). certify calls it only there and says so ("certified for: …").
    layouts: tuple[str, ...] | None = None
    dims: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.space not in SPACES:
            raise TargetError(
                f"normalizer {self.id!r}: space={self.space!r} is not one of {', '.join(SPACES)}"
            )
        if not callable(self.fn):
            raise TargetError(f"normalizer {self.id!r}: fn is not callable")
        object.__setattr__(self, "claims", tuple(self.claims))
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "layouts", _declared_layouts(self.id, self.layouts))
        object.__setattr__(self, "dims", _declared_dims(self.id, self.dims))

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

    def with_reference(self, reference: Any) -> NormalizerSpec:
        """A copy compared with ``reference`` (see the field), claiming ``matches_reference``."""
        claims = self.claims
        if "matches_reference" not in claims:
            claims = (*claims, "matches_reference")
        return dataclasses.replace(self, reference=reference, claims=claims)


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
    reference: Any = None,
    param_checks: Mapping[str, Callable[[Any], str | None]] | None = None,
    layouts: tuple[str, ...] | list[str] | None = None,
    dims: tuple[int, ...] | list[int] | int | None = None,
) -> NormalizerSpec:
    """Public constructor for a spec object that declares its claims (docs/INTERFACES.md).

    ``params`` defaults to the keyword defaults of ``fn``'s signature; ``claims`` defaults to
    the claims implied by ``space``, plus ``matches_reference`` when there is a reference:
    ``reference`` (a callable ``ref(scores, dim=-1, **params)``, a spec or a target string,
    evaluated in float64) or, without one, the general form of ``kernel``. ``param_checks``
    validates parameters given with ``--params`` (see the field). ``layouts`` and ``dims`` declare
    what it takes when that is less than every input: memory layouts among
    :data:`LAYOUT_KINDS` (``"contiguous"`` included) and axes counted from the end (``-1``: the
    last axis); certify then calls it only there (a layout whose every kind is declared: a
    transposed view at an offset when both are declared), and without them it is held to every
    layout, rank and axis.
    """
    if not callable(fn):
        raise TargetError(f"normalizer {id or fn!r}: fn is not callable")
    if claims is None and space in SPACE_CLAIMS:
        claims = SPACE_CLAIMS[space]
        if reference is not None or kernel is not None:
            claims = (*claims, "matches_reference")
    return NormalizerSpec(
        id=id or getattr(fn, "__name__", "normalizer"),
        fn=fn,
        params=_signature_params(fn) if params is None else dict(params),
        claims=claims or (),
        space=space,
        citation=citation,
        kernel=kernel,
        length_aware=length_aware,
        description=description or _first_doc_line(fn),
        reference=reference,
        param_checks=dict(param_checks or {}),
        layouts=None if layouts is None else tuple(layouts),
        dims=None if dims is None else (dims,) if isinstance(dims, int) else tuple(dims),
    )


def _declared_layouts(id: str, layouts: Any) -> tuple[str, ...] | None:
    """``layouts`` as a tuple of :data:`LAYOUT_KINDS` (``None``: every one), else a
    :class:`TargetError` naming the normalizer and the bad entry."""
    if layouts is None:
        return None
    if isinstance(layouts, str):
        layouts = (layouts,)
    layouts = tuple(dict.fromkeys(layouts))
    bad = [k for k in layouts if k not in LAYOUT_KINDS]
    if bad:
        raise TargetError(f"normalizer {id!r}: layouts contains {bad[0]!r}, which is not one of "
                          f"{', '.join(LAYOUT_KINDS)}")
    if "contiguous" not in layouts:
        raise TargetError(f"normalizer {id!r}: layouts must include 'contiguous'")
    return None if set(layouts) == set(LAYOUT_KINDS) else layouts


def _declared_dims(id: str, dims: Any) -> tuple[int, ...] | None:
    """``dims`` as a tuple of :data:`LAYOUT_AXES` (``None``: any axis), else a
    :class:`TargetError`."""
    if dims is None:
        return None
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    bad = [d for d in dims if isinstance(d, bool) or d not in LAYOUT_AXES]
    if bad or not dims:
        raise TargetError(f"normalizer {id!r}: dims={dims!r}: give axes counted from the end, "
                          "-1 (the last axis), -2, -3 or -4")
    dims = tuple(dict.fromkeys(dims))
    return None if set(dims) == set(LAYOUT_AXES) else dims


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
