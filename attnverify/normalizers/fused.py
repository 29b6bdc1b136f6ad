"""``softmax_fused``: softmax on attnverify's own fused CPU kernel, a target like any user's.

``attnverify.normalizers._fused`` (``_fused.c``, built at install time, optional) computes a
float32 softmax over the last dimension in three passes with a vectorised polynomial exp. It is
not the reference path: the built-in ``softmax`` runs ``torch.softmax``
(:mod:`attnverify.normalizers.dense`), and ``softmax_fused`` is certified against it
(``matches_reference``) and benchmarked against ``torch.softmax`` like any user's fast kernel
(``benchmarks/compare_peers.py``, ``docs/benchmarks/cpu-latest.md``).

:func:`softmax_fused` has ``softmax``'s contract: ``softmax((z − max z)/T)`` over ``dim``, a
masked key gives exactly 0 and a fully masked row gives zeros. The kernel runs on a contiguous
float32 CPU tensor (a plain tensor or a Parameter, not another subclass), softmax over its last
dimension; everything else, and every row holding NaN or +inf, runs ``softmax``'s torch path.

Only public torch API. The forward and backward kernels are torch operators,
``torch.ops.attnverify.softmax_fused`` and ``softmax_fused_backward`` (defined with
:mod:`torch.library`, with Meta implementations for fake tensors), so dispatch modes
(``FlopCounterMode``, ``make_fx``, fake tensors) see operator calls instead of hidden C calls
(the backward calls its kernel directly on plain tensors, where the operator's Python dispatch
would be a measurable part of the call; subclasses such as fake tensors get the operator).
Autograd is a :class:`torch.autograd.Function`: its backward is the backward kernel, which
computes softmax's own formula ``y ⊙ (g − Σ g⊙y) / T`` in one pass per row (in place of torch's
private ``_softmax_backward_data``); with ``create_graph`` it is that formula in torch ops, so
double backward works; its ``jvp`` serves forward-mode AD.

Inputs the kernel must not see go to the torch path instead: a torch function mode or subclass
(``torch.overrides.has_torch_function``), a tensor without plain memory (``data_ptr()`` fails for
``torch.func``'s wrapped tensors and is 0 for a zero tensor), a negated view (``is_neg()``),
``torch.compile`` and ``torch.jit.trace``. The one thing outside torch's API is the OpenMP
runtime: the extension links ``libgomp.so.1`` and torch is imported first, so with torch's wheel
(which ships its libgomp under that soname) both share one runtime and thread pool; with a torch
that renames its libgomp the results are the same and a second thread pool exists (a
performance matter only).

Environment:

- ``ATTNVERIFY_FUSED=0`` turns the kernel off (``softmax_fused`` then runs the torch path);
- ``ATTNVERIFY_FUSED_ISA=scalar|avx2|avx512`` forces the forward kernel's instruction set (tests
  use it to cover every path on one machine); asking for one the CPU lacks is an error at first
  use. The backward kernel is plain C compiled once per instruction set (GCC's
  ``target_clones``), and the loader picks the best the CPU has.

Both are parsed by :mod:`attnverify.settings` (read once; ``settings.reload()`` rereads them);
the command line rejects bad values up front.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

from attnverify import settings
from attnverify.normalizers import dense
from attnverify.normalizers.rows import check_temperature

#: The kernel build this module expects; ``_fused.c``'s ``KERNEL_VERSION``.
KERNEL_VERSION = 4

_F32_NORMAL = 1.1754943508222875e-38
_F32_MAX = 3.4028234663852886e38

ISA_NAMES = {level: name for name, level in settings.ISA_LEVELS.items()}

try:  # built by `pip install` when a C compiler is present
    from attnverify.normalizers import _fused as _ext
except ImportError as exc:  # pragma: no cover - depends on the install
    _ext = None
    _WHY_NOT = f"extension not built ({exc}); reinstall with a C compiler to enable it"
else:
    _WHY_NOT = None
    _built = getattr(_ext, "kernel_version", lambda: 0)()
    if _built != KERNEL_VERSION:  # pragma: no cover - a stale in-place build
        _WHY_NOT = (
            f"stale build (kernel version {_built}, expected {KERNEL_VERSION}); "
            "run `pip install -e .` again"
        )
        _ext = None


def status() -> str:
    """One line: whether the fused kernel is live, and with which instruction set, or why not."""
    if _ext is None:
        return f"fused softmax: off, {_WHY_NOT}"
    if not settings.fused_enabled():
        return "fused softmax: off, ATTNVERIFY_FUSED=0"
    forced = settings.fused_isa()
    isa = ISA_NAMES[forced or _ext.available_isa()]
    return f"fused softmax: on ({isa}{', forced' if forced else ''})"


def available() -> bool:
    """Whether :func:`softmax_lastdim` can run the kernel in this process."""
    return _ext is not None and settings.fused_enabled()


def softmax_fused(scores: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Softmax with temperature on attnverify's fused float32 CPU kernel (``_fused.c``).

    The same map as the built-in ``softmax`` (certified against it): ``softmax((z − max z)/T)``,
    masked keys 0, a fully masked row zeros. Contiguous float32 CPU scores, last dimension, run
    the kernel; everything else runs ``softmax``'s ``torch.softmax`` path.
    """
    check_temperature(temperature)
    y = softmax_lastdim(scores, dim, temperature)
    return dense.softmax(scores, dim, temperature) if y is None else y


#: Tensor types whose memory is what their values say (a Parameter is a plain tensor too).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _eligible(x: torch.Tensor, dim: int) -> bool:
    """Plain memory the kernel can read as rows, and nothing that expects to see torch ops: no
    subclass (FakeTensor, …) or torch function mode, no ``torch.func`` wrapper (its
    ``data_ptr()`` raises), no zero tensor (``data_ptr()`` is 0). Public API only; the cheapest
    tests first, since this runs on every call."""
    if not (
        type(x) in _PLAIN
        and x.is_cpu
        and x.dtype is torch.float32
        and x.layout is torch.strided
        and x.dim() > 0
        and dim in (-1, x.dim() - 1)
        and x.is_contiguous()
        and not x.is_neg()
        and not torch.overrides.has_torch_function((x,))
    ):
        return False
    try:
        return x.data_ptr() != 0
    except RuntimeError:  # a tensor without storage: torch.func's wrappers
        return False


def _run(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """The kernel's output; the torch path's instead when a row holds NaN or +inf (or when the
    operator is called directly on a tensor the kernel cannot read as rows)."""
    if not (x.dtype is torch.float32 and x.dim() > 0 and x.numel() and x.is_contiguous()):
        return dense.softmax(x, -1, temperature)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    n = x.shape[-1]
    left = _ext.softmax_f32(
        x.data_ptr(),
        y.data_ptr(),
        x.numel() // n,
        n,
        float(temperature),
        torch.get_num_threads(),
        settings.fused_isa(),  # 0: the kernel picks the best the CPU has
    )
    return dense.softmax(x, -1, temperature) if left else y


def _backward_formula(grad: torch.Tensor, y: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax's backward in torch ops, ``y ⊙ (g − Σ g⊙y) / T``: differentiable (double
    backward) and for any grad tensor."""
    g = y * (grad - (grad * y).sum(dim=-1, keepdim=True))
    return g if temperature == 1.0 else g / temperature


def _run_backward(grad: torch.Tensor, y: torch.Tensor, temperature: float) -> torch.Tensor:
    """The backward kernel's output for a contiguous float32 ``grad`` shaped like ``y`` (the
    forward's contiguous output); :func:`_backward_formula` for any other ``grad`` (an expanded
    one from ``.sum()``, another dtype)."""
    if not (
        grad.dtype is torch.float32
        and y.dtype is torch.float32
        and grad.shape == y.shape
        and grad.is_contiguous()
        and y.is_contiguous()
        and not grad.is_neg()
        and y.dim() > 0
        and y.numel()
    ):
        return _backward_formula(grad, y, temperature)
    dx = torch.empty_like(y, memory_format=torch.contiguous_format)
    n = y.shape[-1]
    _ext.softmax_backward_f32(
        grad.data_ptr(),
        y.data_ptr(),
        dx.data_ptr(),
        y.numel() // n,
        n,
        float(temperature),
        torch.get_num_threads(),
    )
    return dx


def _empty_like(x: torch.Tensor, *_args) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


#: ``torch.ops.attnverify.softmax_fused(x, temperature)`` and
#: ``torch.ops.attnverify.softmax_fused_backward(grad, y, temperature)``: the kernels as torch
#: operators, with Meta implementations (shapes only) for fake tensors.
_LIB = None
if _ext is not None:
    _LIB = torch.library.Library("attnverify", "FRAGMENT")
    _LIB.define("softmax_fused(Tensor x, float temperature) -> Tensor")
    _LIB.impl("softmax_fused", _run, "CPU")
    _LIB.impl("softmax_fused", _empty_like, "Meta")
    _LIB.define("softmax_fused_backward(Tensor grad, Tensor y, float temperature) -> Tensor")
    _LIB.impl("softmax_fused_backward", _run_backward, "CPU")
    _LIB.impl("softmax_fused_backward", lambda g, y, t: _empty_like(y), "Meta")


class _FusedSoftmax(torch.autograd.Function):
    """Forward: the kernel's operator. Backward: the backward kernel's operator, or, with
    ``create_graph``, softmax's derivative in torch ops (so double backward works). ``jvp``: the
    derivative in torch ops."""

    @staticmethod
    def forward(x: torch.Tensor, temperature: float) -> torch.Tensor:
        return torch.ops.attnverify.softmax_fused(x, temperature)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.temperature = inputs[1]
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the formula, which autograd differentiates
            return _backward_formula(grad, y, ctx.temperature), None
        if type(grad) in _PLAIN and not torch.overrides.has_torch_function((grad,)):
            # plain tensors: the kernel directly, without the operator's Python dispatch
            return _run_backward(grad, y, ctx.temperature), None
        return torch.ops.attnverify.softmax_fused_backward(grad, y, ctx.temperature), None

    @staticmethod
    def jvp(ctx, dx: torch.Tensor, _t):
        (y,) = ctx.saved_tensors
        t = dx if ctx.temperature == 1.0 else dx / ctx.temperature
        return y * (t - (y * t).sum(dim=-1, keepdim=True))


def softmax_lastdim(x: torch.Tensor, dim: int, temperature: float):
    """``softmax((x − max x) / temperature)`` over ``dim`` by the kernel, or ``None`` if it does
    not apply.

    ``temperature`` must already be checked (positive, finite). A fully masked row gives zeros.
    If a row holds NaN or +inf the whole result is ``softmax``'s torch path, so such inputs
    behave exactly as without the kernel.
    """
    if _ext is None or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None  # torch.softmax is traceable; a C call is a graph break or, for jit.trace, lost
    if isinstance(temperature, torch.Tensor):
        return None  # a tensor temperature may need its own gradient
    if x.numel() == 0 or not _eligible(x, dim) or not settings.fused_enabled():
        return None
    if temperature != 1.0 and not _F32_NORMAL <= temperature <= _F32_MAX:
        return None  # not a normal float32: the kernel divides in float32
    dual = forward_ad.unpack_dual(x).tangent is not None
    if dual or (x.requires_grad and torch.is_grad_enabled()):
        return _FusedSoftmax.apply(x, temperature)
    return torch.ops.attnverify.softmax_fused(x, temperature)
