"""Scalar strategies (lengths, dtypes, scales, temperatures) and the draws of the structural
parameters every tensor strategy shares (length bounds, batch, dtype, kind, seed)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from attnverify.strategies.validation import (
    _check_choices,
    _check_device,
    _check_int,
    _check_order,
    _check_positive,
    _drawn_member,
    _int_check,
    _resolve,
    _static,
)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEFAULT_DTYPES = (torch.float32, torch.float64)
MAX_SEED = 2**32 - 1
_SEEDS = st.integers(0, MAX_SEED)


@lru_cache(maxsize=4096)
def _ints(lo: int, hi: int) -> SearchStrategy[int]:
    """``st.integers(lo, hi)`` built once: a strategy built inside a draw costs more than the
    draw itself (Hypothesis validates and inspects it)."""
    return st.integers(lo, hi)


@lru_cache(maxsize=1024)
def _sampled(values: tuple) -> SearchStrategy:
    """``st.sampled_from(values)`` built once (see :func:`_ints`)."""
    return st.sampled_from(values)


def _check_common(batch: Any, dtypes_: Any, device: Any) -> None:
    """Validate the options every batched tensor strategy shares."""
    _static(batch, _int_check("batch", 1))
    _check_choices("dtypes", dtypes_, FLOAT_DTYPES)
    _static(device, _check_device)


def lengths(*, min_length: int = 1, max_length: int = 64) -> SearchStrategy[int]:
    """Lengths in ``[min_length, max_length]``, log-spread, shrinking towards ``min_length``.

    Draws an exponent ``e`` then a length up to ``2**e``, so every order of magnitude up to
    ``max_length`` is reached about equally often and shrinking moves to the smallest length.
    The bounds are plain ints.
    """
    _check_int("min_length", min_length, 1)
    _check_int("max_length", max_length, 1)
    _check_order("min_length", min_length, "max_length", max_length)
    return _lengths(min_length, max_length)


@st.composite
def _lengths(draw: Callable, lo: int, hi: int) -> int:
    return _draw_length(draw, lo, hi)


def _bucket(n: int) -> int:
    """The smallest ``e`` with ``n <= 2**e``."""
    return (n - 1).bit_length()


def _draw_length(draw: Callable, lo: int, hi: int) -> int:
    """An exponent ``e``, then a length in ``[lo, 2**e]`` (capped at ``hi``).

    The second range starts at ``lo`` rather than ``2**(e-1) + 1`` so that the shrinker can
    lower ``e`` once the length is small: any length shrinks to its minimum, not to the bottom
    of the bucket it was found in.
    """
    e = draw(_ints(_bucket(lo), _bucket(hi)))
    return draw(_ints(lo, min(hi, 2**e)))


def dtypes(*, allowed: Sequence[torch.dtype] = DEFAULT_DTYPES) -> SearchStrategy[torch.dtype]:
    """One of the ``allowed`` floating dtypes; shrinks towards the first."""
    _check_choices("allowed", allowed, FLOAT_DTYPES)
    return st.sampled_from(tuple(allowed))


def scales(*, min_value: float = 1e-3, max_value: float = 1e3) -> SearchStrategy[float]:
    """Log-uniform magnitudes in ``[min_value, max_value]``, shrinking towards 1.0."""
    return _log_uniform(min_value, max_value)


def temperatures(*, min_value: float = 1e-3, max_value: float = 10.0) -> SearchStrategy[float]:
    """Log-uniform temperatures ``T`` in ``[min_value, max_value]``, shrinking towards 1.0."""
    return _log_uniform(min_value, max_value)


def _log_uniform(min_value: float, max_value: float) -> SearchStrategy[float]:
    """``10**u`` with ``u`` drawn from the log10 range (``u`` shrinks to 0, the value to 1)."""
    _check_positive("min_value", min_value)
    _check_positive("max_value", max_value)
    _check_order("min_value", min_value, "max_value", max_value)
    lo, hi = float(min_value), float(max_value)
    exponents = st.floats(math.log10(lo), math.log10(hi))
    return exponents.map(lambda u: min(max(10.0**u, lo), hi))


def _draw_dtype(draw: Callable, choices: Any) -> torch.dtype:
    """A dtype from a sequence (shrinks to the first) or a strategy (validated)."""
    if isinstance(choices, SearchStrategy):
        return _resolve(draw, choices, _drawn_member("dtypes", FLOAT_DTYPES))
    return draw(_sampled(tuple(choices)))


def _draw_kind(draw: Callable, choices: Any, allowed: Sequence[str]) -> str:
    """A kind from a sequence (shrinks to the first) or a strategy (validated)."""
    if isinstance(choices, SearchStrategy):
        return _resolve(draw, choices, _drawn_member("kinds", allowed))
    return draw(_sampled(tuple(choices)))


def _draw_bounds(draw: Callable, min_length: Any, max_length: Any, shortest: int = 1):
    """Resolve the length bounds (values or strategies) and check their order."""
    lo = _resolve(draw, min_length, _int_check("min_length", shortest))
    hi = _resolve(draw, max_length, _int_check("max_length", shortest))
    _check_order("min_length", lo, "max_length", hi)
    return lo, hi


def _draw_batch(draw: Callable, batch: Any, shortest: int = 1) -> int:
    """``batch`` as given, or 1–4 rows (``shortest``–4 when the kind needs more rows)."""
    if batch is None:
        return draw(_ints(shortest, 4))
    return _resolve(draw, batch, _int_check("batch", 1))
