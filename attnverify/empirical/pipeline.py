"""One ``attnverify empirical`` run: checkpoints, model, extraction, experiments, outputs.

Each experiment's result is checkpointed (atomically) as soon as it finishes; ``--resume``
reuses every checkpoint whose fingerprint matches the run, so an interrupted run redoes nothing
that finished. ``results.json``, ``report.md`` and the figures are rebuilt from the results.
"""

from __future__ import annotations

import os
import platform
import resource
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import attnverify
from attnverify.empirical import config as cfg
from attnverify.empirical import models, targets
from attnverify.empirical.comparison import paper_comparison
from attnverify.empirical.experiments import NEEDS_MODEL, RUNNERS, Context
from attnverify.empirical.extraction import extract
from attnverify.empirical.figures import write_figures
from attnverify.empirical.report import write_report
from attnverify.empirical.store import CheckpointStore, fingerprint, write_json_atomic
from attnverify.empirical.text import Text, load_text, resolve_text_path, token_windows
from attnverify.errors import UsageError

MODEL_CHECKPOINT = "_model"
DEFAULT_LENGTH = 1024


def run(config: cfg.RunConfig) -> dict:
    """Run (or resume) every requested experiment and write the outputs; returns the document."""
    cfg.validate_settings(config)
    _check_device(config.device)
    weightings = targets.resolve(config.normalizers, config.timeout)
    needs_model = [e for e in config.experiments if e in NEEDS_MODEL]
    text = load_text(resolve_text_path(config.text)) if needs_model else None
    store = CheckpointStore(Path(config.out))
    prints = {e: _fingerprint(config, e, text) for e in config.experiments}
    results = _resumed(config, store, prints)
    failed = _failures(results)
    pending = [e for e in config.experiments if e not in results]
    working = [w for w in weightings if w.id not in failed]
    variant_prints = {e: _variant_fingerprint(config, e, text) for e in _variant_names(config)}
    variants = {e: store.load(f"embeddings_{e}", p) if config.resume else None
                for e, p in variant_prints.items()}
    todo = [e for e, found in variants.items() if found is None]
    with _numerics(config):
        meta, ctx = _prepare(config, store, text, working, needs_model, pending, bool(todo))
        for name in pending:
            results[name] = _run_one(name, ctx, store, prints[name], failed)
        for e in todo:
            variants[e] = _run_variant(e, ctx, store, variant_prints[e])
    return _finish(config, meta, results, text, weightings, failed, variants)


#: Experiments whose numbers depend on what x_i is; rerun for each other ``--embeddings`` choice.
#: ``convergence`` is left out: N up to L − 1 on d_model-dimensional hidden states or token
#: embeddings (9× the width of SmolLM2's value vectors) costs more than all the others together.
EMBEDDING_EXPERIMENTS = ("distance_vs_length", "distance_vs_topn", "separability",
                         "temperature", "coverage")


def _variant_names(config: cfg.RunConfig) -> tuple[str, ...]:
    if not any(e in EMBEDDING_EXPERIMENTS for e in config.experiments):
        return ()
    return config.embedding_variants


def _variant_fingerprint(config: cfg.RunConfig, embeddings: str, text: Text | None) -> str:
    return fingerprint({"experiment": f"embeddings:{embeddings}",
                        **cfg.numeric_settings(config),
                        "text_sha256": text.sha256 if text else None})


def _run_variant(embeddings: str, ctx: Context, store: CheckpointStore, print_: str) -> dict:
    """The x-dependent experiments again with x_i = ``embeddings``, the model's softmax only,
    and their comparison rows: how the verdicts move with the choice."""

    start = time.perf_counter()
    sub = Context(ctx.config.replace(embeddings=embeddings),
                  ctx.extraction.with_embeddings(embeddings), [targets.model_weighting()],
                  ctx.lengths, ctx.progress)
    runs = {name: RUNNERS[name](sub) for name in EMBEDDING_EXPERIMENTS
            if name in ctx.config.experiments}
    result = {"embeddings": embeddings, "experiments": runs}
    result["paper_comparison"] = paper_comparison(result)
    result["seconds"] = time.perf_counter() - start
    store.save(f"embeddings_{embeddings}", print_, result)
    return result


def _failures(results: dict) -> dict[str, str]:
    """Normalizers that failed in an earlier (resumed) experiment: ``{id: reason}``."""
    failed: dict[str, str] = {}
    for result in results.values():
        found = result.get("failed_normalizers")
        if isinstance(found, dict):
            failed.update({str(k): str(v) for k, v in found.items()})
    return failed


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: CUDA is not available here; use --device cpu")


def _fingerprint(config: cfg.RunConfig, experiment: str, text: Text | None) -> str:
    settings = {"experiment": experiment, **cfg.numeric_settings(config)}
    if experiment in NEEDS_MODEL:
        settings["text_sha256"] = text.sha256 if text else None
    else:
        for key in ("model", "normalizers", "text"):
            settings.pop(key, None)
    return fingerprint(settings)


def _resumed(config: cfg.RunConfig, store: CheckpointStore, prints: dict) -> dict:
    if not config.resume:
        return {}
    found = {e: store.load(e, prints[e]) for e in config.experiments}
    return {e: r for e, r in found.items() if r is not None}


#: CPU threads when ``--threads`` is not given. One thread measured fastest on the 2-core
#: development machine (62 s against 158 s for the five algorithms on gpt2-random): the
#: per-head tensors are small, and a second OpenMP thread spin-waits whenever another process
#: holds the other core.
DEFAULT_THREADS = 1


@contextmanager
def _numerics(config: cfg.RunConfig):
    """Flush denormals (softmax at T = 1e-3 underflows; denormal arithmetic is ~100× slower)
    and set the CPU threads; both restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_flush_denormal(True)
    torch.set_num_threads(config.threads or DEFAULT_THREADS)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _prepare(config, store, text, weightings, needs_model, pending, variants=False):
    """Model metadata (from a checkpoint when nothing needs the model) and the context;
    ``variants``: other ``--embeddings`` choices still to run (they need the extraction)."""
    model_print = fingerprint({"model": config.model, "seed": config.seed,
                               "max_length": config.max_length, "windows": config.windows,
                               "text": text.sha256 if text else None})
    meta = store.load(MODEL_CHECKPOINT, model_print) if config.resume else None
    lengths = cfg.lengths(config, config.max_length or DEFAULT_LENGTH)
    if not variants and not any(e in NEEDS_MODEL for e in pending) and (meta or not needs_model):
        return meta, Context(config, None, weightings, lengths, _bar_factory(config))
    meta, extraction, lengths = _extract(config, text)
    store.save(MODEL_CHECKPOINT, model_print, meta)
    return meta, Context(config, extraction, weightings, lengths, _bar_factory(config))


def _extract(config: cfg.RunConfig, text: Text):
    t0 = time.perf_counter()
    with _quiet_loading(not config.progress):
        loaded = models.load_model(config.model, config.seed, config.allow_download)
    loaded.model.to(config.device)
    t1 = time.perf_counter()
    max_length = config.max_length or min(DEFAULT_LENGTH, loaded.context)
    cfg.validate_against(config, max_length, loaded.context, config.model)
    windows = token_windows(text, loaded.tokenize, max_length, config.windows)
    bar = _bar_factory(config)("forward passes", len(windows))
    extraction = extract(loaded, windows, config.device, bar,
                         embeddings=(config.embeddings, *_variant_names(config)))
    bar.close()
    t2 = time.perf_counter()
    meta = _model_meta(loaded, max_length, config, t1 - t0, t2 - t1)
    del loaded
    return meta, extraction, cfg.lengths(config, max_length)


@contextmanager
def _quiet_loading(quiet: bool):
    """``--no-progress`` silences transformers' own bars too: its logging bars, and every plain
    tqdm bar made while the model loads (GGUF de-quantisation makes one). tqdm reads
    ``TQDM_DISABLE`` once, when it is imported (before any load here), so the variable alone
    (kept for subprocesses) silences nothing: :func:`_tqdm_disabled` does."""
    if not quiet:
        yield
        return
    from transformers.utils import logging as hf_logging  # optional dependency (models extra)

    before = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    hf_logging.disable_progress_bar()
    try:
        with _tqdm_disabled():
            yield
    finally:
        hf_logging.enable_progress_bar()
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


@contextmanager
def _tqdm_disabled():
    """Every tqdm bar created inside is disabled (tqdm's own class and each subclass that
    initialises through it: ``tqdm.auto``, ``tqdm.asyncio``); restored on the way out."""
    from tqdm import std  # optional dependency (the models extra), loaded on a model load

    original = std.tqdm.__dict__["__init__"]

    def quiet(self, *args, **kwargs):
        kwargs["disable"] = True
        return original.__get__(self, type(self))(*args, **kwargs)

    std.tqdm.__init__ = quiet
    try:
        yield
    finally:
        std.tqdm.__init__ = original


def _model_meta(loaded, max_length, config, load_s, extract_s) -> dict:
    return {
        "name": loaded.name, "description": loaded.description, "weights": loaded.weights,
        "pretrained": loaded.pretrained, "source": loaded.source,
        "tokenizer": loaded.tokenizer_name, "layers": loaded.n_layers,
        "heads_per_layer": loaded.n_heads, "kv_heads_per_layer": loaded.n_kv_heads,
        "head_dim": loaded.head_dim, "context": loaded.context, "parameters": loaded.n_params,
        "max_length": max_length, "windows": config.windows,
        "seconds": {"load": load_s, "extract": extract_s},
    }


def _run_one(name: str, ctx: Context, store: CheckpointStore, print_: str, failed: dict) -> dict:
    """Run one experiment; a normalizer that fails is recorded in ``failed``, dropped for the
    rest of the run, and the experiment is run again without it."""
    start = time.perf_counter()
    while True:
        try:
            result = RUNNERS[name](ctx)
            break
        except targets.NormalizerFailure as exc:
            failed[exc.normalizer] = f"{name}: {exc.reason}"
            ctx.weightings = [w for w in ctx.weightings if w.id != exc.normalizer]
    if failed:
        result["failed_normalizers"] = dict(failed)
    result["seconds"] = time.perf_counter() - start
    store.save(name, print_, result)
    return result


def _bar_factory(config: cfg.RunConfig):
    def make(desc: str, total: int):
        from tqdm.auto import tqdm  # optional dependency (models extra)

        return tqdm(total=total, desc=desc, file=sys.stderr, disable=not config.progress,
                    leave=False, dynamic_ncols=True)

    return make


def _finish(config, meta, results, text, weightings, failed, variants=None) -> dict:
    out = Path(config.out)
    document = {
        "schema_version": 1,
        "kind": "attnverify-empirical",
        "model": meta,
        "text": _text_meta(text),
        "settings": cfg.numeric_settings(config),
        "normalizers": [{"id": w.id, "space": w.space, "source": w.source}
                        for w in weightings if w.id not in failed],
        "failed_normalizers": [{"id": k, "reason": v} for k, v in failed.items()],
        "environment": _environment(config),
        "experiments": {e: _without(results[e], failed) for e in config.experiments
                        if e in results},
    }
    document["command"] = command_line(config)
    document["paper_comparison"] = paper_comparison(document)
    if variants:
        document["embedding_variants"] = variants
    document["figures"] = write_figures(document, out)
    write_json_atomic(out / "results.json", document)
    write_report(document, out / "report.md")
    return document


#: Settings with no command-line flag of their own (a run that changes them in code says so).
_NO_FLAG = ("collapse_width", "collapse_tokens", "collapse_pairs", "training_lambdas")


def command_line(config: cfg.RunConfig) -> str:
    """A command that reproduces the run's numbers: every setting that differs from its
    default, as its flag (``python -m attnverify.empirical`` takes the same flags)."""

    base = cfg.RunConfig(model=config.model)
    parts = ["python", "-m", "attnverify.empirical", "--model", config.model]
    notes: list[str] = []
    if config.text is not None:
        parts += ["--text", str(config.text)]
    if config.experiments != base.experiments:
        parts += ["--experiments", ",".join(config.experiments)]
    if config.normalizers:
        parts += ["--normalizers", ",".join(config.normalizers)]
    if (config.embeddings, config.embedding_variants) != (base.embeddings,
                                                          base.embedding_variants):
        parts += ["--embeddings", ",".join((config.embeddings, *config.embedding_variants))]
    for name in cfg.numeric_settings(config):
        value, default = getattr(config, name), getattr(base, name)
        if name in ("model", "normalizers", "embeddings", "embedding_variants") or \
                value == default or value is None:
            continue
        if name == "temperatures" and value == cfg.log_grid(1e-3, 10.0, len(value)):
            parts += ["--temperature-points", str(len(value))]
        elif name == "temperatures" or name in _NO_FLAG:
            notes.append(f"{name}={value!r} (no flag)")
        else:
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) \
                if isinstance(value, tuple) else str(value)
            parts += [f"--{name.replace('_', '-')}", shown]
    parts += ["--out", str(config.out)]
    # settings with no flag go in a trailing shell comment, not into the arguments
    return shlex.join(parts) + (f"  # {'; '.join(notes)}" if notes else "")


def _without(result: dict, failed: dict) -> dict:
    """A result without the columns of normalizers that failed somewhere in the run."""
    columns = result.get("normalizers")
    if not failed or not isinstance(columns, dict):
        return result
    return {**result, "normalizers": {k: v for k, v in columns.items() if k not in failed}}


def _text_meta(text: Text | None) -> dict | None:
    if text is None:
        return None
    return {"path": _display_path(text.path), "sha256": text.sha256,
            "first_line": text.first_line, "characters": len(text.prose)}


def _display_path(path: Path) -> str:
    """The text's path relative to the working directory when that is shorter."""
    try:
        rel = os.path.relpath(Path(path).resolve())
    except ValueError:  # another drive (Windows)
        return str(path)
    return rel if len(rel) < len(str(path.resolve())) else str(path.resolve())


def _environment(config) -> dict:
    try:
        import transformers  # optional dependency (models extra)

        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover - the model check needs it anyway
        tf_version = None
    return {
        "attnverify_version": getattr(attnverify, "__version__", "unknown"),
        "torch_version": torch.__version__, "transformers_version": tf_version,
        "python": platform.python_version(), "machine": platform.machine(),
        "cpu_threads": config.threads or DEFAULT_THREADS, "device": config.device,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
