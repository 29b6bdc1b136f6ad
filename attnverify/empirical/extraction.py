"""One forward pass per window, capturing every head's queries, keys and values.

The capture is an attention function registered with transformers' ``AttentionInterface``: it
records ``q``, ``k``, ``v`` (after RoPE, if any) and the scale, then runs the model's own eager
attention, so the forward pass is the model's. Keys and values of grouped-query attention are
mapped to query heads the way the model does (``repeat_kv``: query head ``h`` reads key/value head
``h // (H_q / H_kv)``). Logits and weights are recomputed from the record on demand —
``logits = scale · q kᵀ`` with ``-inf`` on masked keys — instead of storing 144 × L × L floats.

What x_i is (``--embeddings``) [choice, docs/THEORY.md §8 says "token embeddings"]: ``value`` — the
head's value vectors, what the weights actually average (the default: s = Σ α_i x_i is then the
head's own output before W_O); ``hidden`` — the layer's normalised input hidden states (the
input of the attention block after its LayerNorm/RMSNorm, shared by the layer's heads, recorded
by a forward pre-hook); ``input`` — the model's token embeddings (the input embedding table's
rows, shared by every head). Theorem 2 projects them onto the sphere; Theorem 1 uses them as
they are.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnverify.errors import UsageError

CAPTURE_NAME = "attnverify_capture"
EMBEDDINGS = ("value", "hidden", "input")
_STATE = threading.local()
_REGISTERED = False


@dataclass
class Extraction:
    """Queries, keys and values of every head in every window.

    Shapes: ``q``, ``k``, ``v`` are ``[window, head, position, d_head]`` with heads flattened
    layer-major (head ``b`` is layer ``b // n_heads``, head ``b % n_heads``); ``scale`` is
    ``[head]``. Key/value heads are already mapped to query heads. The mask is causal (checked
    against the model's own mask during capture).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: torch.Tensor
    n_layers: int
    n_heads: int
    hidden: torch.Tensor | None = None  # [window, layer, position, d_model]
    inputs: torch.Tensor | None = None  # [window, 1, position, d_model]
    embeddings: str = "value"

    def with_embeddings(self, embeddings: str) -> Extraction:
        """The same record with x_i read as ``embeddings`` (``value``, ``hidden``, ``input``)."""
        if embeddings not in EMBEDDINGS:
            raise UsageError(
                f"--embeddings {embeddings!r}: expected one of {', '.join(EMBEDDINGS)}"
            )
        if {"hidden": self.hidden, "input": self.inputs}.get(embeddings, self.v) is None:
            raise UsageError(f"--embeddings {embeddings}: not captured in this extraction")
        return dataclasses.replace(self, embeddings=embeddings)

    @property
    def n_windows(self) -> int:
        return self.q.shape[0]

    @property
    def length(self) -> int:
        return self.q.shape[2]

    @property
    def n_total_heads(self) -> int:
        return self.q.shape[1]

    def head_label(self, b: int) -> str:
        return f"L{b // self.n_heads}H{b % self.n_heads}"

    def row_logits(self, rows: torch.Tensor, keys: int, dtype=torch.float32) -> torch.Tensor:
        """Logits of query positions ``rows`` over the first ``keys`` keys.

        Returns ``[window · head, row, key]`` (windows outer), ``-inf`` where key > row.
        """
        q = self.q[:, :, rows].to(dtype)
        k = self.k[:, :, :keys].to(dtype)
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.scale.to(dtype)[None, :, None, None]
        mask = torch.arange(keys, device=rows.device)[None, :] > rows[:, None]
        logits = logits.masked_fill(mask, float("-inf"))
        return logits.reshape(-1, len(rows), keys)

    def values(self, keys: int, dtype=torch.float32):
        """x_i of the first ``keys`` positions, ``[window · head, key, d]``: the value vectors,
        or (``hidden``/``input``) a :class:`SharedRows` view that maps each head to its layer's
        vectors without copying them once per head."""
        if self.embeddings == "value":
            v = self.v[:, :, :keys].to(dtype)
            return v.reshape(-1, keys, v.shape[-1])
        base = self.hidden if self.embeddings == "hidden" else self.inputs
        per_group = self.n_heads if base.shape[1] > 1 else self.n_total_heads
        return SharedRows(base[:, :, :keys].to(dtype), per_group, self.n_total_heads)

    def layer_logits(self, window: int, layer: int) -> torch.Tensor:
        """Full ``[head, query, key]`` logits of one layer (``-inf`` above the diagonal)."""
        sl = slice(layer * self.n_heads, (layer + 1) * self.n_heads)
        q, k = self.q[window, sl], self.k[window, sl]
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.scale[sl, None, None]
        n = q.shape[1]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        return logits.masked_fill(mask, float("-inf"))

    def layer_attention(self, window: int, layer: int) -> torch.Tensor:
        """The model's attention weights ``[head, query, key]`` (softmax of the logits)."""
        return torch.softmax(self.layer_logits(window, layer), dim=-1)


class SharedRows:
    """``[window · head, key, d]`` rows read from ``base [window, group, key, d]``: head ``h``
    reads group ``h // per_group`` (a layer, or the single group of token embeddings). Only
    slices along the first axis are materialised, so per-layer vectors are never copied once
    per head."""

    def __init__(self, base: torch.Tensor, per_group: int, heads: int):
        self.base, self.per_group, self.heads = base, per_group, heads

    @property
    def shape(self) -> torch.Size:
        w, _, n, d = self.base.shape
        return torch.Size((w * self.heads, n, d))

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    @property
    def device(self) -> torch.device:
        return self.base.device

    def groups(self, sl: slice) -> tuple[torch.Tensor, torch.Tensor]:
        b = torch.arange(sl.start or 0, sl.stop if sl.stop is not None else self.shape[0],
                         device=self.base.device)
        return b // self.heads, (b % self.heads) // self.per_group

    def __getitem__(self, sl: slice) -> torch.Tensor:
        if not isinstance(sl, slice):
            raise TypeError("SharedRows supports slices of the first axis only")
        window, group = self.groups(sl)
        return self.base[window, group]

    def map(self, fn) -> SharedRows:
        """``fn`` applied to every stored vector (e.g. the projection onto the sphere)."""
        return SharedRows(fn(self.base), self.per_group, self.heads)


def extract(loaded, windows: list[list[int]], device: str = "cpu", progress=None,
            embeddings: tuple[str, ...] = ("value",)) -> Extraction:
    """Run one forward pass per window and return every head's q, k, v (and the layers'
    normalised input hidden states and the token embeddings when ``embeddings`` asks)."""
    model = loaded.model
    _install(model)
    base = model.base_model
    records, hidden, inputs = [], [], []
    hooks = _hidden_hooks(model) if "hidden" in embeddings else []
    try:
        for ids in windows:
            tokens = torch.tensor([ids], dtype=torch.long, device=device)
            with _capturing() as layers, torch.inference_mode():
                base(input_ids=tokens, use_cache=False)
                if "input" in embeddings:
                    inputs.append(model.get_input_embeddings()(tokens)[0].float()[None])
            records.append(_stack(layers, loaded))
            if hooks:
                hidden.append(torch.stack([rec[4] for rec in layers]))
            if progress is not None:
                progress.update(1)
    finally:
        for hook in hooks:
            hook.remove()
    q, k, v = (torch.stack([r[i] for r in records]) for i in range(3))
    return Extraction(q=q, k=k, v=v, scale=records[0][3], n_layers=loaded.n_layers,
                      n_heads=loaded.n_heads,
                      hidden=torch.stack(hidden) if hidden else None,
                      inputs=torch.stack(inputs) if inputs else None,
                      embeddings=embeddings[0])


def _hidden_hooks(model) -> list:
    """Forward pre-hooks that remember each attention module's input (the normalised hidden
    states: GPT-2's ``ln_1`` output, Llama's ``input_layernorm`` output)."""
    def remember(module, args, kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        if getattr(_STATE, "records", None) is not None and hidden is not None:
            _STATE.hidden[id(module)] = hidden[0].float().clone()

    return [m.register_forward_pre_hook(remember, with_kwargs=True)
            for m in model.modules() if type(m).__name__.endswith("Attention")]


def _stack(layers: list[tuple], loaded) -> tuple:
    if len(layers) != loaded.n_layers:
        raise UsageError(
            f"captured {len(layers)} attention calls for {loaded.n_layers} layers: the model "
            "does not route attention through transformers' AttentionInterface"
        )
    q = torch.cat([rec[0] for rec in layers])
    k = torch.cat([rec[1] for rec in layers])
    v = torch.cat([rec[2] for rec in layers])
    scale = torch.cat([torch.full((rec[0].shape[0],), rec[3], device=rec[0].device)
                       for rec in layers])
    return q, k, v, scale


def _install(model) -> None:
    """Register the capture function once and point the model at it."""
    global _REGISTERED
    from transformers import AttentionInterface  # optional dependency (models extra)

    # optional dependency (models extra)
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    if not _REGISTERED:
        AttentionInterface.register(CAPTURE_NAME, _capture_attention)
        AttentionMaskInterface.register(CAPTURE_NAME, eager_mask)
        _REGISTERED = True
    if model.config._attn_implementation != CAPTURE_NAME:
        model.set_attn_implementation(CAPTURE_NAME)


@contextmanager
def _capturing() -> Iterator[list]:
    _STATE.records = []
    _STATE.hidden = {}
    try:
        yield _STATE.records
    finally:
        _STATE.records = None
        _STATE.hidden = {}


def _capture_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Record ``q``, ``k``, ``v`` (key/value heads mapped to query heads), then run eager."""
    records = getattr(_STATE, "records", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if records is not None:
        _check_causal(attention_mask, query.shape[-2], key.shape[-2])
        groups = query.shape[1] // key.shape[1]
        k = key.repeat_interleave(groups, dim=1) if groups > 1 else key
        v = value.repeat_interleave(groups, dim=1) if groups > 1 else value
        records.append((query[0].float().clone(), k[0].float().clone(), v[0].float().clone(),
                        float(scaling), _STATE.hidden.get(id(module))))
    eager = _eager_for(module)
    return eager(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def _eager_for(module):
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        # optional dependency (models extra)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    return eager


def _check_causal(mask, n_query: int, n_key: int) -> None:
    """The extraction assumes the plain causal mask; anything else (sliding window, padding)
    would make the recomputed logits differ from the model's."""
    if mask is None:
        return
    m = mask[0, 0] if mask.dim() == 4 else mask
    allowed = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
    causal = torch.ones(n_query, n_key, dtype=torch.bool, device=m.device).tril(n_key - n_query)
    if allowed.shape != causal.shape or not torch.equal(allowed, causal):
        raise UsageError(
            "the model's attention mask is not plainly causal at this length (sliding window?): "
            "lower --max-length"
        )
