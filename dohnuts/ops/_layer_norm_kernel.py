"""Triton kernel for the vision tower's LayerNorm: the residual add and the norm after it in one launch.

`layer_norm_triton(x, weight, bias, eps, residual)`: y = LayerNorm(x [+ residual]) · w + b, and
the sum itself when a residual is given. The sum is rounded to the stream's dtype before it is
normalised, as the unfused `x = x + a; norm(x)` does, so the two paths differ only in the order of
the FP32 reduction; the mean and variance are taken in FP32 and the output rounded once. Where the
tower ran torch's LayerNorm and an add as two kernels reading the stream twice, it runs one. A
kernel of its own rather than a flag of `_rms_norm_kernel`, whose row load it resembles: that one
normalises the unrounded FP32 sum, and its source keys its entries in the tuned tables
(dohnuts.ops._tuned), which only the GPU they were made on can remake.
Inference only: the tower is frozen, so there is no backward; under autograd the op takes its
reference path (`dohnuts.ops.norm.layer_norm_reference`). Imported on the first fused call on a
CUDA device; CPU tensors run in Triton's interpreter, which is how the CPU tests check it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dohnuts.ops._norm_kernels import _on_device, _rows


@triton.jit
def _layer_norm_kernel(X, R, W, B, Y, RO, stride_x, stride_r, stride_y, stride_ro, D, eps,
                       HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row: y = (s − mean) / std · w + b, s = x (+ r, rounded and stored)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    s = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        s = (s.to(tl.float32) + tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32))
        s = s.to(RO.dtype.element_ty)  # the stream's rounding, then the norm of what was stored
        tl.store(RO + row * stride_ro + cols, s, mask=mask)
    s = s.to(tl.float32)
    mean = tl.sum(s, axis=0) / D
    c = tl.where(mask, s - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=0) / D + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (c * rstd * w + b).to(Y.dtype.element_ty), mask=mask)


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                      residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) → y in x's dtype; with `residual` (x's shape and dtype) → (y, residual + x)."""
    D = x.shape[-1]
    if weight.shape != (D,) or bias.shape != (D,):
        raise ValueError(f"layer_norm: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must be ({D},)")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"layer_norm: residual {tuple(residual.shape)} {residual.dtype} must match x's "
                         f"{tuple(x.shape)} {x.dtype}")
    x2 = _rows(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, D)
    r2 = _rows(residual) if residual is not None else x2
    ro = torch.empty_like(y) if residual is not None else y
    ro2 = ro.view(-1, D)
    rows = x2.shape[0]
    if rows and D:
        block = triton.next_power_of_2(D)
        with _on_device(x):
            _layer_norm_kernel[(rows,)](x2, r2, weight, bias, y2, ro2, x2.stride(0), r2.stride(0), D, D, D,
                                        float(eps), HAS_RES=residual is not None, BLOCK=block,
                                        num_warps=max(1, min(8, block // 256)))
    return y if residual is None else (y, ro)
