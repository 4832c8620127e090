"""Triton kernel for SwiGLU on a packed (..., 2I) gate/up GEMM output (dohnuts.ops.activation).

Imported only on the first fused call on a CUDA device (like dohnuts.ops._fla): importing
dohnuts never imports Triton.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK = 1024  # columns per program: 2b's I = 6144 is 6 programs per row, no autotuning needed


@triton.jit
def swiglu_packed_kernel(gu, y, I, stride_gu, stride_y, BLOCK: tl.constexpr):
    """One program: BLOCK columns of one row. y[r, c] = silu(gu[r, c]) · gu[r, I + c], in FP32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    p = gu + row * stride_gu
    g = tl.load(p + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(p + I + cols, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(y + row * stride_y + cols, out.to(y.dtype.element_ty), mask=mask)


def swiglu_packed_triton(gu: torch.Tensor) -> torch.Tensor:
    """gu (..., 2I) → (..., I) contiguous; reads each half in place (no split copies). No autograd."""
    two_i = gu.shape[-1]
    I = two_i // 2
    x = gu.reshape(-1, two_i)  # a view for a GEMM output (or any evenly strided rows)
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(*gu.shape[:-1], I, dtype=gu.dtype, device=gu.device)
    rows = x.shape[0]
    if rows == 0 or I == 0:
        return y
    block = min(BLOCK, triton.next_power_of_2(I))
    # The launch goes to the current CUDA device: make it gu's. (CPU tensors: Triton's interpreter.)
    with torch.cuda.device(gu.device) if gu.is_cuda else contextlib.nullcontext():
        swiglu_packed_kernel[(rows, triton.cdiv(I, block))](x, y, I, x.stride(0), I, BLOCK=block, num_warps=4)
    return y
