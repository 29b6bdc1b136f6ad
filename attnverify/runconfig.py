"""Run configuration, defined once for the command line and the pytest plugin.

- :data:`PROFILES`: per profile, the examples per property, the longest row the strategies draw,
  the most entries of one case and the per-example time limit of an isolated run
  (``--timeout`` overrides it). Each profile is also registered with Hypothesis as
  ``attnverify-<name>`` (``settings.get_profile``).
- :func:`make_context`: the one validated constructor of a :class:`RunContext` (profile, dtypes,
  device, examples, seed, time limit, isolation); every bad value is a :class:`UsageError` that
  names its option.
- :func:`hypothesis_settings`: the one builder of the Hypothesis settings that ``certify``,
  ``falsify``, ``claims`` and the plugin search with.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from dataclasses import dataclass
from functools import cache

from attnverify.errors import UsageError

PROFILE_ENV = "ATTNVERIFY_PROFILE"
#: ``0``/``off`` runs targets in the calling process (for debugging; no time limit).
ISOLATION_ENV = "ATTNVERIFY_ISOLATION"

#: Profiles: examples per property, the longest row the strategies may draw, the most entries
#: of one case (rows × row length, each of the two up to one past a block of that many:
#: ``[4097, 513]`` at ``2**21``) and the per-example time limit in seconds of an isolated run.
PROFILES: dict[str, dict[str, int]] = {
    "dev": {"max_examples": 20, "max_length": 256, "max_elements": 2**17, "timeout_s": 10},
    "ci": {"max_examples": 50, "max_length": 4096, "max_elements": 2**21, "timeout_s": 30},
    "thorough": {"max_examples": 400, "max_length": 65536, "max_elements": 2**23,
                 "timeout_s": 120},
}
PROFILE_NAMES = tuple(PROFILES)
DEFAULT_PROFILE = "ci"
#: ``falsify``'s budget per profile: evaluations of the inequality (battery, strata and polish
#: together: the cap that binds, so a seed gives the same result on every machine) and seconds
#: (a safety net for slow targets; ``--budget`` sets it).
FALSIFY_BUDGETS: dict[str, dict[str, float]] = {
    "dev": {"evaluations": 500, "seconds": 120.0},
    "ci": {"evaluations": 3000, "seconds": 600.0},
    "thorough": {"evaluations": 30000, "seconds": 3600.0},
}

#: Upper bounds of the numeric options (beyond them: exit 2).
MAX_EXAMPLES_LIMIT = 100_000
MAX_TIMEOUT_S = 86_400.0
MAX_SEED = 2**64 - 1
#: ``--seed random``: a fresh seed drawn for the run (and recorded wherever the seed is).
RANDOM_SEED = "random"
MAX_LENGTH_LIMIT = 2**20

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
DEVICES = ("cpu", "cuda")

# torch and Hypothesis load on first use, so that the command line parses (and ``--help``
# prints) without them: ``DTYPES`` and ``RunContext`` are module attributes built on demand.


def __getattr__(name: str):
    if name == "DTYPES":
        return _dtypes()
    if name == "RunContext":
        return _run_context()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _dtypes() -> dict:
    import torch  # torch-free: on the parser's path

    return {name: getattr(torch, name) for name in DTYPE_NAMES}


@cache
def _run_context() -> type:
    from attnverify.checks.base import Context  # torch-free: on the parser's path

    @dataclass(frozen=True)
    class RunContext(Context):
        """A :class:`~attnverify.checks.base.Context` with the run's time limit per example and
        whether targets run in a worker process (:mod:`attnverify.isolation`)."""

        timeout_s: float = float(PROFILES[DEFAULT_PROFILE]["timeout_s"])
        isolation: bool = True
        #: ``"fixed"`` (given or the default) or ``"random"`` (drawn for this run by
        #: ``--seed random``).
        seed_source: str = "fixed"
        #: ``falsify``: evaluations of the search (None: the profile's, FALSIFY_BUDGETS) and its
        #: time cap in seconds (``--budget``; None: the profile's).
        falsify_evaluations: int | None = None
        budget_s: float | None = None
        #: ``certify --database``: the example database (directory or redis://…) every property's
        #: Hypothesis run replays first and files its failures in (``None``: none, as the ci
        #: profile runs).
        database: str | None = None

    RunContext.__module__, RunContext.__qualname__ = __name__, "RunContext"
    return RunContext


@cache
def register_profiles() -> None:
    """Register every profile with Hypothesis as ``attnverify-<name>`` (idempotent)."""
    from hypothesis import HealthCheck, Verbosity, settings  # torch-free: on the parser's path

    base = dict(deadline=None, database=None, report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                print_blob=False, derandomize=False)
    for name, limits in PROFILES.items():
        settings.register_profile(f"attnverify-{name}", max_examples=limits["max_examples"],
                                  **base)


@contextlib.contextmanager
def seeded_generation():
    """Hypothesis draws that depend on the seed and the strategy alone.

    Hypothesis (since 6.131) mixes into what it draws constants read from the source of every
    *local* module loaded in the process (not site-packages; attnverify itself when installed
    editable, a user's own modules in a pytest session). Which modules are loaded differs between
    an unsharded run, a shard, a rerun after ``merge`` and a plugin session, so one seed would
    draw different cases in each, and a sharded run would not merge into the unsharded
    certificate. attnverify's searches run with that pool empty, and with a cache of the
    constants of their own (:func:`_constants_cache`) in place of Hypothesis's, which is given
    back untouched; Hypothesis's own global constants stay. Without the internals this relies on
    (another Hypothesis release), nothing is changed."""
    try:
        from hypothesis.internal.conjecture import providers  # torch-free: on the parser's path
    except ImportError:  # pragma: no cover - a Hypothesis without providers
        yield
        return
    original = getattr(providers, "_get_local_constants", None)
    constants = getattr(providers, "Constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if original is None or constants is None or cache is None:
        yield
        return
    empty = constants()
    providers._get_local_constants = lambda: empty
    # Hypothesis's cache of the constants each kind of draw may take, made from that pool: ours
    # (from the empty pool alone, so one for every search of the process) while a search runs,
    # the process's own after it
    providers.CONSTANTS_CACHE = _constants_cache(type(cache))
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE = cache


#: Entries in :func:`_constants_cache` (Hypothesis's own holds 1024).
CONSTANTS_CACHE_SIZE = 2**14


@cache
def _constants_cache(kind):
    """The cache of constants :func:`seeded_generation` gives Hypothesis (one per process):
    its entries depend on the kind of draw alone, so it is never cleared."""
    return kind(CONSTANTS_CACHE_SIZE)


@contextlib.contextmanager
def unseeded_globals(active: bool = True):
    """While open (where ``active``), Hypothesis leaves the process's global random generators
    alone.

    Before every example Hypothesis seeds Python's and numpy's global generators (and those
    given to ``register_random``) and restores them after it, so that a test drawing from them
    repeats: a few hundred microseconds an example, a few per cent of a certify run. A search
    whose targets run behind the process boundary has nothing in this process that draws from
    them (attnverify's strategies and checks use generators of their own, seeded from the
    case), so there the generators are taken out of Hypothesis's care while it runs and handed
    back after; a target in this process (``--no-isolation``) keeps them seeded. Without the
    internal this relies on (another Hypothesis release), nothing is changed."""
    try:
        from hypothesis.internal import entropy  # torch-free: on the parser's path
    except ImportError:  # pragma: no cover - a Hypothesis without entropy
        yield
        return
    managed = getattr(getattr(entropy, "RANDOMS_TO_MANAGE", None), "data", None)
    if not active or not isinstance(managed, dict):
        yield
        return
    held = dict(managed)  # the weak references themselves: nothing is kept alive here
    managed.clear()
    try:
        yield
    finally:
        for key, ref in held.items():
            managed.setdefault(key, ref)


def hypothesis_settings(ctx, max_examples: int | None = None, *, phases=None):
    """The settings every search runs under: the profile's registered settings with the
    context's example budget (or ``max_examples``) and ``phases`` (default generate, target,
    shrink)."""
    from hypothesis import Phase, settings  # torch-free: on the parser's path

    register_profiles()
    profile = ctx.profile if ctx.profile in PROFILES else DEFAULT_PROFILE
    phases = phases or (Phase.generate, Phase.target, Phase.shrink)
    return settings(settings.get_profile(f"attnverify-{profile}"),
                    max_examples=max_examples or ctx.max_examples, phases=list(phases))


def make_context(
    profile: str | None = None,
    *,
    dtypes: str | None = None,
    device: str = "cpu",
    max_examples: int | None = None,
    seed: int = 0,
    timeout: float | None = None,
    isolation: bool | None = None,
    budget: float | None = None,
    max_length: int | None = None,
) -> RunContext:  # noqa: F821 - built on demand
    """Build a :class:`RunContext`, validating every argument (usage errors name the flag).

    ``max_examples`` is also ``falsify``'s evaluation budget when given; ``budget`` is
    ``falsify``'s time cap (``--budget``); ``max_length`` overrides the profile's longest row."""
    profile = profile or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r}: expected one of {', '.join(PROFILES)}")
    limits = dict(PROFILES[profile])
    timeout_s = float(limits.pop("timeout_s"))
    if max_examples is not None:
        limits["max_examples"] = check_max_examples(max_examples)
    if timeout is not None:
        timeout_s = check_timeout(timeout)
    seed_source = "fixed"
    if isinstance(seed, str) and seed.strip().lower() == RANDOM_SEED:
        seed, seed_source = secrets.randbits(64), "random"
    if max_length is not None:
        limits["max_length"] = check_max_length(max_length)
    return _run_context()(
        profile=profile,
        dtypes=parse_dtypes(dtypes),
        device=check_device(device),
        seed=check_seed(seed),
        seed_source=seed_source,
        timeout_s=timeout_s,
        isolation=isolation_default() if isolation is None else bool(isolation),
        falsify_evaluations=None if max_examples is None else limits["max_examples"],
        budget_s=None if budget is None else check_budget(budget),
        **limits,
    )


def context_from_args(args, *, dtypes: bool = True):
    """The run's context from a command's search options (every value checked: usage errors
    name the option): profile, examples, seed (``random`` drawn here), time limit, isolation,
    and for certify the dtypes and device."""
    extra = {"dtypes": args.dtypes, "device": args.device} if dtypes else {}
    return make_context(args.profile, max_examples=args.max_examples, seed=args.seed,
                        timeout=args.timeout, isolation=False if args.no_isolation else None,
                        **extra)


def falsify_budget(ctx) -> tuple[int, float]:
    """``(evaluations, seconds)`` of a falsify search under ``ctx`` (its own, else the
    profile's :data:`FALSIFY_BUDGETS`)."""
    profile = ctx.profile if ctx.profile in FALSIFY_BUDGETS else DEFAULT_PROFILE
    defaults = FALSIFY_BUDGETS[profile]
    evaluations = getattr(ctx, "falsify_evaluations", None) or int(defaults["evaluations"])
    seconds = getattr(ctx, "budget_s", None) or float(defaults["seconds"])
    return int(evaluations), float(seconds)


def check_max_examples(value) -> int:
    value = _as_int(value, "--max-examples")
    if not 1 <= value <= MAX_EXAMPLES_LIMIT:
        raise UsageError(f"--max-examples must be between 1 and {MAX_EXAMPLES_LIMIT}, got {value}")
    return value


def check_seed(value) -> int:
    value = _as_int(value, "--seed")
    if not 0 <= value <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and 2**64-1, got {value}")
    return value


def _check_seconds(value, option: str) -> float:
    """A positive, finite number of seconds up to :data:`MAX_TIMEOUT_S` (else a usage error
    naming ``option``)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} expects a number of seconds, got {str(value)[:40]!r}") \
            from None
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise UsageError(f"{option} must be a positive number of seconds up to "
                         f"{MAX_TIMEOUT_S:g}, got {value!r}")
    return value


def check_timeout(value) -> float:
    return _check_seconds(value, "--timeout")


def check_budget(value) -> float:
    """``--budget SECONDS``: falsify's time cap, positive and at most a day."""
    return _check_seconds(value, "--budget")


def check_max_length(value) -> int:
    """``--max-length N``: the longest row a search draws, 1 to 2**20."""
    value = _as_int(value, "--max-length")
    if not 1 <= value <= MAX_LENGTH_LIMIT:
        raise UsageError(f"--max-length must be between 1 and {MAX_LENGTH_LIMIT}, got {value}")
    return value


def _as_int(value, option: str) -> int:
    if isinstance(value, bool):
        raise UsageError(f"{option} expects an integer, got {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not text.isascii() or not text.lstrip("+-").isdigit() or len(text) > 40:
        raise UsageError(f"{option} expects an integer, got {str(value)[:40]!r}")
    return int(text)


def parse_dtypes(text: str | None) -> tuple:
    """``--dtypes``: comma-separated names of :data:`DTYPES` (default float32,float64)."""
    dtypes = _dtypes()
    if not text:
        return (dtypes["float32"], dtypes["float64"])
    out = []
    for name in (t.strip() for t in text.split(",")):
        if name not in dtypes:
            raise UsageError(f"unknown dtype {name!r} in --dtypes: expected {', '.join(dtypes)}")
        out.append(dtypes[name])
    return tuple(dict.fromkeys(out))


def check_device(device: str) -> str:
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}: expected cpu or cuda")
    import torch  # torch-free: on the parser's path

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def isolation_default() -> bool:
    """Whether targets run in a worker process unless told otherwise (``ATTNVERIFY_ISOLATION``)."""
    raw = os.environ.get(ISOLATION_ENV, "").strip().lower()
    if raw in ("", "1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise UsageError(f"{ISOLATION_ENV}={raw!r}: expected 1/on or 0/off")


#: ``falsify --workers``: at most this many search processes.
MAX_WORKERS = 64


def check_workers(value: object) -> int:
    """``--workers N``: 1 to :data:`MAX_WORKERS`."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isascii() or not text.isdigit() or len(text) > 6:
        raise UsageError(f"--workers expects a whole number from 1 to {MAX_WORKERS}, "
                         f"got {str(value)[:40]!r}")
    n = int(text)
    if not 1 <= n <= MAX_WORKERS:
        raise UsageError(f"--workers must be between 1 and {MAX_WORKERS}, got {n}")
    return n
