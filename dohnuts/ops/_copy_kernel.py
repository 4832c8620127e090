"""Triton kernel: a 4-D copy whose source may be broadcast over the batch (stride 0).

A forked prefix state reaches the suffix pass as batch-broadcast views. The prefix keys/values
are copied once per branch, joined to the new ones (the suffix's attention input); the recurrent
state is not copied at all since the inference delta rule reads it through a batch stride
(dohnuts.ops._delta_h_kernel), and other paths copy it with this op. PyTorch copies a stride-0
source with its generic strided kernel, one element per thread, well below the memory
bandwidth. Here every program moves a (rows × C) tile with
vectorised loads and stores along the unit-stride last dimension, and a broadcast source is read
from L2 by every batch row after the first. No autograd; CPU tensors run in Triton's interpreter
(the CPU tests).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

TILE = 4096  # elements per program (8–16 KiB)


@triton.jit
def _copy4d_kernel(SRC, DST, R, C, ssb, ssh, ssr, dsb, dsh, dsr, BR: tl.constexpr, BC: tl.constexpr):
    """Program (row block, h, b): DST[b, h, r, c] = SRC[b, h, r, c] (ssb may be 0)."""
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)[:, None]
    c = tl.arange(0, BC)[None, :]
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    m = (r < R) & (c < C)
    x = tl.load(SRC + b * ssb + h * ssh + r * ssr + c, mask=m)
    tl.store(DST + b * dsb + h * dsh + r * dsr + c, x, mask=m)


def copy4d_triton(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst[...] = src for 4-D dst (B, H, R, C) and src (B or 1, H, R, C) of one dtype, both with
    unit stride in C; the other strides are free (a broadcast source, a slice of a wider buffer)."""
    if (dst.dtype != src.dtype or dst.dim() != 4 or src.dim() != 4 or src.shape[1:] != dst.shape[1:]
            or src.shape[0] not in (1, dst.shape[0])):
        raise ValueError(f"copy4d: dst {tuple(dst.shape)} {dst.dtype} from src {tuple(src.shape)} {src.dtype}")
    B, H, R, C = dst.shape
    if B * H * R * C == 0:
        return dst
    if (dst.stride(3) != 1 and C > 1) or (src.stride(3) != 1 and C > 1):
        raise ValueError(f"copy4d: dst strides {dst.stride()}, src strides {src.stride()}: need unit stride in C")
    BC = triton.next_power_of_2(C)
    BR = max(1, TILE // BC)
    BR = min(BR, triton.next_power_of_2(R))
    ssb = 0 if src.shape[0] == 1 else src.stride(0)
    with torch.cuda.device(dst.device) if dst.is_cuda else contextlib.nullcontext():
        _copy4d_kernel[(triton.cdiv(R, BR), H, B)](src, dst, R, C, ssb, src.stride(1), src.stride(2),
                                                   dst.stride(0), dst.stride(1), dst.stride(2),
                                                   BR=BR, BC=BC, num_warps=4)
    return dst
