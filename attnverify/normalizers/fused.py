"""The fused CPU softmax: when it runs, and its autograd.

``attnverify.normalizers._fused`` (``_fused.c``, built at install time, optional) computes a
float32 softmax over the last dimension in three passes with a vectorised polynomial exp. On the
benchmark machine it took 2.11× the time of a same-size copy, where ``torch.softmax`` took 5.1×
(``docs/benchmarks/cpu-latest.md``); its error against float64 is no larger than
``torch.softmax``'s (``tests/test_fused.py``).

:func:`softmax_lastdim` returns ``None`` whenever the kernel does not apply, and the caller then
uses ``torch.softmax``. It applies to a contiguous float32 CPU tensor (a plain tensor or a
Parameter, not another subclass), softmax over its last dimension, outside ``torch.func``
transforms, torch function or dispatch modes, ``torch.compile`` and ``torch.jit.trace``. With
autograd the forward is the kernel and the backward is ``torch``'s own softmax backward, which
is differentiable, so double backward works; forward-mode AD has a ``jvp``.

Environment:

- ``ATTNVERIFY_FUSED=0`` turns the kernel off (everything runs on ``torch.softmax``);
- ``ATTNVERIFY_FUSED_ISA=scalar|avx2|avx512`` forces an instruction set (tests use it to cover
  every path on one machine); asking for one the CPU lacks is an error at first use.

Both are parsed by :mod:`attnverify.settings` (read once; ``settings.reload()`` rereads them);
the command line rejects bad values up front.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

from attnverify import settings

#: The kernel build this module expects; ``_fused.c``'s ``KERNEL_VERSION``.
KERNEL_VERSION = 3

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


#: Tensor types whose memory is what their values say (a Parameter is a plain tensor too).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _eligible(x: torch.Tensor, dim: int) -> bool:
    """Plain memory the kernel can read as rows, and nothing that expects to see torch ops: no
    subclass (FakeTensor, …), no ``torch.func`` transform, no function or dispatch mode (a
    FlopCounterMode, a tracer) active. (Cheapest tests first: this runs on every call.)"""
    return (
        type(x) in _PLAIN
        and x.is_cpu
        and x.dtype is torch.float32
        and x.layout is torch.strided
        and x.dim() > 0
        and dim in (-1, x.dim() - 1)
        and x.is_contiguous()
        and not x.is_neg()
        and not x._is_zerotensor()  # no memory behind it (data_ptr() is 0)
        and not torch._C._are_functorch_transforms_active()
        and torch._C._len_torch_function_stack() == 0
        and torch._C._len_torch_dispatch_stack() == 0
    )


def _run(x: torch.Tensor, temperature: float, reference) -> torch.Tensor:
    """The kernel's output; ``reference(x)`` instead when a row holds NaN or +inf."""
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
    return reference(x) if left else y


class _FusedSoftmax(torch.autograd.Function):
    """Forward: the kernel. Backward: ``torch``'s softmax backward (itself differentiable)."""

    @staticmethod
    def forward(x: torch.Tensor, temperature: float, reference) -> torch.Tensor:
        return _run(x, temperature, reference)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.temperature = inputs[1]
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (y,) = ctx.saved_tensors
        g = torch._softmax_backward_data(grad, y, -1, torch.float32)
        return (g if ctx.temperature == 1.0 else g / ctx.temperature), None, None

    @staticmethod
    def jvp(ctx, dx: torch.Tensor, _t, _r):
        (y,) = ctx.saved_tensors
        t = dx if ctx.temperature == 1.0 else dx / ctx.temperature
        return y * (t - (y * t).sum(dim=-1, keepdim=True))


def softmax_lastdim(x: torch.Tensor, dim: int, temperature: float, reference):
    """``softmax((x − max x) / temperature)`` over ``dim`` by the kernel, or ``None`` if it does
    not apply.

    ``temperature`` must already be checked (positive, finite). A fully masked row gives zeros.
    If a row holds NaN or +inf the result is ``reference(x)`` (the caller's own path, given the
    undivided scores), so such inputs behave exactly as without the kernel.
    """
    if _ext is None or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None  # torch.softmax is traceable; a C call is a graph break or, for jit.trace, lost
    if isinstance(temperature, torch.Tensor):
        return None  # a tensor temperature may need its own gradient
    if x.numel() == 0 or not _eligible(x, dim) or not settings.fused_enabled():
        return None
    if temperature != 1.0 and not _F32_NORMAL <= temperature <= _F32_MAX:
        return None  # not a normal float32: the kernel divides in float32
    if (x.requires_grad and torch.is_grad_enabled()) or forward_ad._current_level >= 0:
        return _FusedSoftmax.apply(x, temperature, reference)
    return _run(x, temperature, reference)
