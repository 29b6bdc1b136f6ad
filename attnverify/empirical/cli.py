"""``attnverify empirical``: argparse wiring for the model check (docs/INTERFACES.md).

The main CLI calls :func:`add_parser` with its subparsers and :func:`run` with the parsed
arguments; ``python -m attnverify.empirical`` does the same on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from attnverify.empirical import config as cfg
from attnverify.empirical.config import HEAVY_KEYS
from attnverify.errors import UsageError

HELP = "run paper A's five experiments and paper B's rank-collapse check on a causal LM"
DESCRIPTION = (
    "Reproduce the papers' experiments on a Hugging Face causal LM: distance vs length (Alg. 1), "
    "distance vs top-N (Alg. 2), critical top-N (Alg. 3), separability (Alg. 4), gradient "
    "sensitivity (Alg. 5) and rank collapse (paper B). Writes results.json, report.md and PNG "
    "figures into --out. Exit 0 when the run completes, 2 for bad input."
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``empirical`` subcommand to an argparse subparsers object and return it."""
    parser = subparsers.add_parser("empirical", help=HELP, description=DESCRIPTION)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    main = parser.add_argument_group("run")
    main.add_argument("--model", required=True,
                      help="gpt2 (or any hub id, from the local cache), a local model directory, "
                           "gpt2-random, tiny-gpt2-random or smollm2-135m")
    main.add_argument("--text", type=Path, default=None,
                      help="UTF-8 text file, plain or .xz/.gz (default: the excerpt of War and "
                           "Peace shipped with attnverify, Books One and Two, public domain)")
    main.add_argument("--experiments", default="all",
                      help=f"'all' or a comma-separated list of: {', '.join(cfg.EXPERIMENTS)}")
    main.add_argument("--normalizers", default="",
                      help="normalizers to apply to the model's own logits, side by side with "
                           "its softmax (built-in ids, module:attr, file.py:attr)")
    main.add_argument("--device", default="cpu", help="cpu or cuda")
    main.add_argument("--out", type=Path, default=None,
                      help="output directory (default: empirical-MODEL)")
    main.add_argument("--resume", action="store_true",
                      help="reuse finished experiments' checkpoints in --out")
    main.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    main.add_argument("--quick", action="store_true",
                      help="small settings for a smoke test (L ≤ 128, fewer rows and draws)")
    main.add_argument("--threads", type=int, default=None,
                      help="torch CPU threads (default 1: the tensors are small, and extra "
                           "threads spin-wait on a shared machine)")
    main.add_argument("--no-progress", action="store_true", help="no progress bars")
    main.add_argument("--allow-download", action="store_true",
                      help="let a hub id download when it is not in the local cache")
    _add_sizes(parser.add_argument_group("sizes (defaults follow paper A)"))


def default(name: str):
    """A :class:`RunConfig` default, so help texts cannot drift from the code."""
    field = cfg.RunConfig.__dataclass_fields__[name]
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _listed(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _add_sizes(group) -> None:
    group.add_argument("--max-length", type=int, default=None,
                       help="largest L (default: min(1024, the model's context))")
    group.add_argument("--min-length", type=int, default=None,
                       help=f"smallest L (default {default('min_length')})")
    group.add_argument("--windows", type=int, default=None,
                       help=f"text windows, one forward pass each (default {default('windows')})")
    group.add_argument("--rows-per-length", type=int, default=None,
                       help="query rows (tokens) per length and window (default "
                            f"{default('rows_per_length')})")
    group.add_argument("--topn", type=int, default=None,
                       help=f"N of Alg. 1 (default {default('topn')})")
    group.add_argument("--topn-list", default=None,
                       help=f"N values of Alg. 2 (default {_listed(default('topn_list'))})")
    group.add_argument("--separability-max-n", type=int, default=None,
                       help=f"largest N of Alg. 4 (default {default('separability_max_n')})")
    group.add_argument("--critical-max-fraction", type=float, default=None,
                       help="Alg. 3 scans N up to this fraction of L (default "
                            f"{default('critical_max_fraction')})")
    group.add_argument("--mc-draws", type=int, default=None,
                       help=f"Monte-Carlo draws for E in Alg. 1-2, each over the {2**HEAVY_KEYS} "
                            f"inclusion patterns of the {HEAVY_KEYS} heaviest keys (default "
                            f"{default('mc_draws')})")
    group.add_argument("--critical-draws", type=int, default=None,
                       help=f"Monte-Carlo draws for E in Alg. 3 (default "
                            f"{default('critical_draws')})")
    group.add_argument("--epsilons", default=None,
                       help=f"ε values of Alg. 5 (default {_listed(default('epsilons'))})")
    group.add_argument("--temperature-points", type=int, default=None,
                       help="points of the log-T grid 1e-3 … 10 in Alg. 5 (default "
                            f"{len(default('temperatures'))})")
    group.add_argument("--collapse-depth", type=int, default=None,
                       help=f"layers of paper B's stacks (default {default('collapse_depth')})")
    group.add_argument("--collapse-lambdas", default=None,
                       help=f"daGPAM λ values (default {_listed(default('collapse_lambdas'))})")
    group.add_argument("--collapse-seeds", type=int, default=None,
                       help=f"seeds per stack (default {default('collapse_seeds')})")


def config_from_args(args: argparse.Namespace) -> cfg.RunConfig:
    """Build the run's settings: defaults, then ``--quick``, then explicit flags."""
    config = cfg.RunConfig(
        model=args.model,
        text=args.text,
        experiments=cfg.parse_experiments(args.experiments),
        normalizers=_parse_normalizers(args.normalizers),
        device=args.device,
        out=args.out or Path(f"empirical-{Path(args.model).name}"),
        resume=args.resume,
        seed=args.seed,
        progress=not args.no_progress,
        allow_download=args.allow_download,
        threads=args.threads,
    )
    if args.quick:
        config = config.replace(**cfg.QUICK)
    return config.replace(**_explicit(args))


def _explicit(args: argparse.Namespace) -> dict:
    plain = ("max_length", "min_length", "windows", "rows_per_length", "topn",
             "separability_max_n", "critical_max_fraction", "mc_draws", "critical_draws",
             "collapse_depth", "collapse_seeds")
    out = {name: getattr(args, name) for name in plain if getattr(args, name) is not None}
    if args.topn_list is not None:
        out["topn_list"] = cfg.parse_int_list(args.topn_list, "--topn-list")
    if args.epsilons is not None:
        out["epsilons"] = cfg.parse_float_list(args.epsilons, "--epsilons")
    if args.collapse_lambdas is not None:
        out["collapse_lambdas"] = cfg.parse_float_list(args.collapse_lambdas, "--collapse-lambdas")
    if args.temperature_points is not None:
        if args.temperature_points < 2:
            raise UsageError("--temperature-points must be at least 2")
        out["temperatures"] = cfg.log_grid(1e-3, 10.0, args.temperature_points)
    return out


def run(args: argparse.Namespace) -> int:
    """Execute ``attnverify empirical``; bad input raises :class:`UsageError` (exit 2)."""
    from attnverify.empirical.pipeline import run as run_pipeline

    config = config_from_args(args)
    document = run_pipeline(config)
    _summary(document, config.out)
    return 0


def _summary(document: dict, out: Path) -> None:
    rows = [r for r in document.get("paper_comparison", []) if r["agrees"] is not None]
    agree = sum(1 for r in rows if r["agrees"])
    meta = document.get("model")
    who = f"{meta['name']}, {meta['weights']} weights" if meta else "attention stacks"
    print(f"attnverify empirical: {who}: {len(document['experiments'])} experiment(s) done; "
          f"{agree} of {len(rows)} paper claims agree; wrote {out}/results.json, "
          f"{out}/report.md and {len(document.get('figures', {}))} figure(s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnverify.empirical",
                                     description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        print(f"attnverify empirical: error: {exc}", file=sys.stderr)
        return 2


def _parse_normalizers(text):
    """Resolved lazily: the normalizers (and torch) load only when a run starts."""
    from attnverify.empirical.targets import parse_normalizers

    return parse_normalizers(text)
