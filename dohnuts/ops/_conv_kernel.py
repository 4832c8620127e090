"""Triton kernel: Gated DeltaNet's short causal conv + SiLU + per-head L2 norm of q or k, in one pass.

For a pass that starts from an empty conv history and returns no state (a batched full pass), the
q and k parts of the packed projection go conv → SiLU → L2 norm per head in one kernel, instead of
fla's conv kernel and then fla's L2-norm kernel inside the delta rule (36 launches and 1.2 ms of a
2b 16k-token pass on the H200, 2026-11-30 profile). Reads the part in place (a strided column
slice), writes (B, T, C) contiguous. No autograd, no state: dohnuts.ops.conv uses it only there.
CPU tensors run in Triton's interpreter (the CPU tests).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

# Tokens per program and warps, tuned once per process on the first call (an eager pass, before
# any CUDA-graph capture). The first version's fixed 32 tokens / 4 warps ran at 1.4 TB/s on the
# H200, no faster than fla's conv plus its L2 norm (2026-11-30 profile, docs/known-issues.md KI-2).
_CONFIGS = [triton.Config({"BT": bt}, num_warps=w) for bt, w in ((32, 4), (64, 4), (64, 8), (128, 8), (128, 16))]


@triton.autotune(configs=_CONFIGS, key=["C", "D", "W"])
@triton.jit
def _conv_silu_l2norm_kernel(X, Wt, Y, T, C, sxb, sxt, eps, D: tl.constexpr, W: tl.constexpr,
                             BT: tl.constexpr):
    """Program (token block, b·heads + h): y[b, t, h·D:(h+1)·D] = l2norm(silu(Σ_k w[:, k] x[t−W+1+k]))."""
    i_t = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    nh = C // D
    b = i_bh // nh
    h = i_bh % nh
    t = i_t * BT + tl.arange(0, BT)[:, None]
    c = h * D + tl.arange(0, D)[None, :]
    acc = tl.zeros((BT, D), dtype=tl.float32)
    for k in tl.static_range(W):
        tt = t - (W - 1) + k
        xk = tl.load(X + b * sxb + tt * sxt + c, mask=(tt >= 0) & (tt < T), other=0.0).to(tl.float32)
        acc += xk * tl.load(Wt + c * W + k).to(tl.float32)
    a = acc * tl.sigmoid(acc)
    y = a / tl.sqrt(tl.sum(a * a, axis=1) + eps)[:, None]
    tl.store(Y + b * T * C + t * C + c, y.to(Y.dtype.element_ty), mask=t < T)


def conv_silu_l2norm_triton(x: torch.Tensor, weight: torch.Tensor, head_dim: int, eps: float = 1e-6,
                            cpu_block_t: int = 32) -> torch.Tensor:
    """x (B, T, C) with unit channel stride, weight (C, W) → (B, T, C): conv from zeros, SiLU, and
    each head's `head_dim` channels scaled to unit L2 norm (1 / sqrt(Σ a² + eps), as fla's l2norm).
    `cpu_block_t`: the tokens per program in the interpreter (on a GPU the tuner picks)."""
    B, T, C = x.shape
    W = weight.shape[-1]
    if weight.shape != (C, W) or C % head_dim or head_dim & (head_dim - 1):
        raise ValueError(f"conv_silu_l2norm: x {tuple(x.shape)}, weight {tuple(weight.shape)}, head_dim {head_dim}: "
                         "need weight (C, W), C a multiple of head_dim and head_dim a power of two")
    if x.stride(-1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    if B * T * C:
        with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
            grid = lambda meta: (triton.cdiv(T, meta["BT"]), B * (C // head_dim))  # noqa: E731
            args = (x, weight, y, T, C, x.stride(0), x.stride(1), float(eps))
            if x.is_cuda:
                _conv_silu_l2norm_kernel[grid](*args, D=head_dim, W=W)
            else:  # the interpreter cannot benchmark configs: run the first one
                _conv_silu_l2norm_kernel.fn[grid](*args, D=head_dim, W=W, BT=cpu_block_t)
    return y
