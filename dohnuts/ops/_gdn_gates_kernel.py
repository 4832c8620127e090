"""Triton kernel: the Gated DeltaNet gates of an inference pass, read in place, in one launch.

The packed input projection emits the gate logits a and b as column slices of its output (B, T,
HV each, a token stride of the whole packed row). fla's gate kernels index them densely, so the
inference delta rule used to run four kernels a layer: two copies that made a and b contiguous,
`fused_beta_sigmoid_fwd` (β = sigmoid(b)) and `gdn_gate_chunk_cumsum` (the decay). This kernel
reads the slices through their strides and writes both results (FP32, dense, as fla's kernels
do), one program per (chunk of BT tokens, batch row) over all heads:

    beta = sigmoid(b)
    g    = scale · cumsum within the chunk of  −exp(A_log) · softplus(a + dt_bias)

softplus(x) = log(1 + exp(x)) below 20, x above (fla's and torch's threshold; fla's NVIDIA build
evaluates it with inline PTX, so the two differ by float rounding: the GPU test bounds it).
No autograd (inference only). CPU tensors run in Triton's interpreter (the CPU tests).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl


@triton.jit
def _gdn_gates_kernel(A, Bl, A_log, dt_bias, G, BETA, T, H, sab, sat, sbb, sbt, scale,
                      BH: tl.constexpr, BT: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    i_b = tl.program_id(1).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)[:, None]
    h = tl.arange(0, BH)[None, :]
    m = (t < T) & (h < H)
    a = tl.load(A + i_b * sab + t * sat + h, mask=m, other=0.0).to(tl.float32)
    a += tl.load(dt_bias + h, mask=h < H, other=0.0).to(tl.float32)
    softplus = tl.where(a < 20.0, tl.log(1.0 + tl.exp(a)), a)
    decay = -tl.exp(tl.load(A_log + h, mask=h < H, other=0.0).to(tl.float32)) * softplus
    out = (i_b * T + t) * H + h  # dense (B, T, H)
    # Rows past T come after every real row of the chunk: they cannot reach a real row's cumsum.
    tl.store(G + out, tl.cumsum(decay, axis=0) * scale, mask=m)
    b = tl.load(Bl + i_b * sbb + t * sbt + h, mask=m, other=0.0).to(tl.float32)
    tl.store(BETA + out, tl.sigmoid(b), mask=m)


def gdn_gates_triton(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                     chunk_size: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b (B, T, H) with unit head stride (any batch and token strides) → (g, beta), (B, T, H)
    FP32 contiguous: g the chunk-local cumulated decay times `scale` (fla's
    `gdn_gate_chunk_cumsum`), beta = sigmoid(b) (fla's `fused_beta_sigmoid_fwd`)."""
    B, T, H = a.shape
    if b.shape != a.shape or A_log.shape != (H,) or dt_bias.shape != (H,):
        raise ValueError(f"gdn_gates: a {tuple(a.shape)}, b {tuple(b.shape)}, A_log {tuple(A_log.shape)}, "
                         f"dt_bias {tuple(dt_bias.shape)}: need a and b of one shape (B, T, H), A_log and dt_bias (H,)")
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    g = torch.empty(B, T, H, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    if B * T * H:
        with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
            _gdn_gates_kernel[(triton.cdiv(T, chunk_size), B)](
                a, b, A_log, dt_bias, g, beta, T, H, a.stride(0), a.stride(1), b.stride(0), b.stride(1), float(scale),
                BH=triton.next_power_of_2(H), BT=chunk_size, num_warps=4)
    return g, beta
