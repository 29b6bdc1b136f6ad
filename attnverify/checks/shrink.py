"""Shrink a failing case to a minimal one that still fails the same way.

Hypothesis shrinks what it generates, but a failure of the fixed battery (a 3 × 9 batch), or the
input a check built from a shrunk row (a row with keys masked, a batch around it), is not minimal.
:func:`shrink` takes such a case and the exception it raised and greedily tries, re-checking the
property each time and keeping a candidate only if it fails in the same way (a violation stays a
violation, a raise stays a raise):

1. simplest layout (:mod:`attnverify.strategies.layouts`): the contiguous ``[R, L]`` block with
   ``dim=-1``, else each kind of the layout alone at rank 2 (then 3), else its kinds together
   at rank 2 (then 3), else one feature less at a time (no storage offset, no slice step, no
   expanded axis, no view, the last axis, the negative spelling of ``dim``), fewest kinds
   first; a candidate is tried only when it is simpler than the current layout;
2. fewest rows: keep only the first rows (1, 2, 3, 4, then either side of each power of two),
   so a failure that needs a chunk and its tail (65 of 3071 rows) gets there in a dozen checks;
   then drop blocks of rows, halving the block size (with any per-row field such as ``delta``),
   down to a sixteenth of the rows first, to single rows after the keys;
3. fewest keys: keep the first keys of every row (the counts of the rows' ladder), every score
   to 0 at once (below), then drop blocks of keys likewise (masked keys are dropped only when
   the failure survives, so a mask the failure needs is kept);
4. simplest values: every score to 0 at once (masked keys too, when the failure does not need
   them), else every finite one; rows lying far from zero as a whole moved ``10**k`` times
   nearer (spread kept) for the largest ``k`` that still fails, found by bisecting the decades
   (a row at ``1e300`` costs about ten re-checks), then a fifth or half of a decade more, so
   a failure far from zero is reported at the smallest magnitude that still fails; else row by
   row, then each finite score to 0, else truncated to an integer, else to one significant
   digit (always towards 0, so a bound such as ``|l| ≤ a`` still holds); otherwise ``-inf``,
   ``inf`` and NaN stay;
5. temperature 1 when the case drew one (not when ``--params`` fixed it).

A case's layout follows its rows: dropping rows or keys fits it to the new row count and length.

A candidate stays in the property's domain: it never makes a row fully masked when the failing
case had no fully masked row (dropping the live keys of ``[[0, -inf]]`` would otherwise "shrink"
a masking bug into an all-masked row, which a normalizer need not handle).

The passes repeat while one makes progress, within :data:`MAX_CHECKS` re-checks (the budget that
binds in practice, so the shrunk case is the same on every machine) and :data:`BUDGET_S` seconds
(a safety net for slow normalizers). Cases with tensors tied to the keys other than the scores
(embeddings) only get the simplest layout.

A candidate the search has already re-checked and rejected (the passes meet some twice: every
score to 0 before and after the rows are dropped, a single score's simpler value) is rejected
again without another re-check, as delta debugging keeps its tests' outcomes (:func:`identity`
says when two candidates are the same input). It still counts against :data:`MAX_CHECKS`, so a
target that answers one input the same way every time is shrunk to the same case as when every
candidate was re-checked; one whose answer to an input changes from call to call is shrunk on
its first answers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from attnverify.checks.base import Deferred, NormalizerError, Violation
from attnverify.strategies.layouts import Layout, build_layout, plain

MAX_CHECKS = 400
#: Rows whose mean lies at least this far from zero (all on one side) are moved nearer zero
#: by :meth:`_Search.nearer_zero`.
FAR = 10.0
#: Row counts :meth:`_Search.first_rows` tries (and key counts :meth:`_Search.first_keys`),
#: fewest first: a few, then either side of every power of two up to 4096 (chunk boundaries).
ROW_LADDER = tuple(sorted({1, 2, 3, 4} | {2**k + d for k in range(3, 13) for d in (-1, 0, 1)}))
BUDGET_S = 30.0
#: Case fields indexed by row (dropped with their row).
ROW_FIELDS = ("delta",)
#: Case fields that tie tensors to the keys: such cases are not shrunk.
KEY_FIELDS = ("x",)


class Hung(Exception):
    """A candidate ran past the per-example time limit: how a time-limit failure fails "the
    same way" while it is shrunk (:func:`attnverify.certify.shrink_hang`)."""


def _kind(exc: BaseException) -> str | None:
    if isinstance(exc, Hung):
        return "hung"
    if isinstance(exc, Deferred):  # no graph, float64 refused, unjudged: each its own failure
        return type(exc).__name__
    if isinstance(exc, Violation):
        return "violation"
    if isinstance(exc, NormalizerError):
        return "raised"
    return None


def shrinkable(case: Any) -> bool:
    scores = getattr(case, "scores", None)
    fields = getattr(case, "_fields", ())
    return (isinstance(scores, torch.Tensor) and scores.dim() == 2
            and not any(f in fields for f in KEY_FIELDS))


def _has_layout(case: Any) -> bool:
    return isinstance(getattr(case, "layout", None), Layout) and \
        isinstance(getattr(case, "scores", None), torch.Tensor) and case.scores.dim() == 2


def shrink(recheck: Callable[[Any], Any], case: Any, exc: BaseException, *,
           vary_temperature: bool = True, budget_s: float = BUDGET_S) -> tuple[Any, BaseException]:
    """The smallest case found that fails ``recheck`` like ``exc``, and its exception, within
    ``budget_s`` seconds (and :data:`MAX_CHECKS` re-checks)."""
    kind = _kind(exc)
    if kind is None or not (shrinkable(case) or _has_layout(case)):
        return case, exc
    search = _Search(recheck, kind, case, exc, budget_s)
    if not shrinkable(case):
        search.simplify_layout()
        return search.case, search.exc
    while search.progress():
        pass
    if vary_temperature:
        t = getattr(case, "temperature", None)
        if isinstance(t, float) and t != 1.0:
            search.attempt(search.case._replace(temperature=1.0))
    return search.case, search.exc


class _Search:
    def __init__(self, recheck, kind, case, exc, budget_s: float = BUDGET_S) -> None:
        self.recheck, self.kind = recheck, kind
        self.case, self.exc = case, exc
        self.may_mask_rows = bool(_fully_masked_rows(case.scores).any())
        self.checks, self.deadline = 0, time.perf_counter() + budget_s
        #: Candidates re-checked and rejected, by :func:`identity`: not re-checked again.
        self.rejected: set = set()

    def exhausted(self) -> bool:
        return self.checks >= MAX_CHECKS or time.perf_counter() > self.deadline

    def attempt(self, candidate) -> bool:
        """Keep ``candidate`` if it fails the same way."""
        if self.exhausted():
            return False
        if not self.may_mask_rows and bool(_fully_masked_rows(candidate.scores).any()):
            return False  # outside the property's domain
        self.checks += 1
        key = identity(candidate)
        if key is not None and key in self.rejected:
            return False  # re-checked already in this search, and rejected
        try:
            self.recheck(candidate)
        except Exception as exc:  # noqa: BLE001 - classified
            if _kind(exc) == self.kind:
                self.case, self.exc = candidate, exc
                return True
        if key is not None:
            self.rejected.add(key)
        return False

    def progress(self) -> bool:
        before = self.checks
        rows = self.case.scores.shape[0]
        changed = self.simplify_layout() | self.drop_rows(fewest=max(1, rows // 16))
        changed |= self.first_keys() | self.zero_all()
        changed |= self.drop_keys() | self.drop_rows() | self.simplify()
        return changed and self.checks > before and not self.exhausted()

    def simplify_layout(self) -> bool:
        """The simplest layout that still fails (see the module docstring)."""
        changed = False
        layout = getattr(self.case, "layout", None)
        while isinstance(layout, Layout) and not self.exhausted():
            for candidate in simpler_layouts(layout):
                if self.attempt(self.case._replace(layout=candidate)):
                    changed, layout = True, candidate
                    break
            else:
                break
        return changed

    def first_rows(self) -> bool:
        """Keep only the first ``n`` rows, for the smallest ``n`` of :data:`ROW_LADDER` that
        still fails (a failure that needs a chunk and a tail, 65 rows of 3071, in a dozen
        checks)."""
        count = self.case.scores.shape[0]
        for n in ROW_LADDER:
            if n >= count or self.exhausted():
                return False
            if self.attempt(_take_rows(self.case, list(range(n)))):
                return True
        return False

    def first_keys(self) -> bool:
        """Keep only the first ``n`` keys of every row, for the smallest ``n`` of
        :data:`ROW_LADDER` that still fails (a failure past some row length, or past some
        number of entries, in a few dozen checks)."""
        length = self.case.scores.shape[-1]
        for n in ROW_LADDER:
            if n >= length or self.exhausted():
                return False
            if self.attempt(_take_keys(self.case, list(range(n)))):
                return True
        return False

    def zero_all(self) -> bool:
        """Every score to 0 at once (masked keys too), else every finite one."""
        scores = self.case.scores
        masked = scores == float("-inf")
        if bool(masked.any()) and self.attempt(self.case._replace(scores=torch.zeros_like(scores))):
            return True
        return self.zero(torch.ones_like(self.case.scores, dtype=torch.bool))

    def drop_rows(self, fewest: int = 1) -> bool:
        """Keep the first rows (:meth:`first_rows`), then drop blocks of rows, halving the block
        down to ``fewest`` rows."""
        changed = self.first_rows()
        size = max(self.case.scores.shape[0] // 2, 1)
        while size >= fewest and not self.exhausted():
            start = 0
            while start < self.case.scores.shape[0] and self.case.scores.shape[0] > 1:
                count = self.case.scores.shape[0]
                keep = [i for i in range(count) if not start <= i < start + size]
                if keep and self.attempt(_take_rows(self.case, keep)):
                    changed = True
                else:
                    start += size
            size //= 2
        return changed

    def drop_keys(self) -> bool:
        changed = False
        size = self.case.scores.shape[-1] // 2
        while size >= 1 and not self.exhausted():
            start = 0
            while start < self.case.scores.shape[-1] and self.case.scores.shape[-1] > 1:
                length = self.case.scores.shape[-1]
                keep = [i for i in range(length) if not start <= i < start + size]
                if keep and self.attempt(_take_keys(self.case, keep)):
                    changed = True
                else:
                    start += size
            size //= 2
        return changed

    def simplify(self) -> bool:
        """Every score to 0 at once (masks included), else every finite one, else row by row
        (when there are several), then each score to a simpler value."""
        changed = self.zero_all()
        changed |= self.nearer_zero()
        if not changed and self.case.scores.shape[0] > 1:
            for r in range(self.case.scores.shape[0]):
                if self.exhausted():
                    break
                rows = torch.zeros_like(self.case.scores, dtype=torch.bool)
                rows[r] = True
                changed |= self.zero(rows)
        for index in range(self.case.scores.numel()):
            if self.exhausted():
                break
            value = float(self.case.scores.flatten()[index])
            if not math.isfinite(value):
                continue
            for simpler in _simpler(value):
                if self.attempt(_set_value(self.case, index, simpler)):
                    changed = True
                    break
        return changed


    def nearer_zero(self) -> bool:
        """Rows lying far from zero as a whole (every finite score on one side, their mean at
        least :data:`FAR` away) moved ``10**k`` times nearer, keeping their spread, for the
        largest ``k`` that still fails (each row no further than below :data:`FAR`): a failure
        far from zero is reported at the smallest magnitude that still fails. ``k`` is searched
        by halving (the largest first, then bisection), so a row at ``1e300`` costs about ten
        re-checks, not one per decade; then a fifth or half of the last decade."""
        scores = self.case.scores
        z = scores.to(torch.float64)
        finite = torch.isfinite(z)
        count = finite.sum(-1, keepdim=True).clamp_min(1)
        mean = torch.where(finite, z, 0.0).sum(-1, keepdim=True) / count
        low = torch.where(finite, z, math.inf).amin(-1, keepdim=True)
        high = torch.where(finite, z, -math.inf).amax(-1, keepdim=True)
        far = ((low > 0) | (high < 0)) & (mean.abs() >= FAR) & finite.any(-1, keepdim=True)
        if not bool(far.any()):
            return False
        # the decades each far row may move: until its mean is below FAR
        decades = torch.where(far, torch.floor(torch.log10(mean.abs() / FAR)) + 1, 0.0)

        def moved(k: float):
            steps = torch.minimum(decades, torch.tensor(float(k), dtype=torch.float64))
            out = torch.where(finite & far, (z - mean) + mean * 10.0 ** -steps, z).to(scores.dtype)
            return None if torch.equal(out, scores) else self.case._replace(scores=out)

        def fails(k: float) -> bool:
            candidate = moved(k)
            return candidate is not None and self.attempt(candidate)

        top = int(decades.max())
        if fails(top):
            return True
        good, bad = 0, top  # the case fails as it is (k = 0), not moved ``top`` decades
        while bad - good > 1 and not self.exhausted():
            mid = (good + bad) // 2
            if fails(mid):
                good = mid
            else:
                bad = mid
        # within the decade: a fifth, else half as far (300 -> 150, then one digit: 100)
        for part in (math.log10(5), math.log10(2)):
            if good + part < bad and fails(good + part):
                return True
        return good > 0

    def zero(self, where: torch.Tensor) -> bool:
        """Set the finite nonzero scores in ``where`` to 0, if that still fails."""
        scores = self.case.scores
        where = where & torch.isfinite(scores) & (scores != 0)
        if not bool(where.any()):
            return False
        return self.attempt(self.case._replace(scores=scores.masked_fill(where, 0.0)))


def identity(case: Any):
    """What makes a candidate the input it is, as a hashable value: its type and every field,
    a tensor by its dtype, device, shape, strides, grad flag and bytes, a float by its bits
    (``-0.0`` is not ``0.0``; NaN is NaN); ``None`` for a field of any other unhashable kind (such a
    candidate is always re-checked)."""
    try:
        return (type(case).__name__, tuple(_field(v) for v in case))
    except TypeError:
        return None


def _field(value: Any):
    if isinstance(value, torch.Tensor):
        t = value.detach()
        raw = t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() \
            if t.numel() else b""
        return ("tensor", str(t.dtype), str(t.device), tuple(t.shape), tuple(t.stride()),
                value.requires_grad, raw)
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_field(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _field(v)) for k, v in value.items())))
    hash(value)  # TypeError: not a value this identity knows
    return (type(value).__name__, value)


def _fully_masked_rows(scores: torch.Tensor) -> torch.Tensor:
    return (scores == float("-inf")).all(dim=-1)


def _simpler(value: float) -> list[float]:
    """Candidates simpler than ``value``, simplest first, each no larger in magnitude."""
    out = []
    for v in (0.0, float(math.trunc(value)), _one_digit(value)):
        if v != value and abs(v) <= abs(value) and v not in out:
            out.append(v)
    return out


def _one_digit(value: float) -> float:
    """``value`` truncated to one significant digit, written as a decimal (0.3 stays 0.3: the
    quotient 0.3/0.1 is 2.9999999999999996, so it is rounded before truncating)."""
    if value == 0:
        return 0.0
    exponent = math.floor(math.log10(abs(value)))
    digit = math.trunc(round(value / 10.0**exponent, 9))
    return float(f"{digit}e{exponent}")


def _refit(case, scores: torch.Tensor) -> dict[str, Any]:
    """``scores`` and the case's layout fitted to them."""
    layout = getattr(case, "layout", None)
    out: dict[str, Any] = {"scores": scores}
    if isinstance(layout, Layout):
        out["layout"] = layout.fit(*scores.shape)
    return out


def _take_rows(case, rows: list[int]):
    index = torch.tensor(rows, device=case.scores.device)
    out = _refit(case, case.scores.index_select(0, index))
    for name in ROW_FIELDS:
        value = getattr(case, name, None)
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            out[name] = value.index_select(0, index.to(value.device))
    return case._replace(**out)


def _take_keys(case, keys: list[int]):
    index = torch.tensor(keys, device=case.scores.device)
    return case._replace(**_refit(case, case.scores.index_select(-1, index)))


def _complexity(layout: Layout) -> tuple:
    """How far ``layout`` is from the contiguous ``[R, L]`` block with ``dim=-1`` (smaller is
    simpler): its kinds, rank (2 first), axis, spelling, offset, steps, copies."""
    views = sum(1 for k in layout.kinds if k != "contiguous")
    return (views, (layout.rank != 2, layout.rank), -layout.from_end, layout.dim >= 0,
            layout.offset, max(layout.step), layout.copies, layout.sizes)


def simpler_layouts(layout: Layout) -> list[Layout]:
    """Candidates simpler than ``layout`` (:func:`_complexity`), simplest first. Made from the
    plain block; each of its kinds alone, its kinds together and all but one of them, at rank
    2 and 3; and the layout with one feature removed (each on its own: the offset, a slice
    step, the expanded axes, the memory order, the axis, the positive spelling). A layout of no
    kind but ``contiguous`` is a kind of its own here (its axis kept at rank 2 and 3)."""
    rows, length = layout.rows, layout.length
    out = [plain(rows, length)]
    kinds = [k for k in layout.kinds if k != "contiguous"]
    # a contiguous block along another axis than the last: that axis at a lower rank
    groups = [(k,) for k in kinds] or [("contiguous",)]
    if len(kinds) > 1:
        groups += [tuple(kinds)] + [tuple(k for k in kinds if k != drop) for drop in kinds
                                    if len(kinds) > 2]
    for group in groups:
        for rank in (2, 3):
            for from_end in dict.fromkeys((-1, max(layout.from_end, -rank))):
                for positive in dict.fromkeys((False, layout.dim >= 0)):
                    out.append(build_layout(rows, length, rank=rank, from_end=from_end,
                                            positive=positive, kind=group))
    rank = layout.rank
    if layout.offset:
        out += [layout._replace(offset=0), layout._replace(offset=1)]
    if max(layout.step) > 1:
        out.append(layout._replace(step=(1,) * rank))
        out += [layout._replace(step=tuple(1 if b == a else s for b, s in enumerate(layout.step)))
                for a in range(rank) if layout.step[a] > 1]
        out.append(layout._replace(step=tuple(min(s, 2) for s in layout.step)))
    if layout.expand:
        sizes = tuple(1 if a in layout.expand else s for a, s in enumerate(layout.sizes))
        out.append(layout._replace(sizes=sizes, expand=()))
        sizes = tuple(min(s, 2) if a in layout.expand else s for a, s in enumerate(layout.sizes))
        out.append(layout._replace(sizes=sizes))
    if layout.order != tuple(range(rank)):
        out.append(layout._replace(order=tuple(range(rank))))
    if layout.axis != rank - 1:
        out.append(_axis_last(layout))
    if layout.dim >= 0:
        out.append(layout._replace(dim=layout.dim - rank))
    here = _complexity(layout)
    seen, simpler = set(), []
    for c in out:
        if c.problem() is None and _complexity(c) < here and c not in seen:
            seen.add(c)
            simpler.append(c)
    return sorted(simpler, key=_complexity)


def _axis_last(layout: Layout) -> Layout:
    """``layout`` with the normalised axis moved to the end (the other axes keep their order and
    features), spelled ``dim=-1``."""
    p = [a for a in range(layout.rank) if a != layout.axis] + [layout.axis]
    return Layout(tuple(layout.sizes[a] for a in p), -1,
                  tuple(p.index(a) for a in layout.order), tuple(layout.step[a] for a in p),
                  tuple(sorted(p.index(a) for a in layout.expand)), layout.offset)


def _set_value(case, index: int, value: float):
    scores = case.scores.clone()
    scores.view(-1)[index] = value
    return case._replace(scores=scores)
