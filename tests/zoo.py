"""The zoo: every defect the team ever planted, every correct control, with its expected verdict
and the test that runs it in CI (issue #25: a defect caught once stays caught).

An entry names a fixture (``tests/fixtures/FILE.py:ATTR``), what must come of it and who runs it:

- ``expect``: the property id the defect must fail (status ``violated`` or ``error``);
  ``"certified"`` for a correct control (every property it is held to holds); ``"probe"`` for
  a fixture that is no defect but reports on the machinery (the worker's process, its reach);
- ``run_by``: the test file that runs it with that expectation. Most planted defects have
  a test of their own (with a shrinking or repro check on top); the rest, and every defect
  of the value domain, run in ``tests/test_zoo.py``, table-driven from :data:`ZOO`;
- ``kind``: ``normalizer`` or ``attention``; ``claims`` / ``reference``: what the zoo's own run
  holds a normalizer to (``None``: its own claims; the reference where ``matches_reference``
  is what finds the defect).

``tests/test_zoo.py`` checks that every public fixture of ``planted_*.py``, ``tamperers.py``,
``hostile.py`` and ``low_precision.py`` is here, and that each entry run elsewhere is named,
with its expected property, by the test file that runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

FIXTURES = Path(__file__).parent / "fixtures"
#: The fixture files the zoo must cover entirely.
COVERED = ("planted*.py", "tamperers.py", "hostile.py", "low_precision.py")
#: The zoo's own test (entries it runs itself).
SELF = "test_zoo.py"


class Entry(NamedTuple):
    file: str
    attr: str
    expect: str
    run_by: str
    kind: str = "normalizer"
    claims: tuple[str, ...] | None = None
    reference: str | None = None

    @property
    def target(self) -> str:
        return f"{FIXTURES / self.file}:{self.attr}"


def _many(file: str, run_by: str, rows, kind: str = "normalizer") -> list[Entry]:
    return [Entry(file, attr, expect, run_by, kind) for attr, expect in rows]


#: ``tests/test_planted_defects.py`` runs these under the ci profile at seed 0 (simplex claimed).
PLANTED = [
    ("overflow_softmax", "finite"),
    ("wrong_threshold_sparsemax", "simplex"),
    ("inplace_softmax", "no_mutation"),
    ("noisy_softmax", "deterministic"),
    ("positional_softmax", "permutation_equivariant"),
    ("mask_leak_softmax", "mask_zero"),
    ("batch_coupled_softmax", "batch_independent"),
    ("row_sum_off_softmax", "simplex"),
    ("sigmoid_claiming_simplex", "simplex"),
    ("nan_on_mask_softmax", "mask_zero"),
]
#: ``tests/test_attention.py`` (dev profile, seed 0), each with its repro.
ATTENTION = [
    ("ignores_bool_mask", "attn_bool_mask"),
    ("inverted_bool_mask", "attn_bool_mask"),
    ("bool_mask_as_additive", "attn_bool_mask"),
    ("ignores_additive_mask", "attn_additive_mask"),
    ("bottom_right_causal", "attn_causal"),
    ("padding_leak", "attn_padding"),
    ("sliding_off_by_one", "attn_sliding_window"),
    ("nan_for_fully_masked", "attn_fully_masked_row"),
    ("doubled_output", "attn_convex_hull"),
    ("positional_bias", "attn_key_permutation"),
    ("gqa_tiled_heads", "attn_gqa"),
    ("batch_coupled", "attn_batch_head_independent"),
    ("half_accumulation", "attn_low_precision"),
    ("wrong_grad_v", "attn_gradients"),
    ("wrong_default_scale", "attn_reference"),
    ("assumes_bhld_memory", "attn_reference"),
    ("first_batch_mask", "attn_bool_mask"),
]

ZOO: list[Entry] = [
    *_many("planted.py", "test_planted_defects.py", PLANTED),
    *_many("planted.py", "test_planted_defects.py", [
        ("torch_softmax", "certified"), ("entmax_sparsemax", "fully_masked_row")]),
    *_many("planted.py", "test_repro.py", [
        ("wrong_shape", "shape"), ("only_at_half_temperature", "certified")]),
    *_many("planted_attention.py", "test_attention.py", ATTENTION, "attention"),
    *_many("planted_attention.py", "test_attention.py", [("eager_attention", "certified")],
           "attention"),
    *_many("planted_attention.py", "test_attention_shapes.py", [
        ("heads_chunked_16", "attn_reference"), ("gqa_values_tiled_wide", "attn_gqa"),
        ("gqa_group_tiles_of_4", "attn_gqa"), ("batch_tiles_of_3", "attn_reference"),
        ("scale_from_value_dim", "attn_reference"), ("head_dim_vectors_of_8", "attn_reference"),
        ("mask_2d_first_row", "attn_bool_mask"),
        ("broadcast_batch_mask_first_only", "attn_bool_mask"),
        ("head_broadcast_bias_split", "attn_additive_mask"),
        ("stride0_mask_fast_path", "attn_fully_masked_row"),
        ("cache_slice_as_dense", "attn_reference"), ("flash_tiled", "attn_reference")],
        "attention"),
    *_many("planted_fuzz.py", "test_fuzz.py", [("tile_softmax", "simplex")]),
    *_many("planted_gradient.py", "test_gradient_trust.py", [
        ("grad_mode_softmax", "gradient"), ("grad_values_softmax", "gradient"),
        ("float32_halved_softmax", "gradient"), ("noisy_softmax", "gradient"),
        ("probe_noisy_softmax", "gradient"), ("block_backward_softmax", "gradient"),
        ("probe_dodger_softmax", "gradient"), ("long_rows_no_float64_softmax", "gradient"),
        ("long_rows_no_graph_softmax", "gradient"),
        ("float32_halved_with_reference", "gradient")]),
    *_many("planted_layout.py", "test_layouts.py", [
        ("storage_order_softmax", "layout_invariant"),
        ("storage_start_softmax", "layout_invariant"), ("view_backward_softmax", "gradient"),
        ("last_axis_softmax", "layout_invariant"), ("row_chunk_tail_softmax", "simplex"),
        ("long_row_path_softmax", "simplex"), ("aligned_view_softmax", "layout_invariant"),
        ("view_tail_gather_softmax", "layout_invariant"),
        ("threaded_split_softmax", "batch_independent"), ("long_mask_tile_softmax", "mask_zero"),
        ("contiguous_lastdim_kernel", "shape"), ("any_layout_softmax", "certified"),
        ("contiguous_lastdim_declared", "certified"), ("at_origin_declared", "certified"),
        ("transposed_declared", "certified")]),
    # the kernels behind the declared specs above, called bare: they raise on a layout they
    # do not take (the declared specs above are certified)
    *_many("planted_layout.py", SELF, [
        ("at_origin_kernel", "shape"), ("transposed_kernel", "shape")]),
    *_many("planted_trust.py", "test_reference.py", [
        ("misscaled_temperature", "matches_reference"), ("sink_unshifted", "matches_reference"),
        ("ignored_alpha", "matches_reference"), ("misscaled_spec", "matches_reference"),
        ("misscaled_kernel_spec", "matches_reference"), ("kernel_softmax_spec", "certified")]),
    *_many("planted_trust.py", "test_gradient.py", [
        ("classic_softmax", "certified"), ("once_softmax", "double_backward"),
        ("halved_gradient_softmax", "gradient"), ("wrong_jvp_softmax", "gradient"),
        ("numpy_softmax", "certified"), ("float32_only_softmax", "certified")]),
    *_many("low_precision.py", "test_reference.py", [
        ("divides", "certified"), ("multiplies", "certified"),
        ("temperature_off", "matches_reference")]),
    *_many("tamperers.py", "test_isolation.py", [
        ("patches_checker", "matches_reference"), ("lying_subclass", "shape"),
        ("cached_by_shape", "deterministic"), ("cached_by_address", "deterministic"),
        ("in_place", "shape"), ("returns_input_view", "shape"), ("clobbers_input", "shape"),
        ("detached_long_rows", "gradient"), ("detached_sometimes", "gradient"),
        ("reused_buffer", "deterministic"), ("grad_off", "no_side_effects"),
        ("default_dtype", "no_side_effects"), ("patches_torch", "no_side_effects"),
        ("threads", "no_side_effects"), ("patches_softmax", "no_side_effects"),
        ("writes_input_later", "no_side_effects"),
        ("shadows_tensor_method", "no_side_effects"), ("reseeds", "no_side_effects"),
        ("flushes_denormals", "no_side_effects"), ("switches_backend", "no_side_effects"),
        ("forges_answers", "shape"), ("never_differentiable", "certified"),
        ("imports_attnverify", "certified"), ("self_checking", "certified"),
        ("threads_on_large_inputs", "no_side_effects"),
        ("reports_process", "probe"), ("reports_layout", "probe")]),
    # helpers of the fixtures, no targets
    *_many("tamperers.py", SELF, [("json_line", "probe")]),
    *_many("hostile.py", SELF, [("fine", "probe")]),
    *_many("tamperers.py", "test_sandbox.py", [
        ("reaches_checker", "probe"), ("reports_reach", "probe")]),
    *_many("hostile.py", "test_hostile.py", [
        ("exits", "shape"), ("hard_exits", "shape"), ("segfaults", "shape"),
        ("raises_base", "shape"), ("hangs", "shape"), ("trickles_an_answer", "shape"),
        ("hogs_memory", "shape"), ("reports_memory_limit", "probe")]),
    # ---- every gradient entry and call sequences (issue #25, items 4 and 5)
    *_many("planted_masked_gradient.py", "test_gradient_trust.py", [
        ("straight_through_mask_softmax", "gradient"), ("lse_backward_softmax", "gradient"),
        ("masked_autograd_softmax", "certified"), ("float32_accumulating_softmax", "certified")]),
    *_many("planted_masked_gradient.py", "test_attention.py", [
        ("floored_backward_attention", "attn_gradients"),
        ("uniform_dead_dq_attention", "attn_fully_masked_row"),
        ("flash_backward_attention", "certified")], "attention"),
    *_many("planted_sequence.py", "test_repro_sequence.py", [
        ("workspace_softmax", "shape"), ("autotuned_softmax", "simplex"),
        ("shape_cache_softmax", "simplex"), ("constant_cache_softmax", "certified")]),
    # ---- a gradient wrong only at the finite-difference points of double_backward, which go
    # to the worker in one request (issue #27)
    *_many("planted_batched_gradient.py", "test_gradient_batched.py", [
        ("probe_backward_softmax", "double_backward"),
        ("probe_detached_softmax", "double_backward")]),
    # ---- a backward wrong only far below zero (issue #25, item 6: the derivatives' domain)
    *_many("planted_far_gradient.py", "test_gradient_domain.py", [
        ("finite_init_backward_softmax", "gradient"), ("online_backward_softmax", "certified")]),
    *_many("planted_attention_sequence.py", "test_attention_sequence.py", [
        ("workspace_attention", "shape"), ("autotuned_attention", "attn_reference"),
        ("shape_cache_attention", "attn_reference"), ("cached_mask_attention", "certified")],
        "attention"),
    # ---- Triton kernels through the interpreter (issue #26); the kernels behind the declared
    # attention specs are run through those specs
    *_many("planted_triton.py", "test_triton.py", [
        ("zero_fill_softmax", "simplex"), ("no_max_softmax", "finite"),
        ("narrow_block_softmax", "matches_reference"), ("unrescaled_softmax", "simplex"),
        ("row_stride_softmax", "layout_invariant"), ("half_exp_softmax", "simplex")]),
    *_many("planted_triton.py", "test_triton.py", [
        ("causal_off_by_one", "attn_causal"), ("half_accumulator", "attn_causal")], "attention"),
    *_many("planted_triton.py", SELF, [
        ("flash_off_by_one", "probe"), ("flash_half_accumulator", "probe")], "attention"),
    # ---- the value domain (issue #25): run here, each by the ci profile at seed 0
    Entry("planted_domain.py", "finite_init_max_softmax", "simplex", SELF),
    Entry("planted_domain.py", "log2_prescale_softmax", "matches_reference", SELF,
          reference="softmax"),
    Entry("planted_domain.py", "clamped_temperature_softmax", "matches_reference", SELF,
          reference="softmax"),
    Entry("planted_domain.py", "threshold_mask_attention", "attn_additive_mask", SELF,
          "attention"),
    Entry("planted_domain.py", "online_block_softmax", "certified", SELF, reference="softmax"),
    Entry("planted_domain.py", "lse_split_softmax", "certified", SELF, reference="softmax"),
    Entry("planted_domain.py", "float32_accumulator_softmax", "certified", SELF,
          reference="softmax"),
    Entry("planted_domain.py", "threaded_softmax", "certified", SELF, reference="softmax"),
    Entry("planted_domain.py", "hf_eager_attention", "certified", SELF, "attention"),
    Entry("planted_domain.py", "online_f32_attention", "certified", SELF, "attention"),
]
