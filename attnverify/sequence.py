"""Defects that need more than one call: the sequence of calls a failure needs, found, shrunk and
replayed.

A target may keep state between calls: a workspace returned again by a later call of the same
shape (the border refuses it), a cache keyed on the shape that answers for other values of that
shape, an output that drifts with the number of calls. Such a failure is seen on one case, but
that case alone, given to a fresh worker, holds. So before a failure is reported, the failing
case is checked again in a **fresh worker** (the target loaded again, :meth:`Monitor.restart`).
Where it fails there the way it failed in the run, it needs no earlier call (the usual
counterexample). Where it does not, the calls the worker answered before it
(:class:`attnverify.remote.History`: each example run on the worker, with the property and the
way it was checked) are replayed before it, each attempt in a fresh worker:

1. the shortest suffix of that history that makes the case fail again (the last 1, 2, 4, …
   examples, then bisection between the last two lengths);
2. its smallest example repeated as few times as still fails, where that fails at all (a
   defect that counts calls needs so many calls, not those cases);
3. then runs of its examples dropped while the rest still fails: halves, quarters, … down to
   single examples (delta debugging by complements: fewest calls).

At most :data:`MAX_ATTEMPTS` fresh workers and :data:`BUDGET_S` seconds of replay per failure.
Each fresh worker is made ready ahead, on another thread (:func:`prepare`: when the failure is
found, before it is shrunk; before each attempt of the search of earlier calls), so the restart
does not wait for the target's load.
The counterexample then carries the earlier examples (``"sequence"``, oldest first) and the repro
line replays them, in order, in one fresh worker before it re-checks the case
(:func:`replay`). A failure that no replay reproduces is reported as before, with
``"reproduces": false``.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from attnverify import heartbeat
from attnverify.attention import cases as attention_cases
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.checks import PROPERTIES
from attnverify.checks.base import Deferred, NormalizerError, Violation, monitor_of
from attnverify.errors import UsageError, WorkerFailed
from attnverify.remote import Refused, case_bytes, channel_of
from attnverify.serialize import decode_case, encode_case, jsonable

#: Fresh workers one failure's search may start, and seconds it may take.
MAX_ATTEMPTS = 24
BUDGET_S = 30.0
#: The kinds of target whose worker can be started afresh and its calls replayed.
KINDS = ("normalizer", "attention")
#: How an example was checked: the property's check (certify's search) or its re-check (a
#: shrinking step, a repro).
HOWS = ("check", "recheck")


class Step(NamedTuple):
    """One earlier example: ``property`` checked (``how``) on ``case``."""

    property: str
    how: str
    case: Any


class Found(NamedTuple):
    """The search's result: ``steps`` the earlier examples the failure needs (``()``: none, the
    case fails alone in a fresh worker), ``exc`` the failure seen on the last replay, and
    whether any replay reproduced it."""

    steps: tuple
    exc: BaseException | None
    reproduces: bool


def step_of(prop_id: str, how: str = "check") -> tuple[str, str]:
    """What :func:`attnverify.heartbeat.example_started` is told an example runs."""
    return (prop_id, how)


def property_of(prop_id: str):
    """The property ``prop_id`` names: a normalizer property (of a normalizer, or of an attention
    kernel lifted to one) or an attention-level one; ``None`` for any other id."""
    return PROPERTIES.get(prop_id) or ATTENTION_PROPERTIES.get(prop_id)


def run_step(spec, ctx, step: Step) -> float:
    """Check ``step`` as it was checked in the run (its exceptions propagate). For an attention
    kernel ``spec`` is the kernel lifted to a normalizer (:mod:`attnverify.attention.lift`),
    which both kinds of property take."""
    prop = property_of(step.property)
    check = prop.recheck if step.how == "recheck" else prop.check
    heartbeat.example_started(step.case, step_of(step.property, step.how))
    try:
        return check(spec, step.case, ctx)
    finally:
        heartbeat.example_finished()


def replay(spec, ctx, steps) -> None:
    """Run ``steps`` in order on the target's current worker, whatever each one's verdict (a
    worker that dies or hangs still ends the replay: :class:`WorkerFailed`)."""
    for step in steps:
        try:
            run_step(spec, ctx, step)
        except Exception:  # noqa: BLE001 - an earlier example's own verdict does not matter
            pass


def applies(spec) -> bool:
    """Whether the target runs behind a channel that can start a fresh worker (a normalizer or
    an attention kernel, :data:`KINDS`)."""
    channel = channel_of(spec)
    monitor = monitor_of(spec)
    return (channel is not None and getattr(channel, "kind", "") in KINDS
            and callable(getattr(monitor, "restart", None)))


def history(spec, case) -> list[Step]:
    """The examples the current worker was given that can be replayed, oldest first, without
    the trailing ones on ``case`` itself (the failure, its confirmation)."""
    out = []
    for step, c, _requests in monitor_of(spec).history.snapshot():
        if step is None or c is None or property_of(step[0]) is None or step[1] not in HOWS:
            continue
        out.append(Step(step[0], step[1], c))
    while out and _same(out[-1].case, case):
        out.pop()
    return out


def _same(kept, case) -> bool:
    """Whether ``kept`` (an entry of the history) is ``case`` itself: the same object, or, for an
    attention case the history built again from its recipe, one holding that case's very recipe
    object (:class:`attnverify.remote.History`)."""
    return kept is case or (isinstance(kept, attention_cases.AttnCase) and
                            kept.recipe is getattr(case, "recipe", None))


def searched(prop, spec, exc) -> bool:
    """Whether :func:`find` searches for ``prop``'s failure ``exc`` on ``spec`` (a violation, a
    raise or a refusal, on a restartable worker), so it will start a fresh worker."""
    if isinstance(exc, Deferred) or not (exc is None or isinstance(exc, (Violation,
                                                                         NormalizerError))):
        return False
    return applies(spec) and property_of(prop.id) is not None


def prepare(prop, spec, exc) -> None:
    """A fresh worker made ready ahead, on another thread, for the search of a failure just
    found (:meth:`attnverify.remote.Channel.prepare`), so that :func:`find`'s first restart,
    after the failure is shrunk, does not wait for the target's load."""
    if searched(prop, spec, exc):
        _prepare(monitor_of(spec))


def _prepare(monitor) -> None:
    ready = getattr(monitor, "prepare", None)
    if callable(ready):
        ready()


def find(prop, spec, ctx, case, exc) -> Found | None:
    """The fewest earlier examples ``case`` needs to fail ``prop`` again the way it failed
    (``exc``; ``None``: an output refused at the border), each replay in a fresh worker;
    ``None`` where the search does not apply (no restartable worker, a failure decided over a
    unit)."""
    if not searched(prop, spec, exc):
        return None
    earlier = history(spec, case)
    search = _Search(prop, spec, ctx, case, exc)
    try:
        alone = search.fails(())
    except (WorkerFailed, _OutOfBudget):  # no fresh worker to judge by: the verdict as it was
        return None
    if alone is not None:
        return Found((), alone, True)
    try:
        return search.shortest(earlier)
    except WorkerFailed:
        return Found((), None, False)


class _OutOfBudget(Exception):
    pass


class _Search:
    def __init__(self, prop, spec, ctx, case, exc):
        self.prop, self.spec, self.ctx, self.case, self.exc = prop, spec, ctx, case, exc
        self.monitor = monitor_of(spec)
        self.attempts = 0
        self.start = time.monotonic()

    def fails(self, steps) -> BaseException | None:
        """Replay ``steps`` then re-check the case, in a fresh worker: the failure if it is the
        same kind as the one seen, else ``None``."""
        if self.attempts >= MAX_ATTEMPTS or time.monotonic() - self.start > BUDGET_S:
            raise _OutOfBudget()
        self.attempts += 1
        self.monitor.restart()
        if self.attempts > 1:  # a search of earlier calls: the next attempt's worker, meanwhile
            _prepare(self.monitor)
        replay(self.spec, self.ctx, steps)
        mark = len(self.monitor.refused)
        try:
            run_step(self.spec, self.ctx, Step(self.prop.id, "recheck", self.case))
        except (Violation, NormalizerError) as again:
            if self.exc is None:
                return again if isinstance(again, Refused) else None
            return again if type(again) is type(self.exc) else None
        refusal = self.exc is None or isinstance(self.exc, Refused)
        if refusal and len(self.monitor.refused) > mark:
            return Refused(self.monitor.refused[mark].what)
        return None

    def shortest(self, earlier: list[Step]) -> Found:
        """The shortest suffix of ``earlier`` that fails (doubling, then bisection), then each
        step dropped in turn while the rest fails."""
        n = len(earlier)
        if not n:
            return Found((), None, False)
        _prepare(self.monitor)  # the first attempt's worker, while the search begins
        known, k, seen = 0, 1, None
        while True:  # the last 1, 2, 4, … examples, the whole history last
            k = min(k, n)
            try:
                seen = self.fails(earlier[n - k:])
            except _OutOfBudget:
                return Found((), None, False)
            if seen is not None:
                break
            if k == n:
                return Found((), None, False)
            known, k = k, 2 * k
        best, best_exc = earlier[n - k:], seen
        lo, hi = known, k  # lo examples hold, hi fail
        try:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                again = self.fails(earlier[n - mid:])
                if again is not None:
                    hi, best, best_exc = mid, earlier[n - mid:], again
                else:
                    lo = mid
            best, best_exc = self.cheapest(best, best_exc)
            best, best_exc = self.fewest(best, best_exc)
        except _OutOfBudget:
            pass
        return Found(tuple(best), best_exc, True)

    def fewest(self, best: list[Step], best_exc) -> tuple[list[Step], Any]:
        """``best`` with runs of steps dropped while the rest still fails: halves first, then
        quarters, down to single steps (delta debugging by complements), so that the one call
        a failure needs is found among many in a few attempts; a candidate already tried (the
        same steps, as a run of repeated steps gives) is not tried again."""
        size, tried = -(-len(best) // 2), set()
        while len(best) > 1:
            dropped, i = False, 0
            while i < len(best):
                fewer = best[:i] + best[i + size:]
                key = tuple(id(s) for s in fewer)
                if not fewer or key in tried:
                    i += size
                    continue
                tried.add(key)
                again = self.fails(fewer)
                if again is not None:
                    best, best_exc, dropped = fewer, again, True
                else:
                    i += size
            if size == 1 and not dropped:
                break
            size = min(-(-len(best) // 2), size if dropped else -(-size // 2))
        return best, best_exc


    def cheapest(self, best: list[Step], best_exc) -> tuple[list[Step], Any]:
        """``best`` made of its smallest step alone, repeated as few times as still fails (a
        defect that counts calls needs so many, not those cases): where that fails at all."""
        if len(best) < 2:
            return best, best_exc
        small = min(best, key=lambda s: case_bytes(s.case))
        if all(s is small for s in best):
            return best, best_exc
        again = self.fails([small] * len(best))
        if again is None:
            return best, best_exc
        best, best_exc = [small] * len(best), again
        lo, hi = 0, len(best)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            again = self.fails([small] * mid)
            if again is not None:
                hi, best, best_exc = mid, [small] * mid, again
            else:
                lo = mid
        return best, best_exc


# --------------------------------------------------------------------------------------------
# JSON


def encode(steps, params) -> list[dict[str, Any]]:
    """The steps as the counterexample's ``"sequence"``: oldest first, each the property, how it
    was checked and the case (:func:`attnverify.serialize.encode_case`; an attention case by
    its recipe, which rebuilds it exactly)."""
    out = []
    for s in steps:
        entry: dict[str, Any] = {"property": s.property, "how": s.how}
        if isinstance(s.case, attention_cases.AttnCase):
            entry["recipe"] = jsonable(s.case.recipe)
        else:
            entry["case"] = encode_case(s.case, params)
        out.append(entry)
    return out


def decode(data: Any, types: dict[str, type]) -> list[Step]:
    """``"sequence"`` of a repro's ``--case``, checked (a bad one is a usage error)."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise UsageError("--case: \"sequence\" must be a list of earlier calls")
    out = []
    for i, entry in enumerate(data):
        recipe = entry.get("recipe") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not (isinstance(entry.get("case"), dict)
                                               or isinstance(recipe, dict)):
            raise UsageError(f"--case: sequence entry {i} must be an object with a \"case\" "
                             "(or an attention case's \"recipe\")")
        prop, how = entry.get("property"), entry.get("how", "check")
        if not isinstance(prop, str) or property_of(prop) is None:
            raise UsageError(f"--case: sequence entry {i}: unknown property {prop!r}")
        if how not in HOWS:
            raise UsageError(f"--case: sequence entry {i}: \"how\" must be one of "
                             f"{', '.join(HOWS)}")
        case = (attention_case(recipe, f"sequence entry {i}") if isinstance(recipe, dict)
                else decode_case(entry["case"], types))
        out.append(Step(prop, how, case))
    return out


def attention_case(recipe: dict[str, Any], where: str = "the case"):
    """The attention case a recipe builds (:func:`attnverify.attention.cases.build`; the fields
    it lacks take their defaults); a bad recipe is a usage error."""
    try:
        return attention_cases.build({**attention_cases.recipe(), **recipe})
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise UsageError(f"--case: {where}: bad attention recipe ({exc})") from None
