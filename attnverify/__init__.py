"""attnverify: property-based verification and benchmarks for attention normalizers."""

from attnverify.registry import Kernel, NormalizerSpec, load_target, normalizer_spec

__version__ = "0.1.0"

__all__ = ["Kernel", "NormalizerSpec", "__version__", "load_target", "normalizer_spec"]
