"""Row softmax in Triton: one program per row, the whole row in one block (Triton's fused-softmax
tutorial), behind the normalizer signature ``softmax(scores, dim=-1)`` attnverify certifies.

    attnverify certify examples/triton/softmax_rows.py:softmax --reference softmax

Without a GPU the kernel runs in Triton's interpreter (attnverify sets it up in its worker).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols,
                   BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    # masked lanes read -inf: they add exp(-inf) = 0 to the sum and never win the max
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


def softmax(scores, dim=-1):
    """Softmax along ``dim`` (float32 or float64), any layout: rows are gathered into a
    contiguous [rows, n] buffer whose row stride the kernel is given."""
    x = scores.movedim(dim, -1)
    shape = x.shape
    rows = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(rows)
    n_rows, n_cols = rows.shape
    if n_rows and n_cols:
        softmax_kernel[(n_rows,)](out, rows, rows.stride(0), out.stride(0), n_cols,
                                  BLOCK_SIZE=triton.next_power_of_2(n_cols))
    return out.reshape(shape).movedim(-1, dim)
