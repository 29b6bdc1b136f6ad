"""Row softmax in Triton over blocks narrower than the row: the online softmax (a running max
and a running sum rescaled whenever the max grows), then a second pass that writes the weights.
The rows may be any strided view: the kernel takes the row stride and the column stride, so no
copy is made.

    attnverify certify examples/triton/softmax_online.py:softmax --reference softmax
"""

import torch
import triton
import triton.language as tl

#: Keys per block: rows longer than this take several blocks (the loop below). Wide blocks mean
#: few steps, which is what the interpreter pays for.
BLOCK = 256


@triton.jit
def online_softmax_kernel(out_ptr, in_ptr, in_row_stride, in_col_stride, out_row_stride,
                          n_cols, BLOCK_SIZE: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0)
    src = in_ptr + row * in_row_stride
    dst = out_ptr + row * out_row_stride
    cols = tl.arange(0, BLOCK_SIZE)
    m = tl.full([BLOCK_SIZE], -float("inf"), ACC)  # running max, per lane
    s = tl.zeros([BLOCK_SIZE], ACC)  # running sum of exp(x - m), per lane
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + cols
        x = tl.load(src + offs * in_col_stride, mask=offs < n_cols,
                    other=-float("inf")).to(ACC)
        m_new = tl.maximum(m, x)
        safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a lane with no key yet
        s = s * tl.exp(m - safe) + tl.exp(x - safe)
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - row_max), axis=0)
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + cols
        x = tl.load(src + offs * in_col_stride, mask=offs < n_cols,
                    other=-float("inf")).to(ACC)
        w = tl.exp(x - row_max) / total
        tl.store(dst + offs, w.to(out_ptr.dtype.element_ty), mask=offs < n_cols)


def softmax(scores, dim=-1):
    """Softmax along ``dim`` (float32 accumulates in float32, float64 in float64)."""
    x = scores.movedim(dim, -1)
    shape = x.shape
    rows = x.reshape(-1, shape[-1])  # a view where the layout allows one, else a copy
    out = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
    n_rows, n_cols = rows.shape
    if n_rows and n_cols:
        acc = tl.float64 if rows.dtype == torch.float64 else tl.float32
        online_softmax_kernel[(n_rows,)](out, rows, rows.stride(0), rows.stride(1),
                                         out.stride(0), n_cols, BLOCK_SIZE=BLOCK, ACC=acc)
    return out.reshape(shape).movedim(-1, dim)
