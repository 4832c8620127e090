"""Triton kernel: a 16 × 16 BF16 matrix product, the probe that tells whether a GPU runs the fused
kernels at all (dohnuts.ops._dispatch.probe_fused_kernels).

It exercises what every fused path needs from the platform — Triton compiling for the device's
architecture (its `tl.dot` lowering: WMMA on RDNA 3, MMA on NVIDIA), loading the binary and
launching it — in well under a second, once per device and process.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dot16_kernel(A, B, C, N: tl.constexpr):
    """C = A · B for one N × N tile (row-major, contiguous)."""
    r = tl.arange(0, N)
    a = tl.load(A + r[:, None] * N + r[None, :])
    b = tl.load(B + r[:, None] * N + r[None, :])
    tl.store(C + r[:, None] * N + r[None, :], tl.dot(a, b))


def dot16_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a, b (16, 16) BF16 contiguous → a · b in FP32."""
    if a.shape != (16, 16) or b.shape != (16, 16) or not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError(f"dot16: need two contiguous (16, 16) matrices, got {tuple(a.shape)} and {tuple(b.shape)}")
    c = torch.empty(16, 16, dtype=torch.float32, device=a.device)
    _dot16_kernel[(1,)](a, b, c, N=16, num_warps=1)
    return c
