"""Triton kernel for SwiGLU on a packed (..., 2I) gate/up GEMM output (dohnuts.ops.activation).
`swiglu_packed_fn` is the differentiable op: this forward kernel and a backward kernel writing both
halves of the packed gradient in one pass. Imported only on the first fused call on a CUDA device
(like dohnuts.ops._fla): importing dohnuts never imports Triton."""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dohnuts.ops import spare as spare_columns

BLOCK = 1024  # columns per program: 2b's I = 6144 is 6 programs per row, no autotuning needed


@triton.jit
def _gate_up(gu, I, stride_gu, BLOCK: tl.constexpr):
    """This program's row, its BLOCK columns and their mask, and the gate and up halves there (FP32)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    p = gu + row * stride_gu
    g = tl.load(p + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(p + I + cols, mask=mask, other=0.0).to(tl.float32)
    return row, cols, mask, g, u


@triton.jit
def swiglu_packed_kernel(gu, y, I, stride_gu, stride_y, BLOCK: tl.constexpr):
    """One program: BLOCK columns of one row. y[r, c] = silu(gu[r, c]) · gu[r, I + c], in FP32."""
    row, cols, mask, g, u = _gate_up(gu, I, stride_gu, BLOCK)
    out = g * tl.sigmoid(g) * u
    tl.store(y + row * stride_y + cols, out.to(y.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_packed_bwd_kernel(gu, dy, dgu, I, stride_gu, stride_dy, BLOCK: tl.constexpr):
    """d gate = dy·u·σ(g)(1 + g(1 − σ(g))), d up = dy·silu(g), into the packed (rows, 2I) gradient."""
    row, cols, mask, g, u = _gate_up(gu, I, stride_gu, BLOCK)
    d = tl.load(dy + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    sg = tl.sigmoid(g)
    q = dgu + row * 2 * I
    tl.store(q + cols, (d * u * sg * (1.0 + g * (1.0 - sg))).to(dgu.dtype.element_ty), mask=mask)
    tl.store(q + I + cols, (d * g * sg).to(dgu.dtype.element_ty), mask=mask)


def _packed_rows(gu: torch.Tensor) -> torch.Tensor:
    x = gu.reshape(-1, gu.shape[-1])  # a view for a GEMM output (or any evenly strided rows)
    return x if x.stride(-1) == 1 else x.contiguous()


def swiglu_packed_triton(gu: torch.Tensor, spare: int = 0) -> torch.Tensor:
    """gu (..., 2I) → (..., I), contiguous or written with `spare` spare columns for the LoRA group
    reading it (dohnuts.ops.spare); reads each half in place (no split copies). No autograd."""
    two_i = gu.shape[-1]
    I = two_i // 2
    x = _packed_rows(gu)
    y = spare_columns.empty((*gu.shape[:-1], I), spare, dtype=gu.dtype, device=gu.device)
    rows = x.shape[0]
    if rows == 0 or I == 0:
        return y
    block = min(BLOCK, triton.next_power_of_2(I))
    # The launch goes to the current CUDA device: make it gu's. (CPU tensors: Triton's interpreter.)
    with torch.cuda.device(gu.device) if gu.is_cuda else contextlib.nullcontext():
        swiglu_packed_kernel[(rows, triton.cdiv(I, block))](x, y, I, x.stride(0), I + spare_columns.width(spare),
                                                             BLOCK=block, num_warps=4)
    return y


class _SwigluPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu, spare):
        ctx.save_for_backward(gu)
        return swiglu_packed_triton(gu, spare)

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        x = _packed_rows(gu)
        two_i = gu.shape[-1]
        I = two_i // 2
        d = dy.reshape(-1, I)
        if d.stride(-1) != 1:
            d = d.contiguous()
        dgu = torch.empty(gu.shape, dtype=gu.dtype, device=gu.device)
        rows = x.shape[0]
        if rows and I:
            block = min(BLOCK, triton.next_power_of_2(I))
            with torch.cuda.device(gu.device) if gu.is_cuda else contextlib.nullcontext():
                swiglu_packed_bwd_kernel[(rows, triton.cdiv(I, block))](x, d, dgu, I, x.stride(0), d.stride(0),
                                                                       BLOCK=block, num_warps=4)
        return dgu, None


def swiglu_packed_fn(gu: torch.Tensor, spare: int = 0) -> torch.Tensor:
    """`swiglu_packed_triton` as a differentiable op (same forward kernel, Triton backward)."""
    return _SwigluPacked.apply(gu, spare)
