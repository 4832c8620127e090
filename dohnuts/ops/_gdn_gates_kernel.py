"""Triton kernels: the Gated DeltaNet gates, read in place, in one launch — and their backward.
`gdn_gates` is the differentiable op (a torch.autograd.Function): training and prediction run the
same forward kernel.

The packed input projection emits the gate logits a and b as column slices of its output (B, T,
HV each, a token stride of the whole packed row). fla's gate kernels index them densely, so the
delta rule used to run four kernels a layer: two copies that made a and b contiguous,
`fused_beta_sigmoid_fwd` (β = sigmoid(b)) and `gdn_gate_chunk_cumsum` (the decay). This kernel
reads the slices through their strides and writes both results (FP32, dense, as fla's kernels
do), one program per (chunk of BT tokens, batch row) over all heads:

    beta = sigmoid(b)
    g    = scale · cumsum within the chunk of  −exp(A_log) · softplus(a + dt_bias)

softplus(x) = log(1 + exp(x)) below 20, x above (fla's and torch's threshold; fla's NVIDIA build
evaluates it with inline PTX, so the two differ by float rounding: the GPU test bounds it).

The backward (`_gdn_gates_bwd_kernel`, one launch, the same programs) takes the gradients of g and
beta to a, b, A_log and dt_bias: the chunk cumsum's transpose (a reverse cumsum), the softplus
and exp derivatives, sigmoid's β(1 − β); A_log's and dt_bias's sums over tokens as one partial a
program, summed by the caller (deterministic, no atomics). CPU tensors run in Triton's interpreter
(the CPU tests).
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
                     chunk_size: int, scale: float, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b (B, T, H) with unit head stride (any batch and token strides) → (g, beta), (B, T, H)
    FP32 contiguous: g the chunk-local cumulated decay times `scale` (fla's `gdn_gate_chunk_cumsum`),
    beta = sigmoid(b) (fla's `fused_beta_sigmoid_fwd`); written into `out` (g, beta) if given."""
    B, T, H = a.shape
    if b.shape != a.shape or A_log.shape != (H,) or dt_bias.shape != (H,):
        raise ValueError(f"gdn_gates: a {tuple(a.shape)}, b {tuple(b.shape)}, A_log {tuple(A_log.shape)}, "
                         f"dt_bias {tuple(dt_bias.shape)}: need a and b of one shape (B, T, H), A_log and dt_bias (H,)")
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    g = torch.empty(B, T, H, dtype=torch.float32, device=a.device) if out is None else out[0]
    beta = torch.empty_like(g) if out is None else out[1]
    if B * T * H:
        with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
            _gdn_gates_kernel[(triton.cdiv(T, chunk_size), B)](
                a, b, A_log, dt_bias, g, beta, T, H, a.stride(0), a.stride(1), b.stride(0), b.stride(1), float(scale),
                BH=triton.next_power_of_2(H), BT=chunk_size, num_warps=4)
    return g, beta


@triton.jit
def _gdn_gates_bwd_kernel(A, Bl, A_log, dt_bias, DG, DBETA, DA, DB, DALOG, DDT, T, H, sab, sat, sbb, sbt, scale,
                          BH: tl.constexpr, BT: tl.constexpr):
    """Program (chunk of BT tokens, batch row b) over all heads, as `_gdn_gates_kernel`:
    d decay = scale · Σ_{s ≥ t in the chunk} dg[s] (the cumsum's transpose); with x = a + dt_bias,
    decay = −exp(A_log) · softplus(x): da = d decay · −exp(A_log) · σ(x) (1 above the softplus
    threshold), d dt_bias = Σ da, d A_log = Σ d decay · decay; db = dβ · β (1 − β). DA, DB (B, T, H)
    dense; DALOG, DDT (chunks · B, H) FP32: this program's sums over its tokens."""
    i_t = tl.program_id(0).to(tl.int64)
    i_b = tl.program_id(1).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)[:, None]
    h = tl.arange(0, BH)[None, :]
    m = (t < T) & (h < H)
    out = (i_b * T + t) * H + h  # dense (B, T, H)
    dg = tl.load(DG + out, mask=m, other=0.0).to(tl.float32)
    ddecay = tl.cumsum(dg, axis=0, reverse=True) * scale  # rows past T are zeros: they add nothing
    x = tl.load(A + i_b * sab + t * sat + h, mask=m, other=0.0).to(tl.float32)
    x += tl.load(dt_bias + h, mask=h < H, other=0.0).to(tl.float32)
    softplus = tl.where(x < 20.0, tl.log(1.0 + tl.exp(x)), x)
    dsoftplus = tl.where(x < 20.0, tl.sigmoid(x), 1.0)
    neg_a = -tl.exp(tl.load(A_log + h, mask=h < H, other=0.0).to(tl.float32))
    da = tl.where(m, ddecay * neg_a * dsoftplus, 0.0)
    tl.store(DA + out, da.to(DA.dtype.element_ty), mask=m)
    row = (i_t * tl.num_programs(1) + i_b) * H + tl.arange(0, BH)
    tl.store(DDT + row, tl.sum(da, axis=0), mask=tl.arange(0, BH) < H)
    tl.store(DALOG + row, tl.sum(tl.where(m, ddecay * neg_a * softplus, 0.0), axis=0), mask=tl.arange(0, BH) < H)
    beta = tl.sigmoid(tl.load(Bl + i_b * sbb + t * sbt + h, mask=m, other=0.0).to(tl.float32))
    dbeta = tl.load(DBETA + out, mask=m, other=0.0).to(tl.float32)
    tl.store(DB + out, (dbeta * beta * (1.0 - beta)).to(DB.dtype.element_ty), mask=m)


def gdn_gates_bwd_triton(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                         dg: torch.Tensor, dbeta: torch.Tensor, chunk_size: int, scale: float):
    """The backward of `gdn_gates_triton` on the same a, b, A_log, dt_bias: dg, dbeta (B, T, H) →
    (da like a, db like b (dense), dA_log, ddt_bias (H,) FP32)."""
    B, T, H = a.shape
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    dg, dbeta = dg.contiguous(), dbeta.contiguous()
    da = torch.empty(B, T, H, dtype=a.dtype, device=a.device)
    db = torch.empty(B, T, H, dtype=b.dtype, device=b.device)
    NC = triton.cdiv(T, chunk_size)
    dA_log = torch.zeros(NC * B, H, dtype=torch.float32, device=a.device)  # every row written (zeros: B·T = 0)
    ddt = torch.zeros_like(dA_log)
    if B * T * H:
        with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
            _gdn_gates_bwd_kernel[(NC, B)](
                a, b, A_log, dt_bias, dg, dbeta, da, db, dA_log, ddt, T, H, a.stride(0), a.stride(1), b.stride(0),
                b.stride(1), float(scale), BH=triton.next_power_of_2(H), BT=chunk_size, num_warps=4)
    return da, db, dA_log.sum(0), ddt.sum(0)


class GdnGates(torch.autograd.Function):
    """`gdn_gates_triton` with its backward (`gdn_gates_bwd_triton`)."""

    @staticmethod
    def forward(ctx, a, b, A_log, dt_bias, chunk_size, scale):
        g, beta = gdn_gates_triton(a, b, A_log, dt_bias, chunk_size, scale)
        ctx.save_for_backward(a, b, A_log, dt_bias)
        ctx.chunk_size, ctx.scale = chunk_size, scale
        ctx.set_materialize_grads(False)
        return g, beta

    @staticmethod
    def backward(ctx, dg, dbeta):
        a, b, A_log, dt_bias = ctx.saved_tensors
        dg = torch.zeros(a.shape, dtype=torch.float32, device=a.device) if dg is None else dg
        dbeta = torch.zeros(b.shape, dtype=torch.float32, device=b.device) if dbeta is None else dbeta
        da, db, dA_log, ddt = gdn_gates_bwd_triton(a, b, A_log, dt_bias, dg, dbeta, ctx.chunk_size, ctx.scale)
        return da, db, dA_log.to(A_log.dtype), ddt.to(dt_bias.dtype), None, None


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The differentiable `gdn_gates_triton`: one forward kernel with or without autograd; under
    autograd the backward is `gdn_gates_bwd_triton` (gradients to a, b, A_log and dt_bias)."""
    return GdnGates.apply(a, b, A_log, dt_bias, chunk_size, scale)


# ---- a shared pass's gates in one launch ---------------------------------------------------------
# A kernel of its own, not a flag of `_gdn_gates_kernel`: a tuned table's compiled entries key each
# kernel by its source and line, and the H200 table's entries for the two above stay valid (M52).

@triton.jit
def _gdn_gates_varlen_kernel(A, Bl, A_log, dt_bias, G, BETA, H, sat, sbt, scale, cu_seqlens, chunk_indices,
                             BH: tl.constexpr, BT: tl.constexpr):
    # `_gdn_gates_kernel` over rows of several sequences one after another: program i_t is chunk
    # chunk_indices[i_t] = (sequence, chunk of it), chunked from the sequence's own start
    i_t = tl.program_id(0).to(tl.int64)
    i_n = tl.load(chunk_indices + 2 * i_t).to(tl.int64)
    i_c = tl.load(chunk_indices + 2 * i_t + 1).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    t = tl.load(cu_seqlens + i_n).to(tl.int64) + i_c * BT + tl.arange(0, BT)[:, None]
    h = tl.arange(0, BH)[None, :]
    m = (t < eos) & (h < H)
    a = tl.load(A + t * sat + h, mask=m, other=0.0).to(tl.float32)
    a += tl.load(dt_bias + h, mask=h < H, other=0.0).to(tl.float32)
    softplus = tl.where(a < 20.0, tl.log(1.0 + tl.exp(a)), a)
    decay = -tl.exp(tl.load(A_log + h, mask=h < H, other=0.0).to(tl.float32)) * softplus
    out = t * H + h  # dense (rows, H)
    # Rows past the sequence's end come after every real row of the chunk: they cannot reach a real
    # row's cumsum.
    tl.store(G + out, tl.cumsum(decay, axis=0) * scale, mask=m)
    b = tl.load(Bl + t * sbt + h, mask=m, other=0.0).to(tl.float32)
    tl.store(BETA + out, tl.sigmoid(b), mask=m)


def gdn_gates_varlen_triton(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                            chunk_index: tuple[torch.Tensor, torch.Tensor], chunk_size: int,
                            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`gdn_gates_triton` over rows of several sequences one after another — a shared pass's prefix
    and suffixes — in one launch: a, b (R, H) with unit head stride (any row stride), `chunk_index`
    (cu_seqlens, chunk_indices) as fla's varlen kernels take them
    (`dohnuts.ops.delta_rule.shared_chunk_index`), each sequence chunked from its own start →
    (g, beta), (R, H) FP32 contiguous: the numbers of a launch per sequence (forward only)."""
    R, H = a.shape
    if b.shape != a.shape or A_log.shape != (H,) or dt_bias.shape != (H,):
        raise ValueError(f"gdn_gates_varlen: a {tuple(a.shape)}, b {tuple(b.shape)}, A_log {tuple(A_log.shape)}, "
                         f"dt_bias {tuple(dt_bias.shape)}: need a and b of one shape (R, H), A_log and dt_bias (H,)")
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    g = torch.empty(R, H, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    cu_seqlens, chunk_indices = chunk_index
    if R * H:
        with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
            _gdn_gates_varlen_kernel[(chunk_indices.shape[0],)](
                a, b, A_log, dt_bias, g, beta, H, a.stride(0), b.stride(0), float(scale), cu_seqlens, chunk_indices,
                BH=triton.next_power_of_2(H), BT=chunk_size, num_warps=4)
    return g, beta
