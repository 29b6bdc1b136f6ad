"""attnverify: property-based verification and benchmarks for attention normalizers."""

from attnverify.attention.spec import AttentionSpec, attention_spec
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
