"""Attention kernels under test: anything with SDPA's signature, lifted to a normalizer.

An attention function computes ``out = α(scores) · V``. With ``V = I`` (the identity over keys)
the output *is* the weight matrix, and with ``K = I``, ``Q = S`` and ``scale = 1`` the scores are
exactly ``S``: every kernel is a normalizer ``S ↦ α`` (:mod:`.lift`), and every normalizer
property applies to it unchanged. On top, the attention-level properties (:mod:`.properties`,
ids ``attn_*``) check what only a kernel can get wrong (masks, causal offsets, scale, GQA head
mapping, batch/head coupling, precision, gradients) on generated ``Q``, ``K``, ``V``, against the
float64 eager reference (:mod:`.reference`) under the tolerance rule of :mod:`.tolerance`.

Modules: :mod:`.spec` (:class:`AttentionSpec`, :func:`attention_spec`), :mod:`.loader`,
:mod:`.kernels` (built-in targets), :mod:`.flex` (FlexAttention, compiled once), :mod:`.mods`
(named score modifications), :mod:`.cases`, :mod:`.checks`, :mod:`.properties`, :mod:`.run`
(certify), :mod:`.command` (the CLI option), :mod:`.repro`.
"""

__all__ = ["AttentionSpec", "attention_spec", "load_attention"]


def __getattr__(name: str):
    """``AttentionSpec`` and ``attention_spec`` from :mod:`.spec`, imported when first used: the
    command line imports :mod:`.command` (its ``--attention`` option) for every command, and
    :mod:`.spec` imports torch, which a command that loads no attention target need not wait for
    before it starts its worker processes (:mod:`attnverify.prestart`)."""
    if name in ("AttentionSpec", "attention_spec"):
        from attnverify.attention import spec  # torch-free: as the package

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_attention(target, params=None):
    """Resolve an attention target string (see :mod:`attnverify.attention.loader`)."""
    from attnverify.attention.loader import load_attention as load  # torch-free: as the package

    return load(target, params)
