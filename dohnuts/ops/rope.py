"""The rotary embedding of query/key heads, and the per-head RMSNorm that precedes it (Qwen3.5's
gated attention normalises q and k per head, then rotates the first R channels).

`apply_rotary` is the plain-torch rotation (rotate_half convention, cos/sin tables (B, T, R) from
dohnuts.model.rope). `norm_rope` is the whole step for one projection: (B, T, H, D) in, as a GEMM
output's view, → (B, H, T, D) normalised and rotated. Its fused path is one Triton kernel, the
forward of an autograd function with a one-kernel Triton backward (dohnuts.ops._norm_kernels).
`rotary_qk` is the vision tower's step: queries and keys of a packed (N, 3, H, D) projection
rotated over all D channels in FP32; its fused path is one inference-only Triton kernel
(dohnuts.ops._rope_kernel: the tower is frozen).
"""

from __future__ import annotations

import torch

from dohnuts.ops._dispatch import recording, use_fused
from dohnuts.ops.norm import rms_norm


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D); cos/sin (B, T, R) with R <= D: rotate the first R channels."""
    r = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, R)
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def norm_rope_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float,
                        cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return apply_rotary(rms_norm(x, weight, eps, weight_offset).transpose(1, 2), cos, sin)


def norm_rope_fused(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float,
                    cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._norm_kernels import norm_rope_fn

    return norm_rope_fn(x, weight, eps, weight_offset, cos, sin)


def norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float,
              cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D) → rotary(rmsnorm(x) · (weight_offset + weight)) as (B, H, T, D).

    cos/sin: (B, T, R), R ≤ D even; channels ≥ R pass through normalised only."""
    fn = norm_rope_fused if use_fused(x) else norm_rope_reference
    return fn(x, weight, eps, weight_offset, cos, sin)


def rotary_qk_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, _ = qkv.unbind(1)  # (N, H, D) each
    # Rotate in FP32 like transformers' vision attention, then return to the working dtype.
    return tuple((x.float() * cos + _rotate_half(x.float()) * sin).to(qkv.dtype) for x in (q, k))


def rotary_qk_fused(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Triton: on a GPU only (the CPU runs the reference path without it)
    from dohnuts.ops._rope_kernel import rotary_qk_triton

    return rotary_qk_triton(qkv, cos, sin)


def rotary_qk(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (N, 3, H, D) → the rotated queries and keys (N, H, D), in qkv's dtype.

    cos/sin: (N, 1, D) FP32, the rotate_half convention over all D channels (the vision tower's 2D
    rotary). The fused path is inference-only; under autograd the reference runs."""
    fn = rotary_qk_fused if use_fused(qkv) and not recording(qkv, cos, sin) else rotary_qk_reference
    return fn(qkv, cos, sin)
