"""FP32 multiply-add chains: the microbenchmark of a device's FP32 vector ceiling (`fp32_fma`,
bench_plugins/analyzers/microbench.py), not a model op.

`fma_chain(x, iters)`: for each element, 4 independent chains a ← a · 0.9999 + 0.0001 of `iters`
steps, started at x, x + 1, x + 2, x + 3, summed — 8 · iters FLOPs per element (`fma_chain_flops`).
The fused path is one Triton kernel that keeps the chains in registers (dohnuts.ops._fma_kernel);
the reference computes the same in torch, one multiply-add of whole tensors at a time.
"""

from __future__ import annotations

import torch

from dohnuts.ops._dispatch import use_fused

CHAINS = 4


def fma_chain_flops(numel: int, iters: int) -> int:
    """The FLOPs of `fma_chain` over `numel` elements (a multiply-add counts 2; the 3 additions
    that start and sum the chains are left out)."""
    return 2 * CHAINS * iters * numel


def fma_chain_reference(x: torch.Tensor, iters: int) -> torch.Tensor:
    """x (N,) FP32 → (N,) FP32: the chains in torch (a step rounds twice here, once in the kernel's
    fused multiply-add: over hundreds of steps the two agree to about 1e-5, relative)."""
    chains = torch.stack([x.float() + k for k in range(CHAINS)])  # (4, N)
    for _ in range(iters):
        chains = chains * 0.9999 + 0.0001
    return (chains[0] + chains[1]) + (chains[2] + chains[3])


def fma_chain_fused(x: torch.Tensor, iters: int) -> torch.Tensor:
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._fma_kernel import fma_chain_triton

    return fma_chain_triton(x.contiguous(), iters)


def fma_chain(x: torch.Tensor, iters: int) -> torch.Tensor:
    """The fused path on a GPU that runs the fused kernels, else the reference."""
    return fma_chain_fused(x, iters) if use_fused(x) else fma_chain_reference(x, iters)
