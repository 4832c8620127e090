"""RMSNorm and gated RMSNorm (the Gated DeltaNet output gate); the vision tower's LayerNorm.

Both compute the normalisation in FP32. The scale is `weight_offset + weight`, taken in FP32:
Qwen3.5's zero-centred RMSNorm multiplies by (1 + w), so the model passes its stored w with
`weight_offset=1.0` (exact when w is stored in BF16).

Fused paths: one Triton kernel per call that also applies the offset, the forward of an autograd
function with a Triton backward (dohnuts.ops._norm_kernels): training and prediction run the same
kernel. The gated norm is fla's (its forward and backward kernels) in both. The LayerNorm (with
its residual add, `add_layer_norm`) serves the frozen vision tower: its fused path is one
inference-only Triton kernel (dohnuts.ops._layer_norm_kernel); under autograd the reference runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import recording, use_fused
from dohnuts.ops._fla import fla
from dohnuts.ops.spare import widen


def _scale(weight: torch.Tensor, offset: float) -> torch.Tensor:
    w = weight.float()
    return w + offset if offset else w


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * _scale(weight, weight_offset)).to(x.dtype)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0,
                   spare: int = 0) -> torch.Tensor:
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._norm_kernels import rms_norm_fn

    return rms_norm_fn(x, weight, eps, weight_offset, spare=spare)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0,
             spare: int = 0) -> torch.Tensor:
    """y = x / rms(x) * (weight_offset + weight) over the last dim. x: (..., D), weight: (D,).
    `spare`: y is written with that many spare columns for the LoRA group reading it
    (dohnuts.ops.spare; the values and shape are the same)."""
    if use_fused(x):
        return rms_norm_fused(x, weight, eps, weight_offset, spare)
    return widen(rms_norm_reference(x, weight, eps, weight_offset), spare)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float, weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    r = residual + x.to(residual.dtype)
    return rms_norm_reference(r, weight, eps, weight_offset), r


def add_rms_norm_fused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float, weight_offset: float = 0.0, spare: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    # One kernel reads x and the residual once, writes the sum (in the residual's dtype) and the
    # normalised sum; the norm is taken of the unrounded FP32 sum (≤ 1 BF16 ulp from the reference).
    from dohnuts.ops._norm_kernels import rms_norm_fn

    return rms_norm_fn(x, weight, eps, weight_offset, residual=residual, spare=spare)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, weight_offset: float = 0.0, spare: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual update and the next norm in one: r = residual + x; returns
    (rmsnorm(r) * (weight_offset + weight), r).

    x, residual: (..., D); weight: (D,). Saves the separate add's full read and write of the
    residual stream (two per decoder layer). `spare`: as `rms_norm`'s, for the normalised rows."""
    if use_fused(x):
        return add_rms_norm_fused(x, residual, weight, eps, weight_offset, spare)
    y, r = add_rms_norm_reference(x, residual, weight, eps, weight_offset)
    return widen(y, spare), r


def gated_rms_norm_reference(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same rounding points as transformers' Qwen3_5RMSNormGated: normalise in FP32, scale in the
    # input dtype, gate in FP32.
    dtype = x.dtype
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * y.to(dtype)
    return (y * F.silu(gate.float())).to(dtype)


def gated_rms_norm_fused(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return fla().rms_norm_gated(x, gate, weight, None, activation="swish", eps=eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = rmsnorm(x) * weight * silu(gate). x, gate: (..., D), weight: (D,)."""
    if use_fused(x):
        return gated_rms_norm_fused(x, gate, weight, eps)
    return gated_rms_norm_reference(x, gate, weight, eps)


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def add_layer_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    r = residual + x
    return layer_norm_reference(r, weight, bias, eps), r


def _layer_norm_fused(x, weight, bias, eps, residual=None):
    # Triton: on a GPU only (the CPU runs the reference path without it)
    from dohnuts.ops._layer_norm_kernel import layer_norm_triton

    return layer_norm_triton(x, weight, bias, eps, residual)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim: (x − mean) / sqrt(var + eps) · weight + bias, computed in FP32.
    x: (..., D); weight, bias: (D,). The fused path is inference-only (the vision tower is frozen)."""
    if use_fused(x) and not recording(x, weight, bias):
        return _layer_norm_fused(x, weight, bias, eps)
    return layer_norm_reference(x, weight, bias, eps)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual update and the LayerNorm after it: r = residual + x (in their dtype); returns
    (layer_norm(r), r). x and residual: (..., D), one shape and dtype. The fused path (one kernel
    instead of an add and a norm) is inference-only; under autograd the reference runs."""
    if use_fused(x) and not recording(x, residual, weight, bias):
        return _layer_norm_fused(x, weight, bias, eps, residual)
    return add_layer_norm_reference(x, residual, weight, bias, eps)
