"""The suite's own speed: certify throughput, per property and per normalizer.

One certify run of the built-ins as the command runs it (each target in a worker process of its
own where the commit has one; profile ``ci``, ``MAX_EXAMPLES`` examples, seed 0), done once in
``setup_cache`` and shared by every benchmark here; each property's examples and
elapsed seconds are summed over the normalizers. Two views of the same numbers:
``track_examples_per_second`` (throughput, higher is better) and ``track_ms_per_example``
(its inverse, which is what ``asv continuous`` gates on: asv flags increases).

A commit without ``attnverify.certify`` skips every combination.
"""

from __future__ import annotations

import os

from .grid import BUILTIN_IDS, TARGET
from .subjects import TARGET_ENV

#: Property ids of docs/INTERFACES.md: the universal ones, then the claimable ones.
PROPERTIES = (
    "shape",
    "finite",
    "deterministic",
    "no_mutation",
    "permutation_equivariant",
    "mask_zero",
    "batch_independent",
    "layout_invariant",
    "no_side_effects",
    "simplex",
    "sub_simplex",
    "nonnegative",
    "affine_sum",
    "shift_invariant",
    "order_preserving",
    "length_aware",
    "fully_masked_row",
    "matches_reference",
    "gradient",
    "double_backward",
    "lemma1_weight_bounds",
    "cor1_softmax_weight_bounds",
    "thm1_fixed_distance",
    "thm1_random_distance",
    "thm2_separation_lower",
    "thm2_separation_upper",
    "lemma2_jacobian",
    "cor3_entrywise",
    "cor3_spectral_paper",
    "jacobian_spectral_half",
    "fd_gradient",
    "gpam_range",
    "lemma3_l1_uniform",
    "lemma3_frobenius_uniform",
)

#: Hypothesis examples per property and normalizer.
MAX_EXAMPLES = 10
PROFILE = "ci"


def _certifier():
    """``run(target string) -> TargetResult`` for this commit's certify API (through its
    process boundary where it has one), or None when it has none."""
    try:
        from attnverify import certify
    except ImportError:
        return None
    ctx = certify.make_context(PROFILE, max_examples=MAX_EXAMPLES, seed=0)
    try:
        from attnverify.isolation import certify_all
    except ImportError:
        certify_all = None
    if callable(certify_all):
        return lambda target: certify_all([target], {}, None, ctx)[0]
    from attnverify.registry import load_target

    return lambda target: certify.certify_target(load_target(target), None, ctx)


def _certify_all() -> dict | None:
    """``{"property": {id: [examples, seconds]}, "normalizer": {id: [examples, seconds]}}``."""
    run = _certifier()
    if run is None:
        return None
    from attnverify.registry import builtin_ids

    targets = {name: name for name in BUILTIN_IDS if name in builtin_ids()}
    if os.environ.get(TARGET_ENV, "").strip():
        targets[TARGET] = os.environ[TARGET_ENV].strip()
    totals: dict[str, dict[str, list[float]]] = {"property": {}, "normalizer": {}}
    for name, target in targets.items():
        for r in run(target).results:
            for kind, key in (("property", r.property), ("normalizer", name)):
                acc = totals[kind].setdefault(key, [0, 0.0])
                acc[0] += int(r.examples)
                acc[1] += float(r.elapsed_s)
    return totals


class _CertifyCache:
    timeout = 1200

    def setup_cache(self):
        return _certify_all()

    def _pick(self, cache, kind: str, key: str) -> tuple[int, float]:
        if cache is None:
            raise NotImplementedError("attnverify.certify is missing in this commit")
        examples, seconds = cache[kind].get(key, (0, 0.0))
        if examples == 0 or seconds <= 0:
            raise NotImplementedError(f"no examples were run for {kind} {key!r}")
        return examples, seconds


class CertifyPerProperty(_CertifyCache):
    """Examples per second of each property, summed over the built-ins (and the target)."""

    params = [list(PROPERTIES)]
    param_names = ["property"]

    def setup(self, cache, prop):
        self._pick(cache, "property", prop)

    def track_examples_per_second(self, cache, prop):
        examples, seconds = self._pick(cache, "property", prop)
        return examples / seconds

    track_examples_per_second.unit = "examples/s"

    def track_ms_per_example(self, cache, prop):
        examples, seconds = self._pick(cache, "property", prop)
        return 1000.0 * seconds / examples

    track_ms_per_example.unit = "ms/example"


class CertifyPerNormalizer(_CertifyCache):
    """Milliseconds per example of a whole certificate, for each built-in (and the target)."""

    params = [[*BUILTIN_IDS, TARGET]]
    param_names = ["normalizer"]

    def setup(self, cache, normalizer):
        self._pick(cache, "normalizer", normalizer)

    def track_ms_per_example(self, cache, normalizer):
        examples, seconds = self._pick(cache, "normalizer", normalizer)
        return 1000.0 * seconds / examples

    track_ms_per_example.unit = "ms/example"
