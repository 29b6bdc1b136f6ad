"""Matrix-free Jacobian norms of a row-wise normalizer.

``f`` maps rows of scores (``[..., L]``, rows along the last dimension) to rows of weights of the
same shape, each output row depending on its own input row only (the ``batch_independent``
property). ``J_b = ∂f(z_b)/∂z_b`` is the ``L × L`` Jacobian of row ``b``; everything here is
batched over rows, so many rows cost one call of ``f``.

Products ``J·v`` come from forward-mode AD (``torch.func.jvp``) and ``Jᵀ·u`` from reverse mode;
where ``f`` offers ``f.products(z)`` (a function behind the process boundary), from that first:
one request to the worker per product or per batch of products. When ``f`` uses a custom
``torch.autograd.Function`` without forward-mode support, both fall back to plain autograd:
``Jᵀu`` is one backward pass and ``J·v`` the double-backward trick ``∂⟨Jᵀw, v⟩/∂w`` (which needs
``f``'s backward to be differentiable), or the dense Jacobian from ``L`` VJPs.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from attnverify.tolerances import tol_for


@functools.cache
def forward_mode() -> None:
    """Load torch's forward-mode decompositions, quietly, before the first forward-mode
    product (every ``torch.func.jvp`` of this module and of ``checks/`` calls this first). That
    product imports ``torch._decomp.decompositions_for_jvp``, which compiles its decompositions
    with ``torch.jit.script``; torch 2.13 deprecates that with one ``DeprecationWarning`` per
    decomposition (18–36 in a pytest run): torch's own use, triggered by our correct one. Loaded
    once, with that one warning filtered (the worker preloads the module likewise), when it is
    first needed: a run that takes no forward-mode product (``falsify`` of a bound without a
    Jacobian) does not pay for the import."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated",
                                category=DeprecationWarning)
        import torch._decomp.decompositions_for_jvp  # noqa: F401 - side effect: registers them


def vjp(out: Tensor, wrt, cotangent: Tensor, **kwargs):
    """``torch.autograd.grad(out, wrt, cotangent, **kwargs)``, taken as the gradient of the
    scalar ``⟨out, cotangent⟩``: the same values (the backward of the sum is ones, that of the
    product ``1·cotangent``, both exact), without ``torch.autograd.grad``'s check of a tensor
    cotangent, which imports ``torch.fx.experimental.symbolic_shapes`` and sympy on first use:
    tenths of a second of a command's start, and tens of MiB, in every checker process. The
    shapes are compared here instead (a cotangent is never broadcast)."""
    if cotangent.shape != out.shape:
        raise RuntimeError(f"Mismatch in shape: a cotangent of shape {tuple(cotangent.shape)} "
                           f"for an output of shape {tuple(out.shape)}")
    return torch.autograd.grad((out * cotangent).sum(), wrt, **kwargs)


RowMap = Callable[[Tensor], Tensor]

#: Elements of the Krylov bases (``[rows, steps, L]``, twice) held at once by :func:`spectral_norm`.
BASIS_ELEMENTS = 1 << 24

#: Elements of the tangent batch (``[block · rows, L]``) used by the column-block norms.
BLOCK_ELEMENTS = 1 << 22

DEFAULT_STEPS = {"lanczos": 128, "power": 2000, "dense": 1, "dense_lanczos": 128, "auto": 128}

#: ``method="auto"`` forms the dense Jacobian (one batch of products, then an SVD) up to this
#: many entries ``R·L²``, and runs Lanczos beyond.
DENSE_AUTO = 1 << 20


class Linearization:
    """``J·v`` and ``Jᵀ·u`` of a row-wise map at fixed rows ``z`` (``[R, L]``).

    ``mode`` says how the products are formed, trying each in turn and keeping the first that
    works (``forward_error`` keeps why forward mode failed):

    - ``"direct"``: ``f.products(z)``, where ``f`` offers it (a row map of a function behind
      the process boundary, :meth:`attnverify.remote.RemoteFunction.products`): each product is
      one request to the worker;
    - ``"forward"``: ``torch.func`` (``jvp`` for ``J·v``, ``vjp`` for ``Jᵀ·u``);
    - ``"double_backward"``: plain autograd on one recorded graph; ``Jᵀu`` is one backward pass
      and ``J·v`` the double-backward trick ``∂⟨Jᵀw, v⟩/∂w`` (``f``'s backward differentiable);
    - ``"reverse_rows"``: reverse mode only (a classic ``autograd.Function`` whose backward is
      ``once_differentiable`` or not recorded): the dense ``[R, L, L]`` Jacobian is built once
      from ``L`` explicit VJPs (rows repeated, one basis cotangent per copy), then ``J·v`` and
      ``Jᵀu`` are matrix products. Needs ``R·L²`` numbers; refused above :data:`DENSE_ELEMENTS`.
    """

    def __init__(self, f: RowMap, z: Tensor) -> None:
        self.f, self.z = f, z.detach()
        self.mode = "forward"
        self._vjp_fn = None
        self.forward_error: BaseException | None = None
        self._graph: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        self._dense: Tensor | None = None
        #: ``f.products(z)`` where ``f`` offers it: ``(jvp(v), vjp(u))`` made directly (a
        #: function behind the process boundary: one request per product), tried first.
        self._direct = None
        products = getattr(f, "products", None)
        if callable(products):
            try:
                self._direct = products(self.z)
                self.mode = "direct"
            except Exception:  # noqa: BLE001 - no direct products: the ways below
                self._direct = None

    def jvp(self, v: Tensor) -> Tensor:
        if self.mode == "direct":
            try:
                return self._direct[0](v)
            except Exception as exc:  # noqa: BLE001 - no forward mode there: fall back
                self.mode = "forward"
                self.forward_error = exc
        if self.mode == "forward":
            try:
                forward_mode()
                return torch.func.jvp(self.f, (self.z,), (v,))[1]
            except Exception as exc:  # noqa: BLE001 - any failure of torch.func: fall back
                self._fall_back(exc)
        if self.mode == "double_backward":
            try:
                zz, out, seed, g = self._recorded()
                if not out.requires_grad:
                    return torch.zeros_like(v)
                # g must depend on the seed: a backward that is not recorded (or is
                # once_differentiable) has no path from seed to g, or raises here
                return vjp(g, seed, v, retain_graph=True)[0]
            except RuntimeError:
                pass
            self.mode = "reverse_rows"
        return torch.bmm(self.dense(), v.unsqueeze(-1)).squeeze(-1)

    def vjp(self, u: Tensor) -> Tensor:
        if self.mode == "direct":
            try:
                return self._direct[1](u)
            except Exception as exc:  # noqa: BLE001 - fall back to the ways below
                self.mode = "forward"
                self.forward_error = exc
        if self.mode == "forward":
            try:
                if self._vjp_fn is None:
                    self._vjp_fn = torch.func.vjp(self.f, self.z)[1]
                return self._vjp_fn(u)[0]
            except Exception as exc:  # noqa: BLE001 - any failure of torch.func: fall back
                self._fall_back(exc)
        if self.mode == "reverse_rows":
            return torch.bmm(self.dense().transpose(1, 2), u.unsqueeze(-1)).squeeze(-1)
        zz, out = self._plain()
        return _grad(out, zz, u)

    def normal(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(J·v, Jᵀu)``, ``u`` the unit direction of ``J·v`` per row (zero where ``J·v`` is):
        a step of Lanczos on ``JᵀJ``. One request where the products are direct and offer it,
        else :meth:`jvp` then :meth:`vjp`."""
        if self.mode == "direct" and len(self._direct) > 2:
            try:
                return self._direct[2](v)
            except Exception as exc:  # noqa: BLE001 - no forward mode there: fall back
                self.mode = "forward"
                self.forward_error = exc
        return _normal(self, v)

    def dense(self) -> Tensor:
        """The ``[R, L, L]`` Jacobian from reverse mode only (built once, by row blocks)."""
        if self._dense is None:
            R, L = self.z.shape
            if R * L * L > DENSE_ELEMENTS:
                raise RuntimeError(
                    f"f has no forward-mode AD and no double backward, and its dense Jacobian "
                    f"({R} rows × {L}² entries) is too large to build from VJPs"
                )
            self._dense = torch.cat(list(_reverse_row_blocks(self.f, self.z)), dim=-2)
        return self._dense

    def _fall_back(self, exc: BaseException) -> None:
        self.mode, self._vjp_fn, self.forward_error = "double_backward", None, exc

    def _plain(self) -> tuple[Tensor, Tensor]:
        if self._graph is not None:
            return self._graph[0], self._graph[1]
        with torch.enable_grad():
            zz = self.z.clone().requires_grad_(True)
            return zz, self.f(zz)

    def _recorded(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if self._graph is None:
            with torch.enable_grad():
                zz = self.z.clone().requires_grad_(True)
                out = self.f(zz)
                seed = torch.zeros_like(out, requires_grad=True)
                g = _grad(out, zz, seed, create_graph=True)
            self._graph = (zz, out, seed, g)
        return self._graph


#: Largest dense Jacobian (``R·L²`` numbers) built from VJPs when ``f`` has only reverse mode.
DENSE_ELEMENTS = 1 << 24


def _reverse_row_blocks(f: RowMap, z: Tensor, block: int | None = None) -> Iterator[Tensor]:
    """Row blocks ``J[:, r0:r0+k, :]`` (``[R, k, L]``) of every row's Jacobian, reverse mode only.

    The rows are repeated ``k`` times and copy ``j`` gets the cotangent ``e_{r0+j}``, so one
    backward pass gives ``k`` rows of ``J`` (``Jᵀe_i`` is row ``i``). Memory ``O(k·R·L)``.
    """
    R, L = z.shape
    k = block or max(1, min(L, BLOCK_ELEMENTS // max(1, R * L)))
    with torch.enable_grad():
        zz = z.detach().repeat(k, 1).requires_grad_(True)
        out = f(zz)
        for r0 in range(0, L, k):
            width = min(k, L - r0)
            basis = z.new_zeros(k, R, L)
            idx = torch.arange(width, device=z.device)
            basis[idx, :, r0 + idx] = 1.0
            g = _grad(out, zz, basis.reshape(k * R, L)).reshape(k, R, L)[:width]
            yield g.transpose(0, 1)


def _grad(out: Tensor, wrt: Tensor, cotangent: Tensor, *, create_graph: bool = False) -> Tensor:
    """``∂⟨out, cotangent⟩/∂wrt``; zeros when ``out`` does not depend on ``wrt``."""
    if not out.requires_grad:
        return torch.zeros_like(wrt)
    (g,) = vjp(
        out,
        wrt,
        cotangent,
        retain_graph=True,
        create_graph=create_graph,
        allow_unused=True,
        materialize_grads=True,
    )
    return g


def linearize(f: RowMap, z: Tensor) -> Linearization:
    """The products ``J·v`` / ``Jᵀ·u`` of ``f`` at the rows ``z`` (``[R, L]``)."""
    return Linearization(f, z)


# --------------------------------------------------------------------------------------------
# Spectral norm


class SpectralNorm(NamedTuple):
    """Largest singular value of each row's Jacobian, with its certificate.

    ``value`` (``[...]``) is the top singular value of a compression ``UᵀJV`` with orthonormal
    ``U, V``, hence a lower bound on ``‖J‖₂`` up to rounding. ``residual`` is ``‖Jᵀu − σv‖₂`` for
    the unit pair with ``Jv = σu``: some singular value of ``J`` lies within ``residual`` of
    ``value``. ``converged`` is ``residual ≤ tol·value`` (or ``value = 0 = residual``).
    """

    value: Tensor
    residual: Tensor
    converged: Tensor
    steps: int
    method: str
    mode: str


def spectral_norm(
    f: RowMap,
    z: Tensor,
    *,
    iters: int | None = None,
    tol: float | None = None,
    seed: int = 0,
    method: str = "lanczos",
    threads: int | None = 1,
) -> SpectralNorm:
    """``‖J‖₂`` of every row of ``z`` (``[..., L]``), matrix-free.

    ``method="lanczos"`` (default): Lanczos with full reorthogonalisation on ``JᵀJ`` scaled to
    unit size (:func:`_lanczos`), one ``J·v`` and one ``Jᵀ·u`` per step, both in one request
    behind the process boundary (:meth:`Linearization.normal`), for symmetric and non-symmetric
    ``J`` alike; step for step the Krylov space of Golub–Kahan bidiagonalisation.
    ``method="power"``: power iteration on ``JᵀJ``. Both stop when every row's ``residual ≤
    tol·value`` or after ``iters`` steps (Lanczos: at most ``L``). ``method="dense"``: every
    row's Jacobian formed by column blocks of products (:func:`dense_jacobian`) and its largest
    singular value taken by an SVD (exact up to rounding; residual 0): few products in few
    batches, which is what a map behind the process boundary needs. ``method="dense_lanczos"``:
    the dense Jacobian formed the same way, then Lanczos on it with its products formed in this
    process (:class:`DenseProducts`): the same value, residual and stopping rule as
    ``"lanczos"`` (``mode`` ``"dense"``), without an SVD's ``L³`` or a request per step, for
    rows whose ``L²`` entries are cheap to form. ``method="auto"``: dense up to
    :data:`DENSE_AUTO` entries, else Lanczos. ``tol`` defaults to the dtype's ``rtol``; the
    start vectors are Gaussian from a generator seeded with ``seed``.

    ``threads`` is torch's intra-op thread count during the iteration (and the dense method's
    SVD), restored afterwards (``None`` keeps the current setting). One thread is the default:
    every step is a handful of memory-bound passes over L numbers, and on a shared CPU the
    thread barriers of a parallel op cost several times what they save (see
    ``benchmarks/bench_jacobian.py``).
    """
    if method not in DEFAULT_STEPS:
        raise ValueError(f"method={method!r} is not one of {', '.join(DEFAULT_STEPS)}")
    length = z.shape[-1]
    if method == "auto":
        rows = z.numel() // max(length, 1)
        method = "dense" if rows * length * length <= DENSE_AUTO else "lanczos"
    if method == "dense":
        return _dense_spectral(f, z, threads)
    steps = iters or DEFAULT_STEPS[method]
    steps = min(steps, length) if method != "power" else steps
    tol = tol_for(z.dtype).rtol if tol is None else tol
    rows = z.detach().reshape(-1, length)
    if method == "dense_lanczos":
        # every row's Jacobian in few requests, then Lanczos on it with products in this process
        J = dense_jacobian(f, rows)
        with intra_op_threads(threads):
            parts = _solve_chunks(lambda i, part: DenseProducts(J[i:i + len(part)]), rows,
                                  steps, tol, seed, "lanczos")
    else:
        with intra_op_threads(threads):
            parts = _solve_chunks(lambda _i, part: linearize(f, part), rows, steps, tol, seed,
                                  method)
    value, residual = (torch.cat([p[i] for p in parts]).reshape(z.shape[:-1]) for i in (0, 1))
    converged = _converged(value, residual, tol)
    return SpectralNorm(value, residual, converged, max(p[2] for p in parts), method, parts[0][3])


def _dense_spectral(f: RowMap, z: Tensor, threads: int | None) -> SpectralNorm:
    """``‖J‖₂`` of every row from its dense Jacobian (an SVD per row)."""
    length = z.shape[-1]
    rows = z.detach().reshape(-1, length)
    J = dense_jacobian(f, rows)
    with intra_op_threads(threads):
        value = torch.linalg.matrix_norm(J, ord=2) if length else rows.new_zeros(len(rows))
    value = value.reshape(z.shape[:-1])
    zero = torch.zeros_like(value)
    return SpectralNorm(value, zero, torch.ones_like(value, dtype=torch.bool), 1, "dense",
                        "dense")


def _solve_chunks(products, rows: Tensor, steps: int, tol: float, seed: int, method: str):
    """Run the solver on chunks of rows small enough for the Krylov bases to fit the budget;
    ``products(start, part)`` gives the ``J·v`` / ``Jᵀ·u`` of the chunk ``part`` of the rows
    that starts at row ``start`` (a :class:`Linearization` or :class:`DenseProducts`)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(rows.shape, generator=gen, dtype=rows.dtype).to(rows.device)
    lanczos = method == "lanczos"
    chunk = max(1, BASIS_ELEMENTS // (steps * rows.shape[-1])) if lanczos else len(rows)
    solve = _lanczos if lanczos else _power
    return [
        solve(products(i * chunk, part), v0, steps, tol)
        for i, (part, v0) in enumerate(zip(rows.split(chunk), start.split(chunk)))
    ]


class DenseProducts:
    """``J·v`` and ``Jᵀ·u`` of dense Jacobians ``J`` (``[R, L, L]``) held in this process: the
    interface of :class:`Linearization` that the solvers use (``mode`` ``"dense"``)."""

    mode = "dense"

    def __init__(self, J: Tensor) -> None:
        self.J = J

    def jvp(self, v: Tensor) -> Tensor:
        return torch.bmm(self.J, v.unsqueeze(-1)).squeeze(-1)

    def vjp(self, u: Tensor) -> Tensor:
        return torch.bmm(self.J.transpose(1, 2), u.unsqueeze(-1)).squeeze(-1)

    def normal(self, v: Tensor) -> tuple[Tensor, Tensor]:
        return _normal(self, v)


def _normal(products, v: Tensor) -> tuple[Tensor, Tensor]:
    """``(J·v, Jᵀu)`` with ``u`` the unit direction of ``J·v`` per row, from ``products``'s
    ``jvp`` and ``vjp`` (two products; a worker's ``normal`` request makes them in one)."""
    jv = products.jvp(v)
    return jv, products.vjp(_unit(jv)[1])


@contextlib.contextmanager
def intra_op_threads(threads: int | None):
    """torch's intra-op thread count set to ``threads`` (None: unchanged) inside the block and
    restored after it."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _converged(value: Tensor, residual: Tensor, tol: float) -> Tensor:
    return residual <= tol * value


def row_norm(w: Tensor) -> Tensor:
    """``‖w‖₂`` per row (last dimension), scaled by the row's largest ``|entry|`` first: the
    squares of a row of 1e-170 (or 1e170) neither underflow nor overflow, as in
    ``torch.linalg.vector_norm``."""
    top = w.abs().amax(-1, keepdim=True) if w.shape[-1] else w.new_zeros(w.shape[:-1] + (1,))
    scale = torch.where((top > 0) & torch.isfinite(top), top, torch.ones_like(top))
    return (torch.linalg.vector_norm(w / scale, dim=-1, keepdim=True) * scale).squeeze(-1)


def _unit(w: Tensor, floor: Tensor | float = 0.0) -> tuple[Tensor, Tensor]:
    """``(‖w‖, w/‖w‖)`` per row; a row with ``‖w‖ ≤ floor`` gives ``(0, 0)`` (breakdown)."""
    norm = row_norm(w)
    keep = norm > floor
    unit = w / torch.where(keep, norm, torch.ones_like(norm)).unsqueeze(-1)
    return torch.where(keep, norm, 0.0), torch.where(keep.unsqueeze(-1), unit, 0.0)


def _reorthogonalize(w: Tensor, basis: Tensor) -> Tensor:
    """``w`` minus its projection on the orthonormal rows of ``basis`` (``[R, m, L]``), twice."""
    for _ in range(2):
        coeffs = torch.bmm(basis, w.unsqueeze(-1))
        w = w - torch.bmm(basis.transpose(1, 2), coeffs).squeeze(-1)
    return w


def _top_ritz(alphas: Tensor, betas: Tensor) -> tuple[Tensor, Tensor]:
    """Top eigenvalue ``θ`` of the symmetric tridiagonal ``T_k`` (diagonal ``alphas``,
    off-diagonal ``betas[:k-1]``) and its residual ``|β_k · y_k|`` (``y`` its unit eigenvector)."""
    k = alphas.shape[-1]
    off = betas[:, : k - 1]
    T = torch.diag_embed(alphas) + torch.diag_embed(off, offset=1) + \
        torch.diag_embed(off, offset=-1)
    theta, y = torch.linalg.eigh(T)
    return theta[:, -1], (betas[:, k - 1] * y[:, k - 1, -1]).abs()


def _check_now(k: int) -> bool:
    """Check convergence after step ``k``: every step early, then every ``1 + k//8`` steps."""
    return k % (1 + k // 8) == 0


def _lanczos(lin: Linearization, v0: Tensor, steps: int, tol: float):
    """Lanczos with full reorthogonalisation on ``A = JᵀJ/c²``, one :meth:`Linearization.normal`
    (one request behind the process boundary) a step.

    ``c = ‖J·v₁‖`` per row (1 where it is 0) keeps ``A`` near unit scale: ``A·v`` is
    ``(‖J·v‖/c)·(Jᵀu/c)`` with ``u = J·v/‖J·v‖``, so neither ``JᵀJ·v`` nor ``c²`` is formed and
    a Jacobian of 1e-170 does not underflow. The Krylov space after ``k`` steps is Golub–Kahan's
    after ``k`` (``T_k = B_kᵀB_k``): the top Ritz value ``θ`` of ``T_k`` gives ``σ = c√θ``, the
    top singular value of ``J`` restricted to it (a lower bound on ``‖J‖₂`` up to rounding).
    ``r = |β_k y_k|`` bounds ``|λ − θ|`` for some eigenvalue ``λ`` of ``A``, so some singular
    value of ``J`` lies within ``c·min(r/√θ, √r)`` of ``σ`` (the residual; ``c·r/√θ`` is the
    Golub–Kahan pair's ``‖Jᵀu − σv‖``). A new direction shorter than ``L·eps·(largest
    coefficient so far)`` is rounding noise: the Krylov space is invariant there, and the row
    continues with zero vectors (exact ``T_k``).
    """
    R, L = v0.shape
    V = v0.new_empty(R, steps, L)
    alphas, betas = v0.new_zeros(R, steps), v0.new_zeros(R, steps)
    noise = L * torch.finfo(v0.dtype).eps
    V[:, 0] = _unit(v0)[1]
    jv, g = lin.normal(V[:, 0])
    c = row_norm(jv)
    c = torch.where(c > 0, c, torch.ones_like(c)).unsqueeze(-1)

    def product(jv: Tensor, g: Tensor) -> Tensor:  # A·v from (J·v, Jᵀu)
        return (row_norm(jv).unsqueeze(-1) / c) * (g / c)

    w = product(jv, g)
    for k in range(steps):
        alphas[:, k] = (V[:, k] * w).sum(-1)
        w = w - alphas[:, k, None] * V[:, k]
        if k:
            w = w - betas[:, k - 1, None] * V[:, k - 1]
        w = _reorthogonalize(w, V[:, : k + 1])
        scale = torch.maximum(alphas[:, : k + 1].abs().amax(-1), betas[:, : k + 1].amax(-1))
        betas[:, k], v = _unit(w, noise * scale)
        if k + 1 == steps or _check_now(k + 1):
            theta, r = _top_ritz(alphas[:, : k + 1], betas[:, : k + 1])
            theta = theta.clamp_min(0)
            root = theta.sqrt()
            near = torch.where(root > 0, r / torch.where(root > 0, root, 1.0), torch.inf)
            sigma, residual = c[:, 0] * root, c[:, 0] * torch.minimum(near, r.sqrt())
            if k + 1 == steps or bool(_converged(sigma, residual, tol).all()):
                return sigma, residual, k + 1, lin.mode
        V[:, k + 1] = v
        w = product(*lin.normal(v))
    raise AssertionError("unreachable")


def _power(lin: Linearization, v0: Tensor, steps: int, tol: float):
    """Power iteration on ``JᵀJ``: ``σ = ‖Jv‖``, ``u = Jv/σ``, residual ``‖Jᵀu − σv‖``."""
    v = _unit(v0)[1]
    for k in range(steps):
        sigma, u = _unit(lin.jvp(v))
        w = lin.vjp(u)
        residual = torch.linalg.vector_norm(w - sigma.unsqueeze(-1) * v, dim=-1)
        if k + 1 == steps or bool(_converged(sigma, residual, tol).all()):
            return sigma, residual, k + 1, lin.mode
        v = _unit(w)[1]
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# Entry-wise norms, by blocks of columns


def _direct_products(f: RowMap, z: Tensor) -> tuple | None:
    """``(v ↦ J·v, u ↦ Jᵀu, …)`` at the rows ``z`` from ``f.products(z)`` where ``f`` offers it
    (a row map of a function behind the process boundary: one request per product, where
    ``torch.func`` through the proxy makes two), else ``None``."""
    products = getattr(f, "products", None)
    if not callable(products):
        return None
    try:
        return products(z)
    except Exception:  # noqa: BLE001 - no direct products: torch.func, as without them
        return None


def _blocks(f: RowMap, z: Tensor, block: int | None) -> Iterator[tuple[Tensor, int]]:
    """Row blocks (axis ``-2``) by reverse mode, or column blocks (axis ``-1``) by forward mode.

    A block of ``k`` rows of ``J`` is one batch of ``k`` reverse-mode products (the rows
    repeated ``k`` times, copy ``j`` with the cotangent ``e_{r0+j}``: ``Jᵀe_i`` is row ``i``),
    one request where ``f`` offers direct products (:func:`_direct_products`): the worker's
    backward is cheaper than its forward mode, in which torch 2.13 runs Python meta functions
    for every op with a constant operand. Where that fails at the first block, or ``f`` offers
    no direct products, a block of ``k`` columns is one batch of ``k`` forward-mode products
    (tangent ``e_{c0+j}``): direct where offered, else ``torch.func.jvp``; and where forward
    mode fails too, reverse mode through ``f`` itself (as in :class:`Linearization`)."""
    shape, length = z.shape[:-1], z.shape[-1]
    rows = z.detach().reshape(-1, length)
    R = len(rows)
    k = block or max(1, min(length, BLOCK_ELEMENTS // max(1, R * length)))
    repeated = rows.repeat(k, 1)
    products = _direct_products(f, repeated)

    def basis_block(start: int) -> tuple[Tensor, int]:
        width = min(k, length - start)
        basis = rows.new_zeros(k, R, length)
        idx = torch.arange(width, device=rows.device)
        basis[idx, :, start + idx] = 1.0
        return basis.reshape(k * R, length), width

    if products is not None:
        r0 = 0
        try:
            for r0 in range(0, length, k):
                cotangent, width = basis_block(r0)
                g = products[1](cotangent).reshape(k, R, length)[:width]
                yield g.transpose(0, 1).reshape(shape + (width, length)), -2
            return
        except Exception:  # noqa: BLE001 - no reverse mode there: forward mode, as before
            if r0:
                raise
    direct = None if products is None else products[0]
    for c0 in range(0, length, k):
        tangent, width = basis_block(c0)
        out = None
        if direct is not None:
            try:
                out = direct(tangent)
            except Exception:  # noqa: BLE001 - no forward mode there: torch.func, as before
                if c0:
                    raise
                direct = None
        if out is None:
            try:
                forward_mode()
                out = torch.func.jvp(f, (repeated,), (tangent,))[1]
            except Exception:  # noqa: BLE001 - no forward mode: rebuild from reverse mode
                if c0:
                    raise
                break
        out = out.reshape(k, R, length)[:width].permute(1, 2, 0)
        yield out.reshape(shape + (length, width)), -1
    else:
        return
    for J in _reverse_row_blocks(f, rows, k):
        yield J.reshape(shape + J.shape[-2:]), -2


def dense_jacobian(f: RowMap, z: Tensor, *, block: int | None = None) -> Tensor:
    """Every row's full Jacobian ``[..., L, L]`` (``J[..., i, k] = ∂f_i/∂z_k``); for small L.
    Behind the process boundary each block (:func:`_blocks`: rows of ``J`` by reverse mode, or
    columns by forward mode; one block holds all ``L`` of one row up to ``L = 2048``) is one
    request."""
    parts = list(_blocks(f, z, block))
    if not parts:
        return z.new_zeros(z.shape + (z.shape[-1],))
    return torch.cat([J for J, _ in parts], dim=parts[0][1])


class EntrywiseNorms(NamedTuple):
    """Entry-wise norms of each row's Jacobian (``[...]`` each)."""

    max_abs: Tensor  # max_ik |J_ik|
    frobenius: Tensor  # √(Σ_ik J_ik²)
    l1_total: Tensor  # Σ_ik |J_ik|


def entrywise_norms(f: RowMap, z: Tensor, *, block: int | None = None) -> EntrywiseNorms:
    """``max |J_ik|``, ``‖J‖_F`` and ``Σ|J_ik|`` per row in one pass over column blocks.

    Memory is one block (see :func:`_blocks`), never the full ``L × L`` matrix.
    """
    top = squares = total = None
    for J, _ in _blocks(f, z, block):
        absJ = J.abs()
        parts = absJ.amax(dim=(-2, -1)), (J * J).sum(dim=(-2, -1)), absJ.sum(dim=(-2, -1))
        if top is None:
            top, squares, total = parts
        else:
            top, squares, total = torch.maximum(top, parts[0]), squares + parts[1], total + parts[2]
    return EntrywiseNorms(top, squares.sqrt(), total)


def entry_max_abs(f: RowMap, z: Tensor, *, block: int | None = None) -> Tensor:
    """``max_ik |J_ik|`` per row (``[...]``), by column blocks."""
    return entrywise_norms(f, z, block=block).max_abs


def frobenius(f: RowMap, z: Tensor, *, block: int | None = None) -> Tensor:
    """``‖J‖_F = √(Σ_ik J_ik²)`` per row (``[...]``), by column blocks."""
    return entrywise_norms(f, z, block=block).frobenius


def l1_total(f: RowMap, z: Tensor, *, block: int | None = None) -> Tensor:
    """``Σ_ik |J_ik|`` per row (``[...]``): the entry-wise ℓ1 total of Lemma 3 of [B]."""
    return entrywise_norms(f, z, block=block).l1_total


# --------------------------------------------------------------------------------------------
# The finite-difference estimator of [A], Algorithm 5


def unit_directions(shape, *, seed: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Gaussian vectors normalised to unit ℓ2 length on the last dim (docs/THEORY.md §5, choice)."""
    v = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)


def fd_estimate(
    f: RowMap, logits: Tensor, direction: Tensor, *, eps: float, temperature: float = 1.0
) -> Tensor:
    """``δ = ‖f((l + εv)/T) − f(l/T)‖₂ / ε`` per row ([A], Algorithm 5, [stated]).

    ``f`` is the normalizer at temperature 1 applied to scaled logits; ``direction`` is ``v``
    (unit rows, see :func:`unit_directions`). For softmax ``δ ≤ min{1/(2T), √2/ε}``
    (:func:`attnverify.bounds.fd_estimator_bound`).
    """
    moved = f((logits + eps * direction) / temperature)
    return torch.linalg.vector_norm(moved - f(logits / temperature), dim=-1) / eps
