"""Spectral norm of the softmax Jacobian: matrix-free Lanczos against a dense Jacobian.

Run: ``python benchmarks/bench_jacobian.py [--max-length 65536] [--dense-max 2048]``.

For L = 1k, 2k, …, 64k it times :func:`attnverify.jacobian.spectral_norm` (Lanczos on
JᵀJ by JVP / VJP products; best of ``--repeats`` after one warm-up call), once with its default of
one intra-op thread and once with ``threads=None`` (torch's setting; on a shared, loaded machine
the thread barriers cost far more than the ops, memory-bound vectors of L doubles, save), and,
up to ``--dense-max``, the dense route: ``torch.autograd.functional.jacobian`` (vectorised),
and up to ``--svd-max`` ``torch.linalg.matrix_norm(J, 2)`` on it (one run each). ``ms/step``
is the one-thread time per Lanczos step (one JVP, one VJP, one reorthogonalisation), which
removes the spectrum-dependent step count; ``residual`` is the Lanczos certificate relative
to the value. Inputs are made before the clock starts; each row is a
seeded Gaussian logit row in float64. The matrix-free time should grow about linearly in L,
the dense one about cubically (the SVD).
"""

from __future__ import annotations

import argparse
import time

import torch

from attnverify.jacobian import spectral_norm


def softmax(z: torch.Tensor) -> torch.Tensor:
    return torch.softmax(z, -1)


def best_time(fn, repeats: int) -> tuple[float, object]:
    """Best wall time of ``repeats`` calls (after one warm-up call) and the last result."""
    result = fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def dense_jacobian(z: torch.Tensor) -> torch.Tensor:
    return torch.autograd.functional.jacobian(softmax, z, vectorize=True)


def row(length: int, args) -> str:
    """One table line: matrix-free time, then the dense Jacobian and its SVD where in reach."""
    gen = torch.Generator().manual_seed(args.seed)
    z = torch.randn(length, generator=gen, dtype=torch.float64)
    fast, _ = best_time(lambda: spectral_norm(softmax, z, threads=None), args.repeats)
    single, result = best_time(lambda: spectral_norm(softmax, z), args.repeats)
    value = float(result.value)
    per_step = 1e3 * single / result.steps
    line = f"{length:>6} {single:>9.4f} {fast:>9.4f} {result.steps:>5} {per_step:>8.3f} "
    line += f"{float(result.residual) / value:>9.1e}"
    if length > args.dense_max:
        return line + f" {'-':>10} {'-':>9} {'-':>11}"
    build, J = best_time(lambda: dense_jacobian(z), 1)
    line += f" {build:>10.3f}"
    if length > args.svd_max:
        return line + f" {'-':>9} {'-':>11}"
    svd, norm = best_time(lambda: torch.linalg.matrix_norm(J, 2), 1)
    return line + f" {svd:>9.3f} {abs(float(norm) - value) / value:>11.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, default=65536)
    parser.add_argument("--dense-max", type=int, default=4096, help="largest L for the dense J")
    parser.add_argument("--svd-max", type=int, default=2048, help="largest L for its SVD")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64, softmax")
    print(
        f"{'L':>6} {'1 thread':>9} {f'{torch.get_num_threads()} thr.':>9} {'steps':>5} "
        f"{'ms/step':>8} "
        f"{'residual':>9} "
        f"{'dense J s':>10} {'svd s':>9} {'|diff|/norm':>11}"
    )
    length = 1024
    while length <= args.max_length:
        print(row(length, args), flush=True)
        length *= 2


if __name__ == "__main__":
    main()
