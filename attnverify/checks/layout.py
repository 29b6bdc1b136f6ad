"""The normaliser called on a case's rows as the case's layout hands them over.

A case keeps its scores as canonical ``[R, L]`` rows and says in ``case.layout`` (a
:class:`~attnverify.strategies.layouts.Layout`, ``None`` for the contiguous block with
``dim=-1``) how the normaliser is given them: rank, axis, memory layout. Every check calls the
normaliser through :func:`weights` (or :func:`given` and :func:`read` where it needs the raw
output), so every property is checked on the layouts the cases draw, and an input a check
derives from the case (keys masked, a row alone, a permutation) is given in the same layout,
fitted to its row count and length.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnverify.checks.base import NormalizerError, Violation, call, call_many, call_many_vjp
from attnverify.jacobian import vjp
from attnverify.strategies.layouts import (
    ANY,
    Layout,
    LayoutMismatch,
    LayoutSpace,
    collect,
    layout_space,
    plain,
    present,
)


def layout_of(case: Any, rows: torch.Tensor | None = None) -> Layout:
    """The case's layout fitted to ``rows`` (default: the case's scores)."""
    scores = case.scores if rows is None else rows
    count, length = scores.shape
    layout = getattr(case, "layout", None)
    return plain(count, length) if layout is None else layout.fit(count, length)


def given(spec, rows: torch.Tensor, temperature, layout: Layout):
    """``(tensor given, raw output)``: the normaliser on ``rows`` presented as ``layout``. What
    it raises is a :class:`NormalizerError` whose message names the layout and whose ``input``
    is ``rows``."""
    layout = layout.fit(*rows.shape)
    x = present(rows, layout)
    try:
        return x, call_view(spec, x, temperature, layout)
    except NormalizerError as exc:
        exc.input = rows if type(rows) is torch.Tensor else None
        raise


def call_view(spec, x: torch.Tensor, temperature, layout: Layout):
    """The normaliser on the tensor ``x`` built by :func:`present` for ``layout``; what it
    raises is a :class:`NormalizerError` whose message names the layout."""
    try:
        return call(spec, x, temperature, dim=layout.dim)
    except NormalizerError as exc:
        if not layout.plain:
            exc.args = (f"{exc.args[0]} (given as {layout.describe()})",)
        raise


def given_many(spec, rows_list: list, temperature, layout: Layout, *,
               reuse: dict | None = None) -> list:
    """:func:`given` for each of ``rows_list`` (each in ``layout`` fitted to it), in order, in
    one request to the worker where the normaliser runs behind the process boundary.
    ``reuse`` ``{i: j}``: input ``i`` is written into the very tensor input ``j`` was given (the
    two fit the same layout)."""
    fitted = [layout.fit(*rows.shape) for rows in rows_list]
    xs = [present(rows, lay) for rows, lay in zip(rows_list, fitted)]

    def run(picks, dim):
        sub = {picks.index(i): picks.index(j) for i, j in (reuse or {}).items()
               if i in picks and j in picks}
        return call_many(spec, [xs[i] for i in picks], temperature, dim=dim, reuse=sub or None)

    return list(zip(xs, _by_dim(fitted, rows_list, run)))


def _by_dim(fitted: list, rows_list: list, run) -> list:
    """``run(picks, dim)`` (one request) for the indices ``picks`` of the ``fitted`` layouts
    that share ``dim``; the answers in the order of ``fitted``. A :class:`NormalizerError`
    names the layout of the input that raised and carries its rows."""
    by_dim: dict[int, list[int]] = {}
    for i, lay in enumerate(fitted):
        by_dim.setdefault(lay.dim, []).append(i)
    answers: list = [None] * len(fitted)
    for dim, picks in by_dim.items():
        try:
            results = run(picks, dim)
        except NormalizerError as exc:
            index = getattr(exc.cause, "index", None)
            failed = picks[index] if isinstance(index, int) and 0 <= index < len(picks) \
                else picks[0]
            lay, rows = fitted[failed], rows_list[failed]
            exc.input = rows.detach() if type(rows) is torch.Tensor else None
            if not lay.plain:
                exc.args = (f"{exc.args[0]} (given as {lay.describe()})",)
            raise
        for i, answer in zip(picks, results):
            answers[i] = answer
    return answers


def case_weights_many(spec, case, rows_list: list, *, copies: str = "first") -> list:
    """:func:`case_weights` of each of ``rows_list``, in one request (:func:`given_many`)."""
    layouts = [layout_of(case, rows) for rows in rows_list]
    if not rows_list:
        return []
    raw = given_many(spec, rows_list, case.temperature, layout_of(case))
    return [read(out, lay, copies=copies) for (_, out), lay in zip(raw, layouts)]


def case_vjps_many(spec, case, rows_list: list, cotangent: torch.Tensor, *,
                   copies: str = "first") -> list | None:
    """``[(weights, gradient, graph)]`` for each of ``rows_list`` (``[R, L]`` rows given in the
    case's layout, as :func:`case_weights`): the ``[R, L]`` weights (:func:`read` of the
    output), the gradient of ``⟨cotangent, weights⟩`` with respect to the rows, and whether the
    output carried a graph; in one request to the worker where the normaliser runs behind the
    process boundary (``None`` for one called in this process: the caller differentiates
    :func:`case_weights` there).

    The layout's two maps are linear and stay in this process: the cotangent sent with each
    input is the adjoint of :func:`collect` applied to ``cotangent``, and the gradient that
    comes back is mapped to the rows through the adjoint of :func:`present`, both taken by
    autograd on the very operations a backward pass through :func:`case_weights` runs (the
    same values, whatever the layout's kind)."""
    if getattr(getattr(spec, "fn", None), "many_vjp", None) is None:
        return None
    rows_list = [rows.detach().clone().requires_grad_(True) for rows in rows_list]
    fitted = [layout_of(case, rows) for rows in rows_list]
    with torch.enable_grad():
        xs = [present(rows, lay) for rows, lay in zip(rows_list, fitted)]
        cotangents = []
        for rows, lay in zip(rows_list, fitted):
            probe = torch.zeros(lay.sizes, dtype=rows.dtype, device=rows.device,
                                requires_grad=True)
            y = collect(probe, lay, copies=copies)
            (c,) = vjp(y, probe, cotangent.to(y.dtype))
            cotangents.append(c)
    answers = _by_dim(fitted, rows_list, lambda picks, dim: call_many_vjp(
        spec, [xs[i].detach() for i in picks], [cotangents[i] for i in picks],
        case.temperature, dim=dim))
    out = []
    for rows, x, lay, (output, grad, graph) in zip(rows_list, xs, fitted, answers):
        with torch.enable_grad():
            (g,) = vjp(x, rows, grad.to(x.dtype))
        out.append((read(output, lay, copies=copies), g, graph))
    return out


def read(out: Any, layout: Layout, *, copies: str = "first") -> torch.Tensor:
    """The raw output as ``[R, L]`` weights; a :class:`Violation` when it is not a tensor of
    the input's shape."""
    try:
        return collect(out, layout, copies=copies)
    except LayoutMismatch as exc:
        where = "" if layout.plain else f" (given {layout.describe()})"
        raise Violation(f"{exc}{where}", observed=1, bound=0, ratio=math.inf) from None


def weights(spec, rows: torch.Tensor, temperature, layout: Layout, *,
            copies: str = "first") -> torch.Tensor:
    """The ``[R, L]`` weights of ``rows`` given to the normaliser as ``layout``."""
    layout = layout.fit(*rows.shape)
    return read(given(spec, rows, temperature, layout)[1], layout, copies=copies)


def case_weights(spec, case, rows: torch.Tensor | None = None, *, copies: str = "first"):
    """:func:`weights` of ``rows`` (default the case's scores) in the case's layout, at the
    case's temperature."""
    rows = case.scores if rows is None else rows
    return weights(spec, rows, case.temperature, layout_of(case, rows), copies=copies)


def where(layout: Layout) -> str:
    """`` (given as …)`` for a message, empty for the plain block."""
    return "" if layout.plain else f" (given as {layout.describe()})"


def space_of(spec) -> LayoutSpace:
    """The layouts and axes ``spec`` declares it takes (``normalizer_spec(layouts=...,
    dims=...)``); every one when it declares none."""
    kinds, axes = getattr(spec, "layouts", None), getattr(spec, "dims", None)
    if kinds is None and axes is None:
        return ANY
    return layout_space(kinds, axes)
