"""Triton kernels: Gated DeltaNet's short causal conv + SiLU (+ per-head L2 norm), with conv state
in and out, in one pass — and its backward. `conv_silu_parts` is the differentiable op (a
torch.autograd.Function): training and prediction run the same forward kernel.

Every pass (inference and training) runs the q, k and v parts of the packed projection through the
forward kernel, all three in one launch: q and k go conv → SiLU → L2 norm per head, v conv → SiLU.
It replaces, per layer, fla's three conv kernels, its three conv-state kernels, the copies that
made a forked (batch-broadcast) or sliced state dense, the concatenation of the three final
states, and the delta rule's two L2-norm kernels: a launch a layer instead of about ten.

- The input is read in place (strided rows of the packed projection); each part's output is
  written (B, T, C_part) contiguous, the parts one after another in one buffer.
- The initial state (B, C, W), oldest input first, is read through its strides: a forked prefix
  state may be a batch-broadcast view (stride 0) and is never copied.
- The final state (the last W inputs, the layout of `dohnuts.ops.conv`) is written through the
  strides of the caller's buffer: each part writes its channels of the one-conv (B, D, W) state.

The backward (dohnuts.ops._conv_bwd_kernel, with the autograd Function that pairs it with this forward)
recomputes the conv from x and the state instead of saving it. CPU tensors: Triton's interpreter.
"""

from __future__ import annotations

import contextlib
import itertools

import torch
import triton
import triton.language as tl

# Tokens per program and warps, tuned per (channels, head dim, width, flags, length bucket) on the
# first call of each (an eager pass, before any CUDA-graph capture); the choice is kept in Triton's
# cache directory (`cache_results`, as fla does), so a later process on the machine skips tuning.
# A fixed tile was no faster than fla's conv plus its L2 norm; of the tuned configs, those that
# measured slow at 2b's shapes are not offered, since a fresh machine's tuner times each config
# once and once kept a slow one (docs/history/evolution.md M17).
_CONFIGS = [triton.Config({"BT": bt}, num_warps=w) for bt, w in ((8, 1), (64, 8), (128, 8), (128, 16))]


@triton.jit
def _silu_norm_store(acc, Y, b, t, c, T, C, eps, mask, norm, NORM: tl.constexpr):
    """Store silu(acc) at rows t, channels c of a (B, T, C) output; divided by its L2 norm per row
    if `norm` (a head of a normalised part; NORM: some head of the launch is)."""
    y = acc * tl.sigmoid(acc)
    if NORM:
        if norm:  # a branch, not a select: v's heads skip the reduction
            y = y / tl.sqrt(tl.sum(y * y, axis=1) + eps)[:, None]
    tl.store(Y + b * T * C + t * C + c, y.to(Y.dtype.element_ty), mask=mask)


@triton.autotune(configs=_CONFIGS, key=["C", "D", "W", "T_BUCKET", "NORM", "HAS_S0", "STORE_ST"], cache_results=True)
@triton.jit
def _conv_kernel(X, Wt, Y, S0, ST, T, C, T_BUCKET, sxb, sxt, swc, swk, s0b, s0c, s0w, stb, stc, stw, eps,
                 c1, c2, norm_ch, D: tl.constexpr, W: tl.constexpr, HP: tl.constexpr, NORM: tl.constexpr,
                 HAS_S0: tl.constexpr, STORE_ST: tl.constexpr, BT: tl.constexpr):
    """Program (head h, token block, batch row b) over channels h·D..(h+1)·D of row b:
    y[t] = silu(Σ_k w[:, k] · x[t−W+1+k]), x[t < 0] from the initial state (or 0), then y / ‖y‖₂
    per row for the heads below channel `norm_ch`. The program holding the last token also writes
    the final state.

    The channels fall in up to three parts, split at c1 ≤ c2 (Gated DeltaNet's q, k and v: one
    launch a layer instead of three); part p's outputs are a contiguous (B, T, C_p) block of Y,
    the parts one after another.

    The tile reads only x, with unit-stride (vectorised) loads. With a state, the first W − 1
    outputs — the only ones that read it — are left to a small head tile of the first block: the
    state's (B, C, W) layout is strided along the channels, and loading it inside the main tile
    (masked, one scalar load per element) ran at a fraction of the bandwidth."""
    # Heads vary fastest: programs running together read and write neighbouring 256-byte pieces of
    # the same rows (faster for short passes, docs/history/evolution.md M16).
    h = tl.program_id(0).to(tl.int64)
    i_t = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)[:, None]
    ch = h * D + tl.arange(0, D)
    c = ch[None, :]
    # this head's part: its first channel, its width, and where its (B, T, C_p) block starts in Y
    c0 = h * D
    start = tl.where(c0 >= c2, c2, tl.where(c0 >= c1, c1, 0)).to(tl.int64)
    width = tl.where(c0 >= c2, C, tl.where(c0 >= c1, c2, c1)).to(tl.int64) - start
    Yp = Y + tl.num_programs(2).to(tl.int64) * T * start
    cp = c - start
    norm = c0 < norm_ch
    acc = tl.zeros((BT, D), dtype=tl.float32)
    for k in tl.static_range(W):
        tt = t - (W - 1) + k
        xk = tl.load(X + b * sxb + tt * sxt + c, mask=(tt >= 0) & (tt < T), other=0.0).to(tl.float32)
        acc += xk * tl.load(Wt + c * swc + k * swk).to(tl.float32)
    keep = t < T
    if HAS_S0:
        keep = keep & (t >= W - 1)  # the head tile below writes outputs 0..W−2
    _silu_norm_store(acc, Yp, b, t, cp, T, width, eps, keep, norm, NORM)
    if HAS_S0:
        if i_t == 0:
            th = tl.arange(0, HP)[:, None]  # outputs 0..W−2 (HP ≥ W − 1 rows, the rest masked)
            head = (th < W - 1) & (th < T)
            acc_h = tl.zeros((HP, D), dtype=tl.float32)
            for k in tl.static_range(W):
                th_in = th - (W - 1) + k  # input index; state column W + th_in holds input th_in < 0
                xh = tl.load(X + b * sxb + th_in * sxt + c, mask=head & (th_in >= 0) & (th_in < T), other=0.0)
                sh = tl.load(S0 + b * s0b + c * s0c + (W + th_in) * s0w, mask=head & (th_in < 0), other=0.0)
                acc_h += (xh.to(tl.float32) + sh.to(tl.float32)) * tl.load(Wt + c * swc + k * swk).to(tl.float32)
            _silu_norm_store(acc_h, Yp, b, th, cp, T, width, eps, head, norm, NORM)
    if STORE_ST:
        if i_t == (T - 1) // BT:
            for j in tl.static_range(W):  # state column j = input T − W + j
                ts = ch * 0 + (T - W + j)  # input index as a vector: the masks below are per channel
                xv = tl.load(X + b * sxb + ts * sxt + ch, mask=ts >= 0, other=0.0).to(tl.float32)
                if HAS_S0:
                    xv += tl.load(S0 + b * s0b + ch * s0c + (W + ts) * s0w, mask=ts < 0, other=0.0).to(tl.float32)
                tl.store(ST + b * stb + ch * stc + j * stw, xv.to(ST.dtype.element_ty))


def conv_silu_triton(x: torch.Tensor, weight: torch.Tensor, head_dim: int, *, normalize: bool,
                     initial_state: torch.Tensor | None = None, final_state: torch.Tensor | None = None,
                     eps: float = 1e-6, cpu_block_t: int = 32) -> torch.Tensor:
    """x (B, T, C) with unit channel stride, weight (C, W) with any strides → y (B, T, C)
    contiguous (a weight stored tap-major, (W, C) transposed, is read with vector loads): the causal
    depthwise conv from `initial_state` (B, C, W) (zeros if None; any strides), SiLU, and, if
    `normalize`, each head's `head_dim` channels scaled to unit L2 norm (1 / sqrt(Σ y² + eps), as
    fla's l2norm). `final_state`: a (B, C, W) tensor (any strides) that receives the last W
    inputs. `cpu_block_t`: the tokens per program in the interpreter (on a GPU the tuner picks)."""
    (y,) = conv_silu_parts_triton(x, weight, head_dim, [x.shape[-1]], normalized_parts=int(normalize),
                                  initial_state=initial_state, final_state=final_state, eps=eps,
                                  cpu_block_t=cpu_block_t)
    return y


def conv_silu_parts_triton(x: torch.Tensor, weight: torch.Tensor, head_dim: int, sizes: list[int], *,
                           normalized_parts: int, initial_state: torch.Tensor | None = None,
                           final_state: torch.Tensor | None = None, eps: float = 1e-6,
                           cpu_block_t: int = 32) -> tuple[torch.Tensor, ...]:
    """`conv_silu_triton` over the channels of x split into up to three parts of `sizes` (each a
    multiple of `head_dim`), in one launch: → one contiguous (B, T, size) output a part (views of
    one buffer), the first `normalized_parts` parts L2-normalised per head. Gated DeltaNet's q, k
    and v (q and k normalised) take one launch a layer instead of three."""
    B, T, C = x.shape
    W = weight.shape[-1]
    _check_parts(x, weight, head_dim, sizes, normalized_parts, initial_state, final_state)
    if x.stride(-1) != 1:
        x = x.contiguous()
    buf = torch.empty(B * T * C, dtype=x.dtype, device=x.device)
    ys, at = [], 0
    for n in sizes:
        ys.append(buf[at:at + B * T * n].view(B, T, n))
        at += B * T * n
    if B * T * C == 0:
        return tuple(ys)
    bounds = [*itertools.accumulate(sizes[:-1]), C, C][:2]  # c1 ≤ c2: where parts 2 and 3 start
    norm_ch = sum(sizes[:normalized_parts])
    s0 = initial_state if initial_state is not None else buf  # a placeholder pointer when absent
    s0_strides = (0 if s0.shape[0] == 1 else s0.stride(0), s0.stride(1), s0.stride(2)) if initial_state is not None \
        else (0, 0, 0)
    st = final_state if final_state is not None else buf
    st_strides = final_state.stride() if final_state is not None else (0, 0, 0)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        grid = lambda meta: (C // head_dim, triton.cdiv(T, meta["BT"]), B)  # noqa: E731
        args = (x, weight, buf, s0, st, T, C, min(triton.next_power_of_2(T), 4096), x.stride(0), x.stride(1),
                weight.stride(0), weight.stride(1),
                *s0_strides, *st_strides, float(eps), *bounds, norm_ch)
        flags = dict(D=head_dim, W=W, HP=max(2, triton.next_power_of_2(W - 1)), NORM=norm_ch > 0,
                     HAS_S0=initial_state is not None, STORE_ST=final_state is not None)
        if x.is_cuda:
            _conv_kernel[grid](*args, **flags)
        else:  # the interpreter cannot benchmark configs: run the given block
            _conv_kernel.fn[grid](*args, **flags, BT=cpu_block_t)
    return tuple(ys)


def _check_parts(x, weight, head_dim, sizes, normalized_parts, initial_state, final_state):
    B, T, C = x.shape
    W = weight.shape[-1]
    if (weight.shape != (C, W) or C % head_dim or head_dim & (head_dim - 1) or not 1 <= len(sizes) <= 3
            or sum(sizes) != C or any(n <= 0 or n % head_dim for n in sizes) or not 0 <= normalized_parts <= len(sizes)):
        raise ValueError(f"conv_silu: x {tuple(x.shape)}, weight {tuple(weight.shape)}, head_dim {head_dim}, parts "
                         f"{list(sizes)}: need weight (C, W), 1–3 parts that are multiples of head_dim (a power of "
                         "two) and sum to C")
    for name, s in (("initial_state", initial_state), ("final_state", final_state)):
        if s is not None and (s.shape[1:] != (C, W) or s.shape[0] not in (1, B)):
            raise ValueError(f"conv_silu: {name} {tuple(s.shape)} for x {tuple(x.shape)} and width {W}: need (B, C, W)")
    if final_state is not None and final_state.shape[0] != B:
        raise ValueError(f"conv_silu: final_state {tuple(final_state.shape)} needs batch {B}")


# A shared pass's conv (below `_conv_kernel`: a kernel's table entry hashes the line it starts on).
@triton.autotune(configs=_CONFIGS, key=["C", "D", "W", "T_BUCKET", "NORM"], cache_results=True)
@triton.jit
def _conv_shared_kernel(X, Wt, Y, R, P, L, C, T_BUCKET, sxt, swc, swk, eps, c1, c2, norm_ch, D: tl.constexpr,
                        W: tl.constexpr, NORM: tl.constexpr, BT: tl.constexpr):
    """`_conv_kernel` over the R rows of a shared pass in one launch: a prefix of P rows from no
    state, then B suffixes of L rows, each starting from the prefix's conv state — its last W − 1
    rows, read in place. Program (head h, row block) over channels h·D..(h+1)·D; part p's outputs
    are a contiguous (R, C_p) block of Y, the parts one after another. A block may straddle groups:
    each row finds its own group's first row, and an input before it is the prefix's row as far
    before P (zero before row 0, and for the prefix itself)."""
    h = tl.program_id(0).to(tl.int64)
    i_t = tl.program_id(1).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)[:, None]
    c = (h * D + tl.arange(0, D))[None, :]
    c0 = h * D
    start = tl.where(c0 >= c2, c2, tl.where(c0 >= c1, c1, 0)).to(tl.int64)
    width = tl.where(c0 >= c2, C, tl.where(c0 >= c1, c2, c1)).to(tl.int64) - start
    Yp = Y + R * start
    suffix = t >= P
    first = tl.where(suffix, P + (t - P) // L * L, 0)  # the first row of this row's group
    acc = tl.zeros((BT, D), dtype=tl.float32)
    for k in tl.static_range(W):
        d = t - (W - 1) + k
        own = d >= first
        row = tl.where(own, d, P - first + d)  # before a suffix's first row: the prefix's history
        ok = (t < R) & (own | (suffix & (row >= 0)))
        xk = tl.load(X + row * sxt + c, mask=ok, other=0.0).to(tl.float32)
        acc += xk * tl.load(Wt + c * swc + k * swk).to(tl.float32)
    _silu_norm_store(acc, Yp, 0, t, c - start, R, width, eps, t < R, c0 < norm_ch, NORM)


def conv_silu_shared_triton(x: torch.Tensor, weight: torch.Tensor, head_dim: int, sizes: list[int], prefix: int,
                            suffix_len: int, *, normalized_parts: int, eps: float = 1e-6,
                            cpu_block_t: int = 32) -> tuple[torch.Tensor, ...]:
    """`conv_silu_parts_triton` over the rows x (R, C) of a shared pass — a prefix of `prefix` rows
    from no state, then suffixes of `suffix_len` rows each from the prefix's final state — in one
    launch: → one contiguous (R, size) output a part (views of one buffer). The numbers are those of
    the prefix's call then the suffixes' from its state, forked (`tests/ops/test_ops.py`)."""
    R, C = x.shape
    W = weight.shape[-1]
    _check_parts(x.view(1, R, C), weight, head_dim, sizes, normalized_parts, None, None)
    if prefix < 1 or suffix_len < 1 or (R - prefix) % suffix_len:
        raise ValueError(f"conv_silu_shared: {R} rows are not a prefix of {prefix} and suffixes of {suffix_len}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    buf = torch.empty(R * C, dtype=x.dtype, device=x.device)
    ys, at = [], 0
    for n in sizes:
        ys.append(buf[at:at + R * n].view(R, n))
        at += R * n
    bounds = [*itertools.accumulate(sizes[:-1]), C, C][:2]
    norm_ch = sum(sizes[:normalized_parts])
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        grid = lambda meta: (C // head_dim, triton.cdiv(R, meta["BT"]))  # noqa: E731
        args = (x, weight, buf, R, prefix, suffix_len, C, min(triton.next_power_of_2(R), 4096), x.stride(0),
                weight.stride(0), weight.stride(1), float(eps), *bounds, norm_ch)
        flags = dict(D=head_dim, W=W, NORM=norm_ch > 0)
        if x.is_cuda:
            _conv_shared_kernel[grid](*args, **flags)
        else:  # the interpreter cannot benchmark configs: run the given block
            _conv_shared_kernel.fn[grid](*args, **flags, BT=cpu_block_t)
    return tuple(ys)
