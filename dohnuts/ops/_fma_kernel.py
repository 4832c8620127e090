"""Triton kernel: FP32 multiply-adds in registers, the FP32 vector ceiling's microbenchmark
(dohnuts.ops.fma, bench_plugins/analyzers/microbench.py `fp32_fma`).

Each element is read once and written once, and runs 4 independent chains of ITERS fused
multiply-adds in between: 8 · ITERS FLOPs for 8 bytes, far past any GPU's ridge point, so the time
is the ALUs'. Independent chains let the compiler issue them back to back (RDNA 3's dual issue,
NVIDIA's instruction-level parallelism); one dependent chain would measure the FMA latency instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHAINS = 4  # independent multiply-add chains per element (the kernel writes them out)


@triton.jit
def _fma_chain_kernel(X, Y, N, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    """Y = the sum of 4 chains a ← a · 0.9999 + 0.0001 of ITERS steps each, started at X + 0..3."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + offs, mask=mask, other=0.0)
    a, b, c, d = x, x + 1.0, x + 2.0, x + 3.0
    for _ in range(ITERS):
        a = tl.fma(a, 0.9999, 0.0001)
        b = tl.fma(b, 0.9999, 0.0001)
        c = tl.fma(c, 0.9999, 0.0001)
        d = tl.fma(d, 0.9999, 0.0001)
    tl.store(Y + offs, (a + b) + (c + d), mask=mask)


def fma_chain_triton(x: torch.Tensor, iters: int, block: int = 1024) -> torch.Tensor:
    """x (N,) FP32 contiguous → the chains' sums (N,) FP32."""
    y = torch.empty_like(x)
    _fma_chain_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), ITERS=iters, BLOCK=block, num_warps=8)
    return y
