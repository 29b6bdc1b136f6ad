"""``attnverify empirical``: argparse wiring for the model check (docs/INTERFACES.md).

The main CLI calls :func:`add_parser` with its subparsers and :func:`run` with the parsed
arguments; ``python -m attnverify.empirical`` does the same on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from pathlib import Path

from attnverify.empirical import config as cfg
from attnverify.empirical.config import HEAVY_KEYS
from attnverify.errors import (
    UsageError,
    interrupt_exit_code,
    interrupt_word,
    terminating_as_interrupt,
)

HELP = "run paper A's five experiments and paper B's rank-collapse check on a causal LM"
DESCRIPTION = (
    "Reproduce the papers' experiments on a Hugging Face causal LM: distance vs length (Alg. 1), "
    "distance vs top-N (Alg. 2), critical top-N (Alg. 3), separability (Alg. 4), gradient "
    "sensitivity (Alg. 5) and rank collapse (paper B). Writes results.json, report.md and PNG "
    "figures into --out. Exit 0 when the run completes, 1 when a --normalizers target failed "
    "(raised, even SystemExit, ran past --timeout or gave no weights: its columns are left "
    "out, the rest is written), 2 for bad input, 130 on Ctrl-C (finished experiments stay "
    "checkpointed)."
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
    main.add_argument("--timeout", type=float, default=None,
                      help="seconds one call of a --normalizers target may take before it is "
                           f"reported as failed (default {default('timeout'):g}; 0: no limit)")
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
    group.add_argument("--embeddings", default=None,
                       help="what x_i is: value (the head's value vectors, default: what the "
                            "weights average), hidden (the layer's normalised input hidden "
                            "states) or input (the token embeddings); a comma-separated list "
                            "reruns the x-dependent experiments for every further choice")
    group.add_argument("--selectivity-temperatures", default=None,
                       help="T values of the temperature-vs-selectivity measurement (default "
                            f"{_listed(default('selectivity_temperatures'))})")
    group.add_argument("--coverage-n", type=int, default=None,
                       help=f"N of the multi-head coverage measurement (default "
                            f"{default('coverage_n')})")
    group.add_argument("--training-steps", type=int, default=None,
                       help=f"steps of paper B's training run (default "
                            f"{default('training_steps')})")
    group.add_argument("--training-layers", type=int, default=None,
                       help=f"layers of paper B's training run (default "
                            f"{default('training_layers')})")


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
             "collapse_depth", "collapse_seeds", "timeout")
    out = {name: getattr(args, name) for name in plain if getattr(args, name) is not None}
    if args.topn_list is not None:
        out["topn_list"] = cfg.parse_int_list(args.topn_list, "--topn-list")
    if args.epsilons is not None:
        out["epsilons"] = cfg.parse_float_list(args.epsilons, "--epsilons")
    if args.collapse_lambdas is not None:
        out["collapse_lambdas"] = cfg.parse_float_list(args.collapse_lambdas, "--collapse-lambdas")
    if args.temperature_points is not None:
        out["temperatures"] = cfg.parse_temperature_points(args.temperature_points)
    if args.embeddings is not None:
        out["embeddings"], out["embedding_variants"] = cfg.parse_embeddings(args.embeddings)
    if args.selectivity_temperatures is not None:
        out["selectivity_temperatures"] = cfg.parse_float_list(args.selectivity_temperatures,
                                                               "--selectivity-temperatures")
    for name in ("coverage_n", "training_steps", "training_layers"):  # checked in config
        if getattr(args, name) is not None:
            out[name] = getattr(args, name)
    return out


def run(args: argparse.Namespace) -> int:
    """Execute ``attnverify empirical``; bad input raises :class:`UsageError` (exit 2).

    Every option is checked, the packages the run needs are imported and ``--out`` is made
    before the model loads. Ctrl-C returns 130 (SIGTERM 143) with the finished experiments'
    checkpoints kept.
    """
    config = config_from_args(args)
    cfg.validate_settings(config)
    _require_packages(config)
    out = Path(config.out)
    created = _prepare_out(out)
    from attnverify.empirical.pipeline import run as run_pipeline  # dispatch: imports torch

    try:
        document = run_pipeline(config)
    except KeyboardInterrupt as exc:  # Ctrl-C, or a terminating signal (Terminated)
        print(f"attnverify empirical: {interrupt_word(exc)}; finished experiments are kept in "
              f"{out / 'checkpoints'} (run again with --resume to reuse them)", file=sys.stderr)
        return interrupt_exit_code(exc)
    except UsageError:
        _remove_empty(out, created)
        raise
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        raise UsageError(f"out of memory ({_first_line(exc)}): lower the sizes asked for "
                         "(--windows, --rows-per-length, --max-length, --mc-draws, …); finished "
                         f"experiments are kept in {out / 'checkpoints'}") from None
    _summary(document, config.out)
    for failure in document.get("failed_normalizers", []):
        print(f"attnverify empirical: normalizer {failure['id']!r} failed in "
              f"{failure['reason']}; its columns are left out", file=sys.stderr)
    return 1 if document.get("failed_normalizers") else 0


def _out_of_memory(exc: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError, or the CPU allocator's refusal."""
    text = str(exc)
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or \
        "can't allocate memory" in text or "out of memory" in text.lower()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def _require_packages(config: cfg.RunConfig) -> None:
    """Import what the run needs now, so a missing package is one line, not a traceback later
    (matplotlib is optional: without it the run writes no figures)."""
    needed = ["tqdm.auto"]
    if set(config.experiments) & set(cfg.PAPER_A_EXPERIMENTS):
        needed.append("transformers")
    for name in needed:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(f"the model check needs {name.split('.')[0]} ({exc}): "
                             "pip install 'attnverify[models,plots]'") from None


def _prepare_out(out: Path) -> Path | None:
    """Check ``--out`` and create it; returns the top-most folder created (None if it existed).

    ``--out`` must be a directory or a path that can be made one, and the files the run writes
    there must not be directories: checked before the model loads, not after the run.
    """
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise UsageError(f"--out {str(out)!r} exists and is not a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise UsageError(f"--out {str(out)!r} is not writable")
        for name in ("results.json", "report.md"):
            if (out / name).is_dir():
                raise UsageError(f"--out {str(out)!r}: {name} there is a directory")
        checkpoints = out / "checkpoints"
        if (checkpoints.exists() or checkpoints.is_symlink()) and not checkpoints.is_dir():
            raise UsageError(f"--out {str(out)!r}: checkpoints there is not a directory")
        return None
    top = out
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    try:
        out.mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"--out {str(out)!r} cannot be created: {exc.strerror or exc}") from None
    return top


def _remove_empty(out: Path, created: Path | None) -> None:
    """Remove the folders :func:`_prepare_out` made, when the run stopped before writing."""
    if created is None:
        return
    folder = out
    while True:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == created:
            return
        folder = folder.parent


def _summary(document: dict, out: Path) -> None:
    rows = [r for r in document.get("paper_comparison", []) if r["agrees"] is not None]
    agree = sum(1 for r in rows if r["agrees"])
    meta = document.get("model")
    who = f"{meta['name']}, {meta['weights']} weights" if meta else "attention stacks"
    print(f"attnverify empirical: {who}: {len(document['experiments'])} experiment(s) done; "
          f"{agree} of {len(rows)} paper claims agree; wrote {out}/results.json, "
          f"{out}/report.md and {len(document.get('figures', {}))} figure(s)")


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors raised as :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(f"{message} (see '{self.prog} --help')")


def main(argv: list[str] | None = None) -> int:
    """``python -m attnverify.empirical``: exit 0 done, 2 bad input, 130 interrupted (143
    terminated)."""
    try:
        with terminating_as_interrupt():
            parser = _Parser(prog="python -m attnverify.empirical", description=DESCRIPTION)
            add_arguments(parser)
            return run(parser.parse_args(argv))
    except UsageError as exc:
        print(f"attnverify empirical: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"attnverify empirical: {interrupt_word(exc)}", file=sys.stderr)
        return interrupt_exit_code(exc)


def _parse_normalizers(text):
    """Resolved lazily: the normalizers (and torch) load only when a run starts."""
    from attnverify.empirical.targets import parse_normalizers  # dispatch: imports torch

    if text and text.strip() and not any(item.strip() for item in text.split(",")):
        raise UsageError(f"--normalizers={text!r} names no normalizer")
    return parse_normalizers(text)
