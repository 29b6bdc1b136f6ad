"""Settings of one ``attnverify empirical`` run, their defaults and their validation.

Defaults follow paper A's experiments (docs/THEORY.md §3–5): N = 5 and L = 32 … 1024 for Alg. 1,
N ∈ {1, 5, 10, 20, 100} at L = 1024 for Alg. 2, N = 1 … 64 for Alg. 4, ε ∈ {1e-3, 1e-1, 10} and
T on a log grid 1e-3 … 10 for Alg. 5; paper B's stacks go 16 layers deep.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnverify.errors import UsageError

#: Keys whose inclusion in I_N is enumerated exactly by the Monte-Carlo E (2³ = 8 strata).
HEAVY_KEYS = 3

#: Largest ``--seed``: the experiments derive generator seeds as ``seed * 1000 + salt``, which
#: must stay within torch's 64-bit seed range.
MAX_SEED = 2**32 - 1
#: Largest ``--threads`` and ``--temperature-points`` accepted (beyond any sensible run).
MAX_THREADS = 1024
MAX_TEMPERATURE_POINTS = 10_000
#: ε of Alg. 5: below 1e-12 the perturbation is lost in float64 rounding (ε = 1e-300 gave
#: g = 0 everywhere).
EPSILON_RANGE = (1e-12, 1e12)
#: Upper limits of the size options: far beyond the papers' settings, low enough that no size
#: asks for absurd memory at once (the training run holds all its batches: 8 kB per step).
SIZE_LIMITS = {
    "windows": 10_000, "rows_per_length": 100_000, "mc_draws": 1_000, "critical_draws": 1_000,
    "collapse_depth": 1_000, "collapse_seeds": 10_000, "coverage_n": 100_000,
    "training_steps": 20_000, "training_layers": 256,
}

#: Paper A's five algorithms, in the paper's order, then paper B's rank-collapse check.
PAPER_A_EXPERIMENTS = (
    "distance_vs_length",
    "distance_vs_topn",
    "critical_topn",
    "separability",
    "gradient",
)
#: Measurements paper A reports beyond its five algorithms (docs/THEORY.md §8).
PAPER_A_MEASUREMENTS = ("lemma1", "temperature", "coverage", "convergence")
#: Paper B: rank collapse at initialisation, gradient histories during training.
PAPER_B_EXPERIMENTS = ("rank_collapse", "training")
EXPERIMENTS = PAPER_A_EXPERIMENTS + PAPER_A_MEASUREMENTS + PAPER_B_EXPERIMENTS

#: Paper A, Table 1: wall time of each algorithm on a 10-core laptop, in seconds.
PAPER_TABLE1_SECONDS = {
    "distance_vs_length": 24 * 60,
    "distance_vs_topn": 37 * 60,
    "critical_topn": 17 * 3600 + 4 * 60,
    "separability": 7 * 60,
    "gradient": 60,
}

#: Fields that do not change any number (excluded from checkpoint fingerprints).
NON_NUMERIC_FIELDS = (
    "out", "resume", "progress", "allow_download", "text", "device", "threads", "timeout",
)


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs; ``validate_against`` checks it against the loaded model."""

    model: str
    text: Path | None = None
    experiments: tuple[str, ...] = EXPERIMENTS
    normalizers: tuple[str, ...] = ()
    device: str = "cpu"
    out: Path = Path("empirical-out")
    resume: bool = False
    seed: int = 0
    max_length: int | None = None
    min_length: int = 32
    windows: int = 8
    rows_per_length: int = 8
    topn: int = 5
    topn_list: tuple[int, ...] = (1, 5, 10, 20, 100)
    separability_max_n: int = 64
    critical_max_fraction: float = 0.25
    mc_draws: int = 2
    critical_draws: int = 1
    temperatures: tuple[float, ...] = field(default_factory=lambda: log_grid(1e-3, 10.0, 25))
    epsilons: tuple[float, ...] = (1e-3, 1e-1, 10.0)
    selectivity_temperatures: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
    coverage_n: int = 16
    #: What x_i is (extraction.py): the first choice runs every experiment; the others rerun
    #: the x-dependent ones with the model's softmax, to show how the verdicts move.
    embeddings: str = "value"
    embedding_variants: tuple[str, ...] = ()
    collapse_depth: int = 16
    collapse_lambdas: tuple[float, ...] = (0.1, 0.5, 1.0)
    #: Paper B varies λ⁺ with λ⁻ = 1 held, and λ⁻ with λ⁺ = 1 held: (λ⁺, λ⁻) pairs.
    collapse_pairs: tuple[tuple[float, float], ...] = ((0.1, 1.0), (0.5, 1.0), (1.0, 0.1),
                                                       (1.0, 0.5))
    collapse_seeds: int = 8
    collapse_width: int = 64
    collapse_tokens: int = 64
    training_steps: int = 200
    training_layers: int = 4
    #: daGPAM (λ⁺, λ⁻) of the training run: paper B's one-λ form, then each λ varied alone.
    training_lambdas: tuple[tuple[float, float], ...] = ((0.5, 0.5), (1.0, 0.5), (0.5, 1.0))
    progress: bool = True
    allow_download: bool = False
    threads: int | None = None
    #: Seconds one call of a ``--normalizers`` target may take (0: no limit).
    timeout: float = 120.0

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)


def log_grid(lo: float, hi: float, points: int) -> tuple[float, ...]:
    """``points`` values from ``lo`` to ``hi``, equally spaced in log10, rounded to 4 digits."""
    if points < 2:
        return (lo,)
    step = (math.log10(hi) - math.log10(lo)) / (points - 1)
    return tuple(float(f"{10 ** (math.log10(lo) + i * step):.4g}") for i in range(points))


QUICK = {
    "max_length": 128,
    "min_length": 16,
    "windows": 2,
    "rows_per_length": 8,
    "topn_list": (1, 2, 5, 10, 20),
    "separability_max_n": 32,
    "mc_draws": 2,
    "temperatures": log_grid(1e-3, 10.0, 9),
    "collapse_depth": 8,
    "collapse_seeds": 2,
    "training_steps": 20,
    "training_layers": 2,
}


def parse_experiments(text: str | None) -> tuple[str, ...]:
    """``all`` or a comma-separated list of experiment names, in canonical order."""
    if text is None or text.strip() in ("", "all"):
        return EXPERIMENTS
    names = [item.strip() for item in text.split(",") if item.strip()]
    if not names:
        raise UsageError(f"--experiments={text!r} names no experiment: expected 'all' or a "
                         f"comma-separated list of {', '.join(EXPERIMENTS)}")
    unknown = [name for name in names if name not in EXPERIMENTS and name != "all"]
    if unknown:
        raise UsageError(
            f"unknown experiment {unknown[0]!r}: expected 'all' or a comma-separated list of "
            f"{', '.join(EXPERIMENTS)}"
        )
    if "all" in names:
        return EXPERIMENTS
    return tuple(name for name in EXPERIMENTS if name in names)


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise UsageError(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} expects positive integers, got {text!r}")
    return tuple(sorted(set(values)))


def parse_float_list(text: str, flag: str) -> tuple[float, ...]:
    """Comma-separated positive finite numbers (nan, inf, 0 and negatives are exit 2)."""
    try:
        values = tuple(float(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise UsageError(f"{flag} expects comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise UsageError(f"{flag} expects positive finite numbers, got {text!r}")
    return values


def parse_temperature_points(points: int) -> tuple[float, ...]:
    """``--temperature-points``: the log-T grid 1e-3 … 10 of Alg. 5."""
    if not 2 <= points <= MAX_TEMPERATURE_POINTS:
        raise UsageError(f"--temperature-points must lie in 2 … {MAX_TEMPERATURE_POINTS}, "
                         f"got {points}")
    return log_grid(1e-3, 10.0, points)


EMBEDDINGS = ("value", "hidden", "input")


def parse_embeddings(text: str) -> tuple[str, tuple[str, ...]]:
    """``--embeddings value[,hidden,input]``: the first choice and the others, in order."""
    names = list(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [name for name in names if name not in EMBEDDINGS]
    if not names or unknown:
        raise UsageError(f"--embeddings {text!r}: expected a comma-separated list of "
                         f"{', '.join(EMBEDDINGS)}")
    return names[0], tuple(names[1:])


def lengths(config: RunConfig, max_length: int) -> tuple[int, ...]:
    """Powers of two from ``min_length`` up to ``max_length`` (``max_length`` always included)."""
    out = []
    length = config.min_length
    while length < max_length:
        out.append(length)
        length *= 2
    out.append(max_length)
    return tuple(out)


def validate_settings(config: RunConfig) -> None:
    """Checks that need no model: positive sizes, seeds and threads in range, the experiments
    and number lists non-empty and finite. Every option is checked here or in a ``parse_*``."""
    if not config.experiments:
        raise UsageError("--experiments names no experiment")
    if not 0 <= config.seed <= MAX_SEED:
        raise UsageError(f"--seed must lie in 0 … {MAX_SEED} (2**32 - 1), got {config.seed}")
    if not (math.isfinite(config.timeout) and config.timeout >= 0):
        raise UsageError(f"--timeout must be a finite number of seconds ≥ 0, got {config.timeout}")
    if config.threads is not None and not 1 <= config.threads <= MAX_THREADS:
        raise UsageError(f"--threads must lie in 1 … {MAX_THREADS}, got {config.threads}")
    if config.max_length is not None:
        _positive(config.max_length, "--max-length")
    _positive(config.topn, "--topn")
    _positive(config.separability_max_n, "--separability-max-n")
    _positive(config.collapse_seeds, "--collapse-seeds")
    for values, flag in ((config.topn_list, "--topn-list"), (config.epsilons, "--epsilons"),
                         (config.collapse_lambdas, "--collapse-lambdas"),
                         (config.selectivity_temperatures, "--selectivity-temperatures"),
                         (config.temperatures, "--temperature-points")):
        if not values or not all(math.isfinite(v) and v > 0 for v in values):
            raise UsageError(f"{flag}: expected positive finite values, got {list(values)}")
    if not all(EPSILON_RANGE[0] <= e <= EPSILON_RANGE[1] for e in config.epsilons):
        raise UsageError(f"--epsilons must lie in {EPSILON_RANGE[0]:g} … {EPSILON_RANGE[1]:g} (a "
                         f"smaller ε is lost in the rounding of the logits), got "
                         f"{list(config.epsilons)}")
    _positive(config.windows, "--windows")
    _positive(config.rows_per_length, "--rows-per-length")
    _positive(config.mc_draws, "--mc-draws")
    _positive(config.critical_draws, "--critical-draws")
    _positive(config.collapse_depth, "--collapse-depth")
    _positive(config.coverage_n, "--coverage-n")
    _positive(config.training_steps, "--training-steps")
    _positive(config.training_layers, "--training-layers")
    for name, limit in SIZE_LIMITS.items():
        if getattr(config, name) > limit:
            raise UsageError(f"--{name.replace('_', '-')}={getattr(config, name)} is beyond the "
                             f"limit of {limit:,}")
    if not {config.embeddings, *config.embedding_variants} <= set(EMBEDDINGS):
        raise UsageError(f"--embeddings: expected a list of {', '.join(EMBEDDINGS)}")
    if config.min_length < 4:
        raise UsageError(f"--min-length={config.min_length} is too small: it must be at least 4")
    if config.max_length is not None and config.max_length < config.min_length:
        raise UsageError(
            f"--max-length={config.max_length} is smaller than --min-length={config.min_length}"
        )
    if not 0 < config.critical_max_fraction <= 0.5:  # also false for nan
        raise UsageError(
            f"--critical-max-fraction must lie in (0, 0.5], got {config.critical_max_fraction}"
        )
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", config.device):
        raise UsageError(f"--device={config.device!r}: expected cpu, cuda or cuda:N")
    if not config.model.strip():
        raise UsageError("--model is empty")


def validate_against(config: RunConfig, max_length: int, context: int, model: str) -> None:
    """Checks against the model: L within its context, every N below the row lengths used."""
    if max_length > context:
        raise UsageError(
            f"L={max_length} is beyond the context of {model} ({context} tokens): "
            f"pass --max-length {context} or less"
        )
    if max_length < config.min_length:
        raise UsageError(
            f"L_max={max_length} is below --min-length={config.min_length}: lower --min-length"
        )
    small = config.min_length
    # Rows for length L attend to L/2+1 … L keys, so N must stay at or below L/2.
    checks = [(config.topn, small // 2, "--topn", f"the smallest L={small}")]
    checks += [(n, max_length // 2, "--topn-list", f"L={max_length}") for n in config.topn_list]
    checks.append(
        (config.separability_max_n, max_length // 2, "--separability-max-n", f"L={max_length}")
    )
    needs = {
        "--topn": ("distance_vs_length",),
        "--topn-list": ("distance_vs_topn",),
        "--separability-max-n": ("separability",),
    }
    for n, limit, flag, where in checks:
        if n > limit and set(needs[flag]) & set(config.experiments):
            raise UsageError(
                f"N={n} ({flag}) is too large for {where}: rows of length L/2+1 … L need "
                f"N ≤ L/2 = {limit} (N ≥ L leaves nothing unselected); lower {flag} or raise "
                "--max-length/--min-length"
            )


def _positive(value: int, flag: str) -> None:
    if value < 1:
        raise UsageError(f"{flag} must be a positive integer, got {value}")


def numeric_settings(config: RunConfig) -> dict:
    """The fields that change numbers, for checkpoint fingerprints."""
    data = dataclasses.asdict(config)
    for name in NON_NUMERIC_FIELDS:
        data.pop(name, None)
    data.pop("experiments", None)
    return data
