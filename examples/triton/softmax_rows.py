"""Row softmax in Triton, one program per row, the whole row in one block (Triton's tutorial)."""

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols,
                   BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


def softmax(scores, dim=-1):
    x = scores.movedim(dim, -1)
    shape = x.shape
    rows = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(rows)
    n_rows, n_cols = rows.shape
    if n_rows and n_cols:
        softmax_kernel[(n_rows,)](out, rows, rows.stride(0), out.stride(0), n_cols,
                                  BLOCK_SIZE=triton.next_power_of_2(n_cols))
    return out.reshape(shape).movedim(-1, dim)
