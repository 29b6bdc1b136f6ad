"""Shrink a failing attention case to the smallest recipe that still fails the same way.

Hypothesis shrinks the recipes it draws, but a failure of the fixed battery (32 heads, batch 4,
``L_q = 129``) is reported as drawn, and Hypothesis stops where its own moves stop. Every
attention counterexample (battery or Hypothesis) goes through :func:`shrink_case`, which
greedily tries smaller recipes, rebuilds each case (:func:`attnverify.attention.cases.build`),
re-checks the property and keeps a candidate only if it fails in the same way (a violation stays
a violation, a raise stays a raise):

1. sizes, each down a ladder of values tried smallest first (1, 2, 3, 4, then either side of
   every power of two and of every multiple of 64), so that a defect needing a size past a
   threshold is reported at the threshold (``h = 17`` for a kernel wrong past 16 heads):
   ``b``; the heads (GQA dropped when the failure survives it, else the key/value heads with the
   group kept, then the group); ``L_q`` and ``L_k`` together while equal, then each; ``d``;
   ``d_v`` (equal to ``d`` first);
2. structure: the contiguous ``bhld`` layout, no mask, a plain (not expanded or sliced) mask of
   the boolean type, no fully masked rows, Gaussian queries and keys of magnitude 1, the default
   scale, the window.

The passes repeat while one makes progress, within :data:`MAX_CHECKS` re-checks and
:data:`BUDGET_S` seconds. A candidate stays in the property's domain: it never gives a query no
key when the failing case had no such query, and keeps to the mask kinds and types the property
draws (an additive-mask counterexample stays additive).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from attnverify.attention import cases as AC
from attnverify.attention.cases import has_dead_rows
from attnverify.checks.base import NormalizerError, Violation

MAX_CHECKS = 160
BUDGET_S = 30.0
#: Sizes tried, smallest first: a few, then either side of every power of two and of every
#: multiple of 64 up to 4096.
LADDER = tuple(sorted({1, 2, 3, 4, 5, 6}
                      | {2**k + e for k in range(3, 13) for e in (-1, 0, 1)}
                      | {64 * m + e for m in range(1, 64) for e in (-1, 0, 1)}))
#: Recipe fields of a mask tensor (dropped with the mask).
MASK_FIELDS = ("mask_type", "mask_shape", "mask_view", "dead")
#: Structural simplifications, tried in order: each a field and its simplest value.
SIMPLER = (("layout", "bhld"), ("mask", "none"), ("mask_view", "plain"), ("mask_type", "bool"),
           ("dead", False), ("qk", "gaussian"), ("mag", 1.0), ("scale", "default"),
           ("keep", 0.5), ("positive_v", False), ("offset", 0.0))


def _kind(exc: BaseException) -> str | None:
    if isinstance(exc, Violation):
        return "violation"
    if isinstance(exc, NormalizerError):
        return "raised"
    return None


def below(n: int, lo: int = 1) -> list[int]:
    """The ladder's values in ``[lo, n)``, smallest first (and ``n − 1``)."""
    return sorted({v for v in LADDER if lo <= v < n} | ({n - 1} if n - 1 >= lo else set()))


def shrink_case(recheck: Callable[[Any], Any], case: Any, exc: BaseException, *,
                domain: Callable[[dict], bool] | None = None,
                **_ignored) -> tuple[Any, BaseException]:
    """The smallest case found that fails ``recheck`` like ``exc``, and its exception.
    ``domain(recipe)``: the recipes the property checks (a mask kind and type it draws); a
    candidate outside it is not tried when the failing case was inside."""
    if _kind(exc) is None or not isinstance(getattr(case, "recipe", None), dict):
        return case, exc
    search = _Search(recheck, case, exc)
    if domain is not None and domain(search.recipe):
        search.domain = domain
    while search.progress():
        pass
    return search.case, search.exc


class _Search:
    def __init__(self, recheck, case, exc) -> None:
        self.recheck, self.kind = recheck, _kind(exc)
        self.case, self.exc = case, exc
        explicit = AC.explicit(case.recipe)
        if explicit != case.recipe:  # the same tensors, every mask field spelled out
            self.case = AC.build(explicit)
        self.may_kill_rows = has_dead_rows(case)
        self.domain: Callable[[dict], bool] | None = None
        self.checks, self.deadline = 0, time.perf_counter() + BUDGET_S

    @property
    def recipe(self) -> dict[str, Any]:
        return self.case.recipe

    def exhausted(self) -> bool:
        return self.checks >= MAX_CHECKS or time.perf_counter() > self.deadline

    def attempt(self, **change) -> bool:
        """Keep the recipe with ``change`` if its case fails the same way."""
        r = {**self.recipe, **change}
        if r.get("mask") in ("none", "causal"):  # no tensor: its fields say nothing
            r = {k: v for k, v in r.items() if k not in MASK_FIELDS}
        if r == self.recipe or self.exhausted() or (self.domain and not self.domain(r)):
            return False
        try:
            candidate = AC.build(r)
        except (ValueError, KeyError, RuntimeError):
            return False  # not a valid recipe (a mask shape the new sizes cannot take, …)
        if not self.may_kill_rows and has_dead_rows(candidate):
            return False  # outside the property's domain
        self.checks += 1
        try:
            self.recheck(candidate)
        except Exception as exc:  # noqa: BLE001 - classified
            if _kind(exc) == self.kind:
                self.case, self.exc = candidate, exc
                return True
        return False

    def down(self, name: str, lo: int = 1, **extra) -> bool:
        """``name`` (with ``extra`` fields derived from it) at the smallest failing value."""
        for value in below(int(self.recipe[name]), lo):
            if self.attempt(**{name: value, **{k: f(value) for k, f in extra.items()}}):
                return True
        return False

    def heads(self) -> bool:
        r = self.recipe
        h, kv = int(r["h"]), int(r["h_kv"])
        if h == kv:
            return self.down("h", h_kv=lambda v: v)
        if self.attempt(h_kv=h):  # GQA is not what fails
            return True
        group = h // kv
        moved = self.down("h_kv", h=lambda v: v * group)
        return self._group(int(self.recipe["h_kv"])) or moved

    def _group(self, kv: int) -> bool:
        group = int(self.recipe["h"]) // kv
        for g in below(group, 2):
            if self.attempt(h=g * kv):
                return True
        return False

    def lengths(self) -> bool:
        """``L_q`` and ``L_k`` together while they are equal (a square mask, a fused QKV
        buffer or a causal triangle may need them so), then each alone."""
        moved = False
        if self.recipe["l_q"] == self.recipe["l_k"]:
            moved = self.down("l_q", l_k=lambda v: v)
        return self.down("l_q") | self.down("l_k") | moved

    def dims(self) -> bool:
        moved = False
        for name in ("d", "d_v"):
            value = int(self.recipe[name])
            if name == "d_v" and value != int(self.recipe["d"]):
                if self.attempt(d_v=int(self.recipe["d"])):
                    moved = True
                    continue
            for smaller in sorted(d for d in AC.HEAD_DIMS if d < value):
                if self.attempt(**{name: smaller}):
                    moved = True
                    break
        return moved

    def progress(self) -> bool:
        moved = False
        for step in (lambda: self.down("b"), self.heads, self.lengths, self.dims):
            if self.exhausted():
                return False
            moved = step() or moved
        for name, value in SIMPLER:
            if self.recipe.get(name, value) != value:
                moved = self.attempt(**{name: value}) or moved
        if int(self.recipe.get("window", 1)) > 1:
            moved = self.down("window") or moved
        moved = self.offset() or moved
        return moved and not self.exhausted()

    def offset(self) -> bool:
        """The additive mask's constant offset a tenth as large while the failure stays (the
        smallest magnitude that still fails)."""
        moved = False
        while abs(float(self.recipe.get("offset", 0.0))) >= 10 and not self.exhausted():
            if not self.attempt(offset=float(self.recipe["offset"]) / 10):
                break
            moved = True
        return moved
