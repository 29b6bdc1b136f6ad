"""What the benchmarks measure: a normalizer by name, its input and its timed calls.

A name is a built-in id, ``target`` (the user's normalizer, ``ATTNVERIFY_BENCH_TARGET``) or a
peer (``torch.softmax``, ``entmax.sparsemax``, ``entmax.entmax15``, ``entmax.entmax_bisect``).
Anything that cannot run here raises ``NotImplementedError``, asv's skip; a target that is set
but fails to load raises its own error, so a typo never passes as a skip.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from . import devices
from .grid import BUILTIN_IDS, OVERRIDES, PEERS, TARGET, TRITON_EXAMPLES

#: ``ATTNVERIFY_BENCH_TARGET``: the user's normalizer as a target string (docs/INTERFACES.md):
#: ``package.module:attr``, ``path/to/file.py:attr``, an entry-point name or a built-in id.
TARGET_ENV = "ATTNVERIFY_BENCH_TARGET"
#: ``ATTNVERIFY_BENCH_PARAMS``: parameters for the target, ``k=v,k=v`` as ``--params`` takes.
TARGET_PARAMS_ENV = "ATTNVERIFY_BENCH_PARAMS"

#: Seed of the scores every benchmark uses.
SEED = 0


def dtype_of(name: str):
    import torch

    return getattr(torch, name)


#: Why a Triton kernel is not timed off a GPU.
TRITON_SKIP = ("Triton kernels are timed on a GPU only: here they would run in Triton's "
               "interpreter, whose timings mean nothing")


def resolve(name: str, device: str = "cpu") -> Callable:
    """``f(scores) -> weights`` along the last dimension, for a grid name (a Triton kernel,
    an example's or the user's target, only on a GPU: ``NotImplementedError`` elsewhere)."""
    if name == TARGET:
        return _target(device)
    if name in TRITON_EXAMPLES:
        return _triton_example(name, device)
    if name in PEERS:
        return _peer(name)
    if name in BUILTIN_IDS:
        return _builtin(name)
    raise ValueError(f"unknown normalizer {name!r} in the benchmark grid")


def _target(device: str) -> Callable:
    target = os.environ.get(TARGET_ENV, "").strip()
    if not target:
        raise NotImplementedError(f"set {TARGET_ENV}=package.module:attr to benchmark a target")
    from attnverify.registry import load_target, parse_params

    spec = load_target(target, parse_params(os.environ.get(TARGET_PARAMS_ENV)))
    if device != "cuda" and _uses_triton(spec.fn):
        raise NotImplementedError(f"{target}: {TRITON_SKIP}")
    return functools.partial(spec, dim=-1)


def _uses_triton(fn) -> bool:
    """Whether ``fn``'s module binds a Triton kernel (``@triton.jit`` and the like)."""
    import inspect

    try:
        from attnverify import triton_runtime
    except ImportError:  # a commit before Triton targets
        return False
    module = inspect.getmodule(fn)
    return bool(module is not None and triton_runtime.kernels_in([module]))


def _triton_example(name: str, device: str) -> Callable:
    if device != "cuda":
        raise NotImplementedError(f"{name}: {TRITON_SKIP}")
    try:
        import triton  # noqa: F401 - only whether it is there
    except ImportError as exc:
        raise NotImplementedError(f"{name}: triton is not installed") from exc
    from pathlib import Path

    from attnverify.registry import load_target

    path = Path(__file__).resolve().parent.parent / "examples" / "triton"
    spec = load_target(f"{path / name.removeprefix('triton.')}.py:softmax")
    return functools.partial(spec, dim=-1)


def _peer(name: str) -> Callable:
    import torch

    if name == "torch.softmax":
        return functools.partial(torch.softmax, dim=-1)
    try:
        import entmax
    except ImportError as exc:
        raise NotImplementedError(f"{name}: the entmax package is not installed") from exc
    fn = getattr(entmax, name.split(".", 1)[1])
    return functools.partial(fn, dim=-1, **OVERRIDES.get(name, {}))


def _builtin(name: str) -> Callable:
    try:
        from attnverify.registry import builtin_ids, load_target
    except ImportError as exc:
        raise NotImplementedError(f"attnverify.registry is missing in this commit: {exc}") from exc
    try:
        ids = builtin_ids()
    except ImportError as exc:
        if "attnverify.normalizers" not in str(exc) and "BUILTINS" not in str(exc):
            raise
        raise NotImplementedError(f"no built-in normalizers in this commit: {exc}") from exc
    if name not in ids:
        raise NotImplementedError(f"{name!r} is not a built-in in this commit")
    spec = load_target(name, OVERRIDES.get(name))
    return functools.partial(spec, dim=-1)


def scores(rows: int, length: int, dtype: str, device: str, *, grad: bool = False):
    """Attention-shaped scores ``[rows, L]`` (rows = batch·heads), N(0, 1), seeded."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    z = torch.randn(rows, length, generator=gen, dtype=torch.float32)
    z = z.to(device=device, dtype=dtype_of(dtype))
    return z.requires_grad_(grad)


class Case:
    """One normalizer on one input, with ``forward()`` and ``backward()`` ready to time.

    Built in ``setup``: skips (``NotImplementedError``) when the device or the normalizer is not
    available, builds the graph once for ``backward()`` and warms both calls up.
    """

    def __init__(
        self, name: str, rows: int, length: int, dtype: str, device: str, *, backward: bool = False
    ):
        devices.require(device)
        devices.configure_threads()
        self.name, self.device = name, device
        self.fn = resolve(name, device)
        self.z = scores(rows, length, dtype, device)
        self.numel = self.z.numel()
        self.itemsize = self.z.element_size()
        self._out = self._grad = self._zg = None
        self._dst = self.z.new_empty(self.z.shape)
        devices.warm_up(self.forward, device)
        if backward:
            self._prepare_backward(rows, length, dtype)
            devices.warm_up(self.backward, device)

    def _prepare_backward(self, rows: int, length: int, dtype: str) -> None:
        import torch

        self._zg = scores(rows, length, dtype, self.device, grad=True)
        out = self.fn(self._zg)
        if not out.requires_grad:
            raise NotImplementedError(f"{self.name}: output does not require grad")
        gen = torch.Generator().manual_seed(SEED + 1)
        grad = torch.randn(out.shape, generator=gen, dtype=torch.float32)
        self._out, self._grad = out, grad.to(device=out.device, dtype=out.dtype)

    def forward(self):
        y = self.fn(self.z)
        devices.sync(self.device)
        return y

    def backward(self):
        import torch

        (g,) = torch.autograd.grad(self._out, self._zg, self._grad, retain_graph=True)
        devices.sync(self.device)
        return g

    def copy(self):
        """A same-size copy: the bandwidth yardstick (reads and writes ``numel`` elements)."""
        self._dst.copy_(self.z)
        devices.sync(self.device)
        return self._dst

    def bytes_moved(self, direction: str) -> int:
        """Memory-bound minimum: forward reads z, writes p; backward reads p and dp, writes dz."""
        per_element = {"forward": 2, "backward": 3, "copy": 2}[direction]
        return per_element * self.numel * self.itemsize
