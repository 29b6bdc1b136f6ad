"""Attention kernels (``certify --attention`` targets): forward and backward time and peak
memory, and the forward time as a ratio to ``sdpa`` on the same inputs.

Parameters: target × L × dtype × device, on ``[1, 4, L, 64]`` queries, keys and values (N(0, 1),
seeded, made in ``setup``), no mask, ``is_causal=False``. FlexAttention compiles in ``setup``
(warm-up) and has no CPU backward in torch 2.13 (skipped); the float64 ``eager`` reference
materialises ``[4, L, L]`` float64 scores and is skipped above L = 4096; CUDA-only backends and
CUDA on a machine without a GPU are skipped by ``NotImplementedError`` in ``setup``.
"""

from __future__ import annotations

import time

from .devices import configure_threads, require, sync, warm_up

TARGETS = ("sdpa", "sdpa_math", "sdpa_flash", "sdpa_efficient", "flex", "eager")
LENGTHS = (1024, 4096, 8192)
DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda")
PARAMS = [list(TARGETS), list(LENGTHS), list(DTYPES), list(DEVICES)]
PARAM_NAMES = ["target", "L", "dtype", "device"]
HEADS, HEAD_DIM = 4, 64
#: The eager reference's float64 scores are 4·L² doubles: 2 GiB at L = 8192.
EAGER_MAX_L = 4096
#: Forward calls per side in ``track_ratio_to_sdpa`` (interleaved, best of).
RATIO_CALLS = 5


class _Case:
    def __init__(self, target, L, dtype, device, backward=False):
        require(device)
        configure_threads()
        import torch

        from attnverify.attention.kernels import builtins

        spec = builtins().get(target)
        if spec is None:
            raise NotImplementedError(f"no attention target {target!r} in this commit")
        if spec.unavailable:
            raise NotImplementedError(spec.unavailable)
        dt = getattr(torch, dtype)
        if not spec.supports(dt):
            raise NotImplementedError(f"{target} does not take {dtype}")
        if target == "eager" and L > EAGER_MAX_L:
            raise NotImplementedError(f"eager materialises float64 scores; L ≤ {EAGER_MAX_L}")
        if backward and not spec.differentiable:
            raise NotImplementedError(f"{target} has no backward here")
        g = torch.Generator().manual_seed(0)
        shape = (1, HEADS, L, HEAD_DIM)
        self.q, self.k, self.v = (
            torch.randn(shape, generator=g).to(device=device, dtype=dt).requires_grad_(backward)
            for _ in range(3))
        self.spec, self.device = spec, device
        if backward:
            out = spec(self.q, self.k, self.v)
            self.grad = torch.randn(out.shape, generator=g).to(device=device, dtype=out.dtype)
        warm_up(self.forward if not backward else self.backward, device)

    def forward(self):
        out = self.spec(self.q, self.k, self.v)
        sync(self.device)
        return out

    def backward(self):
        import torch

        out = self.spec(self.q, self.k, self.v)
        torch.autograd.grad(out, (self.q, self.k, self.v), self.grad)
        sync(self.device)


class AttentionForward:
    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 300

    def setup(self, target, L, dtype, device):
        self.case = _Case(target, L, dtype, device)

    def time_forward(self, target, L, dtype, device):
        self.case.forward()

    def peakmem_forward(self, target, L, dtype, device):
        self.case.forward()


class AttentionBackward:
    """Forward plus backward w.r.t. q, k and v (the graph is rebuilt in each call)."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 300

    def setup(self, target, L, dtype, device):
        self.case = _Case(target, L, dtype, device, backward=True)

    def time_backward(self, target, L, dtype, device):
        self.case.backward()

    def peakmem_backward(self, target, L, dtype, device):
        self.case.backward()


class AttentionRatio:
    """Forward time of the target divided by ``sdpa``'s on the same inputs (best of
    ``RATIO_CALLS`` interleaved calls each): below 1 is faster than torch's default."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 300
    unit = "ratio"

    def setup(self, target, L, dtype, device):
        self.case = _Case(target, L, dtype, device)
        self.base = _Case("sdpa", L, dtype, device)

    def track_ratio_to_sdpa(self, target, L, dtype, device):
        ours, theirs = [], []
        for _ in range(RATIO_CALLS):
            for fn, out in ((self.case.forward, ours), (self.base.forward, theirs)):
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
        return min(ours) / min(theirs)
