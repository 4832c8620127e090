"""Triton kernel for the gated attention's output gate (dohnuts.ops.attention.gated_output).

o (B, H, T, D) from attention and the gate logits (B, T, H, D), a strided view of the packed q
projection, → o · sigmoid(gate) as (B, T, H·D) in one pass. The torch composition took a sigmoid
that rewrites the gate contiguous, then a product that reads o across its transposed layout with
a non-vectorised kernel.
`gated_output_fn` is the differentiable op: this forward kernel, and a backward kernel that
writes do = dy·σ(g) as (B, H, T, D) and dg = dy·o·σ(g)(1 − σ(g)) as (B, T, H, D) in one pass.
Imported on the first fused call on a CUDA device (CPU tensors: Triton's interpreter).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dohnuts.ops._norm_kernels import token_heads_tile


@triton.jit
def _gate_kernel(O, G, Y, T, H, D, sob, soh, sot, sgb, sgt, sgh,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per token (b, t): y[b, t, h·D + d] = o[b, h, t, d] · sigmoid(g[b, t, h, d])."""
    pid, b, t, h, d, mask = token_heads_tile(T, H, D, BLOCK_H, BLOCK_D)
    o = tl.load(O + b * sob + h * soh + t * sot + d, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + b * sgb + t * sgt + h * sgh + d, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + pid * H * D + h * D + d, (o * tl.sigmoid(g)).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gate_bwd_kernel(DY, O, G, DO, DG, T, H, D, sob, soh, sot, sgb, sgt, sgh,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per token (b, t): dy (B, T, H·D) → do (B, H, T, D), dg (B, T, H, D)."""
    pid, b, t, h, d, mask = token_heads_tile(T, H, D, BLOCK_H, BLOCK_D)
    dy = tl.load(DY + pid * H * D + h * D + d, mask=mask, other=0.0).to(tl.float32)
    o = tl.load(O + b * sob + h * soh + t * sot + d, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + b * sgb + t * sgt + h * sgh + d, mask=mask, other=0.0).to(tl.float32)
    sg = tl.sigmoid(g)
    tl.store(DO + ((b * H + h) * T + t) * D + d, (dy * sg).to(DO.dtype.element_ty), mask=mask)
    tl.store(DG + pid * H * D + h * D + d, (dy * o * sg * (1.0 - sg)).to(DG.dtype.element_ty), mask=mask)


def gated_output_triton(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """o (B, H, T, D), gate (B, T, H, D), any strides with unit channel stride → (B, T, H·D)."""
    B, H, T, D = o.shape
    if gate.shape != (B, T, H, D):
        raise ValueError(f"gated_output: o {tuple(o.shape)} needs a gate of shape {(B, T, H, D)}, "
                         f"got {tuple(gate.shape)}")
    if o.stride(-1) != 1:
        o = o.contiguous()
    if gate.stride(-1) != 1:
        gate = gate.contiguous()
    y = torch.empty(B, T, H * D, dtype=o.dtype, device=o.device)
    if B * T and H and D:
        with torch.cuda.device(o.device) if o.is_cuda else contextlib.nullcontext():
            _gate_kernel[(B * T,)](o, gate, y, T, H, D, o.stride(0), o.stride(1), o.stride(2),
                                   gate.stride(0), gate.stride(1), gate.stride(2),
                                   BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D),
                                   num_warps=4)
    return y


class _GatedOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, gate):
        ctx.save_for_backward(o, gate)
        return gated_output_triton(o, gate)

    @staticmethod
    def backward(ctx, dy):
        o, gate = ctx.saved_tensors
        B, H, T, D = o.shape
        if o.stride(-1) != 1:
            o = o.contiguous()
        if gate.stride(-1) != 1:
            gate = gate.contiguous()
        dy = dy.contiguous()
        do = torch.empty(B, H, T, D, dtype=o.dtype, device=o.device)
        dg = torch.empty(B, T, H, D, dtype=gate.dtype, device=o.device)
        if B * T and H and D:
            with torch.cuda.device(o.device) if o.is_cuda else contextlib.nullcontext():
                _gate_bwd_kernel[(B * T,)](dy, o, gate, do, dg, T, H, D, o.stride(0), o.stride(1), o.stride(2),
                                           gate.stride(0), gate.stride(1), gate.stride(2),
                                           BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D),
                                           num_warps=4)
        return do, dg


def gated_output_fn(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`gated_output_triton` as a differentiable op (same forward kernel, Triton backward)."""
    return _GatedOutput.apply(o, gate)
