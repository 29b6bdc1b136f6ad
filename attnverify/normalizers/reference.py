"""Float64 references for the built-ins, written from their defining formulas (docs/NORMALIZERS.md).

Each reference is an independent, deliberately plain implementation: it shares no code with the
built-in it checks (``dense.py`` / ``sparse.py``), runs in float64 whatever the input dtype
(inside :func:`precision`, in the dtype given: the same-precision baseline of the tolerance), and
favours the textbook form over speed (sort-based exact thresholds for sparsemax and 1.5-entmax,
bisection to float64 resolution for α-entmax). The only numerical care taken is what the formula
needs to be evaluable at all: a row shift where the map is shift-invariant (it changes nothing
mathematically), ``expm1`` where ``e^z − 1`` would cancel. The ``matches_reference`` property
compares a normalizer with these, within the tolerance of the normalizer's dtype.

Conventions (the same contract as the built-ins): rows along ``dim``; ``-inf`` is a masked key
with weight exactly 0 that takes no part in the row; a fully masked row gives all zeros; the
temperature divides the scores, ``f(z; T) = f(z/T)``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from attnverify.spec import Kernel

F64 = torch.float64
NEG_INF = float("-inf")
#: Bisection steps for α-entmax: the bracket [−1, 0] halves to below float64 resolution.
BISECTION_STEPS = 200
#: The precision the formulas run in: float64, or the dtype of :func:`precision` (a
#: same-precision baseline).
_WORK = [F64]


@contextlib.contextmanager
def precision(dtype: torch.dtype) -> Iterator[None]:
    """Evaluate the formulas in ``dtype`` instead of float64 while the context is open: the
    same-precision baseline of the tolerance rule (docs/THEORY.md, "How close is close"), the
    formula as written, rounded as a plain implementation in that dtype rounds it."""
    _WORK.append(dtype)
    try:
        yield
    finally:
        _WORK.pop()


def _rows(scores: Tensor, dim: int, temperature: float) -> tuple[Tensor, Tensor]:
    """``(x, live)``: the scores divided by T in float64 (or the :func:`precision` in force)
    with rows on the last dim, and the unmasked keys."""
    z = scores.detach().to(_WORK[-1]).movedim(dim, -1)
    live = z != NEG_INF
    return z / float(temperature), live


def _out(p: Tensor, live: Tensor, dim: int) -> Tensor:
    """Masked keys and fully masked rows to exactly 0; rows back to ``dim``."""
    p = torch.where(live, p, torch.zeros_like(p))
    return p.movedim(-1, dim)


def _max(x: Tensor, live: Tensor) -> Tensor:
    """Largest unmasked value per row (keepdim); 0 for a fully masked row."""
    m = torch.where(live, x, torch.full_like(x, NEG_INF)).amax(-1, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _count(live: Tensor) -> Tensor:
    return live.sum(-1, keepdim=True).to(_WORK[-1])


def _normalise(w: Tensor) -> Tensor:
    """``w / Σw`` per row; a row summing to 0 gives zeros."""
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), torch.zeros_like(w))


def _softmax_rows(x: Tensor, live: Tensor) -> Tensor:
    """``exp(x_i) / Σ_j exp(x_j)`` over the unmasked keys (shifted by the row max: exact)."""
    e = torch.where(live, torch.exp(x - _max(x, live)), torch.zeros_like(x))
    return _normalise(e)


# --------------------------------------------------------------------------------------------
# The softmax family


def softmax(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """``exp(z_i/T) / Σ_j exp(z_j/T)``."""
    x, live = _rows(scores, dim, temperature)
    return _out(_softmax_rows(x, live), live, dim)


def ssmax(scores: Tensor, dim: int = -1, s: float = 0.43, temperature: float = 1.0) -> Tensor:
    """Scalable-Softmax: ``softmax(s · log(n) · z / T)``, n = number of unmasked keys."""
    x, live = _rows(scores, dim, temperature)
    scaled = s * torch.log(_count(live).clamp_min(1.0)) * (x - _max(x, live))
    return _out(_softmax_rows(scaled, live), live, dim)


def softmax1(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """``exp(z_i/T) / (1 + Σ_j exp(z_j/T))``; numerator and denominator times ``e^{−m}``."""
    x, live = _rows(scores, dim, temperature)
    m = _max(x, live).clamp_min(0.0)
    e = torch.where(live, torch.exp(x - m), torch.zeros_like(x))
    return _out(e / (torch.exp(-m) + e.sum(-1, keepdim=True)), live, dim)


def sa_softmax(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """Self-Adjust Softmax: ``(z − min(z_min, 0)) / (max(0, z_max) − min(z_min, 0)) ⊙
    softmax(z/T)``; the factor of an all-zero row (0/0) is 0."""
    x, live = _rows(scores, dim, 1.0)
    lo = torch.where(live, x, torch.full_like(x, math.inf)).amin(-1, keepdim=True).clamp_max(0.0)
    hi = _max(x, live).clamp_min(0.0)
    span = hi - lo
    factor = torch.where(span > 0, (x - lo) / torch.where(span > 0, span, 1.0), 0.0)
    return _out(factor * _softmax_rows(x / float(temperature), live), live, dim)


def sigmoid(
    scores: Tensor, dim: int = -1, bias: float | None = None, temperature: float = 1.0
) -> Tensor:
    """``σ(z/T + b)``, ``b = −log n`` by default (n = number of unmasked keys)."""
    x, live = _rows(scores, dim, temperature)
    b = -torch.log(_count(live).clamp_min(1.0)) if bias is None else float(bias)
    return _out(1.0 / (1.0 + torch.exp(-(x + b))), live, dim)


def softpick(
    scores: Tensor, dim: int = -1, eps: float = 1e-6, temperature: float = 1.0
) -> Tensor:
    """``ReLU(e^z − 1) / (Σ_j |e^{z_j} − 1| + ε)`` on ``z/T``, numerator and denominator times
    ``e^{−m}``, ``m = max(0, max z)`` (the paper's max-shifted form); ``e^{−m}(e^z − 1)`` is
    ``e^{−m}·expm1(z)`` near 0 and ``e^{z−m} − e^{−m}`` elsewhere."""
    x, live = _rows(scores, dim, temperature)
    m = _max(x, live).clamp_min(0.0)
    near = x.abs() < 1.0
    small = torch.exp(-m) * torch.expm1(torch.where(near, x, 0.0))
    large = torch.exp(x - m) - torch.exp(-m)
    d = torch.where(live, torch.where(near, small, large), torch.zeros_like(x))
    den = d.abs().sum(-1, keepdim=True) + eps * torch.exp(-m)
    return _out(d.clamp_min(0.0) / den, live, dim)


def _stable_s(x: Tensor) -> Tensor:
    return torch.where(x >= 0, x.clamp_min(0.0) + 1.0, 1.0 / (1.0 - x.clamp_max(0.0)))


def stablemax(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """``s(z_i/T) / Σ_j s(z_j/T)``, ``s(x) = x + 1`` (x ≥ 0), ``1/(1 − x)`` (x < 0)."""
    x, live = _rows(scores, dim, temperature)
    s = torch.where(live, _stable_s(x), torch.zeros_like(x))
    s = s / s.amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)  # scale: exact
    return _out(_normalise(s), live, dim)


def relu_norm(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """``ReLU(z) / Σ_j ReLU(z_j)``; a row with no positive score gives zeros (the policy)."""
    x, live = _rows(scores, dim, temperature)
    r = torch.where(live, x.clamp_min(0.0), torch.zeros_like(x))
    r = r / r.amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)  # scale: exact
    return _out(_normalise(r), live, dim)


def dagpam(scores: Tensor, dim: int = -1, lam: float = 0.5, temperature: float = 1.0) -> Tensor:
    """``(1 + λ)·softmax(z/T) − λ·softmax(−z/T)`` over the unmasked keys."""
    x, live = _rows(scores, dim, temperature)
    neg = torch.where(live, -x, torch.full_like(x, NEG_INF))
    p = (1.0 + lam) * _softmax_rows(x, live) - lam * _softmax_rows(neg, live)
    return _out(p, live, dim)


# --------------------------------------------------------------------------------------------
# Sparse maps: exact thresholds


def _sorted(x: Tensor, live: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Unmasked values sorted descending (masked last, as 0), their liveness and ranks 1…L."""
    srt, order = torch.sort(torch.where(live, x, torch.full_like(x, NEG_INF)), -1, True)
    alive = live.gather(-1, order)
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype, device=x.device)
    return torch.where(alive, srt, torch.zeros_like(srt)), alive, k


def sparsemax(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """Euclidean projection of ``z/T`` onto the simplex: ``[z − τ]₊``, τ from the sorted row:
    the support is the largest k with ``1 + k·z_(k) > Σ_{i≤k} z_(i)``, ``τ = (Σ_{i≤K} z_(i) − 1)/K``
    (Martins & Astudillo 2016, Alg. 1)."""
    x, live = _rows(scores, dim, temperature)
    x = x - _max(x, live)
    srt, alive, k = _sorted(x, live)
    csum = srt.cumsum(-1)
    support = (1.0 + k * srt > csum) & alive
    size = support.sum(-1, keepdim=True).clamp_min(1)
    tau = (csum.gather(-1, size - 1) - 1.0) / size.to(x.dtype)
    return _out((x - tau).clamp_min(0.0), live, dim)


def entmax15(scores: Tensor, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """1.5-entmax: ``[z/2 − τ]₊²`` on ``z/T``, τ exact from the sorted row (Peters et al. 2019,
    Alg. 2): for the top k, ``τ_k = μ_k − sqrt((1 − k·(m2_k − μ_k²))/k)`` with μ, m2 the mean
    and mean square; the support is the largest k with ``τ_k ≤ z_(k)``."""
    x, live = _rows(scores, dim, temperature)
    x = (x - _max(x, live)) / 2.0
    srt, alive, k = _sorted(x, live)
    mean = srt.cumsum(-1) / k
    mean_sq = (srt * srt).cumsum(-1) / k
    delta = (1.0 - k * (mean_sq - mean * mean)) / k
    tau = mean - torch.sqrt(delta.clamp_min(0.0))
    support = (tau <= srt) & alive
    size = support.sum(-1, keepdim=True).clamp_min(1)
    return _out((x - tau.gather(-1, size - 1)).clamp_min(0.0) ** 2, live, dim)


def entmax_alpha(
    scores: Tensor, dim: int = -1, alpha: float = 1.5, temperature: float = 1.0
) -> Tensor:
    """α-entmax ``[(α−1)z − τ]₊^{1/(α−1)}`` on ``z/T``: softmax at α = 1, the exact sparsemax
    and 1.5-entmax at α = 2 and 1.5, otherwise τ by bisection on [−1, 0] (the row shifted to
    max 0) to float64 resolution, then the row normalised."""
    alpha = float(alpha)
    if alpha == 1.0:
        return softmax(scores, dim, temperature)
    if alpha == 2.0:
        return sparsemax(scores, dim, temperature)
    if alpha == 1.5:
        return entmax15(scores, dim, temperature)
    x, live = _rows(scores, dim, temperature)
    x = (alpha - 1.0) * (x - _max(x, live))
    x = torch.where(live, x, torch.full_like(x, NEG_INF))
    power = 1.0 / (alpha - 1.0)
    lo, hi = torch.full_like(x[..., :1], -1.0), torch.zeros_like(x[..., :1])
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        above = ((x - mid).clamp_min(0.0) ** power).sum(-1, keepdim=True) >= 1.0
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return _out(_normalise((x - lo).clamp_min(0.0) ** power), live, dim)


# --------------------------------------------------------------------------------------------
# A kernel's general form


def from_kernel(kernel: Kernel) -> Callable[..., Tensor]:
    """The general normalizer of a kernel, ``α_i = F(z_i, T) / Σ_j F(z_j, T)`` over the unmasked
    keys in float64 (docs/THEORY.md §1); a fully masked row gives zeros. ``F`` is used as given:
    where it overflows, the reference is undefined (NaN) and ``matches_reference`` skips the
    row."""

    def reference(scores: Tensor, dim: int = -1, temperature: float = 1.0, **_: object):
        z = scores.detach().to(_WORK[-1]).movedim(dim, -1)
        live = z != NEG_INF
        f = torch.where(live, kernel.F(torch.where(live, z, 0.0), float(temperature)), 0.0)
        total = f.sum(-1, keepdim=True)
        dead = ~live.any(-1, keepdim=True)
        p = f / torch.where(dead, 1.0, total)
        return _out(p, live, dim)

    reference.__name__ = f"kernel reference ({kernel.formula or 'F'})"
    return reference


#: The reference of every built-in, by id.
REFERENCES: dict[str, Callable[..., Tensor]] = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "entmax_alpha": entmax_alpha,
    "ssmax": ssmax,
    "sa_softmax": sa_softmax,
    "sigmoid": sigmoid,
    "softpick": softpick,
    "stablemax": stablemax,
    "softmax1": softmax1,
    "relu_norm": relu_norm,
    "dagpam": dagpam,
}
