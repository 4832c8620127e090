"""Triton kernel for the vision tower's rotary embedding: one launch for queries and keys.

`rotary_qk_triton(qkv, cos, sin)`: the attention's packed projection (N, 3, H, D), read in place
from the GEMM output, → the rotated queries and keys (N, H, D) each, contiguous, in the
projection's dtype. The rotation is rotate_half's over all D channels, computed in FP32 and
rounded once, as the reference (`dohnuts.ops.rope.rotary_qk_reference`) does in about fourteen
kernels (two casts, two halves, a negation, a concatenation, two products and a sum, for each of
q and k, and two casts back). Inference only: the tower is frozen, so there is no backward;
under autograd the op takes its reference path. Imported on the first fused call on a CUDA device;
CPU tensors run in Triton's interpreter, which is how the CPU tests check its indexing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dohnuts.ops._norm_kernels import _on_device


@triton.jit
def _rotary_qk_kernel(QKV, COS, SIN, Q, K, H, D, s_n, s_3, s_h, s_cn,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per token: all its query and key heads, rotated by the token's cos/sin row."""
    n = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < H) & (d < D)
    half = D // 2
    p = tl.where(d < half, d + half, d - half)  # rotate_half's partner channel
    c = tl.load(COS + n * s_cn + d, mask=d < D, other=0.0).to(tl.float32)
    s = tl.load(SIN + n * s_cn + d, mask=d < D, other=0.0).to(tl.float32)
    out = n * H * D + h * D + d
    src = QKV + n * s_n + h * s_h
    x = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(src + p, mask=mask, other=0.0).to(tl.float32)
    tl.store(Q + out, (x * c + tl.where(d < half, -xp, xp) * s).to(Q.dtype.element_ty), mask=mask)
    src = src + s_3
    x = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(src + p, mask=mask, other=0.0).to(tl.float32)
    tl.store(K + out, (x * c + tl.where(d < half, -xp, xp) * s).to(K.dtype.element_ty), mask=mask)


def rotary_qk_triton(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (N, 3, H, D), unit channel stride; cos/sin (N, D) or (N, 1, D) → q, k (N, H, D)."""
    N, three, H, D = qkv.shape
    cos, sin = cos.reshape(N, -1), sin.reshape(N, -1)
    if three != 3 or D % 2 or cos.shape != (N, D) or sin.shape != cos.shape:
        raise ValueError(f"rotary_qk: qkv {tuple(qkv.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}: "
                         "need qkv (N, 3, H, D) with D even and cos = sin = (N, D)")
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    q = torch.empty(N, H, D, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty_like(q)
    if N and H and D:
        with _on_device(qkv):
            _rotary_qk_kernel[(N,)](qkv, cos, sin, q, k, H, D, qkv.stride(0), qkv.stride(1), qkv.stride(2),
                                    cos.stride(0), BLOCK_H=triton.next_power_of_2(H),
                                    BLOCK_D=triton.next_power_of_2(D), num_warps=4)
    return q, k
