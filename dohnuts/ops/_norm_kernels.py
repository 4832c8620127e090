"""Triton kernels for inference-time RMSNorm: one launch where the model used to issue several.

- `rms_norm_triton(x, w, eps, offset, residual)`: y = (x [+ residual]) / rms · (offset + w), and the
  sum itself when a residual is given; the offset applied in the kernel (no cast and add of w a call).
- `norm_rope_triton(x, w, eps, offset, cos, sin)`: a query or key projection (B, T, H, D), read in
  place from a strided GEMM output, → per-head RMSNorm, then the rotary embedding on the first R
  channels, written as (B, H, T, D) — what `rms_norm` + transpose + `apply_rotary` did in ~8
  kernels (a norm, slices, a negation, two concatenations, products and a sum).

Both compute in FP32 and round once to the output dtype. Each is the forward of an autograd
function (`rms_norm_fn`, `norm_rope_fn`) whose backward is one Triton kernel a call: training and
prediction run the same forward kernel. The backward recomputes 1/rms from the saved input (a row
read it already makes) instead of saving it. A trainable norm weight (none under LoRA) has its
gradient summed in torch from a per-row product the kernel writes only then. Imported only on the
first fused call on a CUDA device (like dohnuts.ops._fla); CPU tensors run in Triton's
interpreter, which is how the CPU tests check their indexing and gradients.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dohnuts.ops import spare as spare_columns


@triton.jit
def _rms_norm_kernel(X, R, W, Y, RO, stride_x, stride_r, stride_y, stride_ro, D, eps, offset,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row: y = x̂ · (offset + w), x̂ = s / rms(s), s = x (+ r, also stored)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    s = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        s += tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(RO + row * stride_ro + cols, s.to(RO.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / D + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    tl.store(Y + row * stride_y + cols, (s * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def token_heads_tile(T, H, D, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The tile of a one-program-per-token kernel over (heads, channels): the flat token index,
    its (b, t), head rows h (BLOCK_H, 1), channel columns d (1, BLOCK_D) and the in-bounds mask."""
    pid = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    return pid, pid // T, pid % T, h, d, (h < H) & (d < D)


@triton.jit
def _norm_rope_kernel(X, W, COS, SIN, Y, T, H, D, R, eps, offset,
                      sxb, sxt, sxh, scb, sct, syb, syh, syt,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per token (b, t), all its heads: RMSNorm per head, rotate channels < R."""
    _, b, t, h, d, mask = token_heads_tile(T, H, D, BLOCK_H, BLOCK_D)
    src = X + b * sxb + t * sxt + h * sxh
    x = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # (BLOCK_H,)
    y = x * rstd[:, None] * (tl.load(W + d, mask=d < D, other=0.0).to(tl.float32) + offset)
    # rotate_half's partner of channel d (< R): d + R/2 in the first half, d − R/2 in the second.
    half = R // 2
    p = tl.where(d < half, d + half, tl.where(d < R, d - half, d))
    xp = tl.load(src + p, mask=mask, other=0.0).to(tl.float32)
    yp = xp * rstd[:, None] * (tl.load(W + p, mask=p < D, other=0.0).to(tl.float32) + offset)
    rot = d < R
    c = tl.load(COS + b * scb + t * sct + d, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(SIN + b * scb + t * sct + d, mask=rot, other=0.0).to(tl.float32)
    out = tl.where(rot, y * c + tl.where(d < half, -yp, yp) * s, y)
    tl.store(Y + b * syb + h * syh + t * syt + d, out.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(DY, S, W, DX, DR, DRES, DWP, stride_dy, stride_s, D, eps, offset,
                         HAS_DR: tl.constexpr, HAS_RES: tl.constexpr, STORE_DWP: tl.constexpr,
                         BLOCK: tl.constexpr):
    """One program per row: ds = rstd · (w̃·dy − x̂ · mean(x̂ · w̃·dy)) (+ the sum's own gradient
    dr), with x̂ = s · rstd, w̃ = offset + w; written as dx (and as the residual's gradient, in
    its dtype); with STORE_DWP the row's dy · x̂ (FP32) for the weight's gradient."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    s = tl.load(S + row * stride_s + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / D + eps)
    xhat = s * rstd
    gw = dy * (tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset)
    ds = rstd * (gw - xhat * (tl.sum(gw * xhat, axis=0) / D))
    if HAS_DR:
        ds += tl.load(DR + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + row * D + cols, ds.to(DX.dtype.element_ty), mask=mask)
    if HAS_RES:
        tl.store(DRES + row * D + cols, ds.to(DRES.dtype.element_ty), mask=mask)
    if STORE_DWP:
        tl.store(DWP + row * D + cols, dy * xhat, mask=mask)


@triton.jit
def _norm_rope_bwd_kernel(DY, X, W, COS, SIN, DX, DWP, T, H, D, R, eps, offset,
                          sxb, sxt, sxh, scb, sct, STORE_DWP: tl.constexpr,
                          BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per token (b, t), all its heads. The rotation's transpose first: dn[d] =
    dy[d]·cos[d] + dy[d + R/2]·sin[d + R/2] (d < R/2), − dy[d − R/2]·sin[d − R/2] (R/2 ≤ d < R),
    dy[d] beyond R; then the per-head RMSNorm backward. dy is (B, H, T, D) contiguous; dx is
    written (B, T, H, D) contiguous."""
    pid, b, t, h, d, mask = token_heads_tile(T, H, D, BLOCK_H, BLOCK_D)
    half = R // 2
    p = tl.where(d < half, d + half, tl.where(d < R, d - half, d))
    dsrc = DY + ((b * H + h) * T + t) * D
    dy = tl.load(dsrc + d, mask=mask, other=0.0).to(tl.float32)
    dyp = tl.load(dsrc + p, mask=mask & (d < R), other=0.0).to(tl.float32)
    rot = d < R
    c = tl.load(COS + b * scb + t * sct + d, mask=rot, other=1.0).to(tl.float32)
    sp = tl.load(SIN + b * scb + t * sct + p, mask=rot, other=0.0).to(tl.float32)
    dn = dy * c + tl.where(d < half, dyp * sp, -dyp * sp)
    x = tl.load(X + b * sxb + t * sxt + h * sxh + d, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # (BLOCK_H,)
    xhat = x * rstd[:, None]
    gw = dn * (tl.load(W + d, mask=d < D, other=0.0).to(tl.float32) + offset)
    dx = rstd[:, None] * (gw - xhat * (tl.sum(gw * xhat, axis=1) / D)[:, None])
    out = (pid * H + h) * D + d
    tl.store(DX + out, dx.to(DX.dtype.element_ty), mask=mask)
    if STORE_DWP:
        tl.store(DWP + out, dn * xhat, mask=mask)


def _on_device(x: torch.Tensor):
    # The launch goes to the current CUDA device: make it x's. (CPU tensors: Triton's interpreter.)
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, D) with unit column stride (a view when the layout allows, else a copy)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
                    residual: torch.Tensor | None = None,
                    spare: int = 0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) → y in x's dtype; with `residual` → (y, x + residual in the residual's dtype).
    y is written with `spare` spare columns for the LoRA group reading it (dohnuts.ops.spare)."""
    D = x.shape[-1]
    if weight.shape != (D,):
        raise ValueError(f"weight must have shape ({D},), got {tuple(weight.shape)}")
    x2 = _rows(x)
    y = spare_columns.empty(x.shape, spare, dtype=x.dtype, device=x.device)
    y2 = y.reshape(-1, D)  # a view, row stride D + the spare's width
    r2 = ro = ro2 = None
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} differs from x's {tuple(x.shape)}")
        r2 = _rows(residual)
        ro = torch.empty(x.shape, dtype=residual.dtype, device=x.device)
        ro2 = ro.view(-1, D)
    rows = x2.shape[0]
    if rows and D:
        block = triton.next_power_of_2(D)
        with _on_device(x):
            _rms_norm_kernel[(rows,)](
                x2, x2 if r2 is None else r2, weight, y2, y2 if ro2 is None else ro2,
                x2.stride(0), 0 if r2 is None else r2.stride(0), y2.stride(0), D, D, float(eps), float(offset),
                HAS_RES=residual is not None, BLOCK=block, num_warps=max(1, min(8, block // 256)))
    return y if residual is None else (y, ro)


def norm_rope_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, cos: torch.Tensor,
                     sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D), any strides with unit channel stride; cos/sin (B, T, R), R ≤ D even
    → (B, H, T, D) contiguous."""
    B, T, H, D = x.shape
    R = cos.shape[-1]
    if weight.shape != (D,) or R % 2 or R > D or cos.shape != (B, T, R) or sin.shape != cos.shape:
        raise ValueError(f"norm_rope: x {tuple(x.shape)}, weight {tuple(weight.shape)}, cos {tuple(cos.shape)}, "
                         f"sin {tuple(sin.shape)}: need weight (D,), cos = sin = (B, T, R) with R even and ≤ D")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty(B, H, T, D, dtype=x.dtype, device=x.device)
    if B * T and H and D:
        block_d = triton.next_power_of_2(D)
        with _on_device(x):
            _norm_rope_kernel[(B * T,)](
                x, weight, cos, sin, y, T, H, D, R, float(eps), float(offset),
                x.stride(0), x.stride(1), x.stride(2), cos.stride(0), cos.stride(1),
                y.stride(0), y.stride(1), y.stride(2),
                BLOCK_H=triton.next_power_of_2(H), BLOCK_D=block_d, num_warps=4)
    return y


def _norm_warps(block: int) -> int:
    return max(1, min(8, block // 256))


class _RmsNorm(torch.autograd.Function):
    """rms_norm_triton with a backward; the residual form returns (y, x + residual)."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, offset, spare):
        out = rms_norm_triton(x, weight, eps, offset, residual=residual, spare=spare)
        ctx.eps, ctx.offset, ctx.has_res = eps, offset, residual is not None
        ctx.x_dtype = x.dtype
        # The backward needs the normalised rows: x, or the sum (the second output, already made).
        ctx.save_for_backward(out[1] if ctx.has_res else x, weight)
        return out

    @staticmethod
    def backward(ctx, dy, dr=None):
        s, weight = ctx.saved_tensors
        D = s.shape[-1]
        s2 = _rows(s)
        dy2 = _rows(dy)
        rows = s2.shape[0]
        need_w = ctx.needs_input_grad[1]
        dx = torch.empty(s.shape, dtype=ctx.x_dtype, device=s.device)
        dwp = torch.empty(rows, D, dtype=torch.float32, device=s.device) if need_w else dx
        dr2 = None if dr is None else dr.reshape(-1, D).contiguous()  # the sum's own gradient
        # x's gradient in x's dtype, the residual's in its own (the sum's dtype): both are ds
        dres = torch.empty(s.shape, dtype=s.dtype, device=s.device) if ctx.has_res else None
        if rows and D:
            block = triton.next_power_of_2(D)
            with _on_device(s):
                _rms_norm_bwd_kernel[(rows,)](
                    dy2, s2, weight, dx, dx if dr2 is None else dr2, dx if dres is None else dres, dwp,
                    dy2.stride(0), s2.stride(0), D, float(ctx.eps), float(ctx.offset),
                    HAS_DR=dr2 is not None, HAS_RES=dres is not None, STORE_DWP=need_w,
                    BLOCK=block, num_warps=_norm_warps(block))
        dw = dwp.sum(0).to(weight.dtype) if need_w else None
        return dx, dw, dres, None, None, None


def rms_norm_fn(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
                residual: torch.Tensor | None = None, spare: int = 0):
    """`rms_norm_triton` as a differentiable op (same forward kernel, Triton backward)."""
    return _RmsNorm.apply(x, weight, residual, eps, offset, spare)


class _NormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, cos, sin, eps, offset):
        ctx.eps, ctx.offset = eps, offset
        ctx.save_for_backward(x, weight, cos, sin)
        return norm_rope_triton(x, weight, eps, offset, cos, sin)

    @staticmethod
    def backward(ctx, dy):
        x, weight, cos, sin = ctx.saved_tensors
        B, T, H, D = x.shape
        R = cos.shape[-1]
        if x.stride(-1) != 1:
            x = x.contiguous()
        if cos.stride(-1) != 1 or sin.stride() != cos.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
        dy = dy.contiguous()
        need_w = ctx.needs_input_grad[1]
        dx = torch.empty(B, T, H, D, dtype=x.dtype, device=x.device)
        dwp = torch.empty(B, T, H, D, dtype=torch.float32, device=x.device) if need_w else dx
        if B * T and H and D:
            with _on_device(x):
                _norm_rope_bwd_kernel[(B * T,)](
                    dy, x, weight, cos, sin, dx, dwp, T, H, D, R, float(ctx.eps), float(ctx.offset),
                    x.stride(0), x.stride(1), x.stride(2), cos.stride(0), cos.stride(1), STORE_DWP=need_w,
                    BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D), num_warps=4)
        dw = dwp.sum((0, 1, 2)).to(weight.dtype) if need_w else None
        return dx, dw, None, None, None, None


def norm_rope_fn(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, cos: torch.Tensor,
                 sin: torch.Tensor) -> torch.Tensor:
    """`norm_rope_triton` as a differentiable op (same forward kernel, Triton backward; the
    rotary tables take no gradient)."""
    return _NormRope.apply(x, weight, cos, sin, eps, offset)
