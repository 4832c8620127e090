"""Triton kernel: the chunk-state recurrence of the gated delta rule — with a forked initial state,
and optionally each chunk's output in the same pass.

Derived from fla 0.6.0's `chunk_gated_delta_rule_fwd_kernel_h_blockdim64`
(fla/ops/common/chunk_delta_h.py) and `chunk_fwd_kernel_o` (fla/ops/common/chunk_o.py), MIT
licence, © Songlin Yang, Yu Zhang, Zhiyuan Li and contributors, trimmed to what Qwen3.5 uses —
scalar log2 gates per head, the state in (K, V) order, equal-length sequences, K ≤ 128 in two
blocks of 64 (fla: four, K ≤ 256) — with two changes:

1. The initial state is read through a batch stride. fla indexes it densely (sequence n at
   n·HV·K·V), so a shared prefix's state had to be copied once per branch before the suffix pass
   (32 MiB a layer for 32 branches of a 2b model); here the branches read one state (stride 0).
2. `FUSE_O`: each chunk's output is computed from the state while it is in registers, fla's
   output kernel folded into the loop. fla writes every chunk's state h[t] (in k's dtype) and
   v_new, and its output kernel reads both back; with FUSE_O neither exists. The price: a
   sequence's chunks run one after another (fla's output kernel runs them in parallel), so the
   caller fuses only when the batch fills the GPU (dohnuts.ops.delta_rule._fused_output).
3. `FUSE_WU` (with FUSE_O): fla's `recompute_w_u` folded in too. The kernel reads the values v,
   β and the solved intra-chunk matrix A of fla's kkt_solve kernel instead of w = A·(β·2^g·k) and
   u = A·(β·v): v_new = A·(β·v − (β·2^g·k)·S), one more 64 × 64 product a chunk, and w and u
   (as large as k and v) are never written nor read back.

Per (sequence, value head, V block), over chunks t of BT tokens (fla's algorithm):
    v_new = u − w·S                      (FUSE_WU: A·(β·v − (β·2^g·k)·S))
    o[t] = scale · (q·S · 2^g + tril(q·kᵀ · 2^(g_i − g_j)) · v_new)          (FUSE_O)
    S = S·2^(g_last) + kᵀ·(v_new · 2^(g_last − g))
storing o (FUSE_O) or h[t] = S at the chunk's start and v_new (read by fla's output kernel), and
optionally the final S. S enters every product in k's dtype, as fla's stored h[t] does.

The kernel has no backward of its own: it is the forward of dohnuts.ops.delta_rule.ChunkedDeltaRule
(training and prediction alike), whose backward is fla's, and whose backward recomputes the chunk
states of a forked state with `delta_h_triton` (fla's state kernel would index it densely). CPU
tensors run in Triton's interpreter (the CPU tests).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

# fla's tuning space for this kernel on Hopper (num_warps 2/4, stages 2–4, BV 32/64).
_CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=s) for w in (2, 4) for s in (2, 3, 4) for bv in (32, 64)]


@triton.jit
def _h_block(h, i_k: tl.constexpr, K, V, o_v, m_v):
    """Pointers and mask of rows i_k·64 .. i_k·64 + 63 of a (K, V) state, columns o_v."""
    o_k = i_k * 64 + tl.arange(0, 64)
    return h + o_k[:, None] * V + o_v[None, :], (o_k[:, None] < K) & m_v[None, :]


@triton.jit
def _store_state(h, b_h1, b_h2, K: tl.constexpr, V, o_v, m_v):
    """Store a state held as two 64-row blocks (the second only when K > 64) at h, (K, V)."""
    p, m = _h_block(h, 0, K, V, o_v, m_v)
    tl.store(p, b_h1.to(p.dtype.element_ty), mask=m)
    if K > 64:
        p, m = _h_block(h, 1, K, V, o_v, m_v)
        tl.store(p, b_h2.to(p.dtype.element_ty), mask=m)


@triton.jit
def _delta_h_kernel(q, k, v, w, v_new, g, beta, h, o, h0, ht, T, s0n, scale, size_class, H: tl.constexpr,
                    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                    USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr, FUSE_O: tl.constexpr,
                    FUSE_WU: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_h = i_nh // HV, i_nh % HV
    bos = i_n * T
    NT = tl.cdiv(T, BT)

    # The state as two 64-row blocks of K (K ≤ 128; the second block is unused when K ≤ 64).
    b_h1 = tl.zeros([64, BV], dtype=tl.float32)
    b_h2 = tl.zeros([64, BV], dtype=tl.float32)

    v += (bos * HV + i_h).to(tl.int64) * V
    k += (bos * H + i_h // (HV // H)).to(tl.int64) * K
    if FUSE_WU:  # w is fla's A, (N, T, HV, BT); v the values themselves; β per token
        w += (bos * HV + i_h).to(tl.int64) * BT
        beta += (bos * HV + i_h).to(tl.int64)
    else:
        w += (bos * HV + i_h).to(tl.int64) * K
    if FUSE_O:  # the chunk outputs are computed here: no h, no v_new
        q += (bos * H + i_h // (HV // H)).to(tl.int64) * K
        o += (bos * HV + i_h).to(tl.int64) * V
    else:
        h += (i_n * NT * HV + i_h).to(tl.int64) * K * V
        v_new += (bos * HV + i_h).to(tl.int64) * V

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    if USE_INITIAL_STATE:
        s0 = h0 + i_n * s0n + i_h * K * V  # the one change from fla: s0n may be 0 (a forked state)
        p0, m0 = _h_block(s0, 0, K, V, o_v, m_v)
        b_h1 += tl.load(p0, mask=m0, other=0.0).to(tl.float32)
        if K > 64:
            p0, m0 = _h_block(s0, 1, K, V, o_v, m_v)
            b_h2 += tl.load(p0, mask=m0, other=0.0).to(tl.float32)

    o_k1 = tl.arange(0, 64)
    for i_t in range(NT):
        i_t64 = tl.zeros([], dtype=tl.int64) + i_t  # int64 (and a tensor in the interpreter)
        o_t = i_t64 * BT + tl.arange(0, BT)
        m_t = o_t < T
        if not FUSE_O:
            _store_state(h + i_t64 * HV * K * V, b_h1, b_h2, K, V, o_v, m_v)

        # the chunk's gates (log2, cumulated within the chunk) and kᵀ, by 64-row blocks of K
        last_idx = tl.minimum((i_t + 1) * BT, T) - 1
        b_g_last = tl.load(g + (bos * HV + last_idx * HV + i_h).to(tl.int64)).to(tl.float32)
        b_g = tl.load(g + (bos * HV + i_h).to(tl.int64) + o_t * HV, mask=m_t, other=0.0).to(tl.float32)
        b_k1 = tl.load(k + o_k1[:, None] + o_t[None, :] * (H * K), mask=(o_k1[:, None] < K) & m_t[None, :], other=0.0)
        if K > 64:
            b_k2 = tl.load(k + 64 + o_k1[:, None] + o_t[None, :] * (H * K),
                           mask=(64 + o_k1[:, None] < K) & m_t[None, :], other=0.0)

        if FUSE_WU:
            # fla's recompute_w_u folded in: u = A·(β·v) and w = A·(β·2^g·k), so
            #   v_new = u − w·S = A·(β·v − (β·2^g·k)·S)
            # — one more product (with A), and w and u are never written nor read back.
            b_b = tl.load(beta + o_t * HV, mask=m_t, other=0.0).to(tl.float32)
            b_bg = (b_b * tl.math.exp2(b_g))[:, None]
            b_w = tl.load(k + o_t[:, None] * (H * K) + o_k1[None, :], mask=m_t[:, None] & (o_k1[None, :] < K),
                          other=0.0)
            b_w = (b_w * b_bg).to(b_w.dtype)
            b_v = tl.dot(b_w, b_h1.to(b_w.dtype))
            if K > 64:
                b_w = tl.load(k + o_t[:, None] * (H * K) + 64 + o_k1[None, :],
                              mask=m_t[:, None] & (64 + o_k1[None, :] < K), other=0.0)
                b_w = (b_w * b_bg).to(b_w.dtype)
                b_v = tl.dot(b_w, b_h2.to(b_w.dtype), b_v)
            b_v = tl.load(v + o_t[:, None] * (HV * V) + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                          other=0.0).to(tl.float32) * b_b[:, None] - b_v
            # Rows masked, columns not (as in fla's recompute_w_u): a row's columns past T are in
            # A's upper triangle. With both masked, Triton 3.6 faulted at partial last chunks
            # (illegal address). The upper triangle is selected away here, so A needs no
            # zero-filled allocation (fla's kernel writes only the lower blocks).
            o_c = tl.arange(0, BT)
            b_a = tl.load(w + o_t[:, None] * (HV * BT) + o_c[None, :], mask=m_t[:, None], other=0.0)
            b_a = tl.where(o_c[:, None] >= o_c[None, :], b_a, 0.0)
            b_v = tl.dot(b_a, b_v.to(b_a.dtype))
        else:
            # v_new = u − w·S, by 64-row blocks of K
            b_w = tl.load(w + o_t[:, None] * (HV * K) + o_k1[None, :], mask=m_t[:, None] & (o_k1[None, :] < K),
                          other=0.0)
            b_v = tl.dot(b_w, b_h1.to(b_w.dtype))
            if K > 64:
                b_w = tl.load(w + o_t[:, None] * (HV * K) + 64 + o_k1[None, :],
                              mask=m_t[:, None] & (64 + o_k1[None, :] < K), other=0.0)
                b_v = tl.dot(b_w, b_h2.to(b_w.dtype), b_v)
            b_v = tl.load(v + o_t[:, None] * (HV * V) + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0) - b_v

        if FUSE_O:
            # fla's chunk_fwd_o on this chunk, with S still in registers (fla reads h[t] back in
            # k's dtype; S enters the product in k's dtype here too):
            #   o = scale · (q·S · 2^g + tril(q·kᵀ · 2^(g_i − g_j)) · v_new)
            b_q = tl.load(q + o_t[:, None] * (H * K) + o_k1[None, :], mask=m_t[:, None] & (o_k1[None, :] < K),
                          other=0.0)
            b_o = tl.dot(b_q, b_h1.to(b_q.dtype))
            b_A = tl.dot(b_q, b_k1)
            if K > 64:
                b_q = tl.load(q + o_t[:, None] * (H * K) + 64 + o_k1[None, :],
                              mask=m_t[:, None] & (64 + o_k1[None, :] < K), other=0.0)
                b_o = tl.dot(b_q, b_h2.to(b_q.dtype), b_o)
                b_A = tl.dot(b_q, b_k2, b_A)
            b_o = b_o * tl.math.exp2(b_g)[:, None]
            b_A = b_A * tl.math.exp2(b_g[:, None] - b_g[None, :])
            b_A = tl.where((o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :], b_A, 0)
            b_o = (b_o + tl.dot(b_A.to(b_q.dtype), b_v.to(b_q.dtype))) * scale
            tl.store(o + o_t[:, None] * (HV * V) + o_v[None, :], b_o.to(o.dtype.element_ty),
                     mask=m_t[:, None] & m_v[None, :])
        else:
            tl.store(v_new + o_t[:, None] * (HV * V) + o_v[None, :], b_v.to(v_new.dtype.element_ty),
                     mask=m_t[:, None] & m_v[None, :])

        # decay to the chunk's end, then S += kᵀ · v_new
        b_v = b_v * tl.where(m_t, tl.math.exp2(b_g_last - b_g), 0)[:, None]
        b_g_last = tl.math.exp2(b_g_last)
        b_h1 *= b_g_last
        if K > 64:
            b_h2 *= b_g_last
        b_v = b_v.to(k.dtype.element_ty)
        b_h1 = tl.dot(b_k1, b_v, b_h1)
        if K > 64:
            b_h2 = tl.dot(b_k2, b_v, b_h2)

    if STORE_FINAL_STATE:
        _store_state(ht + i_nh * K * V, b_h1, b_h2, K, V, o_v, m_v)


# `size_class` (⌈log2⌉ of sequences × value heads, unused by the kernel) is a tuning key: the best
# block differs between a lone prefix and a 32-sequence batch (measured: docs/history/evolution.md
# M18), and a key on T would tune again at every new length.
_KEY = ["H", "HV", "K", "V", "BT", "USE_INITIAL_STATE", "STORE_FINAL_STATE", "FUSE_O", "FUSE_WU", "size_class"]
_tuned = triton.autotune(configs=_CONFIGS, key=_KEY, cache_results=True)(_delta_h_kernel)
# The fused kernel's configs: each one ran correct at the workloads' shapes on the H200 (Triton
# 3.6). (BV 32, 4 warps, 1 stage) is left out: it faults there with an illegal memory access
# (docs/known-issues.md KI-11); 8 warps were slower (docs/history/evolution.md M18).
_O_CONFIGS = [triton.Config({"BV": bv}, num_warps=4, num_stages=s) for bv, s in ((64, 1), (64, 2), (32, 2), (32, 3))]
_tuned_o = triton.autotune(configs=_O_CONFIGS, key=_KEY, cache_results=True)(_delta_h_kernel)


def _check(k, w, u, g, initial_state, w_cols=None, beta=None):
    """Shapes and layouts; returns the initial state's batch stride. `w_cols`: w's last dimension
    (K; the chunk size when w is fla's A and u the values, with `beta`)."""
    N, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    if (K > 128 or w.shape != (N, T, HV, w_cols or K) or u.shape[:2] != (N, T) or g.shape != (N, T, HV) or HV % H
            or (beta is not None and beta.shape != (N, T, HV))):
        raise ValueError(f"delta_h: k {tuple(k.shape)}, w {tuple(w.shape)}, u {tuple(u.shape)}, g {tuple(g.shape)}"
                         + ("" if beta is None else f", beta {tuple(beta.shape)}"))
    for name, t in (("k", k), ("w", w), ("u", u), ("g", g), ("beta", beta)):
        if t is None:
            continue
        if not t.is_contiguous():
            raise ValueError(f"delta_h: {name} must be contiguous")
    if initial_state is None:
        return 0
    s = initial_state
    if s.shape[1:] != (HV, K, V) or s.shape[0] not in (1, N) or not s[0].is_contiguous() or s.dtype != torch.float32:
        raise ValueError(f"delta_h: initial_state {tuple(s.shape)} {s.dtype} strides {s.stride()}: "
                         f"need (N or 1, {HV}, {K}, {V}) FP32, contiguous per sequence")
    return 0 if s.shape[0] == 1 else s.stride(0)


def _launch(q, k, w, u, g, v_new, h, o, initial_state, final, s0n, scale, chunk_size, cpu_block_v, beta=None):
    N, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    if N * T == 0:
        return
    dummy = o if o is not None else h  # pointers a pass does not use (never dereferenced)
    h0 = initial_state if initial_state is not None else dummy
    args = (q if q is not None else dummy, k, u, w, v_new if v_new is not None else dummy, g,
            beta if beta is not None else dummy, h if h is not None else dummy, o if o is not None else dummy, h0, final if final is not None else dummy,
            T, s0n, scale, (N * HV - 1).bit_length())
    flags = dict(H=H, HV=HV, K=K, V=V, BT=chunk_size, USE_INITIAL_STATE=initial_state is not None,
                 STORE_FINAL_STATE=final is not None, FUSE_O=o is not None, FUSE_WU=beta is not None)
    with torch.cuda.device(k.device) if k.is_cuda else contextlib.nullcontext():
        if k.is_cuda:
            tuner = _tuned_o if o is not None else _tuned
            tuner[lambda meta: (triton.cdiv(V, meta["BV"]) * N * HV,)](*args, **flags)
        else:  # the interpreter cannot benchmark configs: run the given block
            _delta_h_kernel[(triton.cdiv(V, cpu_block_v) * N * HV,)](*args, **flags, BV=cpu_block_v)


def delta_h_triton(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, g: torch.Tensor,
                   initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                   chunk_size: int = 64, cpu_block_v: int = 32):
    """fla's `chunk_gated_delta_rule_fwd_h` for equal-length sequences: k (N, T, H, K), w (N, T, HV, K),
    u (N, T, HV, V), g (N, T, HV) chunk-cumulated log2 gates (FP32) → (h (N, NT, HV, K, V) in k's
    dtype, v_new like u, final state (N, HV, K, V) FP32 or None). `initial_state`: (N or 1, HV, K, V)
    FP32, contiguous per sequence; a batch stride of 0 (an expanded fork) is read, never copied."""
    s0n = _check(k, w, u, g, initial_state)
    N, T, _, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    h = k.new_empty(N, triton.cdiv(T, chunk_size), HV, K, V)
    v_new = torch.empty_like(u)
    final = k.new_zeros(N, HV, K, V, dtype=torch.float32) if output_final_state else None
    _launch(None, k, w, u, g, v_new, h, None, initial_state, final, s0n, 1.0, chunk_size, cpu_block_v)
    return h, v_new, final


def delta_rule_output_triton(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, g: torch.Tensor,
                             scale: float, initial_state: torch.Tensor | None = None,
                             output_final_state: bool = False, chunk_size: int = 64, cpu_block_v: int = 32):
    """The state recurrence and fla's `chunk_fwd_o` in one kernel: q like k (N, T, H, K) → (o like u,
    final state or None). Each chunk's output is computed from the state while it is still in
    registers, so the per-chunk states h (N·NT·HV·K·V in k's dtype: 128 MiB for a 2b 32 × 512
    pass) and v_new are never written nor read back. Same arguments and state rules as
    `delta_h_triton`; `scale` multiplies q (K^-½ in Gated DeltaNet). The runtime calls
    `delta_rule_output_wy_triton` (fla's w and u not even formed); this form is its reference in
    the tests and `benchmarks/maintainers/kernel_lab.py`."""
    s0n = _check(k, w, u, g, initial_state)
    if q.shape != k.shape or not q.is_contiguous():
        raise ValueError(f"delta_rule_output: q {tuple(q.shape)} must be contiguous and shaped like k {tuple(k.shape)}")
    N, _, _, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    o = torch.empty_like(u)
    final = k.new_zeros(N, HV, K, V, dtype=torch.float32) if output_final_state else None
    _launch(q, k, w, u, g, None, None, o, initial_state, final, s0n, scale, chunk_size, cpu_block_v)
    return o, final


def delta_rule_output_wy_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                                A: torch.Tensor, g: torch.Tensor, scale: float,
                                initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                                chunk_size: int = 64, cpu_block_v: int = 32, out: torch.Tensor | None = None):
    """`delta_rule_output_triton` with fla's `recompute_w_u` folded in: from the values v (N, T, HV, V),
    β (N, T, HV) and fla's solved intra-chunk matrix A (N, T, HV, chunk) — the output of its
    kkt_solve kernel, (I + tril(β·k·kᵀ·2^(g_i − g_j), −1))⁻¹ per chunk — instead of w = A·(β·2^g·k)
    and u = A·(β·v). Each chunk's new values are A·(β·v − (β·2^g·k)·S), so w and u (as large as k
    and v) are never written nor read back. → (o like v, final state or None)."""
    s0n = _check(k, A, v, g, initial_state, w_cols=chunk_size, beta=beta)
    if q.shape != k.shape or not q.is_contiguous():
        raise ValueError(f"delta_rule_output: q {tuple(q.shape)} must be contiguous and shaped like k {tuple(k.shape)}")
    N, _, _, K = k.shape
    HV = v.shape[2]
    if out is not None and (out.shape != v.shape or out.dtype != v.dtype or not out.is_contiguous()):
        raise ValueError(f"delta_rule_output: out {tuple(out.shape)} {out.dtype} must be contiguous and like v "
                         f"{tuple(v.shape)} {v.dtype}")
    o = torch.empty_like(v) if out is None else out
    final = k.new_zeros(N, HV, K, v.shape[3], dtype=torch.float32) if output_final_state else None
    _launch(q, k, A, v, g, None, None, o, initial_state, final, s0n, scale, chunk_size, cpu_block_v, beta=beta)
    return o, final
