"""The quantities of a generated case that ``attnverify falsify`` expressions may use.

A *case* is a normalizer (a :class:`~attnverify.registry.NormalizerSpec`), one row of logits
(float64, ``-inf`` = masked key), its temperature and parameter overrides. Each quantity has a name
(the identifier used in expressions), a one-line description (``attnverify quantities``) and a
function of the case. Only the quantities an expression names are computed, and each Jacobian is
built once per case: the Jacobian quantities cost ``O(L²)`` (entry-wise) or a Lanczos run.

**Masked rows.** Every quantity is defined over the keys the normalizer attends to: the
unmasked keys (finite logit). ``L`` counts them, ``a``, the weights, their sums and the entropy
range over them, and the Jacobians are of the unmasked weights with respect to the unmasked
logits, ``J_ik = ∂α_i/∂l_k`` (softmax: ``(diag α − ααᵀ)/T``). So a bound written for an unmasked
row of length ``L`` (Lemma 1: ``max_weight <= exp(2*a/T)/L``) keeps its meaning on a padded row;
``L_padded`` is the row length with the masked keys. A quantity with no value on a row (``a`` of a
row with no unmasked key) is NaN there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from attnverify import jacobian
from attnverify.errors import UsageError
from attnverify.registry import NormalizerSpec

#: Parameter names read as daGPAM's λ, in order.
LAMBDA_PARAMS = ("lam", "lambda_", "lmbda")


class Case:
    """One generated case; every derived value is computed on first use and kept."""

    def __init__(
        self,
        spec: NormalizerSpec,
        row: Tensor,
        temperature: float | None = None,
        params: Mapping[str, Any] | None = None,
        weights: Tensor | None = None,
    ) -> None:
        self.spec = spec
        self.row = torch.as_tensor(row, dtype=torch.float64).detach().reshape(-1)
        self.overrides = dict(params or {})
        self.temperature = 1.0
        if spec.takes_temperature:
            chosen = self.overrides.get("temperature", spec.params["temperature"])
            self.temperature = float(chosen if temperature is None else temperature)
            self.overrides["temperature"] = self.temperature
        if weights is not None:  # computed already, with the others of a batch (weights_many)
            self.weights = weights.detach()

    def normalize(self, scores: Tensor) -> Tensor:
        return self.spec(scores, dim=-1, **self.overrides)

    @cached_property
    def weights(self) -> Tensor:
        return self.normalize(self.row).detach()

    @cached_property
    def unmasked(self) -> Tensor:
        return torch.isfinite(self.row)

    @cached_property
    def all_unmasked(self) -> bool:
        return bool(self.unmasked.all())

    @cached_property
    def live_logits(self) -> Tensor:
        """The unmasked logits."""
        return self.row if self.all_unmasked else self.row[self.unmasked]

    @cached_property
    def live_weights(self) -> Tensor:
        """The weights of the unmasked keys."""
        return self.weights if self.all_unmasked else self.weights[self.unmasked]

    @cached_property
    def free_map(self) -> tuple[Callable[[Tensor], Tensor], Tensor]:
        """The map of the unmasked logits to their weights, and those logits."""
        idx = torch.nonzero(self.unmasked).reshape(-1)
        if len(idx) == len(self.row):
            return _FreeMap(self, None), self.row
        return _FreeMap(self, idx), self.row[idx]

    @cached_property
    def spectral(self) -> jacobian.SpectralNorm:
        f, z = self.free_map
        # a short row's Jacobian is formed whole (one batch of products: one request behind the
        # process boundary) and its norm taken by an SVD up to DENSE_KEYS, by Lanczos in this
        # process up to DENSE_LANCZOS_KEYS; a longer one's norm comes from Lanczos on products
        length = z.shape[-1]
        method = "dense" if length <= DENSE_KEYS else \
            "dense_lanczos" if length <= DENSE_LANCZOS_KEYS else "lanczos"
        return jacobian.spectral_norm(f, z, method=method)

    @cached_property
    def entrywise(self) -> jacobian.EntrywiseNorms:
        """Entry-wise Jacobian norms on the unmasked keys, one pass over column blocks."""
        f, z = self.free_map
        return jacobian.entrywise_norms(f, z)

    def param(self, names: Iterable[str], default: float) -> float:
        for name in names:
            if name in self.overrides:
                return float(self.overrides[name])
            if name in self.spec.params:
                return float(self.spec.params[name])
        return default


#: Rows of at most this many unmasked keys get their spectral norm from the dense Jacobian: one
#: batch of L products (one request behind the process boundary) and an SVD of at most 128²,
#: exact up to rounding, where Lanczos makes one request (two products) a step, tens of steps
#: on such rows.
DENSE_KEYS = 128

#: Rows of more than :data:`DENSE_KEYS` and at most this many unmasked keys: the dense Jacobian
#: (one batch of L products) and Lanczos on it in this process (``method="dense_lanczos"``;
#: an SVD costs L³). Longer rows run Lanczos on products: the dense Jacobian's L² products cost
#: the worker and the transfer more than Lanczos's round trips save there (measured side by
#: side in the run that set this, docs/FALSIFY.md).
DENSE_LANCZOS_KEYS = 256


class _FreeMap:
    """The map of a case's unmasked logits (``[..., L]``) to their weights; with
    :meth:`products` where the normalizer offers direct products (one request each behind the
    process boundary, :meth:`attnverify.remote.RemoteFunction.products`)."""

    def __init__(self, case: Case, idx: Tensor | None) -> None:
        self.case, self.idx = case, idx

    def _full(self, x: Tensor) -> Tensor:
        if self.idx is None:
            return x
        base = self.case.row
        return base.expand(x.shape[:-1] + base.shape).index_copy(-1, self.idx, x)

    def __call__(self, x: Tensor) -> Tensor:
        out = self.case.normalize(self._full(x))
        return out if self.idx is None else out.index_select(-1, self.idx)

    def __getattr__(self, name: str):
        if name != "products":
            raise AttributeError(name)
        direct = getattr(self.case.spec.fn, "products", None)
        if not callable(direct):
            raise AttributeError(name)
        return self._products

    def _products(self, z: Tensor):
        spec = self.case.spec
        jvp, vjp, normal = spec.fn.products(dim=-1, **{**spec.params, **self.case.overrides})
        full = self._full(z)
        if self.idx is None:
            return (lambda v: jvp(full, v)), (lambda u: vjp(full, u)), (lambda v: normal(full, v))
        idx = self.idx

        def embed(t: Tensor) -> Tensor:
            return torch.zeros_like(full).index_copy(-1, idx, t)

        keep = embed(torch.ones_like(z))

        def free_normal(v: Tensor) -> tuple[Tensor, Tensor]:
            jv, g = normal(full, embed(v), keep)
            return jv.index_select(-1, idx), g.index_select(-1, idx)

        return ((lambda v: jvp(full, embed(v)).index_select(-1, idx)),
                (lambda u: vjp(full, embed(u)).index_select(-1, idx)), free_normal)


@dataclass(frozen=True)
class Quantity:
    """A named quantity of a case: ``compute(case) -> float``."""

    name: str
    description: str
    compute: Callable[[Case], float]
    #: Costs O(L²) (entry-wise Jacobian by column blocks): callers cap the row length.
    quadratic: bool = False
    #: How far the exact value may lie from the float64 one (:func:`rounding_errors`):
    #: ``"exact"`` (counts, the input's own numbers), ``"rounded"`` (one rounding),
    #: ``"weights"`` (computed by the normalizer), ``"entropy"``, ``"jacobian"``.
    rounding: str = "weights"
    #: Takes integer values (a count of keys).
    count: bool = False
    #: Computed from the weights (the normalizer called once on the row), and from nothing
    #: else of the normalizer: :func:`weights_many` can compute them for many cases at once.
    weighted: bool = False


def _unmasked_weights(case: Case) -> Tensor:
    return case.live_weights


def _over_unmasked(reduce: Callable[[Tensor], Tensor]) -> Callable[[Case], float]:
    """``reduce`` of the unmasked weights; NaN on a row with no unmasked key."""

    def compute(case: Case) -> float:
        w = _unmasked_weights(case)
        return float(reduce(w)) if w.numel() else math.nan

    return compute


def _entropy(case: Case) -> float:
    w = _unmasked_weights(case)
    w = w[w > 0]
    return float(-(w * torch.log(w)).sum())


def _logit_gap(case: Case) -> float:
    logits = case.live_logits
    if len(logits) < 2:
        return 0.0
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def _quantities() -> dict[str, Quantity]:
    q = [
        Quantity(
            "L",
            "number of keys the normalizer attends to: unmasked keys (finite logit) only",
            lambda c: int(c.unmasked.sum()),
            rounding="exact", count=True,
        ),
        Quantity(
            "L_padded", "row length with the masked keys (-inf) included", lambda c: len(c.row),
            rounding="exact", count=True,
        ),
        Quantity(
            "n_unmasked", "number of unmasked keys (the same as L)",
            lambda c: int(c.unmasked.sum()), rounding="exact", count=True,
        ),
        Quantity("T", "temperature (1 for a normalizer without one)", lambda c: c.temperature,
                 rounding="exact"),
        Quantity(
            "a",
            "largest |logit| over the unmasked keys",
            lambda c: float(c.live_logits.abs().max()) if c.live_logits.numel() else math.nan,
            rounding="exact",
        ),
        Quantity(
            "logit_gap", "largest unmasked logit minus the second largest (0 if fewer)", _logit_gap,
            rounding="rounded",
        ),
        Quantity(
            "max_weight",
            "largest weight over the unmasked keys",
            _over_unmasked(torch.max),
            weighted=True,
        ),
        Quantity(
            "min_weight",
            "smallest weight over the unmasked keys",
            _over_unmasked(torch.min),
            weighted=True,
        ),
        Quantity(
            "sum_weight",
            "sum of the weights of the unmasked keys",
            lambda c: float(_unmasked_weights(c).sum()),
            weighted=True,
        ),
        Quantity(
            "sum_sq_weight",
            "sum of squared unmasked weights, Σα² (Lemma 3: ℓ1 total = 2(1 − Σα²))",
            lambda c: float((_unmasked_weights(c) ** 2).sum()),
            weighted=True,
        ),
        Quantity(
            "entropy",
            "Shannon entropy −Σ α log α over the positive unmasked weights (nats)",
            _entropy,
            rounding="entropy", weighted=True,
        ),
        Quantity(
            "n_support",
            "number of unmasked keys with a nonzero weight",
            lambda c: int((_unmasked_weights(c) != 0).sum()),
            rounding="exact", count=True, weighted=True,
        ),
        Quantity(
            "lambda",
            "daGPAM's λ (parameter lam); 0 for a normalizer without one",
            lambda c: c.param(LAMBDA_PARAMS, 0.0),
            rounding="exact",
        ),
        Quantity(
            "jacobian_spectral",
            "‖∂α/∂l‖₂, spectral norm (Lanczos, certified residual)",
            lambda c: float(c.spectral.value),
            rounding="jacobian",
        ),
        Quantity(
            "jacobian_entry",
            "max |∂α_i/∂l_k|, the largest Jacobian entry",
            lambda c: float(c.entrywise.max_abs),
            quadratic=True,
            rounding="jacobian",
        ),
        Quantity(
            "jacobian_frobenius",
            "‖∂α/∂l‖_F, Frobenius norm of the Jacobian",
            lambda c: float(c.entrywise.frobenius),
            quadratic=True,
            rounding="jacobian",
        ),
        Quantity(
            "jacobian_l1_total",
            "Σ_ik |∂α_i/∂l_k|, entry-wise ℓ1 total of the Jacobian",
            lambda c: float(c.entrywise.l1_total),
            quadratic=True,
            rounding="jacobian",
        ),
    ]
    return {item.name: item for item in q}


#: Every quantity, by name, in the order ``attnverify quantities`` lists them.
QUANTITIES: dict[str, Quantity] = _quantities()
#: The quantities computed from the weights alone (:attr:`Quantity.weighted`).
WEIGHTED = frozenset(name for name, q in QUANTITIES.items() if q.weighted)


#: Units of float64 rounding (2**-52) a computed weight may be off by, relative to its value:
#: a few for the normalizer's own arithmetic, plus a share per halving of the row (sums of L
#: terms) and per unit of a/T (the rounding of a logit, ``eps·|l/T|``, becomes a relative error
#: of ``exp(l/T)``).
WEIGHT_ULPS, ULPS_PER_LOG2_LENGTH, ULPS_PER_RATIO = 8.0, 4.0, 4.0
#: Relative error of a Jacobian quantity: the convergence tolerance of its Lanczos run (the
#: float64 ``rtol``), which the dense and entry-wise ones are well inside.
JACOBIAN_RELATIVE_ERROR = 1e-7


def rounding_errors(values: Mapping[str, float], length: int, scale: float) -> dict[str, float]:
    """How far the exact value of each quantity in ``values`` may lie from its float64 value,
    for a row of ``length`` keys (masked ones included) whose largest ``|logit|/T`` is ``scale``:
    0 for exact quantities, one rounding for ``"rounded"`` ones, ``δ·|v|`` for weights with
    ``δ = eps·(8 + 4·log2 length + 4·scale)``, ``δ·(H + 1)`` for the entropy (each term
    ``−p log p`` moves by ``(|log p| + 1)·p·δ``), and :data:`JACOBIAN_RELATIVE_ERROR`·|v| for
    Jacobian quantities. A weight computed as exactly 0 is taken as exactly 0 (float64 cannot
    tell an underflow from a true zero). Used by :meth:`attnverify.expr.Inequality.judge`."""
    eps = 2.0**-52
    ratio = scale if math.isfinite(scale) else 0.0
    delta = eps * (WEIGHT_ULPS + ULPS_PER_LOG2_LENGTH * math.log2(max(length, 1))
                   + ULPS_PER_RATIO * ratio)
    out = {}
    for name, v in values.items():
        kind = QUANTITIES[name].rounding
        v = abs(float(v))
        if kind == "exact" or not math.isfinite(v):
            out[name] = 0.0
        elif kind == "rounded":
            out[name] = eps * v
        elif kind == "entropy":
            out[name] = delta * (v + 1.0)
        elif kind == "jacobian":
            out[name] = JACOBIAN_RELATIVE_ERROR * v
        else:
            out[name] = delta * v
    return out


#: Where each quantity of the input itself lies, on every row the search may draw (at least one
#: unmasked key, finite logits) and for every normalizer.
INPUT_RANGES: dict[str, tuple[float, float]] = {
    "L": (1.0, math.inf),
    "L_padded": (1.0, math.inf),
    "n_unmasked": (1.0, math.inf),
    "a": (0.0, math.inf),
    "logit_gap": (0.0, math.inf),
}
#: Where the quantities of the weights lie for a normalizer whose output space is known (a
#: built-in: attnverify's own code, never a target's word), by output space
#: (docs/INTERFACES.md). The Jacobian quantities are norms: at least 0.
_NORMS = {"jacobian_spectral": (0.0, math.inf), "jacobian_entry": (0.0, math.inf),
          "jacobian_frobenius": (0.0, math.inf), "jacobian_l1_total": (0.0, math.inf)}
_ANY = (-math.inf, math.inf)
OUTPUT_RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "simplex": {"max_weight": (0.0, 1.0), "min_weight": (0.0, 1.0), "sum_weight": (1.0, 1.0),
                "sum_sq_weight": (0.0, 1.0), "entropy": (0.0, math.inf),
                "n_support": (1.0, math.inf), **_NORMS},
    "sub_simplex": {"max_weight": (0.0, 1.0), "min_weight": (0.0, 1.0),
                    "sum_weight": (0.0, 1.0), "sum_sq_weight": (0.0, 1.0),
                    "entropy": (0.0, math.inf), "n_support": (0.0, math.inf), **_NORMS},
    "nonnegative": {"max_weight": (0.0, math.inf), "min_weight": (0.0, math.inf),
                    "sum_weight": (0.0, math.inf), "sum_sq_weight": (0.0, math.inf),
                    "entropy": _ANY, "n_support": (0.0, math.inf), **_NORMS},
    "affine": {"max_weight": _ANY, "min_weight": _ANY, "sum_weight": (1.0, 1.0),
               "sum_sq_weight": (0.0, math.inf), "entropy": _ANY, "n_support": (0.0, math.inf),
               **_NORMS},
    "any": {"max_weight": _ANY, "min_weight": _ANY, "sum_weight": _ANY,
            "sum_sq_weight": (0.0, math.inf), "entropy": _ANY, "n_support": (0.0, math.inf),
            **_NORMS},
}
#: Built-ins whose weights leave their declared space somewhere: relu_norm's row with no
#: positive score gives zeros (its policy), so its sums lie in [0, 1].
RANGE_SPACE = {"relu_norm": "sub_simplex"}


def quantity_ranges(names: Iterable[str], *, space: str | None,
                    temperature: tuple[float, float],
                    lam: float) -> dict[str, tuple[float, float]] | None:
    """Where each quantity of ``names`` lies over every input: :data:`INPUT_RANGES`, ``T`` in
    ``temperature``, ``lambda`` the parameter's value, the weights' quantities by the output
    ``space`` (:data:`OUTPUT_RANGES`; ``None``: the normalizer's own code decides them, which
    may return anything, NaN included). ``None`` where a quantity has no known range: one of the
    weights of a normalizer that is not a built-in (its values, even NaN, are its code's)."""
    out: dict[str, tuple[float, float]] = {}
    known = OUTPUT_RANGES.get(space, {}) if space is not None else {}
    for name in names:
        if name in INPUT_RANGES:
            out[name] = INPUT_RANGES[name]
        elif name == "T":
            out[name] = temperature
        elif name == "lambda":
            out[name] = (lam, lam)
        elif name in known:
            out[name] = known[name]
        else:
            return None
    return out


def describe() -> list[tuple[str, str]]:
    """``(name, description)`` of every quantity, for ``attnverify quantities``."""
    return [(q.name, q.description) for q in QUANTITIES.values()]


def evaluate_quantities(
    names: Iterable[str],
    spec: NormalizerSpec,
    row: Tensor,
    temperature: float | None = None,
    params: Mapping[str, Any] | None = None,
    weights: Tensor | None = None,
) -> dict[str, float]:
    """The named quantities of one case, and only those; an unknown name is a usage error.

    ``row`` is one row of logits (converted to float64); ``temperature`` overrides the spec's
    (``T`` is 1 for a normalizer without temperature); ``params`` overrides other parameters.
    ``weights``: the normalizer's output on this case, computed already (:func:`weights_many`);
    the normalizer is then not called for the :data:`WEIGHTED` quantities.
    """
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in QUANTITIES]
    if unknown:
        raise UsageError(f"unknown quantity {unknown[0]!r} (known: {', '.join(QUANTITIES)})")
    case = Case(spec, row, temperature, params, weights=weights)
    return {name: float(QUANTITIES[name].compute(case)) for name in names}


def weights_many(spec: NormalizerSpec, cases: list[tuple[Tensor, float | None]],
                 params: Mapping[str, Any] | None = None) -> list[Tensor] | None:
    """The weights of each ``(row, temperature)`` of ``cases``, in order, in one request to the
    worker where the normalizer runs behind the process boundary (its proxy's ``many``: each
    call with the very row and parameters :class:`Case` would call it with); ``None`` where the
    normalizer offers no such request (a function called in this process). A call that raises
    raises as the proxy's ``many`` does."""
    many = getattr(spec.fn, "many", None)
    if not callable(many) or not cases:
        return None
    built = [Case(spec, row, t, params) for row, t in cases]
    out = many([c.row for c in built], dim=-1,
               per_call=[{**spec.params, **c.overrides} for c in built])
    return [w.detach() for w in out]
