"""Public Hypothesis strategies for attnverify's property suite.

Conventions follow Hypothesis's numpy strategies:

* options are keyword-only; an option of a tensor strategy accepts a value or a strategy that
  draws the value (the bounds of the scalar strategies :func:`lengths`, :func:`scales` and
  :func:`temperatures` are plain values, as in ``st.integers``);
* arguments are validated when the strategy is built, with
  :class:`hypothesis.errors.InvalidArgument` naming the argument; a value drawn from a strategy
  option is validated when it is drawn;
* results are :class:`typing.NamedTuple` records.

Every strategy draws only small structural parameters (length, dimension, dtype, kind of
adversary, scale, seed) and builds its tensors from a seeded :class:`torch.Generator` in float64
on the requested device, converting to the drawn dtype at the end. Examples stay cheap at large
lengths and shrink to a minimal case: the shortest length, the first (simplest) kind and dtype,
scale 1 and seed 0. Lengths are drawn as a power-of-two bucket then a length inside it, so they
shrink towards small values while ``max_length`` (the caller's; the settings profiles are in
:data:`attnverify.certify.PROFILES`) stays reachable.

Each tensor strategy has a deterministic builder (``logit_rows`` → :func:`build_rows`, ...) taking
the record's structural fields; :func:`repro` prints the one-line call that rebuilds a record. The
same seed gives the same tensor on the same device type (CPU and CUDA generators differ).

Inputs are constructed to satisfy a theorem's hypotheses (THEORY.md), never filtered with
``assume``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

__all__ = [
    "ALL_KINDS",
    "BOUNDED_KINDS",
    "DEFAULT_DTYPES",
    "EMBEDDING_KINDS",
    "FLOAT_DTYPES",
    "HUGE_MAGNITUDES",
    "MASK_KINDS",
    "PEAK_MARGIN",
    "QUERY_KEY_KINDS",
    "TIE_GAP",
    "BoundedRows",
    "EmbeddingSet",
    "Embeddings",
    "QueryKeys",
    "Rows",
    "bounded_rows",
    "build_bounded_rows",
    "build_embedding_set",
    "build_query_keys",
    "build_rows",
    "build_sphere_embeddings",
    "dtypes",
    "embedding_sets",
    "lengths",
    "logit_rows",
    "query_key_sets",
    "repro",
    "scales",
    "sphere_embeddings",
    "temperatures",
]

#: Adversarial kinds of :func:`logit_rows`, simplest first (shrinking moves towards the first).
ALL_KINDS = (
    "gaussian",
    "uniform_bounded",
    "exact_ties",
    "two_way_tie",
    "near_ties",
    "huge_range",
    "masked",
    "fully_masked",
    "single",
    "mixed_scale",
    "one_hot_like",
)
#: Kinds that put ``-inf`` (masked keys) into the scores; excluded when ``allow_mask=False``.
MASK_KINDS = ("masked", "fully_masked")
#: Kinds of :func:`bounded_rows`: uniform in [−a, a]; every logit ±a; one +a and the rest −a.
BOUNDED_KINDS = ("uniform", "extremes", "peak")
#: Kinds of :func:`query_key_sets`: Gaussian keys; keys ±√d·q̂ (|logit| = Δ); keys of mixed norm.
QUERY_KEY_KINDS = ("gaussian", "aligned", "mixed_norms")
#: Kinds of :func:`embedding_sets`.
EMBEDDING_KINDS = ("gaussian", "mixed_norms", "duplicates", "collinear")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEFAULT_DTYPES = (torch.float32, torch.float64)
#: Magnitudes of ``huge_range`` rows, all far beyond fp32 ``exp`` overflow (≈ 88.7).
HUGE_MAGNITUDES = (1e4, 1e8, 1e30)
#: How far below the two equal maxima the rest of a ``two_way_tie`` row lies.
TIE_GAP = 1e3
#: How far the peak of a ``one_hot_like`` row lies above the rest.
PEAK_MARGIN = 1e3
#: Row scales of ``mixed_scale`` span ``scale·10**lo … scale·10**hi``.
MIXED_EXPONENTS = (-6.0, 4.0)
MAX_SEED = 2**32 - 1
_MAX_RESAMPLES = 64
_CHUNK_PAIRS = 2**22  # pairwise distances computed per chunk in the δ search
#: (shortest, longest) row length each kind allows; None = unbounded.
_KIND_LENGTHS: dict[str, tuple[int, int | None]] = {
    "single": (1, 1),
    "exact_ties": (2, None),
    "two_way_tie": (2, None),
    "near_ties": (2, None),
    "masked": (2, None),
    "one_hot_like": (2, None),
}
_SEEDS = st.integers(0, MAX_SEED)


# --------------------------------------------------------------------------- records


class Rows(NamedTuple):
    """Batched logit rows from :func:`logit_rows`; rows along the last dim.

    ``scores`` is ``[batch, length]`` in ``dtype`` on the requested device; ``-inf`` marks a
    masked key. ``scale`` is the magnitude the kind used (the huge magnitude for
    ``huge_range``); ``max_abs`` caps every finite ``|score|`` (None: only the dtype's range).
    """

    scores: torch.Tensor
    kind: str
    length: int
    batch: int
    dtype: torch.dtype
    scale: float
    seed: int
    max_abs: float | None = None


class BoundedRows(NamedTuple):
    """Rows with every logit in ``[-a, a]`` (Lemma 1), ``scores`` ``[batch, length]``."""

    scores: torch.Tensor
    a: float
    kind: str
    length: int
    batch: int
    dtype: torch.dtype
    seed: int


class QueryKeys(NamedTuple):
    """Queries and keys for Corollary 1.

    ``q`` is ``[batch, d]``, ``K`` ``[batch, length, d]``, ``logits = K q`` ``[batch, length]``
    (computed in float64 from the stored ``q``, ``K``, then rounded to ``dtype``), ``delta``
    ``[batch]`` float64 with ``delta = ‖q‖·max_j‖k_j‖`` (raised, if rounding needs it, so that
    every ``|logit| ≤ delta``).
    """

    q: torch.Tensor
    K: torch.Tensor
    logits: torch.Tensor
    delta: torch.Tensor
    kind: str
    length: int
    d: int
    batch: int
    dtype: torch.dtype
    scale: float
    seed: int


class Embeddings(NamedTuple):
    """Embeddings on a sphere (Theorem 2 hypotheses).

    ``x`` is ``[length, d]`` with every row of norm ``M`` (to the dtype's rounding), pairwise
    distinct; ``delta > 0`` is the minimum pairwise distance of ``x`` as stored (in float64);
    ``n_top`` is a top-set size N in ``1 … length-1``.
    """

    x: torch.Tensor
    M: float
    delta: float
    n_top: int
    length: int
    d: int
    dtype: torch.dtype
    seed: int


class EmbeddingSet(NamedTuple):
    """Arbitrary embeddings ``x`` ``[length, d]`` and a top-set size ``n_top`` in 1 … length-1
    (Theorem 1)."""

    x: torch.Tensor
    n_top: int
    kind: str
    length: int
    d: int
    dtype: torch.dtype
    scale: float
    seed: int


# --------------------------------------------------------------------------- validation


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    """``value`` must be an int in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an integer")
    if value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name}={value!r} must be at most {maximum}")


def _check_positive(name: str, value: Any) -> None:
    """``value`` must be a finite real number > 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{name}={value!r} must be a finite number > 0")


def _check_order(lo_name: str, lo: Any, hi_name: str, hi: Any) -> None:
    """``lo`` must not exceed ``hi``."""
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} is larger than {hi_name}={hi!r}")


def _check_member(name: str, value: Any, allowed: Sequence[Any], drawn: bool = False) -> None:
    """``value`` (given, or ``drawn`` from a strategy option) must be one of ``allowed``."""
    if not any(value is a or value == a for a in allowed):
        said = f"{name} drew {value!r}, which" if drawn else f"{name}={value!r}"
        raise InvalidArgument(f"{said} is not one of {_names(allowed)}")


def _check_choices(name: str, values: Any, allowed: Sequence[Any]) -> None:
    """A non-strategy ``values`` must be a non-empty sequence of members of ``allowed``."""
    if isinstance(values, SearchStrategy):
        return
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise InvalidArgument(
            f"{name}={values!r} must be a non-empty sequence, e.g. {name}=({allowed[0]!r},)"
        )
    for value in values:
        if not any(value is a or value == a for a in allowed):
            raise InvalidArgument(
                f"{name} contains {value!r}, which is not one of {_names(allowed)}"
            )


def _check_device(device: Any) -> None:
    """``device`` must name a device torch can allocate on."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidArgument(f"device={device!r} cannot be used: {first}") from None


def _names(values: Sequence[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def _static(value: Any, check: Callable[[Any], None]) -> None:
    """Validate ``value`` now unless it is a strategy (then it is validated when drawn)."""
    if value is not None and not isinstance(value, SearchStrategy):
        check(value)


def _resolve(draw: Callable, value: Any, check: Callable[[Any], None] | None = None) -> Any:
    """Draw ``value`` if it is a strategy (and validate the draw), else use it as is."""
    if isinstance(value, SearchStrategy):
        value = draw(value)
        if check is not None:
            check(value)
    return value


def _int_check(name: str, minimum: int) -> Callable[[Any], None]:
    return lambda v: _check_int(name, v, minimum)


def _drawn_member(name: str, allowed: Sequence[Any]) -> Callable[[Any], None]:
    return lambda v: _check_member(name, v, allowed, drawn=True)


def _positive_check(name: str, optional: bool = False) -> Callable[[Any], None]:
    return lambda v: None if v is None and optional else _check_positive(name, v)


def _check_length_options(min_length: Any, max_length: Any, shortest: int = 1) -> None:
    """Validate the non-strategy length bounds."""
    _static(min_length, _int_check("min_length", shortest))
    _static(max_length, _int_check("max_length", shortest))
    if not _any_strategy(min_length, max_length):
        _check_order("min_length", min_length, "max_length", max_length)


def _any_strategy(*values: Any) -> bool:
    return any(isinstance(v, SearchStrategy) for v in values)


def _check_common(batch: Any, dtypes_: Any, device: Any) -> None:
    """Validate the options every batched tensor strategy shares."""
    _static(batch, _int_check("batch", 1))
    _check_choices("dtypes", dtypes_, FLOAT_DTYPES)
    _static(device, _check_device)


# --------------------------------------------------------------------------- scalar strategies


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
    e = draw(st.integers(_bucket(lo), _bucket(hi)))
    return draw(st.integers(lo, min(hi, 2**e)))


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
    return draw(st.sampled_from(tuple(choices)))


def _draw_kind(draw: Callable, choices: Any, allowed: Sequence[str]) -> str:
    """A kind from a sequence (shrinks to the first) or a strategy (validated)."""
    if isinstance(choices, SearchStrategy):
        return _resolve(draw, choices, _drawn_member("kinds", allowed))
    return draw(st.sampled_from(tuple(choices)))


def _draw_bounds(draw: Callable, min_length: Any, max_length: Any, shortest: int = 1):
    """Resolve the length bounds (values or strategies) and check their order."""
    lo = _resolve(draw, min_length, _int_check("min_length", shortest))
    hi = _resolve(draw, max_length, _int_check("max_length", shortest))
    _check_order("min_length", lo, "max_length", hi)
    return lo, hi


def _draw_batch(draw: Callable, batch: Any, shortest: int = 1) -> int:
    """``batch`` as given, or 1–4 rows (``shortest``–4 when the kind needs more rows)."""
    if batch is None:
        return draw(st.integers(shortest, 4))
    return _resolve(draw, batch, _int_check("batch", 1))


# --------------------------------------------------------------------------- tensor helpers


class _Ctx(NamedTuple):
    """What a kind builder needs: the seeded generator and the shape and magnitude."""

    g: torch.Generator
    device: torch.device
    dtype: torch.dtype
    scale: float
    batch: int = 1
    length: int = 1
    d: int = 1


def _ctx(seed: int, device: Any, dtype: torch.dtype, scale: float, **shape: int) -> _Ctx:
    dev = torch.device(device)
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return _Ctx(g, dev, dtype, float(scale), **shape)


def _work(device: torch.device) -> torch.dtype:
    """float64, except on MPS which has none."""
    return torch.float32 if device.type == "mps" else torch.float64


def _randn(c: _Ctx, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=c.g, device=c.device, dtype=_work(c.device))


def _rand(c: _Ctx, *shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=c.g, device=c.device, dtype=_work(c.device))


def _randint(c: _Ctx, low: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=c.g, device=c.device)


def _signs(c: _Ctx, *shape: int) -> torch.Tensor:
    return torch.where(_rand(c, *shape) < 0.5, -1.0, 1.0).to(_work(c.device))


def _positions(c: _Ctx, k: int) -> torch.Tensor:
    """``k`` distinct random key positions per row, ``[batch, k]``."""
    return _rand(c, c.batch, c.length).argsort(dim=1)[:, :k]


def _floor_to_dtype(value: float, dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` that is ``<= value`` (``value >= 0``)."""
    t = torch.tensor(value, dtype=torch.float64).to(dtype)
    if float(t) > value:
        t = torch.nextafter(t, torch.zeros_like(t))
    return float(t)


def _finish(x: torch.Tensor, dtype: torch.dtype, max_abs: float | None) -> torch.Tensor:
    """Clamp finite entries to ``±cap`` (``max_abs`` and the dtype's range), convert to ``dtype``.

    ``cap`` is representable in ``dtype`` and rounding is monotone, so the result stays within
    ``±max_abs``; ``-inf`` (masked keys) is kept.
    """
    limit = torch.finfo(dtype).max if max_abs is None else min(max_abs, torch.finfo(dtype).max)
    cap = _floor_to_dtype(limit, dtype)
    wide = x.to(_work(x.device))
    return torch.where(torch.isfinite(wide), wide.clamp(-cap, cap), wide).to(dtype)


# --------------------------------------------------------------------------- logit rows


def _gaussian(c: _Ctx) -> torch.Tensor:
    return c.scale * _randn(c, c.batch, c.length)


def _uniform_bounded(c: _Ctx) -> torch.Tensor:
    """Uniform in ``[-a, a]``, ``a`` = scale rounded towards zero into the dtype (so the bound
    holds after conversion)."""
    edge = _floor_to_dtype(min(c.scale, torch.finfo(c.dtype).max), c.dtype)
    return edge * (2 * _rand(c, c.batch, c.length) - 1)


def _exact_ties(c: _Ctx) -> torch.Tensor:
    """1 to min(L-1, 4) distinct levels per row (1 = all equal), so every row has a tie."""
    m = int(_randint(c, 1, max(1, min(c.length - 1, 4)) + 1))
    levels = c.scale * _randn(c, c.batch, m)
    return levels.gather(1, _randint(c, 0, m, c.batch, c.length))


def _two_way_tie(c: _Ctx) -> torch.Tensor:
    """Two equal maxima, the rest at least ``TIE_GAP`` below (Corollary 3's witness)."""
    top = c.scale * _randn(c, c.batch, 1)
    rest = top - TIE_GAP - c.scale * _rand(c, c.batch, c.length)
    return rest.scatter(1, _positions(c, 2), top.expand(-1, 2))


def _near_ties(c: _Ctx) -> torch.Tensor:
    """Values ``base + k ulp`` of the target dtype, k = 0 … span (each present), span ≤ 3."""
    span = int(_randint(c, 1, min(3, c.length - 1) + 1))
    magnitude = min(c.scale, torch.finfo(c.dtype).max / 2)
    x = (magnitude * (2 * _rand(c, c.batch, 1) - 1)).to(c.dtype).expand(-1, c.length)
    steps = _randint(c, 0, span + 1, c.batch, c.length)
    every = torch.arange(span + 1, device=c.device).expand(c.batch, -1)
    steps = steps.scatter(1, _positions(c, span + 1), every)
    up = torch.full_like(x, math.inf)
    for step in range(span):
        x = torch.where(steps > step, torch.nextafter(x, up), x)
    return x


def _huge_range(c: _Ctx) -> torch.Tensor:
    """Uniform in ``[-s, s]`` with ``+s`` (and ``-s`` when L ≥ 2) present; ``s`` is huge."""
    x = c.scale * (2 * _rand(c, c.batch, c.length) - 1)
    k = min(2, c.length)
    ends = torch.tensor([c.scale, -c.scale][:k], dtype=x.dtype, device=c.device)
    return x.scatter(1, _positions(c, k), ends.expand(c.batch, -1))


def _masked(c: _Ctx) -> torch.Tensor:
    """Gaussian rows with some ``-inf`` keys; every row keeps ≥ 1 unmasked and ≥ 1 masked key."""
    x = _gaussian(c)
    mask = _rand(c, c.batch, c.length) < 0.1 + 0.8 * _rand(c, 1)
    pos = _positions(c, 2)
    mask = mask.scatter(1, pos[:, :1], False).scatter(1, pos[:, 1:], True)
    return x.masked_fill(mask, -math.inf)


def _fully_masked(c: _Ctx) -> torch.Tensor:
    """Gaussian rows, a random non-empty set of them entirely ``-inf``."""
    x = _gaussian(c)
    rows = _rand(c, c.batch) < 0.5
    rows[_randint(c, 0, c.batch, 1)] = True
    return x.masked_fill(rows[:, None], -math.inf)


def _mixed_scale(c: _Ctx) -> torch.Tensor:
    """Row ``r`` has scale ``scale·10**e_r``, ``e`` spread over ``MIXED_EXPONENTS``."""
    lo, hi = MIXED_EXPONENTS
    if c.batch == 1:
        exps = lo + (hi - lo) * _rand(c, 1)
    else:
        grid = torch.linspace(lo, hi, c.batch, device=c.device, dtype=_work(c.device))
        exps = grid[torch.randperm(c.batch, generator=c.g, device=c.device)]
    return c.scale * torch.pow(10.0, exps)[:, None] * _randn(c, c.batch, c.length)


def _one_hot_like(c: _Ctx) -> torch.Tensor:
    """Gaussian rows with one logit ``PEAK_MARGIN`` above the row's maximum."""
    x = _gaussian(c)
    peak = x.amax(dim=1, keepdim=True) + PEAK_MARGIN
    return x.scatter(1, _positions(c, 1), peak)


_ROW_BUILDERS: dict[str, Callable[[_Ctx], torch.Tensor]] = {
    "gaussian": _gaussian,
    "uniform_bounded": _uniform_bounded,
    "exact_ties": _exact_ties,
    "two_way_tie": _two_way_tie,
    "near_ties": _near_ties,
    "huge_range": _huge_range,
    "masked": _masked,
    "fully_masked": _fully_masked,
    "single": _gaussian,
    "mixed_scale": _mixed_scale,
    "one_hot_like": _one_hot_like,
}


def _kind_bounds(kind: str, lo: int, hi: int) -> tuple[int, int]:
    """The length range of ``kind`` intersected with ``[lo, hi]`` (may be empty)."""
    klo, khi = _KIND_LENGTHS.get(kind, (1, None))
    return max(lo, klo), min(hi, hi if khi is None else khi)


def _kind_problem(kind: str, lo: int, hi: int, names: tuple[str, str], **known: Any) -> str | None:
    """Why ``kind`` cannot be built with these options, or None.

    ``known`` holds the options known so far: ``batch``, ``max_abs``, ``allow_mask`` (absent or
    None = unknown, no constraint).
    """
    klo, khi = _KIND_LENGTHS.get(kind, (1, None))
    if khi is not None and lo > khi:
        return f"needs length <= {khi}, but {names[0]}={lo}"
    if hi < klo:
        return f"needs length >= {klo}, but {names[1]}={hi}"
    if kind in MASK_KINDS and known.get("allow_mask") is False:
        return "puts -inf into the scores, but allow_mask=False"
    if kind == "mixed_scale" and known.get("batch") == 1:
        return "needs batch >= 2, but batch=1"
    max_abs = known.get("max_abs")
    if kind == "huge_range" and max_abs is not None and max_abs < HUGE_MAGNITUDES[0]:
        return f"needs max_abs >= {HUGE_MAGNITUDES[0]:g}, but max_abs={max_abs!r}"
    return None


def _check_row_key(kind, length, batch, dtype, scale, seed, max_abs) -> None:
    """Validate the arguments of :func:`build_rows`."""
    _check_member("kind", kind, ALL_KINDS)
    _check_int("length", length, 1)
    _check_int("batch", batch, 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_positive("scale", scale)
    _check_int("seed", seed, 0, 2**64 - 1)
    _static(max_abs, _positive_check("max_abs", optional=True))
    problem = _kind_problem(kind, length, length, ("length", "length"), max_abs=max_abs)
    if problem:
        raise InvalidArgument(f"kind={kind!r} {problem}")


def build_rows(
    kind: str,
    *,
    length: int,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    scale: float | None = None,
    seed: int = 0,
    max_abs: float | None = None,
    device: Any = "cpu",
) -> Rows:
    """Build the ``[batch, length]`` logit rows of one adversarial ``kind`` (see
    :func:`logit_rows`), deterministically from ``seed``.

    ``scale`` is the kind's magnitude (the std, the bound ``a``, the huge ``s`` of
    ``huge_range``, the base of ``mixed_scale``'s row scales); None means 1.0, and
    ``HUGE_MAGNITUDES[0]`` for ``huge_range``. Finite entries are clamped to ``±max_abs`` and to
    the range of ``dtype``.
    """
    if scale is None:
        scale = HUGE_MAGNITUDES[0] if kind == "huge_range" else 1.0
    _check_row_key(kind, length, batch, dtype, scale, seed, max_abs)
    c = _ctx(seed, device, dtype, scale, batch=batch, length=length)
    scores = _finish(_ROW_BUILDERS[kind](c), dtype, max_abs)
    return Rows(scores, kind, length, batch, dtype, float(scale), seed, max_abs)


def logit_rows(
    *,
    min_length: int | SearchStrategy[int] = 1,
    max_length: int | SearchStrategy[int] = 64,
    batch: int | SearchStrategy[int] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    kinds: Sequence[str] | SearchStrategy[str] | None = None,
    scale: float | SearchStrategy[float] | None = None,
    max_abs: float | SearchStrategy[float] | None = None,
    allow_mask: bool = True,
    device: Any = "cpu",
) -> SearchStrategy[Rows]:
    """Batched logit rows ``[batch, L]`` of adversarial kinds, as :class:`Rows`.

    Kinds (``ALL_KINDS``, simplest first): ``gaussian`` (N(0, scale²)); ``uniform_bounded``
    (uniform in [−scale, scale]); ``exact_ties`` (1–4 distinct levels per row, 1 = all equal);
    ``two_way_tie`` (two equal maxima, the rest ``TIE_GAP`` or more below: Corollary 3's
    witness); ``near_ties`` (values ``k`` ulps of the dtype apart, built with
    ``torch.nextafter``); ``huge_range`` (uniform in ``[−s, s]`` with ``±s`` present, ``s`` from
    ``HUGE_MAGNITUDES`` that fit the dtype and ``max_abs``: ``exp`` overflows in fp32);
    ``masked`` (some ``-inf`` keys, at least one unmasked per row); ``fully_masked`` (at least
    one whole row ``-inf``); ``single`` (L = 1); ``mixed_scale`` (row scales spread from
    1e-6·scale to 1e4·scale); ``one_hot_like`` (one logit ``PEAK_MARGIN`` above the rest).

    ``kinds=None`` uses every kind the other options allow; an explicit kind that they rule
    out (``single`` with ``min_length > 1``, ``masked`` with ``allow_mask=False``, …) is an
    error. ``batch=None`` draws 1–4 rows (2–4 for ``mixed_scale``); ``scale=None`` draws from
    :func:`scales`; ``max_abs`` caps every finite ``|score|`` (the margins of ``two_way_tie`` and
    ``one_hot_like`` shrink with it). Shrinks towards the shortest length, the first kind and
    dtype, one row, scale 1 and seed 0.
    """
    _check_length_options(min_length, max_length)
    _check_common(batch, dtypes, device)
    _static(scale, _positive_check("scale"))
    _static(max_abs, _positive_check("max_abs", optional=True))
    kinds = _static_row_kinds(kinds, min_length, max_length, batch, max_abs, allow_mask)
    scale = scales() if scale is None else scale
    options = (min_length, max_length, batch, dtypes, kinds, scale, max_abs)
    return _logit_rows(options, bool(allow_mask), device)


def _static_row_kinds(kinds, min_length, max_length, batch, max_abs, allow_mask):
    """Validate explicit kinds against the options known now; default to all that fit."""
    _check_choices("kinds", kinds if kinds is not None else ALL_KINDS, ALL_KINDS)
    if isinstance(kinds, SearchStrategy):
        return kinds
    lo, hi = (1, math.inf) if _any_strategy(min_length, max_length) else (min_length, max_length)
    known = {
        "batch": None if _any_strategy(batch) else batch,
        "max_abs": None if _any_strategy(max_abs) else max_abs,
        "allow_mask": bool(allow_mask),
    }
    names = ("min_length", "max_length")
    if kinds is None:
        return tuple(k for k in ALL_KINDS if not _kind_problem(k, lo, hi, names, **known))
    for kind in kinds:
        problem = _kind_problem(kind, lo, hi, names, **known)
        if problem:
            raise InvalidArgument(f"kinds contains {kind!r}, which {problem}")
    return tuple(kinds)


@st.composite
def _logit_rows(draw: Callable, options: tuple, allow_mask: bool, device: Any) -> Rows:
    min_length, max_length, batch, dtypes_, kinds, scale, max_abs = options
    lo, hi = _draw_bounds(draw, min_length, max_length)
    max_abs = _resolve(draw, max_abs, _positive_check("max_abs", optional=True))
    dtype = _draw_dtype(draw, dtypes_)
    known = {"batch": batch if isinstance(batch, int) else None, "max_abs": max_abs}
    kind = _draw_row_kind(draw, kinds, lo, hi, dict(known, allow_mask=allow_mask))
    length = draw(_lengths(*_kind_bounds(kind, lo, hi)))
    rows = _draw_batch(draw, batch, 2 if kind == "mixed_scale" else 1)
    scale = _draw_row_scale(draw, kind, scale, dtype, max_abs)
    seed = draw(_SEEDS)
    return build_rows(
        kind, length=length, batch=rows, dtype=dtype, scale=scale, seed=seed,
        max_abs=max_abs, device=_resolve(draw, device, _check_device),
    )  # fmt: skip


def _draw_row_kind(draw: Callable, kinds: Any, lo: int, hi: int, known: dict) -> str:
    """A kind that fits the drawn options (a drawn kind that does not fit is an error)."""
    names = ("min_length", "max_length")
    if isinstance(kinds, SearchStrategy):
        kind = _draw_kind(draw, kinds, ALL_KINDS)
        problem = _kind_problem(kind, lo, hi, names, **known)
        if problem:
            raise InvalidArgument(f"kinds drew {kind!r}, which {problem}")
        return kind
    fitting = [k for k in kinds if not _kind_problem(k, lo, hi, names, **known)]
    if not fitting:
        raise InvalidArgument(
            f"no kind in kinds={kinds!r} fits min_length={lo}, max_length={hi}, "
            f"batch={known['batch']!r}, max_abs={known['max_abs']!r}, "
            f"allow_mask={known['allow_mask']!r}"
        )
    return draw(st.sampled_from(fitting))


def _draw_row_scale(draw: Callable, kind: str, scale: Any, dtype: torch.dtype, max_abs) -> float:
    """The kind's magnitude: a huge one for ``huge_range``, else ``scale`` capped by max_abs."""
    cap = torch.finfo(dtype).max if max_abs is None else min(max_abs, torch.finfo(dtype).max)
    if kind == "huge_range":
        return draw(st.sampled_from([m for m in HUGE_MAGNITUDES if m <= cap]))
    return min(float(_resolve(draw, scale, _positive_check("scale"))), cap)


# --------------------------------------------------------------------------- bounded rows


def _bounded_extremes(c: _Ctx) -> torch.Tensor:
    return c.scale * _signs(c, c.batch, c.length)


def _bounded_peak(c: _Ctx) -> torch.Tensor:
    """One logit ``+a``, the rest ``-a`` (the fixed-margin peak of THEORY.md §2)."""
    x = torch.full((c.batch, c.length), -c.scale, device=c.device, dtype=_work(c.device))
    return x.scatter(1, _positions(c, 1), c.scale)


_BOUNDED_BUILDERS = {
    "uniform": _uniform_bounded,
    "extremes": _bounded_extremes,
    "peak": _bounded_peak,
}


def build_bounded_rows(
    kind: str,
    *,
    a: float,
    length: int,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: Any = "cpu",
) -> BoundedRows:
    """Build ``[batch, length]`` rows with every logit in ``[-a, a]`` (``±a`` is rounded towards
    zero into ``dtype``, so the bound holds exactly after conversion)."""
    _check_member("kind", kind, BOUNDED_KINDS)
    _check_positive("a", a)
    _check_int("length", length, 1)
    _check_int("batch", batch, 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_int("seed", seed, 0, 2**64 - 1)
    edge = _floor_to_dtype(min(a, torch.finfo(dtype).max), dtype)
    c = _ctx(seed, device, dtype, edge, batch=batch, length=length)
    scores = _finish(_BOUNDED_BUILDERS[kind](c), dtype, a)
    return BoundedRows(scores, float(a), kind, length, batch, dtype, seed)


def bounded_rows(
    *,
    a: float | SearchStrategy[float] | None = None,
    min_length: int | SearchStrategy[int] = 1,
    max_length: int | SearchStrategy[int] = 64,
    batch: int | SearchStrategy[int] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    kinds: Sequence[str] | SearchStrategy[str] = BOUNDED_KINDS,
    device: Any = "cpu",
) -> SearchStrategy[BoundedRows]:
    """Rows with every logit in ``[-a, a]`` (Lemma 1's hypotheses), as :class:`BoundedRows`.

    Kinds (``BOUNDED_KINDS``): ``uniform``; ``extremes`` (every logit ``±a``); ``peak`` (one
    ``+a``, the rest ``-a``, the tight case). ``a=None`` draws from
    ``scales(min_value=1e-2, max_value=10)``, shrinking to 1.
    """
    _static(a, _positive_check("a"))
    _check_length_options(min_length, max_length)
    _check_common(batch, dtypes, device)
    _check_choices("kinds", kinds, BOUNDED_KINDS)
    a = scales(min_value=1e-2, max_value=10.0) if a is None else a
    return _bounded_rows((a, min_length, max_length, batch, dtypes, kinds), device)


@st.composite
def _bounded_rows(draw: Callable, options: tuple, device: Any) -> BoundedRows:
    a, min_length, max_length, batch, dtypes_, kinds = options
    lo, hi = _draw_bounds(draw, min_length, max_length)
    dtype = _draw_dtype(draw, dtypes_)
    kind = _draw_kind(draw, kinds, BOUNDED_KINDS)
    length = draw(_lengths(lo, hi))
    rows = _draw_batch(draw, batch)
    a = _resolve(draw, a, _positive_check("a"))
    seed = draw(_SEEDS)
    return build_bounded_rows(
        kind, a=a, length=length, batch=rows, dtype=dtype, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip


# --------------------------------------------------------------------------- queries and keys


def _keys_gaussian(c: _Ctx, q: torch.Tensor) -> torch.Tensor:
    return _randn(c, c.batch, c.length, c.d)


def _keys_aligned(c: _Ctx, q: torch.Tensor) -> torch.Tensor:
    """Keys ``±√d·q̂``: every ``|logit|`` equals Δ, the tight case of Corollary 1."""
    direction = q / q.norm(dim=-1, keepdim=True)
    return _signs(c, c.batch, c.length, 1) * math.sqrt(c.d) * direction[:, None, :]


def _keys_mixed_norms(c: _Ctx, q: torch.Tensor) -> torch.Tensor:
    """Gaussian keys with norms spread over four decades (1e-3 … 10)."""
    norms = torch.pow(10.0, -3 + 4 * _rand(c, c.batch, c.length, 1))
    return norms * _randn(c, c.batch, c.length, c.d)


_KEY_BUILDERS = {
    "gaussian": _keys_gaussian,
    "aligned": _keys_aligned,
    "mixed_norms": _keys_mixed_norms,
}


def _fit_query(q: torch.Tensor, K: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Scale ``q`` down where ``Δ = ‖q‖·max‖k‖`` would not fit comfortably in ``dtype``."""
    delta = q.norm(dim=-1) * K.norm(dim=-1).amax(dim=-1)
    factor = (torch.finfo(dtype).max / 4 / delta).clamp(max=1.0)
    return q * factor[:, None]


def _delta(q: torch.Tensor, K: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``‖q‖·max_j‖k_j‖`` in float64, raised to ``max |logit|`` if rounding put one above it."""
    wide = _work(q.device)
    cs = q.to(wide).norm(dim=-1) * K.to(wide).norm(dim=-1).amax(dim=-1)
    return torch.maximum(cs, logits.to(wide).abs().amax(dim=-1))


def build_query_keys(
    kind: str,
    *,
    length: int,
    d: int,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
    seed: int = 0,
    device: Any = "cpu",
) -> QueryKeys:
    """Build queries ``q`` (entries N(0, scale²/d), so a Gaussian logit has std ≈ scale) and
    keys ``K`` of one kind (``QUERY_KEY_KINDS``), with ``logits = K q`` and Δ."""
    _check_member("kind", kind, QUERY_KEY_KINDS)
    for name, value in (("length", length), ("d", d), ("batch", batch)):
        _check_int(name, value, 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_positive("scale", scale)
    _check_int("seed", seed, 0, 2**64 - 1)
    c = _ctx(seed, device, dtype, scale, batch=batch, length=length, d=d)
    q = c.scale / math.sqrt(d) * _randn(c, batch, d)
    K = _KEY_BUILDERS[kind](c, q)
    q, K = _finish(_fit_query(q, K, dtype), dtype, None), _finish(K, dtype, None)
    logits = torch.einsum("bld,bd->bl", K.to(_work(c.device)), q.to(_work(c.device))).to(dtype)
    return QueryKeys(
        q, K, logits, _delta(q, K, logits), kind, length, d, batch, dtype, float(scale), seed
    )


def query_key_sets(
    *,
    min_length: int | SearchStrategy[int] = 1,
    max_length: int | SearchStrategy[int] = 64,
    d: int | SearchStrategy[int] | None = None,
    batch: int | SearchStrategy[int] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    kinds: Sequence[str] | SearchStrategy[str] = QUERY_KEY_KINDS,
    scale: float | SearchStrategy[float] | None = None,
    device: Any = "cpu",
) -> SearchStrategy[QueryKeys]:
    """Queries, keys, ``logits = K q`` and ``Δ = ‖q‖·max_j‖k_j‖`` for Corollary 1, as
    :class:`QueryKeys` (every logit lies in ``[-Δ, Δ]``).

    Kinds (``QUERY_KEY_KINDS``): ``gaussian``; ``aligned`` (keys ``±√d·q̂``, so ``|logit| = Δ``);
    ``mixed_norms`` (key norms over four decades). ``d=None`` draws 1–64 (log-spread);
    ``scale=None`` draws from :func:`scales`.
    """
    _check_length_options(min_length, max_length)
    _static(d, _int_check("d", 1))
    _check_common(batch, dtypes, device)
    _check_choices("kinds", kinds, QUERY_KEY_KINDS)
    _static(scale, _positive_check("scale"))
    d = _lengths(1, 64) if d is None else d
    scale = scales() if scale is None else scale
    options = (min_length, max_length, d, batch, dtypes, kinds, scale)
    return _query_key_sets(options, device)


@st.composite
def _query_key_sets(draw: Callable, options: tuple, device: Any) -> QueryKeys:
    min_length, max_length, d, batch, dtypes_, kinds, scale = options
    lo, hi = _draw_bounds(draw, min_length, max_length)
    dtype = _draw_dtype(draw, dtypes_)
    kind = _draw_kind(draw, kinds, QUERY_KEY_KINDS)
    length = draw(_lengths(lo, hi))
    dim = _resolve(draw, d, _int_check("d", 1))
    rows = _draw_batch(draw, batch)
    scale = _resolve(draw, scale, _positive_check("scale"))
    seed = draw(_SEEDS)
    return build_query_keys(
        kind, length=length, d=dim, batch=rows, dtype=dtype, scale=scale, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip


# --------------------------------------------------------------------------- embeddings


def _sphere(c: _Ctx, n: int, radius: float) -> torch.Tensor:
    """``n`` points uniform on the sphere of ``radius`` in ``R^d`` (float64)."""
    z = _randn(c, n, c.d)
    return radius * z / z.norm(dim=1, keepdim=True)


def _duplicate_rows(x: torch.Tensor) -> torch.Tensor:
    """Boolean mask of rows equal to some other row."""
    _, inverse, counts = torch.unique(x, dim=0, return_inverse=True, return_counts=True)
    return counts[inverse] > 1


def _distinct_sphere(c: _Ctx, radius: float) -> torch.Tensor:
    """Sphere points that are pairwise distinct *after* rounding to the dtype (δ > 0).

    Rows that collide are redrawn from the same generator, so the result stays deterministic.
    """
    x = _finish(_sphere(c, c.length, radius), c.dtype, None)
    for _ in range(_MAX_RESAMPLES):
        dup = _duplicate_rows(x)
        if not bool(dup.any()):
            return x
        x[dup] = _finish(_sphere(c, int(dup.sum()), radius), c.dtype, None)
    raise InvalidArgument(
        f"could not place length={c.length} distinct points on a sphere in d={c.d} in "
        f"{c.dtype}; use a smaller length, a larger d or a wider dtype"
    )


def _min_pairwise_distance(x: torch.Tensor) -> float:
    """Smallest ``‖x_i − x_j‖`` over ``i ≠ j`` in float64, computed directly (no Gram trick,
    which loses close pairs) in chunks of rows."""
    wide = x.to(_work(x.device))
    n = wide.shape[0]
    step = max(1, _CHUNK_PAIRS // n)
    best = math.inf
    for start in range(0, n, step):
        dist = torch.cdist(
            wide[start : start + step], wide, compute_mode="donot_use_mm_for_euclid_dist"
        )
        rows = torch.arange(dist.shape[0], device=x.device)
        dist[rows, rows + start] = math.inf
        best = min(best, float(dist.min()))
    return best


def _check_embedding_key(length: int, d: int, n_top: int, dtype: torch.dtype, seed: int) -> None:
    """Validate the arguments every embedding builder shares."""
    _check_int("length", length, 2)
    _check_int("d", d, 1)
    _check_int("n_top", n_top, 1, length - 1)
    _check_member("dtype", dtype, FLOAT_DTYPES)
    _check_int("seed", seed, 0, 2**64 - 1)


def build_sphere_embeddings(
    *,
    length: int,
    d: int,
    radius: float = 1.0,
    n_top: int = 1,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: Any = "cpu",
) -> Embeddings:
    """Build ``length`` pairwise-distinct points uniform on the sphere of ``radius`` in ``R^d``
    and their minimum pairwise distance δ > 0 (cost O(length² · d) for δ)."""
    _check_embedding_key(length, d, n_top, dtype, seed)
    _check_positive("radius", radius)
    if radius > torch.finfo(dtype).max / 2:
        raise InvalidArgument(f"radius={radius!r} does not fit in {dtype}")
    if d == 1 and length > 2:
        raise InvalidArgument(f"d=1 has only 2 points on a sphere, but length={length}")
    c = _ctx(seed, device, dtype, radius, length=length, d=d)
    x = _distinct_sphere(c, float(radius))
    return Embeddings(x, float(radius), _min_pairwise_distance(x), n_top, length, d, dtype, seed)


def sphere_embeddings(
    *,
    min_length: int | SearchStrategy[int] = 2,
    max_length: int | SearchStrategy[int] = 64,
    d: int | SearchStrategy[int] | None = None,
    radius: float | SearchStrategy[float] | None = None,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    device: Any = "cpu",
) -> SearchStrategy[Embeddings]:
    """Points uniform on the sphere of radius M with δ > 0 and a top-set size N (Theorem 2's
    hypotheses), as :class:`Embeddings`.

    ``d=None`` draws up to 64 (log-spread; 1 only when length ≤ 2, since a 1-d sphere has two
    points, and from 4 for half precision past length 64); points that round to the same value
    are redrawn, and a set that cannot be made distinct (a fixed small ``d``, a long set, half
    precision) raises :class:`InvalidArgument`. ``radius=None`` draws M from :func:`scales`.
    ``min_length`` is at least 2. Shrinks to length 2, d 1, M 1, N 1, seed 0.
    """
    _check_length_options(min_length, max_length, shortest=2)
    _static(d, _int_check("d", 1))
    _static(radius, _positive_check("radius"))
    _check_choices("dtypes", dtypes, FLOAT_DTYPES)
    _static(device, _check_device)
    if d == 1 and isinstance(min_length, int) and min_length > 2:
        raise InvalidArgument(f"d=1 has only 2 points on a sphere, but min_length={min_length}")
    options = (min_length, max_length, d, scales() if radius is None else radius, dtypes)
    return _sphere_embeddings(options, device)


@st.composite
def _sphere_embeddings(draw: Callable, options: tuple, device: Any) -> Embeddings:
    min_length, max_length, d, radius, dtypes_ = options
    lo, hi = _draw_bounds(draw, min_length, max_length, shortest=2)
    dtype = _draw_dtype(draw, dtypes_)
    length, dim = _draw_length_and_d(draw, lo, hi, d, dtype)
    radius = _resolve(draw, radius, _positive_check("radius"))
    n_top = draw(st.integers(1, length - 1))
    seed = draw(_SEEDS)
    return build_sphere_embeddings(
        length=length, d=dim, radius=radius, n_top=n_top, dtype=dtype, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip


def _smallest_sphere_d(length: int, dtype: torch.dtype) -> int:
    """Default lower bound on d: a 1-d sphere has 2 points, and a half-precision circle only a
    few thousand, so long half-precision sets start at d = 4."""
    if length <= 2:
        return 1
    return 4 if length > 64 and torch.finfo(dtype).bits == 16 else 2


def _draw_length_and_d(draw: Callable, lo: int, hi: int, d: Any, dtype) -> tuple[int, int]:
    """Length and dimension, ``d = 1`` only for length ≤ 2 (see :func:`_smallest_sphere_d`)."""
    if d is None:
        length = draw(_lengths(lo, hi))
        return length, draw(_lengths(_smallest_sphere_d(length, dtype), 64))
    dim = _resolve(draw, d, _int_check("d", 1))
    if dim == 1 and lo > 2:
        raise InvalidArgument(f"d=1 has only 2 points on a sphere, but min_length={lo}")
    return draw(_lengths(lo, min(hi, 2) if dim == 1 else hi)), dim


def _embed_gaussian(c: _Ctx) -> torch.Tensor:
    return c.scale * _randn(c, c.length, c.d)


def _embed_mixed_norms(c: _Ctx) -> torch.Tensor:
    """Gaussian points with norms spread over six decades."""
    return _embed_gaussian(c) * torch.pow(10.0, -3 + 6 * _rand(c, c.length, 1))


def _embed_duplicates(c: _Ctx) -> torch.Tensor:
    """1 … length-1 distinct points, repeated: some embeddings coincide."""
    m = int(_randint(c, 1, c.length))
    points = c.scale * _randn(c, m, c.d)
    return points[_randint(c, 0, m, c.length)]


def _embed_collinear(c: _Ctx) -> torch.Tensor:
    """Points ``t_i·v`` on one line through the origin."""
    v = _randn(c, c.d)
    return c.scale * _randn(c, c.length, 1) * (v / v.norm())


_EMBEDDING_BUILDERS = {
    "gaussian": _embed_gaussian,
    "mixed_norms": _embed_mixed_norms,
    "duplicates": _embed_duplicates,
    "collinear": _embed_collinear,
}


def build_embedding_set(
    kind: str,
    *,
    length: int,
    d: int,
    n_top: int = 1,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
    seed: int = 0,
    device: Any = "cpu",
) -> EmbeddingSet:
    """Build ``length`` embeddings in ``R^d`` of one kind (``EMBEDDING_KINDS``)."""
    _check_member("kind", kind, EMBEDDING_KINDS)
    _check_embedding_key(length, d, n_top, dtype, seed)
    _check_positive("scale", scale)
    c = _ctx(seed, device, dtype, scale, length=length, d=d)
    x = _finish(_EMBEDDING_BUILDERS[kind](c), dtype, None)
    return EmbeddingSet(x, n_top, kind, length, d, dtype, float(scale), seed)


def embedding_sets(
    *,
    min_length: int | SearchStrategy[int] = 2,
    max_length: int | SearchStrategy[int] = 64,
    d: int | SearchStrategy[int] | None = None,
    scale: float | SearchStrategy[float] | None = None,
    kinds: Sequence[str] | SearchStrategy[str] = EMBEDDING_KINDS,
    dtypes: Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
    device: Any = "cpu",
) -> SearchStrategy[EmbeddingSet]:
    """Arbitrary embeddings and a top-set size N in 1 … L−1 (Theorem 1), as
    :class:`EmbeddingSet`.

    Kinds (``EMBEDDING_KINDS``): ``gaussian``; ``mixed_norms`` (norms over six decades);
    ``duplicates`` (some points coincide); ``collinear``. ``d=None`` draws 1–64 (log-spread);
    ``scale=None`` draws from :func:`scales`. For weights of the same length, draw
    ``logit_rows(min_length=e.length, max_length=e.length)`` after this one (``st.data()``).
    """
    _check_length_options(min_length, max_length, shortest=2)
    _static(d, _int_check("d", 1))
    _static(scale, _positive_check("scale"))
    _check_choices("kinds", kinds, EMBEDDING_KINDS)
    _check_choices("dtypes", dtypes, FLOAT_DTYPES)
    _static(device, _check_device)
    d = _lengths(1, 64) if d is None else d
    options = (min_length, max_length, d, scales() if scale is None else scale, kinds, dtypes)
    return _embedding_sets(options, device)


@st.composite
def _embedding_sets(draw: Callable, options: tuple, device: Any) -> EmbeddingSet:
    min_length, max_length, d, scale, kinds, dtypes_ = options
    lo, hi = _draw_bounds(draw, min_length, max_length, shortest=2)
    dtype = _draw_dtype(draw, dtypes_)
    kind = _draw_kind(draw, kinds, EMBEDDING_KINDS)
    length = draw(_lengths(lo, hi))
    dim = _resolve(draw, d, _int_check("d", 1))
    scale = _resolve(draw, scale, _positive_check("scale"))
    n_top = draw(st.integers(1, length - 1))
    seed = draw(_SEEDS)
    return build_embedding_set(
        kind, length=length, d=dim, n_top=n_top, dtype=dtype, scale=scale, seed=seed,
        device=_resolve(draw, device, _check_device),
    )  # fmt: skip


# --------------------------------------------------------------------------- repro

#: Builder and ``kwarg[=field]`` list that rebuild each record type.
_REPRO = {
    "Rows": ("build_rows", "length batch dtype scale seed max_abs"),
    "BoundedRows": ("build_bounded_rows", "a length batch dtype seed"),
    "QueryKeys": ("build_query_keys", "length d batch dtype scale seed"),
    "Embeddings": ("build_sphere_embeddings", "length d radius=M n_top dtype seed"),
    "EmbeddingSet": ("build_embedding_set", "length d n_top dtype scale seed"),
}


def repro(record: NamedTuple) -> str:
    """The one-line call that rebuilds ``record`` exactly (needs ``import torch,
    attnverify.strategies``), e.g. ``attnverify.strategies.build_rows('gaussian', length=3,
    batch=1, dtype=torch.float32, scale=1.0, seed=0, max_abs=None, device='cpu')``."""
    builder, spec = _REPRO[type(record).__name__]
    args = [repr(record.kind)] if "kind" in record._fields else []
    for item in spec.split():
        kwarg, _, field = item.partition("=")
        args.append(f"{kwarg}={getattr(record, field or kwarg)!r}")
    args.append(f"device={str(record[0].device)!r}")
    return f"attnverify.strategies.{builder}({', '.join(args)})"
