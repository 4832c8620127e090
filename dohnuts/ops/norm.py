"""RMSNorm and gated RMSNorm (the Gated DeltaNet output gate).

Both compute the normalisation in FP32. The caller passes the *effective* scale: Qwen3.5's
zero-centred RMSNorm multiplies by (1 + w), so the model passes `1 + w.float()` (an FP32 vector,
which keeps the scale exact when the weights are stored in BF16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import use_fused


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from dohnuts.ops._fla import fla

    return fla().rms_norm(x, weight, None, eps=eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / rms(x) * weight over the last dim. x: (..., D), weight: (D,)."""
    return rms_norm_fused(x, weight, eps) if use_fused(x) else rms_norm_reference(x, weight, eps)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    r = residual + x.to(residual.dtype)
    return rms_norm_reference(r, weight, eps), r


def add_rms_norm_fused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    from dohnuts.ops._fla import fla

    # One kernel reads x and the residual once, writes the sum (in the residual's dtype) and the
    # normalised sum; the norm is taken of the unrounded FP32 sum (≤ 1 BF16 ulp from the reference).
    y, r = fla().rms_norm(x, weight, None, residual=residual, eps=eps, prenorm=True)
    return y, r


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual update and the next norm in one: r = residual + x; returns (rmsnorm(r) * weight, r).

    x, residual: (..., D); weight: (D,). Saves the separate add's full read and write of the
    residual stream (two per decoder layer)."""
    if use_fused(x):
        return add_rms_norm_fused(x, residual, weight, eps)
    return add_rms_norm_reference(x, residual, weight, eps)


def gated_rms_norm_reference(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same rounding points as transformers' Qwen3_5RMSNormGated: normalise in FP32, scale in the
    # input dtype, gate in FP32.
    dtype = x.dtype
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * y.to(dtype)
    return (y * F.silu(gate.float())).to(dtype)


def gated_rms_norm_fused(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from dohnuts.ops._fla import fla

    return fla().rms_norm_gated(x, gate, weight, None, activation="swish", eps=eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = rmsnorm(x) * weight * silu(gate). x, gate: (..., D), weight: (D,)."""
    if use_fused(x):
        return gated_rms_norm_fused(x, gate, weight, eps)
    return gated_rms_norm_reference(x, gate, weight, eps)
