"""attnverify: property-based verification and benchmarks for attention normalizers.

``import attnverify`` stays torch-free (the pytest plugin is auto-loaded in every adopter's
pytest run); the attention record types, which need torch, load on first use.
"""

from attnverify.registry import Kernel, NormalizerSpec, load_target, normalizer_spec

__version__ = "0.1.0"

__all__ = [
    "AttentionSpec",
    "Kernel",
    "NormalizerSpec",
    "__version__",
    "attention_spec",
    "load_target",
    "normalizer_spec",
]

_LAZY = {"AttentionSpec", "attention_spec"}


def __getattr__(name: str):
    if name in _LAZY:
        from attnverify.attention import spec  # torch-free: the package imports without torch

        return getattr(spec, name)
    raise AttributeError(f"module 'attnverify' has no attribute {name!r}")
