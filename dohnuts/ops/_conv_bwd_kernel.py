"""Triton kernels: the backward of Gated DeltaNet's conv + SiLU (+ per-head L2 norm) —
dohnuts.ops._conv_kernel's forward —, and the autograd Function that pairs the two
(`ConvSiluParts`, `conv_silu_parts`: the forward kernel, then `conv_silu_parts_bwd_triton`).

Two launches over the forward's programs (head, token block, batch row), recomputing the conv
from x and the initial state instead of saving it:

- `_conv_bwd_du_kernel`: the gradient at the conv's output, du (x's dtype, (B, T, C)), through the L2
  norm of q and k and the SiLU, and each token block's share of the weight gradient;
- `_conv_bwd_dx_kernel`: the input gradient (the transposed conv of du, plus the final state's
  gradient at the last W inputs) and the initial state's (its columns read by the first W − 1
  outputs, or part of the final state when T < W).

The initial state is read through its strides (a forked state: stride 0 in the batch); its
gradient is per row, summed over a fork by autograd. CPU tensors run in Triton's interpreter
(the CPU tests).
"""

from __future__ import annotations

import contextlib
import itertools

import torch
import triton
import triton.language as tl

from dohnuts.ops._conv_kernel import _CONFIGS, _check_parts, conv_silu_parts_triton, conv_silu_shared_triton

# The gradient kernels' tuning space. The first one's token block is fixed (`_BWD_BT`): it sizes
# the buffer of per-block weight-gradient partials, allocated before the tuner picks.
_BWD_BT = 64
_DU_CONFIGS = [triton.Config({}, num_warps=w) for w in (4, 8)]


@triton.jit
def _conv_input(X, S0, b, tt, c, T, sxb, sxt, s0b, s0c, s0w, W: tl.constexpr, WITH_S0: tl.constexpr):
    """The conv's inputs at rows tt (may be < 0) of channels c, FP32: x, or where tt < 0 the initial
    state's column W + tt (WITH_S0; zeros without a state)."""
    v = tl.load(X + b * sxb + tt * sxt + c, mask=(tt >= 0) & (tt < T), other=0.0).to(tl.float32)
    if WITH_S0:
        v += tl.load(S0 + b * s0b + c * s0c + (W + tt) * s0w, mask=(tt < 0) & (tt > -W), other=0.0).to(tl.float32)
    return v


@triton.jit
def _du_dw_tile(X, Wt, S0, DYp, DU, DWP, b, i_t, nblocks, t, c, ch, cp, width, T, C, sxb, sxt, swc, swk, s0b, s0c,
                s0w, eps, norm, D: tl.constexpr, W: tl.constexpr, NORM: tl.constexpr, WITH_S0: tl.constexpr,
                STORE_DW: tl.constexpr, BT: tl.constexpr):
    """One token block of `_conv_bwd_du_kernel` (WITH_S0: the block that reads the state)."""
    acc = tl.zeros((BT, D), dtype=tl.float32)
    for k in tl.static_range(W):
        xk = _conv_input(X, S0, b, t - (W - 1) + k, c, T, sxb, sxt, s0b, s0c, s0w, W, WITH_S0)
        acc += xk * tl.load(Wt + c * swc + k * swk).to(tl.float32)
    keep = t < T
    sig = tl.sigmoid(acc)
    dy = tl.load(DYp + b * T * width + t * width + cp, mask=keep, other=0.0).to(tl.float32)
    if NORM:
        if norm:  # z = y · r, r = (Σ y² + eps)^-½ per row: dy = r · (dz − z · Σ z·dz)
            y = acc * sig
            r = 1.0 / tl.sqrt(tl.sum(y * y, axis=1) + eps)
            z = y * r[:, None]
            dy = (dy - z * tl.sum(z * dy, axis=1)[:, None]) * r[:, None]
    du = tl.where(keep, dy * sig * (1.0 + acc * (1.0 - sig)), 0.0)  # silu'(u) = σ(u)·(1 + u·(1 − σ(u)))
    tl.store(DU + (b * T + t) * C + c, du, mask=keep)
    if STORE_DW:  # this block's share of dw[c, k] = Σ_t du[t, c] · input[t − W + 1 + k, c] (cached loads)
        for k in tl.static_range(W):
            xk = _conv_input(X, S0, b, t - (W - 1) + k, c, T, sxb, sxt, s0b, s0c, s0w, W, WITH_S0)
            tl.store(DWP + ((b * nblocks + i_t) * C + ch) * W + k, tl.sum(du * xk, axis=0))


@triton.autotune(configs=_DU_CONFIGS, key=["C", "D", "W", "T_BUCKET", "NORM", "HAS_S0", "STORE_DW"],
                 cache_results=True)
@triton.jit
def _conv_bwd_du_kernel(X, Wt, S0, DY0, DY1, DY2, DU, DWP, T, C, T_BUCKET, sxb, sxt, swc, swk, s0b, s0c, s0w, eps,
                        c1, c2, norm_ch, D: tl.constexpr, W: tl.constexpr, NORM: tl.constexpr,
                        HAS_S0: tl.constexpr, STORE_DW: tl.constexpr, BT: tl.constexpr):
    """Program (head h, token block, batch row b), as `_conv_kernel`: recomputes u = conv(x) on the
    block, takes the output gradient of its part (DY0, DY1 or DY2: q, k, v) back through the L2
    norm (heads below `norm_ch`) and SiLU to du (DU's dtype, (B, T, C)), and (STORE_DW) writes the block's
    partial weight gradient (DWP: (B · blocks, C, W) FP32, summed by the caller: no atomics, so the
    sum is deterministic). Only the first block reads the initial state."""
    h = tl.program_id(0).to(tl.int64)
    i_t = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    nblocks = tl.num_programs(1).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)[:, None]
    ch = h * D + tl.arange(0, D)
    c = ch[None, :]
    c0 = h * D
    start = tl.where(c0 >= c2, c2, tl.where(c0 >= c1, c1, 0)).to(tl.int64)
    width = tl.where(c0 >= c2, C, tl.where(c0 >= c1, c2, c1)).to(tl.int64) - start
    if c0 >= c2:
        DYp = DY2
    elif c0 >= c1:
        DYp = DY1
    else:
        DYp = DY0
    cp = c - start
    norm = c0 < norm_ch
    if HAS_S0:
        if i_t == 0:
            _du_dw_tile(X, Wt, S0, DYp, DU, DWP, b, i_t, nblocks, t, c, ch, cp, width, T, C, sxb, sxt, swc, swk,
                        s0b, s0c, s0w, eps, norm, D, W, NORM, True, STORE_DW, BT)
        else:
            _du_dw_tile(X, Wt, S0, DYp, DU, DWP, b, i_t, nblocks, t, c, ch, cp, width, T, C, sxb, sxt, swc, swk,
                        s0b, s0c, s0w, eps, norm, D, W, NORM, False, STORE_DW, BT)
    else:
        _du_dw_tile(X, Wt, S0, DYp, DU, DWP, b, i_t, nblocks, t, c, ch, cp, width, T, C, sxb, sxt, swc, swk,
                    s0b, s0c, s0w, eps, norm, D, W, NORM, False, STORE_DW, BT)


@triton.autotune(configs=_CONFIGS, key=["C", "D", "W", "T_BUCKET", "HAS_DST", "STORE_DS0"], cache_results=True)
@triton.jit
def _conv_bwd_dx_kernel(DU, Wt, DST, DX, DS0, T, C, T_BUCKET, swc, swk, sdb, sdc, sdw, sdx, D: tl.constexpr,
                        W: tl.constexpr, WP: tl.constexpr, HAS_DST: tl.constexpr, STORE_DS0: tl.constexpr,
                        BT: tl.constexpr):
    """Program (head h, token block, batch row b): the transposed conv of du,
    dx[t] = Σ_k w[:, k] · du[t + W − 1 − k], plus the final state's gradient DST (B, C, W), any
    strides, at the last W inputs; DX (B, T, C), rows sdx apart (C: dense; wider: the first C
    columns of a packed projection's gradient). With STORE_DS0 the first block also writes
    the initial state's gradient DS0 (B, C, W) FP32 dense: state column j is input j − W, read by
    outputs 0 .. j − 1, and is in the final state (column j − T) when T < W."""
    h = tl.program_id(0).to(tl.int64)
    i_t = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)[:, None]
    c = (h * D + tl.arange(0, D))[None, :]
    acc = tl.zeros((BT, D), dtype=tl.float32)
    for k in tl.static_range(W):
        tt = t + (W - 1 - k)
        wk = tl.load(Wt + c * swc + k * swk).to(tl.float32)
        acc += tl.load(DU + (b * T + tt) * C + c, mask=tt < T, other=0.0) * wk
    if HAS_DST:
        if (i_t + 1) * BT > T - W:  # the block holds some of the last W inputs
            jf = t - (T - W)  # final state column of input t
            acc += tl.load(DST + b * sdb + c * sdc + jf * sdw, mask=(jf >= 0) & (t < T), other=0.0).to(tl.float32)
    tl.store(DX + (b * T + t) * sdx + c, acc.to(DX.dtype.element_ty), mask=t < T)
    if STORE_DS0:
        if i_t == 0:
            js = tl.arange(0, WP)[:, None]  # state columns 0 .. W − 1 (WP ≥ W rows, the rest masked)
            acc_s = tl.zeros((WP, D), dtype=tl.float32)
            for k in tl.static_range(W):
                ts = js - 1 - k  # the output that reads state column js through tap k
                acc_s += tl.load(DU + (b * T + ts) * C + c, mask=(js < W) & (ts >= 0) & (ts < T), other=0.0) \
                    * tl.load(Wt + c * swc + k * swk).to(tl.float32)
            if HAS_DST:
                jsf = js - T  # the final state column holding state column js (T < W)
                acc_s += tl.load(DST + b * sdb + c * sdc + jsf * sdw, mask=(js < W) & (jsf >= 0),
                                 other=0.0).to(tl.float32)
            tl.store(DS0 + (b * C + c) * W + js, acc_s, mask=js < W)


def conv_silu_parts_bwd_triton(x: torch.Tensor, weight: torch.Tensor, head_dim: int, sizes: list[int],
                               normalized_parts: int, grads: list[torch.Tensor],
                               initial_state: torch.Tensor | None = None, final_grad: torch.Tensor | None = None,
                               state_grad: bool = False, weight_grad: bool = True, eps: float = 1e-6,
                               cpu_block_t: int = 32):
    """The backward of `conv_silu_parts_triton` on the same x, weight, head_dim, sizes and state:
    `grads` the gradients of the part outputs ((B, T, size) each, contiguous, x's dtype),
    `final_grad` the final state's (B, C, W) (any strides) or None → (dx (B, T, C) in x's dtype,
    dweight (C, W) FP32 if `weight_grad` else None, dstate (B, C, W) FP32 if `state_grad` else None).

    dx is laid out like x where x is the first C columns of wider rows (a packed projection's
    output, Gated DeltaNet's qkv/b/a): the first C columns of a buffer as wide, whose other columns
    the projection's split fills with its other parts' gradients (`dohnuts.model.packing.columns`),
    so the projection's gradient is written once. Otherwise dense."""
    B, T, C = x.shape
    W = weight.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    row = x.stride(1)
    wide = row > C and x.stride(0) == T * row and B * T > 0
    du = torch.empty(B, T, C, dtype=x.dtype, device=x.device)  # stored as autograd would (M61); FP32 in registers
    dx = (torch.empty(B, T, row, dtype=x.dtype, device=x.device)[..., :C] if wide
          else torch.empty(B, T, C, dtype=x.dtype, device=x.device))
    bt_du = _BWD_BT if x.is_cuda else cpu_block_t
    partials = torch.empty(B * triton.cdiv(T, bt_du) if weight_grad else 1, C, W, dtype=torch.float32,
                           device=x.device)
    ds0 = torch.empty(B, C, W, dtype=torch.float32, device=x.device) if state_grad else None
    if B * T * C == 0:
        return dx.zero_(), partials.zero_()[0] if weight_grad else None, None if ds0 is None else ds0.zero_()
    bounds = [*itertools.accumulate(sizes[:-1]), C, C][:2]
    norm_ch = sum(sizes[:normalized_parts])
    s0 = initial_state if initial_state is not None else du
    s0_strides = (0 if s0.shape[0] == 1 else s0.stride(0), s0.stride(1), s0.stride(2)) if initial_state is not None \
        else (0, 0, 0)
    dys = [*grads, *grads[-1:] * (3 - len(grads))]  # three pointers; parts past the last are never selected
    dst = final_grad if final_grad is not None else du
    dst_strides = final_grad.stride() if final_grad is not None else (0, 0, 0)
    t_bucket = min(triton.next_power_of_2(T), 4096)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        du_args = (x, weight, s0, *dys, du, partials, T, C, t_bucket, x.stride(0), x.stride(1), weight.stride(0),
                   weight.stride(1), *s0_strides, float(eps), *bounds, norm_ch)
        du_flags = dict(D=head_dim, W=W, NORM=norm_ch > 0, HAS_S0=initial_state is not None, STORE_DW=weight_grad,
                        BT=bt_du)
        grid_du = (C // head_dim, triton.cdiv(T, bt_du), B)
        dx_args = (du, weight, dst, dx, ds0 if ds0 is not None else du, T, C, t_bucket, weight.stride(0),
                   weight.stride(1), *dst_strides, dx.stride(1))
        dx_flags = dict(D=head_dim, W=W, WP=max(2, triton.next_power_of_2(W)), HAS_DST=final_grad is not None,
                        STORE_DS0=state_grad)
        if x.is_cuda:
            _conv_bwd_du_kernel[grid_du](*du_args, **du_flags)
            _conv_bwd_dx_kernel[lambda meta: (C // head_dim, triton.cdiv(T, meta["BT"]), B)](*dx_args, **dx_flags)
        else:  # the interpreter cannot benchmark configs: run the given block
            _conv_bwd_du_kernel.fn[grid_du](*du_args, **du_flags)
            _conv_bwd_dx_kernel.fn[(C // head_dim, triton.cdiv(T, cpu_block_t), B)](*dx_args, **dx_flags,
                                                                                    BT=cpu_block_t)
    return dx, partials.sum(0) if weight_grad else None, ds0


class ConvSiluParts(torch.autograd.Function):
    """`conv_silu_parts_triton` with its backward (`conv_silu_parts_bwd_triton`): → (*parts, final
    state or None). Gradients reach x, the weight and the initial state — also a forked one, a
    batch-broadcast view of a prefix's state that is part of the graph (the shared training pass):
    its gradient is per branch, and autograd's expand sums the branches into the prefix."""

    @staticmethod
    def forward(ctx, x, weight, initial_state, head_dim, sizes, normalized_parts, output_final_state, eps,
                cpu_block_t):
        B, _, C = x.shape
        final = x.new_empty(B, C, weight.shape[-1]) if output_final_state else None
        # Tap-major weight (one small copy a layer): each tap's channels are then contiguous.
        weight = weight.t().contiguous().t()  # (C, W) with strides (1, C)
        outs = conv_silu_parts_triton(x, weight, head_dim, sizes, normalized_parts=normalized_parts,
                                      initial_state=initial_state, final_state=final, eps=eps, cpu_block_t=cpu_block_t)
        ctx.save_for_backward(x, weight, initial_state)
        ctx.args = (head_dim, list(sizes), normalized_parts, eps, cpu_block_t)
        ctx.set_materialize_grads(False)
        return (*outs, final)

    @staticmethod
    def backward(ctx, *grads):
        x, weight, initial_state = ctx.saved_tensors
        head_dim, sizes, normalized_parts, eps, cpu_block_t = ctx.args
        B, T, _ = x.shape
        dys = [x.new_zeros(B, T, n) if g is None else g.to(x.dtype).contiguous() for n, g in zip(sizes, grads)]
        state_grad = initial_state is not None and ctx.needs_input_grad[2]
        dx, dw, ds0 = conv_silu_parts_bwd_triton(x, weight, head_dim, sizes, normalized_parts, dys, initial_state,
                                                 grads[-1], state_grad, ctx.needs_input_grad[1], eps, cpu_block_t)
        if ds0 is not None:
            if initial_state.shape[0] != B:  # one state read by every row
                ds0 = ds0.sum(0, keepdim=True)
            ds0 = ds0.to(initial_state.dtype)
        return dx, None if dw is None else dw.to(weight.dtype), ds0, None, None, None, None, None, None


def conv_silu_parts(x: torch.Tensor, weight: torch.Tensor, head_dim: int, sizes: list[int], *,
                    normalized_parts: int, initial_state: torch.Tensor | None = None,
                    output_final_state: bool = False, eps: float = 1e-6,
                    cpu_block_t: int = 32) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """The differentiable `conv_silu_parts_triton`: x (B, T, C), weight (C, W) (any layout: the
    kernel reads a tap-major copy) → (parts, final state (B, C, W) or None). One forward kernel with
    or without autograd; under autograd the backward is `conv_silu_parts_bwd_triton`."""
    _check_parts(x, weight, head_dim, sizes, normalized_parts, initial_state, None)
    *outs, final = ConvSiluParts.apply(x, weight, initial_state, head_dim, tuple(sizes), normalized_parts,
                                       output_final_state, eps, cpu_block_t)
    return tuple(outs), final


class ConvSiluShared(torch.autograd.Function):
    """`conv_silu_shared_triton` (a shared pass's rows in one forward launch) with its backward, that
    of the two calls it replaces: the suffixes' from the prefix's conv state (its last W inputs, a
    view of x), whose gradient, summed over the suffixes, is the prefix's final state's; then the
    prefix's."""

    @staticmethod
    def forward(ctx, x, weight, head_dim, sizes, normalized_parts, prefix, suffix_len, eps, cpu_block_t):
        weight = weight.t().contiguous().t()  # tap-major, as ConvSiluParts
        outs = conv_silu_shared_triton(x, weight, head_dim, sizes, prefix, suffix_len,
                                       normalized_parts=normalized_parts, eps=eps, cpu_block_t=cpu_block_t)
        ctx.save_for_backward(x, weight)
        ctx.args = (head_dim, list(sizes), normalized_parts, prefix, suffix_len, eps, cpu_block_t)
        ctx.set_materialize_grads(False)
        return outs

    @staticmethod
    def backward(ctx, *grads):
        x, weight = ctx.saved_tensors
        head_dim, sizes, normalized_parts, P, L, eps, cpu_block_t = ctx.args
        (R, C), W = x.shape, weight.shape[-1]
        B = (R - P) // L
        dys = [x.new_zeros(R, n) if g is None else g.to(x.dtype).contiguous() for n, g in zip(sizes, grads)]
        history = x[max(P - W, 0):P]
        if P < W:  # a prefix shorter than the conv: its state starts with zeros
            history = torch.cat([history.new_zeros(W - P, C), history])
        state = history.t().unsqueeze(0)  # (1, C, W): the prefix's final conv state, in place when P ≥ W
        wgrad = ctx.needs_input_grad[1]
        dx_s, dw_s, ds0 = conv_silu_parts_bwd_triton(
            x[P:].view(B, L, C), weight, head_dim, sizes, normalized_parts, [d[P:].view(B, L, -1) for d in dys],
            state, None, True, wgrad, eps, cpu_block_t)
        dx_p, dw_p, _ = conv_silu_parts_bwd_triton(
            x[:P].view(1, P, C), weight, head_dim, sizes, normalized_parts, [d[:P].view(1, P, -1) for d in dys],
            None, ds0.sum(0, keepdim=True), False, wgrad, eps, cpu_block_t)
        dx = torch.cat([dx_p.view(P, C), dx_s.view(B * L, C)])
        return dx, (dw_p + dw_s).to(weight.dtype) if wgrad else None, None, None, None, None, None, None, None


def conv_silu_shared(x: torch.Tensor, weight: torch.Tensor, head_dim: int, sizes: list[int], prefix: int,
                     suffix_len: int, *, normalized_parts: int, eps: float = 1e-6,
                     cpu_block_t: int = 32) -> tuple[torch.Tensor, ...]:
    """The differentiable `conv_silu_shared_triton`: the rows x (R, C) of a shared pass (a prefix of
    `prefix` rows, then suffixes of `suffix_len` rows from its conv state), weight (C, W) (any
    layout) → one (R, size) output a part; under autograd the backward of the prefix's and the
    suffixes' calls it replaces."""
    return ConvSiluShared.apply(x, weight, head_dim, tuple(sizes), normalized_parts, prefix, suffix_len, eps,
                                cpu_block_t)
