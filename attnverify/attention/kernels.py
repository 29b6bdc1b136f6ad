"""Built-in attention targets (``attnverify list`` prints them in their own section).

| id | what it runs |
| --- | --- |
| ``sdpa`` | ``torch.nn.functional.scaled_dot_product_attention``, default dispatch |
| ``sdpa_math`` / ``sdpa_flash`` / ``sdpa_efficient`` / ``sdpa_cudnn`` | SDPA restricted to one
  backend (``torch.nn.attention.sdpa_kernel``); efficient and cuDNN exist on CUDA only |
| ``flex`` | FlexAttention (``torch.nn.attention.flex_attention``) compiled once per process,
  called in a canonical form that keeps the compiled graphs few (:mod:`attnverify.attention.flex`) |
| ``flex_direct`` | FlexAttention compiled and called on the inputs as given (slow to certify) |
| ``flex_causal``, ``flex_sliding_window``, ``flex_alibi``, ``flex_softcap`` | FlexAttention with
  that score modification (:mod:`attnverify.attention.mods`) |
| ``eager`` | the float64 reference of :mod:`attnverify.attention.reference` (softmax) |
| ``eager_<normalizer>`` | the same reference with any built-in normalizer in place of softmax
  (``eager_sparsemax``, ``eager_entmax15``, …): every built-in normalizer lifted to attention |

A kernel that cannot run here (no CUDA, a backend torch was built without) is still listed, with
the reason, and ``certify`` reports it as skipped (``not_applicable``) rather than failed.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnverify.attention import flex, mods
from attnverify.attention.reference import eager
from attnverify.attention.spec import ALL_DTYPES, AttentionSpec
from attnverify.registry import builtins as normalizers


def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """torch's scaled_dot_product_attention, default dispatch."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          scale=scale, enable_gqa=enable_gqa)


def _backend(name: str):
    return getattr(SDPBackend, name)


def sdpa_backend(backend: str):
    """SDPA restricted to one backend (``MATH``, ``FLASH_ATTENTION``, …)."""

    def run(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        with sdpa_kernel([_backend(backend)]):
            return sdpa(q, k, v, attn_mask, is_causal, scale, enable_gqa)

    run.__name__ = f"sdpa_{backend.lower()}"
    run.__doc__ = f"SDPA with only the {backend} backend enabled."
    return run


def _cuda_only(name: str) -> str:
    if torch.cuda.is_available():
        return ""
    return f"{name} runs on CUDA only and torch sees no CUDA device"


def eager_normalizer(normalizer: str):
    """The float64 eager reference with ``normalizer``, output cast back to the input dtype."""

    def run(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        out = eager(q, k, v, attn_mask, is_causal, scale, enable_gqa, normalizer=normalizer)
        return out.to(q.dtype)

    run.__name__ = f"eager_{normalizer}"
    run.__doc__ = f"float64 eager attention with {normalizer} (matmul, mask, {normalizer}, matmul)"
    return run


@functools.cache
def builtins() -> dict[str, AttentionSpec]:
    """Every built-in attention target by id, in the order of the module docstring."""

    specs = [
        AttentionSpec("sdpa", sdpa, gqa=True, description="torch SDPA, default dispatch"),
        AttentionSpec("sdpa_math", sdpa_backend("MATH"), gqa=True,
                      description="torch SDPA, math backend"),
        AttentionSpec("sdpa_flash", sdpa_backend("FLASH_ATTENTION"), gqa=True,
                      unavailable=flex.flash_unavailable(),
                      description="torch SDPA, flash backend (CPU flash where built)"),
        AttentionSpec("sdpa_efficient", sdpa_backend("EFFICIENT_ATTENTION"), gqa=True,
                      unavailable=_cuda_only("the memory-efficient backend"),
                      description="torch SDPA, memory-efficient backend"),
        AttentionSpec("sdpa_cudnn", sdpa_backend("CUDNN_ATTENTION"), gqa=True,
                      unavailable=_cuda_only("the cuDNN backend"),
                      description="torch SDPA, cuDNN backend"),
        AttentionSpec("flex", flex.flex, gqa=True, dtypes=flex.DTYPES,
                      max_head_dim=flex.MAX_HEAD_DIM, differentiable=flex.DIFFERENTIABLE,
                      unavailable=flex.unavailable(), compile_s=flex.COMPILE_S,
                      description="FlexAttention, compiled (masks as a score_mod bias)"),
        AttentionSpec("flex_direct", flex.flex_direct, gqa=True, dtypes=flex.DTYPES,
                      max_head_dim=flex.MAX_HEAD_DIM, differentiable=flex.DIFFERENTIABLE,
                      unavailable=flex.unavailable(), compile_s=flex.COMPILE_S,
                      description="FlexAttention compiled on the inputs as given (no canonical "
                      "form; slow: a compile per shape family)"),
    ]
    for mod in mods.MODS:
        specs.append(AttentionSpec(
            f"flex_{mod}", functools.partial(flex.flex, mod=mod), params=mods.DEFAULTS[mod],
            score_mod=mod, gqa=True, dtypes=flex.DTYPES, max_head_dim=flex.MAX_HEAD_DIM,
            differentiable=flex.DIFFERENTIABLE, unavailable=flex.unavailable(),
            compile_s=flex.COMPILE_S,
            description=f"FlexAttention with the {mod} score modification"))
    specs.append(AttentionSpec("eager", eager_normalizer("softmax"), gqa=True,
                               dtypes=ALL_DTYPES, description="float64 eager reference"))
    for norm_id, norm in normalizers().items():
        specs.append(AttentionSpec(
            f"eager_{norm_id}", eager_normalizer(norm_id), normalizer=norm_id, space=norm.space,
            gqa=True, description=f"float64 eager attention with the built-in {norm_id}"))
    return {s.id: s for s in specs}


def list_rows() -> list[tuple[str, ...]]:
    """Rows of ``attnverify list``'s attention section: id, normalizer, what it takes, status."""
    rows = [("id", "normalizer", "takes", "status")]
    for spec in builtins().values():
        takes = ", ".join(str(d).removeprefix("torch.") for d in spec.dtypes)
        if spec.gqa:
            takes += "; GQA"
        if spec.score_mod:
            takes += f"; {spec.score_mod}" + "".join(f" {k}={v}" for k, v in spec.params.items())
        status = f"skipped: {spec.unavailable}" if spec.unavailable else spec.description
        rows.append((spec.id, spec.normalizer, takes, status))
    return rows
