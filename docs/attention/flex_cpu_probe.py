"""Probes of compiled FlexAttention on CPU, outside attnverify (torch only).

Each probe calls ``torch.compile(flex_attention)`` the way a user would and compares with
``scaled_dot_product_attention`` in float64 on the same inputs. Run:
``OMP_NUM_THREADS=1 python docs/attention/flex_cpu_probe.py``; cpu-report.md quotes its output.
"""

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention


def probe(fn, label, q_shape, k_shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*q_shape, generator=g)
    k = torch.randn(*k_shape, generator=g)
    v = torch.randn(*k_shape, generator=g)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    try:
        out = fn(q, k, v)
        err = (out.double() - ref).abs().nan_to_num(float("inf")).max().item()
        print(f"{label}: q {list(q_shape)} k {list(k_shape)}: max |out - ref| = {err:.3g}",
              flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"{label}: q {list(q_shape)} k {list(k_shape)}: raised "
              f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)


def main():
    print(f"torch {torch.__version__}")
    # 1. a fresh compile whose first (static) shape has L = 40
    static = torch.compile(flex_attention)
    probe(static, "fresh compile, first call", (1, 1, 40, 16), (1, 1, 40, 16))
    probe(static, "same compiled fn, second shape (dynamic recompile)", (1, 1, 33, 16),
          (1, 1, 33, 16))
    # 2. shapes after the dynamic recompile of another fresh compile
    dyn = torch.compile(flex_attention)
    for q_shape, k_shape in [((1, 1, 16, 16), (1, 1, 16, 16)), ((1, 1, 40, 16), (1, 1, 40, 16)),
                             ((2, 2, 9, 16), (2, 2, 40, 16)), ((2, 1, 1, 16), (2, 1, 3, 16))]:
        probe(dyn, "fresh compile, sequence of shapes", q_shape, k_shape)


if __name__ == "__main__":
    main()
