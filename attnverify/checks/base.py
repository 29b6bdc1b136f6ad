"""The property record, the violation it raises, and the context it runs in.

A property has an id (its report key), a one-line statement, an applicability rule, a case
strategy and a check. The check raises :class:`Violation` with the observed value, the bound and
their ratio; it returns the ratio (≤ 1 when the property holds with room) so that the search can
steer towards the worst case with ``hypothesis.target``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace as _replace
from typing import Any

import torch

from attnverify.errors import UsageError, WorkerFailed
from attnverify.registry import NormalizerSpec
from attnverify.tolerances import tol_for

LOW_PRECISION = (torch.float16, torch.bfloat16)


class Violation(AssertionError):
    """A claimed property failed on a concrete input.

    ``input`` is the scores tensor the normalizer was actually given when the check built its own
    input from the case (a row with keys masked, a batch around the row, …); ``None`` means the
    case's own scores. The report and the repro use it, so that the counterexample is the input
    that failed.
    """

    def __init__(self, message: str, *, observed: float, bound: float, ratio: float,
                 input: torch.Tensor | None = None, case: Any = None, **details):
        super().__init__(message)
        self.message = message
        self.observed = float(observed)
        self.bound = float(bound)
        self.ratio = float(ratio)
        self.input = input
        #: The whole case that failed when it is another than the one being checked (a side
        #: effect seen on an earlier call); ``None``: the case being checked.
        self.case = case
        self.details = details


class Deferred(Violation):
    """A case a property cannot judge on its own: the runner (:func:`attnverify.certify.run_unit`)
    collects these on every case of a unit and decides over them all (:meth:`decide`). Checked
    alone (a repro, a shrinking step), such a case is a violation."""

    @classmethod
    def decide(cls, hits: list, examples: int, elsewhere: int):
        """The unit's verdict from ``hits`` (``[(case, exception)]``, in order) among
        ``examples`` cases, ``elsewhere`` of which were deferred for another reason: ``None``
        (the unit stands), ``("not_applicable", message)``, or ``("failed", case,
        exception)``."""
        raise NotImplementedError


class NoGraph(Deferred):
    """The output carries no autograd graph on this input: a property that differentiates the
    normalizer cannot judge it here. Decided over every case of the unit: on none of them a
    graph, the property is not applicable (a normalizer that is not differentiable, and the
    message says its gradients were not checked); on some but not others, a violation on the
    first input without one (its derivative would be lost there without a word)."""

    def __init__(self, message: str = "the output carries no autograd graph on this input",
                 **kw):
        super().__init__(message, observed=1, bound=0, ratio=math.inf, **kw)

    @classmethod
    def decide(cls, hits, examples, elsewhere):
        if len(hits) >= examples:
            return ("not_applicable", f"gradients not checked: the output carries no autograd "
                    f"graph on any of the {examples} inputs tried (the normalizer is not "
                    "differentiable)")
        others = examples - len(hits) - elsewhere
        if others <= 0:
            return None  # the other cases were deferred for another reason, decided there
        return ("failed", hits[0][0], cls(
            f"the output carries no autograd graph on this input, though it carries one on "
            f"{others} other input{'s' if others != 1 else ''}: its derivative would be lost "
            "here without a word"))


class NoFloat64(Deferred):
    """The normalizer raises on this input's float64 scores and takes them as float32: the
    float64 derivatives cannot be checked here. Decided over every case of the unit: raising
    on every one is "not applicable" (a float32 kernel; its float32 unit checks its
    derivatives), on some a violation (float64 works elsewhere)."""

    def __init__(self, cause: str, message: str | None = None, **kw):
        self.cause = cause
        super().__init__(message or f"the normalizer raised {cause} on float64 scores, though "
                         "it takes these scores as float32", observed=1, bound=0,
                         ratio=math.inf, **kw)

    @classmethod
    def decide(cls, hits, examples, elsewhere):
        cause = hits[0][1].cause
        if len(hits) >= examples:
            return ("not_applicable", f"float64 not checked: the normalizer raises on float64 "
                    f"scores on every one of the {examples} inputs tried ({cause}) and takes "
                    "them as float32; its derivatives are checked on float32 scores (the "
                    "float32 unit)")
        others = examples - len(hits) - elsewhere
        if others <= 0:
            return None
        return ("failed", hits[0][0], cls(cause, (
            f"the normalizer raised {cause} on the float64 scores of this input, though it "
            f"takes float64 scores on {others} other input{'s' if others != 1 else ''}")))


class Unjudged(Deferred):
    """Fewer than half the rows of this input could be judged: at every step tried, the
    difference quotients of the map disagree (:mod:`attnverify.checks.gradient`). A kink at an
    exact tie does that to some inputs of a correct normalizer; a map whose values are noisy
    (or that answers finite-difference probes with noise) does it to most. Decided over every
    case of the unit: more than :data:`JUDGED_FLOOR` of them unjudged fails the property."""

    def __init__(self, message: str, *, judged: int = 0, rows: int = 0, **kw):
        self.judged, self.rows = judged, rows
        super().__init__(message, observed=judged, bound=rows, ratio=math.inf, **kw)

    @classmethod
    def decide(cls, hits, examples, elsewhere):
        judgeable = examples - elsewhere
        if judgeable <= 0 or len(hits) <= JUDGED_FLOOR * judgeable:
            return None
        first = hits[0][1]
        return ("failed", hits[0][0], cls(
            f"the derivative could not be judged on {len(hits)} of the {judgeable} inputs "
            f"tried (fewer than half of their rows each; on this one {first.judged} of "
            f"{first.rows}): the difference quotients disagree at every step tried, so the "
            "map's values are noisy, or not smooth, where a smooth map is expected",
            judged=first.judged, rows=first.rows))


#: The most inputs of a unit that may go unjudged (:class:`Unjudged`), as a fraction: every
#: built-in judges at least 3/4 of its inputs on every unit (sa_softmax, whose exact ties are
#: kinks, the fewest), every other built-in all of them.
JUDGED_FLOOR = 0.5


@dataclass(frozen=True)
class Context:
    """Where and how a property runs: profile limits, dtypes, device, seed, and the temperature
    fixed by ``--params temperature=…`` (``None``: the cases draw one)."""

    profile: str = "ci"
    max_examples: int = 60
    max_length: int = 4096
    #: The most entries of one case, rows × row length (:data:`attnverify.runconfig.PROFILES`).
    max_elements: int = 2**21
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
    device: str = "cpu"
    seed: int = 0
    temperature: float | None = None
    #: ``--reference REF``: the target string every target is compared with (matches_reference).
    reference: str | None = None
    #: The most rows one call of the target gets (``None``: no cap): a Triton kernel run by the
    #: interpreter pays per program instance (:data:`attnverify.triton_runtime.MAX_ROWS`). Cases
    #: keep their row lengths, layouts, axes, dtypes, masks and temperatures; only the row count
    #: (batch axes) is capped.
    max_rows: int | None = None
    #: An attention call's cap, ``(batch × query heads, queries)`` (``None``: no cap); see
    #: :data:`attnverify.triton_runtime.MAX_PROGRAMS`.
    max_programs: tuple[int, int] | None = None

    #: The one dtype of the unit being run (:mod:`attnverify.shard`): ``full_dtypes`` and
    #: ``low_dtypes`` then hold it alone (or nothing); ``None``: every dtype of ``dtypes``.
    unit_dtype: torch.dtype | None = None
    #: ``certify --shard K/N``: the :class:`attnverify.shard.Shard` whose units run here
    #: (``None``: every unit).
    shard: Any = None

    @property
    def full_dtypes(self) -> tuple[torch.dtype, ...]:
        """Dtypes checked directly (float32 / float64); half types are checked by agreement."""
        return self._unit(self.all_full_dtypes)

    @property
    def low_dtypes(self) -> tuple[torch.dtype, ...]:
        return self._unit(self.all_low_dtypes)

    @property
    def all_full_dtypes(self) -> tuple[torch.dtype, ...]:
        """:attr:`full_dtypes` of the whole run, whatever the unit."""
        full = tuple(d for d in self.dtypes if d not in LOW_PRECISION)
        return full or (torch.float32,)

    @property
    def all_low_dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(d for d in self.dtypes if d in LOW_PRECISION)

    def _unit(self, dtypes: tuple[torch.dtype, ...]) -> tuple[torch.dtype, ...]:
        if self.unit_dtype is None:
            return dtypes
        return tuple(d for d in dtypes if d == self.unit_dtype)

    def unit_position(self, dtype: torch.dtype) -> int:
        """Where ``dtype`` stands among the run's dtypes of its kind (full or half): the
        explicit cases of a unit continue where the unit before it stopped, and only the first
        unit of a kind adds the cases that are not per dtype (long rows, many rows, many
        entries)."""
        family = self.all_low_dtypes if dtype in LOW_PRECISION else self.all_full_dtypes
        return family.index(dtype) if self.unit_dtype is not None and dtype in family else 0


def own_float64(spec, ctx) -> tuple[torch.dtype, ...]:
    """:attr:`Property.dtypes` of a property whose cases are float64 whatever ``--dtypes``
    says: one unit."""
    return (torch.float64,)


@dataclass(frozen=True)
class Property:
    """A checkable statement about a normalizer.

    ``applies(spec, ctx)`` returns ``None`` when the property applies, else the reason it does
    not; ``cases(spec, ctx)`` is a Hypothesis strategy of inputs; ``check(spec, case, ctx)``
    returns the ratio observed / allowed or raises :class:`Violation`.
    """

    id: str
    statement: str
    cases: Callable[[NormalizerSpec, Context], Any]
    check: Callable[[NormalizerSpec, Any, Context], float]
    applies: Callable[[NormalizerSpec, Context], str | None] = lambda spec, ctx: None
    explicit: Callable[[NormalizerSpec, Context], list[Any]] = lambda spec, ctx: []
    universal: bool = False
    examples_scale: float = 1.0
    #: The check on the exact input of a violation (``Violation.input`` as the case's scores);
    #: ``None``: ``check`` itself. Set for checks that build their input from the case.
    verify: Callable[[NormalizerSpec, Any, Context], float] | None = None
    #: The dtypes its cases take in ``ctx``, one unit of work each (:mod:`attnverify.shard`):
    #: a unit runs with ``ctx.unit_dtype`` set to its dtype. ``None``: ``ctx.full_dtypes``.
    #: A property whose cases have a dtype of their own (float64) returns that one.
    dtypes: Callable[[NormalizerSpec, Context], tuple[torch.dtype, ...]] | None = None
    #: Shrinks a failing case: ``shrink(recheck, case, exc, **options) -> (case, exc)``;
    #: ``None``: :func:`attnverify.checks.shrink.shrink` (rows of scores).
    shrink: Callable[..., tuple[Any, BaseException]] | None = None

    @property
    def own_dtype(self) -> bool:
        """Its cases have a dtype of their own (:func:`own_float64`): its one unit runs in the
        run's context, not restricted to a dtype."""
        return self.dtypes is own_float64

    def unit_dtypes(self, spec: NormalizerSpec, ctx: Context) -> tuple[torch.dtype, ...]:
        """The dtypes of its units in ``ctx`` (the whole run's, never one unit's)."""
        whole = ctx if ctx.unit_dtype is None else _replace(ctx, unit_dtype=None)
        out = tuple(self.dtypes(spec, whole)) if self.dtypes is not None else whole.full_dtypes
        return tuple(dict.fromkeys(out)) or whole.all_full_dtypes[:1]

    def recheck(self, spec: NormalizerSpec, case: Any, ctx: Context) -> float:
        """Check ``case`` as a repro does: with :attr:`verify` when the property has one."""
        return (self.verify or self.check)(spec, case, ctx)


# --------------------------------------------------------------------------------------------
# Shared helpers for checks


class NormalizerError(Exception):
    """The normalizer under test raised; ``cause`` is its exception."""

    def __init__(self, cause: BaseException, input: torch.Tensor | None = None):
        text = str(cause).strip()
        # a target raising in its worker arrives as attnverify.remote.TargetRaised: its own type
        name = getattr(cause, "remote_type", None) or type(cause).__name__
        super().__init__(f"{name}: {text.splitlines()[0] if text else ''}")
        self.cause = cause
        self.input = input if type(input) is torch.Tensor else None  # not inside transforms


def call(spec: NormalizerSpec, scores: torch.Tensor, temperature: float | None = None, *,
         dim: int = -1, **kw):
    """Call the normalizer along ``dim`` with its parameters, adding ``temperature`` only where
    it applies.

    Whatever the normalizer raises comes back as :class:`NormalizerError` (carrying the scores it
    was given as ``input``), so that a fault of the normalizer is told apart from a fault of the
    suite. An output refused at the process boundary (a :class:`Violation`) and a worker that
    died or hung (:class:`~attnverify.errors.WorkerFailed`) pass through unchanged.
    """
    if temperature is not None and spec.takes_temperature:
        kw["temperature"] = temperature
    try:
        return spec(scores, dim=dim, **kw)
    except (KeyboardInterrupt, WorkerFailed, Violation):
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit, GeneratorExit, … fail the property
        raise NormalizerError(exc, input=scores) from exc


def call_many(spec: NormalizerSpec, inputs: list, temperature: float | None = None, *,
              dim: int = -1, reuse: dict | None = None, **kw) -> list:
    """:func:`call` on each of ``inputs`` (same temperature, parameters and ``dim``), in order:
    one request to the worker where the normalizer runs behind the process boundary, else one
    call each. ``reuse`` ``{i: j}``: call ``i`` gets its values in the tensor call ``j`` was
    given (the same storage and address; the two have the same layout). A raise is
    :class:`NormalizerError` carrying the input that raised."""
    many = getattr(getattr(spec, "fn", None), "many", None)
    if many is None or any(t.requires_grad for t in inputs):
        given: list = []
        out = []
        for i, t in enumerate(inputs):
            t = _into(given[reuse[i]], t) if reuse and i in reuse else _copy(t)
            given.append(t)
            out.append(call(spec, t, temperature, dim=dim, **kw))
        return out
    if temperature is not None and spec.takes_temperature:
        kw["temperature"] = temperature
    try:
        return many(list(inputs), dim=dim, reuse=reuse, **{**spec.params, **kw})
    except (KeyboardInterrupt, WorkerFailed, Violation):
        raise
    except BaseException as exc:  # noqa: BLE001 - the normalizer's fault, with its input
        index = getattr(exc, "index", None)
        failed = inputs[index] if isinstance(index, int) and 0 <= index < len(inputs) else None
        raise NormalizerError(exc, input=failed) from exc


def call_many_vjp(spec: NormalizerSpec, inputs: list, cotangents: list,
                  temperature: float | None = None, *, dim: int = -1, **kw) -> list | None:
    """``[(output, gradient, graph)]`` of the normalizer on each of ``inputs`` with grad: its
    output, the gradient of ``⟨cotangent, output⟩`` with respect to the input, whether the
    output carried a graph; one request to the worker where the normalizer runs behind the
    process boundary (``RemoteFunction.many_vjp``). ``None`` for a normalizer called in this
    process (the caller differentiates it here). A raise is :class:`NormalizerError` carrying
    the input that raised."""
    many = getattr(getattr(spec, "fn", None), "many_vjp", None)
    if many is None:
        return None
    if temperature is not None and spec.takes_temperature:
        kw["temperature"] = temperature
    try:
        return many(list(inputs), list(cotangents), dim=dim, **{**spec.params, **kw})
    except (KeyboardInterrupt, WorkerFailed, Violation):
        raise
    except BaseException as exc:  # noqa: BLE001 - the normalizer's fault, with its input
        index = getattr(exc, "index", None)
        failed = inputs[index] if isinstance(index, int) and 0 <= index < len(inputs) else None
        raise NormalizerError(exc, input=failed) from exc


def _span(t: torch.Tensor) -> torch.Tensor:
    """The 1-D view of ``t``'s storage from element 0 to the last element ``t`` reaches."""
    n = 0 if t.numel() == 0 else t.storage_offset() + sum(
        (size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
    return torch.as_strided(t, (n,), (1,), 0)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in new storage with the same sizes, strides and storage offset."""
    span = _span(t.detach())
    fresh = span.clone()
    return torch.as_strided(fresh, t.shape, t.stride(), t.storage_offset() if span.numel()
                            else 0)


def _into(earlier: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``earlier`` holding ``t``'s storage bytes (the same layout): the same tensor, new
    values."""
    with torch.no_grad():
        _span(earlier).copy_(_span(t.detach()))
    return earlier


def monitor_of(spec):
    """What the worker behind ``spec`` reported (:class:`attnverify.remote.Monitor`: side
    effects, refused outputs, its process ids), or ``None`` for a spec called in this process
    without a proxy. Read from the spec's function (or its attention kernel's), by duck typing,
    so that the checks need not import :mod:`attnverify.remote`."""
    fn = getattr(spec, "fn", None)
    attention = getattr(fn, "attention", None)
    if attention is not None:
        fn = getattr(attention, "fn", None)
    monitor = getattr(fn, "monitor", None)
    return monitor if hasattr(monitor, "effects") and hasattr(monitor, "refused") else None


def as_float64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def sum_tolerance(dtype: torch.dtype, length: int) -> float:
    """Allowed |row sum − target|: the dtype's atol plus rtol grown with √L (summation error).

    At L = 4096 in float32 this is about 9e-5: a 1e-3 error in a row sum is always caught.
    """
    t = tol_for(dtype)
    return t.atol + t.rtol * math.sqrt(max(length, 1))


def _diff_allowed(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: float,
                  slack: torch.Tensor | None = None):
    """``(|got − want|, scale·(atol + rtol·|want|) + slack)`` in float64; equal NaNs and equal
    infinities count as no difference, any other NaN as an infinite one. ``slack``: an
    elementwise allowance on top (:func:`rounded_scalings`)."""
    t = tol_for(dtype)
    g, w = as_float64(got), as_float64(want)
    allowed = scale * (t.atol + t.rtol * w.abs().nan_to_num(0.0, 0.0, 0.0))
    if slack is not None:
        allowed = allowed + slack
    diff = (g - w).abs()
    agree = (torch.isnan(g) & torch.isnan(w)) | (torch.isinf(g) & (g == w))
    diff = torch.where(agree, torch.zeros_like(diff), diff).nan_to_num(nan=math.inf)
    return diff, allowed


def close_mask(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: float = 1.0,
               slack: torch.Tensor | None = None):
    """Elementwise ``|got − want| ≤ scale·(atol + rtol·|want|) + slack``; returns (ok, excess).

    ``excess`` is the largest ratio |diff| / allowed, so ≤ 1 means within tolerance.
    """
    diff, allowed = _diff_allowed(got, want, dtype, scale, slack)
    ratio = diff / allowed
    return bool((ratio <= 1).all()), float(ratio.max()) if ratio.numel() else 0.0


def mismatch_message(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale=1.0,
                     slack: torch.Tensor | None = None) -> str:
    """torch.testing-style summary: "Mismatched elements: 3 / 100 (3.0%) …"."""
    diff, allowed = _diff_allowed(got, want, dtype, scale, slack)
    n, total = int((diff > allowed).sum()), diff.numel()
    idx = int(torch.argmax(diff - allowed)) if total else 0
    return (
        f"Mismatched elements: {n} / {total} ({100.0 * n / max(total, 1):.1f}%); "
        f"greatest absolute difference: {float(diff.flatten()[idx]):.3g} at index {idx} "
        f"(up to {float(allowed.flatten()[idx]):.3g} allowed)"
    )


def rounded_scalings(scores: torch.Tensor, temperature) -> list[torch.Tensor]:
    """Float64 scores ``z'`` whose ``z'/T`` is ``z/T`` rounded once to the scores' dtype, as a
    kernel computing in that dtype rounds it (``z / T``, and ``z`` times ``1/T`` rounded);
    none in float64, at ``T = 1``, or where a rounded value is not finite (an overflow of the
    dtype stays a failure). Masked keys stay masked."""
    dtype = scores.dtype
    if temperature is None or float(temperature) == 1.0 or dtype == torch.float64 or \
            not dtype.is_floating_point:
        return []
    t = float(temperature)
    z = scores.to(torch.float64)
    live = torch.isfinite(z)
    out = []
    for scaled in (scores / t, scores * torch.tensor(1.0 / t, dtype=dtype)):
        rounded = scaled.to(dtype).to(torch.float64)
        if bool(torch.isfinite(rounded[live]).all()):
            out.append(torch.where(live, rounded * t, z))
    return out


def moved_by(want: torch.Tensor, others: list[torch.Tensor]) -> torch.Tensor:
    """``max |other − want|`` elementwise over ``others`` of ``want``'s shape (zero where there
    are none, and where a difference is not a number): how far a rounding moves ``want``."""
    slack = torch.zeros_like(want)
    for other in others:
        if other.shape == want.shape:
            slack = torch.maximum(slack, (other - want).abs().nan_to_num(0.0, 0.0, 0.0))
    return slack


def describe_dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def positive_temperature(value: Any, option: str = "--params") -> float:
    """``value`` as a temperature: a positive, finite number, else a usage error naming
    ``option``."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        t = math.nan
    if isinstance(value, bool) or not (math.isfinite(t) and t > 0):
        raise UsageError(f"{option} temperature={value!r}: the temperature must be a positive, "
                         "finite number")
    return t
