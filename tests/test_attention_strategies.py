"""The attention case strategies are built once per parameter set, not inside every draw
(building and validating a fresh strategy tree per draw cost most of a draw's time)."""

from attnverify.attention import cases


def test_length_and_head_strategies_are_built_once_per_parameters():
    assert cases._lengths(1, 512) is cases._lengths(1, 512)
    assert cases._lengths(3, 64) is not cases._lengths(1, 64)
    assert cases._same_heads(16) is cases._same_heads(16)
    assert cases._kv_heads(2, 16) is cases._kv_heads(2, 16)
    assert cases._offsets("float16") is cases._offsets("float16")
    assert cases._value_dims(8, (8, 16)) is cases._value_dims(8, (8, 16))
    assert cases._explicit_scales(8) is cases._explicit_scales(8)
