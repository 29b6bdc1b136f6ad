"""How rows of scores are handed to a normaliser: rank, axis, memory layout and row count.

Attention does not call a normaliser on one contiguous ``[rows, L]`` block with ``dim=-1``. It
hands it ``q @ k.transpose(-2, -1)`` (a ``[B, H, L_q, L_k]`` tensor), permuted views of
``[B, L, H, d]`` buffers, masks expanded with stride 0 over heads, slices of larger buffers, and
``B·H·L_q`` rows at once. A :class:`Layout` describes one such presentation of a ``[R, L]``
block of rows (the *case's* scores, always kept in that canonical form):

- ``sizes``: the tensor the normaliser is given (rank 1–4), the row length at axis ``dim``;
- ``dim``: the axis it normalises, as passed (``-1`` or ``rank - 1`` name the same axis);
- ``order``: the memory order of the axes, outermost first (a permutation; the identity is a
  contiguous tensor, a swap of two axes a transposed view, anything else a permuted view);
- ``step``: a slice step per axis (``2`` on an axis: every second entry of a buffer twice as
  long, a strided slice);
- ``expand``: axes of stride 0 (a batch or head axis broadcast with ``expand``; each of its
  ``sizes[a]`` copies holds the same rows);
- ``offset``: the storage offset of the first element (a view into a larger buffer).

These combine, as attention combines them: ``q @ k.transpose(-2, -1)`` on a slice of a buffer
is a transposed, strided view at an offset; a fused QKV split is a strided view at an offset.
A layout's kinds (:attr:`Layout.kinds`) are all those its sizes, strides and offset show.

The rows are the entries along ``dim`` at every index of the other axes, in index order, the
expanded axes at index 0: ``x.movedim(dim, -1)[..., 0 on expanded axes, ...].reshape(R, L)``.
:func:`present` builds the tensor (a view into a buffer whose unused entries hold large finite
values, so that a kernel that reads memory in storage order reads them);
:func:`collect` reads the weights back as ``[R, L]``. Both are differentiable (also under
``torch.func.jvp`` / ``vjp``), so a derivative taken through :func:`present` is the derivative of
the normaliser on that view.

:func:`row_layouts` is the Hypothesis strategy (each feature drawn on its own, shrinking towards
the simplest presentation: the contiguous ``[R, L]`` block with ``dim=-1``, each feature removed on
its own, rank 2 before 3 and 4, the last axis before another, the negative spelling before the
positive one), :func:`build_layout` its deterministic builder (one kind or several together),
:func:`row_counts` and :func:`block_lengths` the row counts and row lengths that cross block
sizes. A space of declared restrictions (:class:`LayoutSpace`) admits a layout when it declares
every one of its kinds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from attnverify.spec import LAYOUT_AXES, LAYOUT_KINDS

#: Memory layouts, simplest first (what a normaliser may declare it supports, and what shrinking
#: moves away from, last to first): :data:`attnverify.spec.LAYOUT_KINDS`.
KINDS = LAYOUT_KINDS
#: Ranks of the tensor given: ``[L]``, ``[rows, L]``, ``[B, L_q, L]``, ``[B, H, L_q, L]``.
RANKS = (1, 2, 3, 4)
#: Axes counted from the end (``-1``: the last axis).
AXES = LAYOUT_AXES
#: Value of the buffer entries a view does not cover: large and finite, so that a kernel that
#: reads them (storage order, a forgotten offset) returns visibly wrong weights.
GAP_BASE = 50.0
GAP_PERIOD = 13
#: Copies along an expanded axis, slice steps and storage offsets :func:`build_layout` picks from.
COPIES = (2, 3, 4)
STEPS = (2, 3)
MAX_OFFSET = 17


class Layout(NamedTuple):
    """One presentation of ``[R, L]`` rows to a normaliser (see the module docstring)."""

    sizes: tuple[int, ...]
    dim: int
    order: tuple[int, ...]
    step: tuple[int, ...]
    expand: tuple[int, ...] = ()
    offset: int = 0

    # ---- derived structure

    @property
    def rank(self) -> int:
        return len(self.sizes)

    @property
    def axis(self) -> int:
        """The normalised axis, ``0 … rank-1``."""
        return self.dim % self.rank

    @property
    def from_end(self) -> int:
        """The normalised axis counted from the end (``-1``: the last axis)."""
        return self.axis - self.rank

    @property
    def length(self) -> int:
        return self.sizes[self.axis]

    @property
    def row_axes(self) -> tuple[int, ...]:
        """The axes that index rows: all but the normalised axis and the expanded ones."""
        return tuple(a for a in range(self.rank) if a != self.axis and a not in self.expand)

    @property
    def rows(self) -> int:
        """``R``: distinct rows (the expanded copies not counted)."""
        return math.prod(self.sizes[a] for a in self.row_axes)

    @property
    def copies(self) -> int:
        return math.prod(self.sizes[a] for a in self.expand)

    @property
    def rows_given(self) -> int:
        """Rows the normaliser is given: ``R`` times the expanded copies."""
        return self.rows * self.copies

    def _padded(self, a: int) -> int:
        return (1 if a in self.expand else self.sizes[a]) * self.step[a]

    @property
    def block(self) -> tuple[int, ...]:
        """The buffer the view is cut from, in memory order (outermost first)."""
        return tuple(self._padded(a) for a in self.order)

    @property
    def strides(self) -> tuple[int, ...]:
        unit, out = 1, [0] * self.rank
        for a in reversed(self.order):
            out[a] = 0 if a in self.expand else unit * self.step[a]
            unit *= self._padded(a)
        return tuple(out)

    @property
    def span(self) -> int:
        """Storage entries the view needs (its offset included)."""
        return self.offset + math.prod(self.block)

    @property
    def plain(self) -> bool:
        """The contiguous ``[R, L]`` block with ``dim=-1``: the tensor is the rows themselves."""
        return (self.rank == 2 and self.dim == -1 and self.order == (0, 1)
                and self.step == (1, 1) and not self.expand and self.offset == 0)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The layout's kinds (:data:`KINDS`), read from its sizes and strides: ``contiguous``
        when none of the others applies. An axis of size 1 does not make a view."""
        strides, sizes = self.strides, self.sizes
        out = []
        if self.offset:
            out.append("offset")
        live = [a for a in range(self.rank) if sizes[a] > 1 and strides[a] != 0]
        memory = sorted(live, key=lambda a: (-strides[a], a))
        if memory != live:
            out.append("transposed" if _one_swap(live, memory) else "permuted")
        expected = 1
        for a in reversed(memory):
            if strides[a] != expected:
                out.append("strided")
                break
            expected *= sizes[a]
        if any(sizes[a] > 1 and strides[a] == 0 for a in range(self.rank)):
            out.append("expanded")
        return tuple(k for k in KINDS if k in out) or ("contiguous",)

    # ---- words

    def describe(self) -> str:
        """Plain words: ``a transposed view of a [3, 5] block, dim=0``."""
        kinds = set(self.kinds)
        views = [k for k in ("transposed", "permuted", "strided") if k in kinds]
        if views:
            text = f"a {' and '.join(views)} view of a {list(self.block)} block"
            notes = [f"axes in memory order {list(self.order)}"] if "permuted" in kinds else []
            if "strided" in kinds:
                notes += [f"step {s} along axis {a}" for a, s in enumerate(self.step) if s > 1]
            if notes:
                text += f" ({'; '.join(notes)})"
        else:
            base = [1 if a in self.expand else s for a, s in enumerate(self.sizes)]
            text = f"a contiguous {base} tensor"
        for a in self.expand:
            if self.sizes[a] > 1:
                text += f", axis {a} expanded with stride 0 to {self.sizes[a]} copies"
        if self.offset:
            text += f", at storage offset {self.offset}"
        return f"{text}, dim={self.dim}"

    # ---- other row counts

    def fit(self, rows: int, length: int) -> Layout:
        """The same layout for ``rows`` rows of ``length`` keys (a derived input, a shrunk
        case): the row axes keep their sizes when they hold ``rows`` rows, else every row axis but
        the last becomes 1; a rank-1 layout given several rows becomes rank 2."""
        if rows == self.rows and length == self.length:
            return self
        sizes = list(self.sizes)
        sizes[self.axis] = length
        axes = self.row_axes
        if rows != self.rows:
            if not axes and rows > 1:
                return _grow(self, rows, length)
            for a in axes:
                sizes[a] = 1
            if axes:
                sizes[axes[-1]] = rows
        return self._replace(sizes=tuple(sizes))

    # ---- JSON

    def to_json(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "strides": list(self.strides),
                "storage_offset": self.offset, "dim": self.dim, "order": list(self.order),
                "step": list(self.step), "expand": list(self.expand), "kinds": list(self.kinds),
                "text": self.describe()}

    @classmethod
    def from_json(cls, data: Any) -> Layout:
        """Inverse of :meth:`to_json`; a malformed layout raises ``ValueError`` saying why."""
        if not isinstance(data, dict):
            raise ValueError("the layout must be a JSON object")
        try:
            sizes = _ints(data["sizes"], "sizes")
            rank = len(sizes)
            layout = cls(
                sizes=sizes, dim=int(data["dim"]),
                order=_ints(data.get("order", list(range(rank))), "order"),
                step=_ints(data.get("step", [1] * rank), "step"),
                expand=_ints(data.get("expand", []), "expand"),
                offset=int(data.get("storage_offset", 0)))
        except KeyError as exc:
            raise ValueError(f"the layout has no {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad layout: {exc}") from None
        problem = layout.problem()
        if problem:
            raise ValueError(problem)
        if "strides" in data and list(data["strides"]) != list(layout.strides):
            raise ValueError(f"the layout's strides {data['strides']} are not those of its "
                             f"order, step and expand ({list(layout.strides)})")
        return layout

    def problem(self) -> str | None:
        """Why this is not a valid layout, or ``None``."""
        rank = self.rank
        if rank not in RANKS:
            return f"rank {rank}: expected 1 to 4 axes"
        if any(s < 1 for s in self.sizes):
            return f"sizes {list(self.sizes)}: every size must be at least 1"
        if not -rank <= self.dim < rank:
            return f"dim={self.dim} is not an axis of a rank-{rank} tensor"
        if sorted(self.order) != list(range(rank)):
            return f"order {list(self.order)} is not a permutation of the {rank} axes"
        if len(self.step) != rank or any(s < 1 for s in self.step):
            return f"step {list(self.step)}: one step ≥ 1 per axis"
        if any(not 0 <= a < rank or a == self.axis for a in self.expand) or \
                len(set(self.expand)) != len(self.expand):
            return f"expand {list(self.expand)}: distinct axes other than dim"
        if self.offset < 0:
            return f"storage offset {self.offset} is negative"
        return None


def _one_swap(logical: list[int], memory: list[int]) -> bool:
    return sum(1 for a, b in zip(logical, memory) if a != b) == 2


def _ints(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or any(
            isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ValueError(f"{name} must be a list of integers")
    return tuple(value)


def _grow(layout: Layout, rows: int, length: int) -> Layout:
    """A layout with no row axis given several rows: one more axis (rank ≤ 4), else the
    expanded axes become row axes."""
    if layout.rank < 4:
        rank = layout.rank + 1
        axis = layout.axis + 1
        sizes = (rows,) + tuple(length if a == layout.axis else s
                                for a, s in enumerate(layout.sizes))
        dim = axis if layout.dim >= 0 else axis - rank
        order = (0,) + tuple(a + 1 for a in layout.order)
        step = (1,) + layout.step
        expand = tuple(a + 1 for a in layout.expand)
        return Layout(sizes, dim, order, step, expand, layout.offset)
    sizes = [1 if a != layout.axis else length for a in range(layout.rank)]
    free = [a for a in range(layout.rank) if a != layout.axis]
    sizes[free[-1]] = rows
    return layout._replace(sizes=tuple(sizes), expand=())


def plain(rows: int, length: int) -> Layout:
    """The contiguous ``[rows, length]`` block, ``dim=-1``."""
    return Layout((rows, length), -1, (0, 1), (1, 1))


# --------------------------------------------------------------------------------------------
# Building the tensor, reading the weights back


@lru_cache(maxsize=32)
def _gaps(span: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The buffer a view is cut from, before the rows are written into it (never modified:
    :func:`present` scatters out of place)."""
    return GAP_BASE + (torch.arange(span, device=device) % GAP_PERIOD).to(dtype)


def present(rows: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The ``[R, L]`` ``rows`` given as ``layout`` (fitted to ``R`` and ``L``): a view with the
    layout's sizes, strides and storage offset into a fresh buffer. Differentiable; the plain
    layout returns ``rows`` itself when they are a contiguous block at offset 0, else a copy that
    is."""
    count, length = rows.shape
    layout = layout.fit(count, length)
    if layout.plain:
        # the plain layout is a contiguous block at offset 0: rows that are a view of something
        # larger (a row sliced from its batch) would otherwise reach the normaliser at an offset
        # a kernel declaring only "contiguous" never agreed to
        if rows.storage_offset() or not rows.is_contiguous():
            return rows.clone(memory_format=torch.contiguous_format)
        return rows
    axis, rank = layout.axis, layout.rank
    base = [1 if a in layout.expand else layout.sizes[a] for a in range(rank)]
    logical = rows.reshape([base[a] for a in range(rank) if a != axis] + [length])
    logical = logical.movedim(-1, axis)
    strides = layout.strides
    # expanded axes have size 1 in ``logical``: any stride places them
    flat = torch.as_strided_scatter(_gaps(layout.span, rows.dtype, str(rows.device)), logical,
                                    base, strides, layout.offset)
    return flat.as_strided(layout.sizes, strides, layout.offset)


class LayoutMismatch(ValueError):
    """The normaliser returned something that is not a tensor of the input's shape."""


def collect(out: Any, layout: Layout, *, copies: str = "first") -> torch.Tensor:
    """The weights ``out`` of a tensor given as ``layout`` as ``[R, L]`` rows. Along expanded
    axes: the first copy (``copies="first"``), the mean of the copies (``"mean"``, whose
    derivative reaches every copy) or every copy (``"all"``: ``[copies, R, L]``). Raises
    :class:`LayoutMismatch` unless ``out`` is a tensor of the layout's shape."""
    if not isinstance(out, torch.Tensor):
        raise LayoutMismatch(f"returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(layout.sizes):
        raise LayoutMismatch(f"returned shape {list(out.shape)} for an input of shape "
                             f"{list(layout.sizes)}")
    if layout.plain:
        return out if copies != "all" else out.unsqueeze(0)
    if copies == "all":
        k = len(layout.expand)
        rest = [a for a in range(layout.rank) if a not in layout.expand]
        out = out.movedim(layout.expand, tuple(range(k)))
        out = out.movedim(k + rest.index(layout.axis), -1)
        return out.reshape(layout.copies, layout.rows, layout.length)
    for a in layout.expand:
        out = out.mean(dim=a, keepdim=True) if copies == "mean" else out.narrow(a, 0, 1)
    return out.movedim(layout.axis, -1).reshape(layout.rows, layout.length)


# --------------------------------------------------------------------------------------------
# Construction


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n <= 4096 else [1, n]


def _split(rows: int, parts: int, rng: random.Random) -> list[int]:
    """``parts`` sizes whose product is ``rows`` (the last takes what is left), each above 1
    where the rows allow it (so that a permutation of the axes is a real view)."""
    out = []
    for _ in range(parts - 1):
        choices = [d for d in _divisors(rows) if d <= 16]
        inner = [d for d in choices if 1 < d < rows]
        d = rng.choice(inner or choices)
        out.append(d)
        rows //= d
    return out + [rows]


#: The memory orders a layout may have besides the identity (one at most: the other features,
#: a slice, a stride-0 axis and an offset, combine with either and with each other).
VIEWS = ("transposed", "permuted")


def features_of(kind: str | Iterable[str]) -> frozenset[str]:
    """The features a ``kind`` names: one of :data:`KINDS`, or several together (an iterable:
    ``("transposed", "strided", "offset")`` is a transposed, strided view at an offset);
    ``contiguous`` adds nothing. ``InvalidArgument`` for an unknown kind or for ``transposed``
    with ``permuted`` (one memory order)."""
    names = (kind,) if isinstance(kind, str) else tuple(kind)
    bad = [k for k in names if k not in KINDS]
    if bad:
        raise InvalidArgument(f"kind={bad[0]!r} must be one of {KINDS}")
    out = frozenset(names) - {"contiguous"}
    if set(VIEWS) <= out:
        raise InvalidArgument("kind: a layout is transposed or permuted, not both")
    return out


def build_layout(rows: int, length: int, *, rank: int = 2, from_end: int = -1,
                 positive: bool = False, kind: str | Iterable[str] = "contiguous",
                 detail: int = 0, space: LayoutSpace | None = None) -> Layout:
    """A layout of ``rows`` rows of ``length`` keys at rank ``rank``, normalising the axis
    ``from_end`` (``-1``: the last), spelled positive or negative, with the features ``kind``
    names (:func:`features_of`: one kind, or several together). ``detail`` seeds the free
    choices (how the rows split over the axes, which axes are permuted, sliced or expanded, the
    steps, the copies, the offset). Within ``space`` (declared restrictions): what it rules out
    is left out. Deterministic.

    A feature shows where the sizes allow it: a view needs two axes of more than one entry, a
    slice one; an expanded axis raises the rank where no free axis is left for it."""
    features = features_of(kind)
    _check_build(rows, length, rank, from_end)
    rng = random.Random(detail)
    expanded = "expanded" in features
    if expanded and (rank < 2 or (rank == 2 and rows > 1)):
        rank = min(4, rank + (2 if rank < 2 and rows > 1 else 1))
    if rows > 1 and rank == 1:
        rank = 2
    from_end = max(from_end, -rank)
    axis = rank + from_end
    others = [a for a in range(rank) if a != axis]
    expand: tuple[int, ...] = ()
    if expanded:
        choices = others if rows == 1 else others[:-1] or others
        expand = (rng.choice(choices),)
    row_axes = [a for a in others if a not in expand]
    sizes = [1] * rank
    sizes[axis] = length
    for a in expand:
        sizes[a] = rng.choice(COPIES)
    if row_axes:
        for a, s in zip(row_axes, _split(rows, len(row_axes), rng)):
            sizes[a] = s
    # axes that make a view (size > 1, not expanded); a permutation of the others changes nothing
    live = [a for a in range(rank) if sizes[a] > 1 and a not in expand]
    order = _memory_order(rank, live or list(range(rank)), features, rng)
    step = [1] * rank
    if "strided" in features:
        sliced = live or [a for a in [axis, *others] if a not in expand]
        count = 2 if len(sliced) > 1 and rng.random() < 1 / 3 else 1
        for a in rng.sample(sliced, count):
            step[a] = rng.choice(STEPS)
    offset = rng.randint(1, MAX_OFFSET) if "offset" in features else 0
    dim = axis if positive else axis - rank
    layout = Layout(tuple(sizes), dim, tuple(order), tuple(step), expand, offset)
    return layout if space is None else space.restrict(layout)


def _memory_order(rank: int, live: list[int], features: frozenset[str],
                  rng: random.Random) -> list[int]:
    """The memory order of the axes: the identity, two ``live`` axes swapped (``transposed``)
    or the ``live`` axes in another order (``permuted``; a swap where only two are live)."""
    order = list(range(rank))
    view = next((k for k in VIEWS if k in features), None)
    if view is None or len(live) < 2:
        return order
    if view == "transposed" or len(live) == 2:
        i, j = rng.sample(live, 2)
        order[i], order[j] = order[j], order[i]
        return order
    moved = list(live)
    while moved == live or _one_swap(live, moved):
        rng.shuffle(moved)
    for a, b in zip(live, moved):
        order[a] = b
    return order


def _check_build(rows, length, rank, from_end) -> None:
    for name, value in (("rows", rows), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgument(f"{name}={value!r} must be an integer ≥ 1")
    if rank not in RANKS:
        raise InvalidArgument(f"rank={rank!r} must be one of {RANKS}")
    if from_end not in AXES:
        raise InvalidArgument(f"from_end={from_end!r} must be one of {AXES}")


# --------------------------------------------------------------------------------------------
# Declared restrictions


class LayoutSpace(NamedTuple):
    """The layouts and axes a normaliser takes: ``kinds`` among :data:`KINDS` (``None``: all),
    ``axes`` counted from the end (``None``: any)."""

    kinds: tuple[str, ...] | None = None
    axes: tuple[int, ...] | None = None

    @property
    def restricted(self) -> bool:
        return self.kinds is not None or self.axes is not None

    def admits(self, layout: Layout) -> bool:
        """Every kind of ``layout`` is declared (a combination of declared kinds included),
        and so is its axis."""
        kinds_ok = self.kinds is None or set(layout.kinds) <= set(self.kinds)
        return kinds_ok and (self.axes is None or layout.from_end in self.axes)

    def restrict(self, layout: Layout) -> Layout:
        """``layout`` without what this space rules out: the axis moved to an allowed one, then
        each feature it does not declare dropped (a view, a slice, an expanded axis, an
        offset), the declared ones kept."""
        if self.admits(layout):
            return layout
        if self.axes is not None and layout.from_end not in self.axes:
            layout = _move_axis(layout, self.axes)
        kinds = set(KINDS if self.kinds is None else self.kinds)
        have = set(layout.kinds)
        if have & {"transposed", "permuted"} - kinds:
            layout = layout._replace(order=tuple(range(layout.rank)))
        if "strided" in have - kinds:
            layout = layout._replace(step=(1,) * layout.rank)
        if "expanded" in have - kinds:
            sizes = tuple(1 if a in layout.expand else s for a, s in enumerate(layout.sizes))
            layout = layout._replace(sizes=sizes, expand=())
        if "offset" in have - kinds:
            layout = layout._replace(offset=0)
        return layout

    def words(self) -> str:
        """``contiguous, offset layouts; the last axis only`` (for "certified for: …")."""
        kinds = "every layout" if self.kinds is None else \
            f"{', '.join(k for k in KINDS if k in self.kinds)} layouts only"
        if self.axes is None:
            axes = "any axis"
        elif set(self.axes) == {-1}:
            axes = "the last axis only"
        else:
            axes = "axes " + ", ".join(str(a) for a in sorted(self.axes, reverse=True)) + \
                " (from the end) only"
        return f"{kinds}; {axes}; ranks 1–4"

    def to_json(self) -> dict[str, Any] | None:
        if not self.restricted:
            return None
        return {"layouts": None if self.kinds is None else list(self.kinds),
                "dims": None if self.axes is None else list(self.axes)}


def _move_axis(layout: Layout, axes: Sequence[int]) -> Layout:
    """The rows normalised along an allowed axis (the one nearest the end that fits, leading
    axes of size 1 added where none fits), the other axes in their order with their memory
    order, steps, expansion and offset."""
    if not any(-a <= layout.rank for a in axes):
        extra = max(-a for a in axes) - layout.rank
        layout = Layout((1,) * extra + layout.sizes,
                        layout.dim + extra if layout.dim >= 0 else layout.dim,
                        tuple(range(extra)) + tuple(a + extra for a in layout.order),
                        (1,) * extra + layout.step, tuple(a + extra for a in layout.expand),
                        layout.offset)
    rank, axis = layout.rank, layout.axis
    target = max(a for a in axes if -a <= rank) + rank
    others = [a for a in range(rank) if a != axis]
    p = others[:target] + [axis] + others[target:]  # new axis i is old axis p[i]
    return Layout(tuple(layout.sizes[a] for a in p),
                  target if layout.dim >= 0 else target - rank,
                  tuple(p.index(a) for a in layout.order), tuple(layout.step[a] for a in p),
                  tuple(sorted(p.index(a) for a in layout.expand)), layout.offset)


def layout_space(kinds: Iterable[str] | None = None, axes: Iterable[int] | None = None
                 ) -> LayoutSpace:
    """A :class:`LayoutSpace`, validated (``ValueError`` naming the bad entry)."""
    if kinds is not None:
        kinds = tuple(dict.fromkeys(kinds))
        bad = [k for k in kinds if k not in KINDS]
        if bad:
            raise ValueError(f"layouts: {bad[0]!r} is not one of {', '.join(KINDS)}")
        if "contiguous" not in kinds:
            raise ValueError("layouts must include 'contiguous'")
        if set(kinds) == set(KINDS):
            kinds = None
    if axes is not None:
        axes = tuple(dict.fromkeys(axes))
        bad = [a for a in axes if isinstance(a, bool) or a not in AXES]
        if bad or not axes:
            raise ValueError(f"dims: {bad[0] if bad else axes!r} is not an axis counted from "
                             "the end (-1 the last axis, -2, -3, -4)")
        if set(axes) == set(AXES):
            axes = None
    return LayoutSpace(kinds, axes)


ANY = LayoutSpace()


# --------------------------------------------------------------------------------------------
# Hypothesis


@lru_cache(maxsize=64)
def shapes(space: LayoutSpace = ANY) -> tuple[tuple[int, int, bool], ...]:
    """``(rank, from_end, positive)`` choices of ``space``, simplest first: rank 2 before 1, 3
    and 4, the last axis before another, the negative spelling before the positive one."""
    axes = AXES if space.axes is None else tuple(a for a in AXES if a in space.axes)
    return tuple((rank, from_end, positive) for rank in (2, 1, 3, 4) for from_end in axes
                 if -from_end <= rank for positive in (False, True))


@lru_cache(maxsize=64)
def _shape_choices(space: LayoutSpace) -> SearchStrategy:
    return st.sampled_from(shapes(space))


@lru_cache(maxsize=64)
def _view_choices(space: LayoutSpace) -> SearchStrategy | None:
    views = tuple(k for k in VIEWS if space.kinds is None or k in space.kinds)
    return st.sampled_from((None, *views)) if views else None


_BOOLEANS = st.booleans()
#: One layout draw in this many is contiguous outright (no feature drawn).
CONTIGUOUS_SHARE = 4


@lru_cache(maxsize=4096)
def ints(lo: int, hi: int) -> SearchStrategy[int]:
    """``st.integers(lo, hi)``, built once: a draw inside a composite strategy then costs no
    strategy construction (which Hypothesis makes expensive)."""
    return st.integers(lo, hi)


def draw_features(draw: Callable, space: LayoutSpace = ANY) -> tuple[str, ...]:
    """The features of a layout inside ``space``, each drawn on its own: contiguous outright
    one draw in :data:`CONTIGUOUS_SHARE`, else a memory order (none, ``transposed`` or
    ``permuted``), then ``strided``, ``offset`` and ``expanded``, each yes or no. Each shrinks
    away on its own (none first, then no)."""
    if not draw(ints(0, CONTIGUOUS_SHARE - 1)):
        return ()
    allowed = KINDS if space.kinds is None else space.kinds
    views = _view_choices(space)
    view = draw(views) if views is not None else None
    out = [view] if view else []
    out += [k for k in ("strided", "offset", "expanded") if k in allowed and draw(_BOOLEANS)]
    return tuple(out)


def draw_layout(draw: Callable, rows: int, length: int, space: LayoutSpace = ANY) -> Layout:
    """A layout of ``rows`` rows of ``length`` keys inside ``space``: a rank, an axis and its
    spelling (:func:`shapes`), the features (:func:`draw_features`, any of them together) and
    the free choices (``detail``)."""
    rank, from_end, positive = draw(_shape_choices(space))
    features = draw_features(draw, space)
    detail = draw(ints(0, 255))
    return build_layout(rows, length, rank=rank, from_end=from_end, positive=positive,
                        kind=features, detail=detail, space=space)


def row_layouts(*, rows: int | SearchStrategy[int] = 1, length: int | SearchStrategy[int] = 8,
            kinds: Sequence[str] | None = None, dims: Sequence[int] | None = None
            ) -> SearchStrategy[Layout]:
    """Layouts of ``rows`` rows of ``length`` keys: ranks 1–4, any axis (``dims``: only those,
    counted from the end), any of :data:`KINDS` and several together (``kinds``: only layouts
    whose every kind is among those). Shrinks towards the contiguous ``[rows, length]`` block
    with ``dim=-1``, each feature on its own."""
    try:
        space = layout_space(kinds, dims)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None

    @st.composite
    def draw_one(draw):
        r = draw(rows) if isinstance(rows, SearchStrategy) else rows
        n = draw(length) if isinstance(length, SearchStrategy) else length
        return draw_layout(draw, r, n, space)

    return draw_one()


#: Row counts past chunk boundaries: one fewer and one more than every multiple of 64 up to
#: 4096 (so of 128, 1024 and the powers of two from 64), and than the smaller powers of two.
ROW_TAILS = tuple(sorted({n + d for n in [2**k for k in range(2, 6)] + list(range(64, 4097, 64))
                          for d in (-1, 1)}))


#: One row count in this many is a tail of :data:`ROW_TAILS` (:func:`row_counts`).
MANY_SHARE = 4


@lru_cache(maxsize=64)
def row_counts(*, min_rows: int = 1, max_rows: int = 4, many: int = 4097,
               share: int = MANY_SHARE):
    """Row counts: mostly ``min_rows … max_rows``; one draw in ``share`` a tail of
    :data:`ROW_TAILS` up to ``many`` (shrinking towards the few)."""
    tails = tuple(n for n in ROW_TAILS if max_rows < n <= many)
    few = ints(min_rows, max_rows)
    pick = st.sampled_from(tails) if tails else None

    @st.composite
    def draw_one(draw):
        if tails and draw(ints(0, share - 1)) == share - 1:
            return draw(pick)
        return draw(few)

    return draw_one()


def block_length(draw: Callable, lo: int, hi: int) -> int:
    """A row length in ``[lo, hi]``: a power-of-two bucket ``2**e``, then either any length up
    to it or ``2**e - 1``, ``2**e``, ``2**e + 1`` (clipped), so that lengths cross block sizes."""
    e = draw(ints((lo - 1).bit_length(), (hi - 1).bit_length()))
    edge = draw(ints(0, 3))
    if edge == 0:
        return draw(ints(lo, min(hi, 2**e)))
    return min(hi, max(lo, 2**e + edge - 2))


def block_lengths(*, min_length: int = 1, max_length: int = 4096) -> SearchStrategy[int]:
    """Row lengths in ``[min_length, max_length]`` that often sit at ``2**k - 1``, ``2**k``,
    ``2**k + 1``; shrinks towards ``min_length``."""
    if not 1 <= min_length <= max_length:
        raise InvalidArgument(f"need 1 ≤ min_length={min_length} ≤ max_length={max_length}")
    return st.composite(lambda draw: block_length(draw, min_length, max_length))()
