"""Run properties against a normalizer and collect results.

Every property runs in two steps: a fixed battery of adversarial cases, then Hypothesis, whose
``hypothesis.target`` steers the search towards the worst ratio observed / allowed and whose
shrinker minimises any failure. The smallest failing case of the two is reported. A normalizer
that raises is a result with status ``error``, never a crash of the suite.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings

from attnverify.checks import PROPERTIES, Property, Violation, properties_for
from attnverify.checks.base import Context, NormalizerError, positive_temperature
from attnverify.checks.shrink import shrink
from attnverify.errors import UsageError
from attnverify.registry import NormalizerSpec
from attnverify.serialize import encode_case, jsonable, number, repro_command  # noqa: F401

PROFILE_ENV = "ATTNVERIFY_PROFILE"

#: Profiles: examples per property and the largest row length the strategies may draw.
PROFILES: dict[str, dict[str, int]] = {
    "dev": {"max_examples": 20, "max_length": 256},
    "ci": {"max_examples": 50, "max_length": 4096},
    "thorough": {"max_examples": 400, "max_length": 65536},
}

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


@dataclass
class PropertyResult:
    property: str
    claimed: bool
    status: str  # holds | violated | error | not_applicable
    examples: int = 0
    worst_ratio: float | None = None
    counterexample: dict[str, Any] | None = None
    message: str = ""
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if out["worst_ratio"] is not None:
            out["worst_ratio"] = number(out["worst_ratio"])  # one encoding: "inf", not 1e308
        out["elapsed_s"] = round(self.elapsed_s, 4)
        return out


@dataclass
class TargetResult:
    target: str
    claims: list[str]
    results: list[PropertyResult] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        bad = [r for r in self.results if r.claimed and r.status in ("violated", "error")]
        return "failed" if bad else "certified"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "claims": list(self.claims),
            "params": {k: jsonable(v) for k, v in self.params.items()},
            "verdict": self.verdict,
            "results": [r.to_json() for r in self.results],
        }


def make_context(
    profile: str | None = None,
    *,
    dtypes: str | None = None,
    device: str = "cpu",
    max_examples: int | None = None,
    seed: int = 0,
) -> Context:
    """Build a :class:`Context`, validating every argument (usage errors name the flag)."""
    profile = profile or os.environ.get(PROFILE_ENV) or "ci"
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r}: expected one of {', '.join(PROFILES)}")
    limits = dict(PROFILES[profile])
    if max_examples is not None:
        if max_examples < 1:
            raise UsageError(f"--max-examples must be at least 1, got {max_examples}")
        limits["max_examples"] = max_examples
    return Context(
        profile=profile,
        dtypes=parse_dtypes(dtypes),
        device=_check_device(device),
        seed=int(seed),
        **limits,
    )


def parse_dtypes(text: str | None) -> tuple[torch.dtype, ...]:
    if not text:
        return (torch.float32, torch.float64)
    out = []
    for name in (t.strip() for t in text.split(",")):
        if name not in DTYPES:
            raise UsageError(f"unknown dtype {name!r} in --dtypes: expected {', '.join(DTYPES)}")
        out.append(DTYPES[name])
    return tuple(dict.fromkeys(out))


def _check_device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}: expected cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def fix_temperature(ctx: Context, params, option: str = "--params") -> Context:
    """``ctx`` with the temperature that ``params`` fix, validated (positive and finite, else a
    usage error naming ``option``): every case then uses that T wherever it would draw one, and
    every bound the same T. Without ``temperature`` in ``params``, ``ctx`` unchanged."""
    value = (params or {}).get("temperature")
    if value is None:
        return ctx
    return dataclasses.replace(ctx, temperature=positive_temperature(value, option))


def resolve_claims(spec: NormalizerSpec, claims: list[str] | None) -> list[str]:
    """The non-universal claims to check: ``claims`` when given, else the spec's own."""
    chosen = list(spec.claims if claims is None else claims)
    unknown = [c for c in chosen if c not in PROPERTIES]
    if unknown:
        raise UsageError(
            f"unknown property id {unknown[0]!r}: run 'attnverify properties' for the list"
        )
    universal = [c for c in chosen if PROPERTIES[c].universal]
    if universal:
        raise UsageError(f"{universal[0]!r} is universal: it is always checked, not claimed")
    return list(dict.fromkeys(chosen))


def certify_target(
    spec: NormalizerSpec,
    claims: list[str] | None = None,
    ctx: Context | None = None,
    *,
    label: str | None = None,
    progress=None,
) -> TargetResult:
    """Check the universal properties and the claims of one normalizer."""
    ctx = ctx or make_context()
    chosen = resolve_claims(spec, claims)
    spec = spec.with_claims(chosen)
    result = TargetResult(target=label or spec.id, claims=chosen, params=dict(spec.params))
    for prop in properties_for(chosen, ctx):
        result.results.append(run_property(prop, spec, ctx, claimed=True))
        if progress is not None:
            progress(result.target, result.results[-1])
    return result


class _State:
    def __init__(self) -> None:
        self.examples = 0
        self.worst = 0.0
        self.last: Any = None
        self.reproduces = True


def _size(case: Any) -> int:
    scores = getattr(case, "scores", None)
    return int(scores.numel()) if isinstance(scores, torch.Tensor) else 0


def run_property(
    prop: Property, spec: NormalizerSpec, ctx: Context, *, claimed: bool = True
) -> PropertyResult:
    """Run one property: the adversarial battery first, then Hypothesis; never raises for the
    normalizer's faults. A failure is reported on the smallest failing case found (the
    battery's, or Hypothesis's shrunk one)."""
    start = time.perf_counter()
    reason = prop.applies(spec, ctx)
    if reason:
        return PropertyResult(prop.id, claimed, "not_applicable", message=reason)
    state = _State()
    failures: list[tuple[Any, BaseException]] = []
    for case in prop.explicit(spec, ctx):
        try:
            _evaluate(prop, spec, ctx, state, case)
        except Exception as exc:  # noqa: BLE001 - classified below
            failures.append((case, exc))
    try:
        _hypothesis_test(prop, spec, ctx, state)()
    except Exception as exc:  # noqa: BLE001 - classified below
        failures.append((getattr(exc, "attnverify_case", state.last), exc))
    if not failures:
        return _finish(prop, claimed, "holds", state, start, "", None, spec, ctx)
    case, exc = min(failures, key=lambda f: (_size(f[0]), not isinstance(f[1], Violation)))
    case, exc, state.reproduces = _exact_and_minimal(prop, spec, ctx, case, exc)
    state.last = case
    if isinstance(exc, Violation):
        return _finish(prop, claimed, "violated", state, start, exc.message, exc, spec, ctx)
    if isinstance(exc, NormalizerError):
        message = f"the normalizer raised {exc}"
    elif isinstance(exc, hypothesis.errors.Unsatisfiable):
        message = f"no valid case: {exc}"
    else:
        message = f"internal error in attnverify ({type(exc).__name__}: {_first_line(exc)})"
    return _finish(prop, claimed, "error", state, start, message, None, spec, ctx)


def _evaluate(prop: Property, spec, ctx, state: _State, case) -> float:
    state.examples += 1
    state.last = case
    try:
        ratio = float(prop.check(spec, case, ctx))
    except Exception as exc:
        exc.attnverify_case = case  # the failing case, whatever Hypothesis runs after it
        raise
    if math.isfinite(ratio):
        state.worst = max(state.worst, ratio)
    return ratio


def _hypothesis_test(prop: Property, spec: NormalizerSpec, ctx: Context, state: _State):
    def body(case):
        ratio = _evaluate(prop, spec, ctx, state, case)
        if math.isfinite(ratio):
            hypothesis.target(min(ratio, 1e12), label=prop.id)

    examples = max(1, int(round(ctx.max_examples * prop.examples_scale)))
    conf = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        phases=[Phase.generate, Phase.target, Phase.shrink],
        print_blob=False,
    )
    return hypothesis.seed(ctx.seed)(conf(given(prop.cases(spec, ctx))(body)))


def _exact_and_minimal(prop: Property, spec, ctx, case, exc):
    """``(case, exception, reproduces)``: the input the normalizer was actually given (for a
    property that builds its input from the case, :attr:`Violation.input`), shrunk to the fewest
    rows, fewest keys and simplest values that still fail the same way
    (:mod:`attnverify.checks.shrink`), re-checked as the repro will re-check it."""
    given = getattr(exc, "input", None)
    fields = getattr(case, "_fields", ())
    if prop.verify is not None and isinstance(given, torch.Tensor) and "scores" in fields:
        case = case._replace(scores=given.detach().clone())
    if not isinstance(exc, (Violation, NormalizerError)):
        return case, exc, True

    def recheck(candidate):
        return prop.recheck(spec, candidate, ctx)

    small, small_exc = shrink(recheck, case, exc, vary_temperature=ctx.temperature is None)
    if small_exc is not exc:
        return small, small_exc, True
    try:  # nothing smaller failed: confirm that the repro fails on the case itself
        recheck(case)
    except (Violation, NormalizerError) as again:
        return case, again if type(again) is type(exc) else exc, type(again) is type(exc)
    except Exception:  # noqa: BLE001
        return case, exc, False
    return case, exc, False


def _finish(prop, claimed, status, state, start, message, violation, spec, ctx) -> PropertyResult:
    worst = state.worst
    counterexample = None
    if status in ("violated", "error") and state.last is not None:
        counterexample = describe_case(state.last, spec)
        case_json = dict(counterexample)
        if violation is not None:
            worst = max(worst, violation.ratio)
            counterexample.update(jsonable({
                "observed": violation.observed, "bound": violation.bound,
                "ratio": violation.ratio, **violation.details,
            }))
        if not state.reproduces:
            counterexample["reproduces"] = False
        counterexample["repro"] = repro_command(spec.target or spec.id, case_json,
                                                property=prop.id)
    return PropertyResult(
        property=prop.id,
        claimed=claimed,
        status=status,
        examples=state.examples,
        worst_ratio=worst,
        counterexample=counterexample,
        message=message,
        elapsed_s=time.perf_counter() - start,
    )


def describe_case(case: Any, spec: NormalizerSpec) -> dict[str, Any]:
    """The case as JSON (:func:`attnverify.serialize.encode_case`): every field, the scores in
    full with their masks, their dtype and shape, and the normalizer's parameters."""
    return encode_case(case, spec.params)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
