"""Probes of compiled FlexAttention on CPU, outside attnverify (torch only).

``torch.compile(flex_attention)`` is called the way a user would, on a sequence of shapes in one
fresh process, and each call is compared with ``scaled_dot_product_attention`` in float64 on the
same inputs; every shape is called twice with the same inputs. Run (a fresh inductor cache
makes the compiles happen again)::

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=1 python docs/attention/flex_cpu_probe.py

cpu-report.md quotes its output.
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

SHAPES = [((1, 1, 16, 16), (1, 1, 16, 16)), ((1, 1, 40, 16), (1, 1, 40, 16)),
          ((2, 2, 9, 16), (2, 2, 40, 16)), ((2, 2, 9, 16), (2, 2, 40, 16)),
          ((1, 3, 33, 16), (1, 3, 100, 16))]


def probe(fn, q_shape, k_shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*q_shape, generator=g)
    k = torch.randn(*k_shape, generator=g)
    v = torch.randn(*k_shape, generator=g)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    errs = []
    for _ in range(2):
        try:
            out = fn(q, k, v)
            errs.append(f"{(out.double() - ref).abs().nan_to_num(float('inf')).max().item():.3g}")
        except Exception as exc:  # noqa: BLE001
            errs.append(f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    print(f"q {list(q_shape)} k {list(k_shape)} seed {seed}: max |out - ref| = "
          f"{errs[0]} (first call), {errs[1]} (same inputs again)", flush=True)


def main():
    print(f"torch {torch.__version__}")
    compiled = torch.compile(flex_attention)
    for i, (q_shape, k_shape) in enumerate(SHAPES):
        probe(compiled, q_shape, k_shape, seed=i)
    return 0


if __name__ == "__main__":
    sys.exit(main())
