"""The gated delta rule (Gated DeltaNet's token mixer), with recurrent state in and out.

Per value head, with state S (K × V), log-decay g_t <= 0 and write strength beta_t in (0, 1):

    S_t = exp(g_t) · S_{t-1}
    S_t = S_t + k_t (beta_t · (v_t − k_tᵀ S_t))ᵀ      (delta rule: write only the correction)
    o_t = (scale · q_t)ᵀ S_t

q and k are L2-normalised first (Qwen3.5 always does). Query/key heads are shared by
HV / H consecutive value heads (grouped value attention). Shapes: q, k (B, T, H, K);
v (B, T, HV, V); g, beta (B, T, HV); state (B, HV, K, V) in FP32.

Three implementations with one signature: the fused chunked op (GPU; `ChunkedDeltaRule`, a
torch.autograd.Function whose forward is the prediction path's kernels — dohnuts' gate kernel,
fla's intra-chunk solve, dohnuts' state-and-output kernel — and whose backward is fla's
gated-delta-rule backward kernels), a chunked FP32 torch reference (CPU; the WY/UT-transform
algorithm of fla and transformers), and a naive token-by-token recurrence used only by tests as
the ground truth. Training and prediction run the same forward kernels.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import use_fused
from dohnuts.ops._fla import allow_hopper_backward_for_bk128, fla, hopper_backward_hazard

CHUNK = 64


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm):
    """FP32, head-major (B, HV, T, ·) tensors with q/k expanded to the value heads."""
    H, HV = q.shape[2], v.shape[2]
    if HV != H:
        q = q.repeat_interleave(HV // H, dim=2)
        k = k.repeat_interleave(HV // H, dim=2)
    q, k, v, g, beta = (x.transpose(1, 2).float() for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return q * scale, k, v, g, beta


def gated_delta_rule_recurrent(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm=True):
    """Token-by-token ground truth (slow; tests only)."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    B, HV, T, K = k.shape
    Vd = v.shape[-1]
    S = q.new_zeros(B, HV, K, Vd) if initial_state is None else initial_state.float()
    out = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        pred = (S * k[:, :, t, :, None]).sum(-2)  # (B, HV, V)
        delta = (v[:, :, t] - pred) * beta[:, :, t, None]
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    o = torch.stack(out, dim=2).transpose(1, 2).to(dtype)  # (B, T, HV, V)
    return o, (S if output_final_state else None)


def gated_delta_rule_reference(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm=True):
    """Chunked FP32 reference: exact in exact arithmetic, O(T/C) sequential steps."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    B, HV, T, K = k.shape
    Vd = v.shape[-1]
    C = CHUNK
    pad = (-T) % C
    if pad:
        # Padded steps have k = 0, beta = 0 and g = 0: they neither decay nor write the state.
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // C
    q, k, v = (x.reshape(B, HV, N, C, -1) for x in (q, k, v))  # (B, HV, N, C, ·)
    g, beta = g.reshape(B, HV, N, C), beta.reshape(B, HV, N, C)

    gc = g.cumsum(-1)  # log decay from chunk start to position i (inclusive)
    upper = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(upper, float("-inf")).exp()  # (B,HV,N,C,C) i>=j

    kb = k * beta[..., None]
    # UT transform: (I + strictly_lower(diag(beta) K Kᵀ ∘ decay)) U = [beta·V, beta·K·exp(gc)].
    A = (kb @ k.transpose(-1, -2)) * decay
    rhs = torch.cat([v * beta[..., None], kb * gc.exp()[..., None]], dim=-1)
    sol = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    u, w = sol[..., :Vd], sol[..., Vd:]  # u: new values, w: decayed keys that read the old state

    attn = (q @ k.transpose(-1, -2)) * decay  # intra-chunk scores, causal incl. diagonal
    q_dec = q * gc.exp()[..., None]
    k_dec = k * (gc[..., -1:] - gc).exp()[..., None]
    chunk_decay = gc[..., -1].exp()[..., None, None]  # (B, HV, N, 1, 1)

    S = q.new_zeros(B, HV, K, Vd) if initial_state is None else initial_state.float()
    outs = []
    for i in range(N):
        v_new = u[:, :, i] - w[:, :, i] @ S  # (B, HV, C, V)
        outs.append(q_dec[:, :, i] @ S + attn[:, :, i] @ v_new)
        S = S * chunk_decay[:, :, i] + k_dec[:, :, i].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, HV, N * C, Vd)[:, :, :T]
    return o.transpose(1, 2).to(dtype), (S if output_final_state else None)


def gated_delta_rule_fused(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm=True):
    """`ChunkedDeltaRule` on explicit gates: g (B, T, HV) the per-token log decay, chunk-cumulated
    (log2, fla's convention) in torch so that its gradient flows back."""
    B, T, HV = g.shape
    pad = (-T) % CHUNK
    gc = F.pad(g.float(), (0, 0, 0, pad)).view(B, -1, CHUNK, HV).cumsum(2).view(B, -1, HV)[:, :T]
    return _chunked_fused(q, k, v, gc * fla().RCP_LN2, beta, scale, initial_state, output_final_state, use_qk_l2norm)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm=True):
    """Returns (o (B, T, HV, V), final_state (B, HV, K, V) FP32 or None)."""
    fn = gated_delta_rule_fused if use_fused(q) else gated_delta_rule_reference
    return fn(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm)


def gdn_gates_reference(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                        dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet's gates from their projections: (g, beta), both (B, T, HV).

    g = −exp(A_log) · softplus(a + dt_bias) ≤ 0 in FP32 (log-space decay); beta = sigmoid(b)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.sigmoid()


def gated_delta_rule_from_logits(q, k, v, a, b, A_log, dt_bias, initial_state=None, output_final_state=False,
                                 use_qk_l2norm=True):
    """`gated_delta_rule` with the gates still raw: a, b (B, T, HV) are the projections that
    `gdn_gates_reference` turns into g and beta; A_log, dt_bias (HV,).

    Fused (inference and training alike): the gates in one Triton kernel reading the logits in
    place (dohnuts.ops._gdn_gates_kernel, its own backward), then `ChunkedDeltaRule` — the forward
    of the prediction path, fla's gated-delta-rule backward. On the reference path the gates are
    computed in torch and passed on."""
    if use_fused(q):
        # Triton and fla: on a GPU only (the CPU runs the reference path without them)
        from dohnuts.ops._gdn_gates_kernel import gdn_gates

        with _device(q):
            g, beta = gdn_gates(a, b, A_log, dt_bias, chunk_size=CHUNK, scale=fla().RCP_LN2)
        return _chunked_fused(q, k, v, g, beta, None, initial_state, output_final_state, use_qk_l2norm)
    g, beta = gdn_gates_reference(a, b, A_log, dt_bias)
    return gated_delta_rule(q, k, v, g, beta, None, initial_state, output_final_state, use_qk_l2norm)


def _fused_output(N: int, HV: int, K: int, V: int, device: torch.device) -> bool:
    """Whether the state recurrence computes the outputs too (dohnuts.ops._delta_h_kernel, FUSE_O):
    from half as many programs — (sequence, value head, 64 values) — as the GPU has
    multiprocessors, and for key heads up to 128.

    The fused kernel runs a sequence's chunks one after another; fla's output kernel runs every
    chunk in parallel, which wins only while the fused kernel leaves most of the GPU idle (a lone
    shared prefix). The measurements that drew the line are in docs/history/evolution.md (M18, M19)."""
    return K <= 128 and 2 * N * HV * -(-V // 64) >= _multiprocessors(device)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _kkt_solve(f, k, g, beta, zero_upper: bool = False):
    """fla's fused kkt + solve_tril kernel alone (the first step of its
    `chunk_gated_delta_rule_fwd_intra`, whose second step, recompute_w_u, the fused output kernel
    does itself): A = (I + tril(β·k·kᵀ·2^(g_i − g_j), −1))⁻¹ per chunk, (N, T, HV, CHUNK) in k's dtype.
    Only its lower blocks are written: the fused output kernel selects the upper ones away, so
    they stay unwritten (`zero_upper` False) unless fla's backward will read A (its recompute_w_u
    and prepare_wy_repr_bwd load whole 64 × 64 blocks: zeros then).

    Launched at one config, `_KKT_CONFIG`, not through fla's autotuner: that tuner keys the kernel
    by head counts and sizes alone, so the first launch's shape chose the config for every later
    one (a GPU test's small pass chose 4 warps, far slower at the workloads' passes), while one
    config is the fastest at every shape measured (docs/history/evolution.md M29)."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    import triton

    N, T, H, K = k.shape
    HV = beta.shape[2]
    alloc = torch.zeros if zero_upper else torch.empty
    A = alloc(N, T, HV, CHUNK, device=k.device, dtype=k.dtype)
    _kkt_kernel()[(triton.cdiv(T, CHUNK), N * HV)](
        k=k, g=g, beta=beta, A=A, cu_seqlens=None, chunk_indices=None, T=T, H=H, HV=HV, K=K, BT=CHUNK, BC=16,
        USE_G=True, IS_VARLEN=False, **_KKT_CONFIG)
    return A


# fla's candidate with 64-wide key blocks and one warp (kernel_lab.py kkt_configs, M29).
_KKT_CONFIG = {"BK": 64, "num_warps": 1}


def _kkt_kernel():
    """fla's kkt_solve kernel itself, from under its `@triton.heuristics` (whose two flags
    `_kkt_solve` passes) and its autotuner."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from triton.runtime import Autotuner, Heuristics


    fn = fla().chunk_gated_delta_rule_fwd_kkt_solve_kernel
    while isinstance(fn, (Autotuner, Heuristics)):
        fn = fn.fn
    return fn


def _device(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()  # CPU: Triton's interpreter


def _chunked_fused(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm):
    """`ChunkedDeltaRule` on gates already in fla's form (g: log2, chunk-cumulated, FP32). The
    state is made FP32 here (in the graph) and dense unless it is a fork the kernels read in place
    (an expanded view of one state, batch stride 0, K ≤ 128)."""
    K = k.shape[-1]
    if initial_state is not None:
        initial_state = initial_state.float()
        if not _forked(initial_state, K) and not initial_state.is_contiguous():
            initial_state = initial_state.contiguous()
    return ChunkedDeltaRule.apply(q, k, v, g, beta, initial_state, K ** -0.5 if scale is None else scale,
                                  output_final_state, use_qk_l2norm)


def _forked(initial_state, K: int) -> bool:
    return (initial_state is not None and initial_state.shape[0] > 1 and initial_state.stride(0) == 0 and K <= 128
            and initial_state[0].is_contiguous())


def prepare_delta_rule_backward(K: int) -> None:
    """Before a forward whose backward will run through fla's gated delta-rule backward at key head
    dim K: fla's #640 guard lifted where dohnuts' GPU gradient-parity tests prove that backward
    (block size BK=128 on Hopper), refused elsewhere (docs/known-issues.md KI-1). The training
    peer (transformers + PEFT) calls it too: its backward is the same fla kernels."""
    if hopper_backward_hazard():
        if 1 << (K - 1).bit_length() < 128:  # fla picks BK = min(next_pow2(K), 128) on Hopper
            raise RuntimeError(
                f"gated delta rule backward at key head dim {K} would run at block size BK<128 on Hopper "
                "with a Triton that miscompiles it (fla #640); dohnuts allows only BK=128 there "
                "(docs/known-issues.md KI-1)"
            )
        allow_hopper_backward_for_bk128()


class ChunkedDeltaRule(torch.autograd.Function):
    """The chunked gated delta rule: the prediction path's forward kernels, fla's backward.

    Forward (with or without autograd, the same kernels): fla's L2 norm if asked (Gated DeltaNet's
    conv kernel normalises q and k already), then, when the batch fills the GPU
    (`_fused_output`), fla's kkt_solve kernel gives each chunk's solved matrix A and one dohnuts
    kernel does the rest — fla's recompute_w_u, the state recurrence and each chunk's output from
    the state still in registers (`delta_rule_output_wy_triton`): w, u, the per-chunk states and
    v_new (in all 2.5× the size of k and v; the states alone 128 MiB a layer of a 2b 32 × 512 pass)
    are never written. Otherwise (a lone shared prefix; K > 128) fla's intra-chunk step gives w, u
    and A, then fla's state kernel — dohnuts' copy for a forked state — and fla's output kernel.
    Both paths read a forked state (an expanded (1, HV, K, V) view, batch stride 0) in place.

    Saved for the backward: q, k, v, g, β, A and the initial state (a view when forked). The
    backward is fla's `chunk_gated_delta_rule_bwd` step by step: w and u recomputed from A, the
    chunk states recomputed (dohnuts' state kernel for a forked state, which fla would index
    densely), then fla's dv, dh, dq/dk/dw/dg and WY kernels. g's gradient is taken back to the
    log2 gates this op receives (fla's is in natural-log units); the gate kernels' backward
    (dohnuts.ops._gdn_gates_kernel) takes it to a, A_log and dt_bias. A forked state gets a
    gradient per branch; autograd's expand sums them into the prefix's state."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, output_final_state, use_qk_l2norm):
        f = fla()
        K = k.shape[-1]
        needs_grad = any(ctx.needs_input_grad)
        if needs_grad and q.is_cuda:
            prepare_delta_rule_backward(K)
        with _device(q):
            q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))  # fla's input guard did the same
            q_rstd = k_rstd = None
            if use_qk_l2norm:
                (q, q_rstd), (k, k_rstd) = f.l2norm_fwd(q), f.l2norm_fwd(k)
            o, final, A = _group_forward(f, q, k, v, g, beta, initial_state, scale, output_final_state, needs_grad)
        if needs_grad:
            ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, A, initial_state)
            ctx.scale, ctx.use_qk_l2norm, ctx.forked = scale, use_qk_l2norm, _forked(initial_state, K)
        ctx.set_materialize_grads(False)
        return o.to(q.dtype), final

    @staticmethod
    def backward(ctx, do, dht):
        q, q_rstd, k, k_rstd, v, g, beta, A, h0 = ctx.saved_tensors
        with _device(q):
            dq, dk, dv, dg, db, dh0 = _group_backward(fla(), q, k, v, g, beta, A, h0, ctx.forked, ctx.scale, do, dht)
            if ctx.use_qk_l2norm:
                dq, dk = fla().l2norm_bwd(q, q_rstd, dq), fla().l2norm_bwd(k, k_rstd, dk)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, db.to(beta.dtype), dh0, None, None, None


def _group_forward(f, q, k, v, g, beta, initial_state, scale, output_final_state, needs_grad, A=None, out=None):
    """`ChunkedDeltaRule`'s forward kernels over one group of equal-length sequences (q and k
    normalised, every input contiguous) → (o, final state or None, A). `A`: the group's solved
    intra-chunk matrices when a launch for several groups made them already (`SharedDeltaRule`;
    written in full, upper blocks zero, where the split path or the backward reads them). `out`: a
    contiguous tensor like v that receives o."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._delta_h_kernel import delta_h_triton, delta_rule_output_wy_triton

    K = k.shape[-1]
    N, _, HV, V = v.shape
    if _fused_output(N, HV, K, V, q.device):
        if A is None:
            A = _kkt_solve(f, k, g, beta, zero_upper=needs_grad)
        o, final = delta_rule_output_wy_triton(q, k, v, beta, A, g, scale, initial_state, output_final_state,
                                               chunk_size=CHUNK, out=out)
        return o, final, A
    if A is None:
        w, u, A = f.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=CHUNK)
    else:
        w, u = f.recompute_w_u_fwd(k=k, v=v, beta=beta, A=A, g=g)
    state_step = delta_h_triton if _forked(initial_state, K) else _fla_state_step
    h, v_new, final = state_step(k=k, w=w, u=u, g=g, initial_state=initial_state,
                                 output_final_state=output_final_state, chunk_size=CHUNK)
    return _fla_output(f, q, k, v_new, h, g, scale, out), final, A


def _fla_state_step(k, w, u, g, initial_state, output_final_state, chunk_size):
    """fla's `chunk_gated_delta_rule_fwd_h` for equal-length sequences, its kernel launched here
    with the final state left uninitialised: the kernel writes every element of it (each program
    its head's block of values, all K rows), where fla's wrapper zero-fills it first — one launch
    a layer fewer in a shared pass's prefix."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    import triton

    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    h = k.new_empty(B, triton.cdiv(T, chunk_size), HV, K, V)
    final = torch.empty(B, HV, K, V, dtype=torch.float32, device=k.device) if output_final_state else None
    v_new = torch.empty_like(u)
    fla().chunk_gated_delta_rule_fwd_kernel_h_blockdim64[lambda meta: (triton.cdiv(V, meta["BV"]) * B * HV,)](
        k=k, v=u, w=w, v_new=v_new, g=g, gk=None, h=h, h0=initial_state, ht=final, cu_seqlens=None,
        chunk_offsets=None, T=T, H=H, HV=HV, K=K, V=V, BT=chunk_size, STATE_V_FIRST=False)
    return h, v_new, final


def _fla_output(f, q, k, v_new, h, g, scale, out=None):
    """fla's `chunk_fwd_o` for equal-length sequences, its kernel launched here writing into `out`
    (a contiguous tensor like v_new: a shared pass's buffer), not into a new tensor then copied."""
    # Triton: on a GPU only (the CPU runs the reference path without it)
    import triton

    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    o = torch.empty_like(v_new) if out is None else out
    nt = triton.cdiv(T, CHUNK)
    f.chunk_fwd_kernel_o[lambda meta: (triton.cdiv(V, meta["BV"]) * nt, B * HV)](
        q=q, k=k, v=v_new, h=h, g=g, g_gamma=None, o=o, cu_seqlens=None, chunk_indices=None, scale=scale, T=T,
        H=H, HV=HV, K=K, V=V, BT=CHUNK, STATE_V_FIRST=False)
    return o


def _group_backward(f, q, k, v, g, beta, A, h0, forked, scale, do, dht):
    """fla's `chunk_gated_delta_rule_bwd` step by step over one group (q and k as the forward's
    kernels read them: normalised) → (dq, dk, dv, dg at the log2 gates, dβ, dh0); do, dht may be
    None (zero)."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._delta_h_kernel import delta_h_triton

    do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
    dht = None if dht is None else dht.float().contiguous()
    w, u = f.recompute_w_u_fwd(k=k, v=v, beta=beta, A=A, g=g)
    state_step = delta_h_triton if forked else f.chunk_gated_delta_rule_fwd_h
    h, v_new, _ = state_step(k=k, w=w, u=u, g=g, initial_state=h0, output_final_state=False, chunk_size=CHUNK)
    dv = f.chunk_bwd_dv_local(q=q, k=k, g=g, do=do, scale=scale, chunk_size=CHUNK)
    # h0 only sizes dh0 here (empty_like: dense even for a forked view); dh0 is per branch
    dh, dh0, dv = f.chunk_gated_delta_rule_bwd_dhu(q=q, k=k, w=w, g=g, h0=h0, dht=dht, do=do, dv=dv, scale=scale,
                                                   chunk_size=CHUNK)
    dq, dk, dw, dg = f.chunk_bwd_dqkwg(q=q, k=k, v=v_new, w=w, g=g, h=h, dv=dv, do=do, dh=dh, scale=scale,
                                       chunk_size=CHUNK)
    dk2, dv, db, dg2 = f.prepare_wy_repr_bwd(k=k, v=v, beta=beta, g=g, A=A, dw=dw, du=dv)
    dk.add_(dk2)
    dg.add_(dg2)
    # fla's dg is the gradient at the natural-log gates: g here is log2, g_log2 = g_ln / ln 2
    return dq, dk, dv, dg * math.log(2), db, dh0


# ---- a shared pass: the prefix and its forked suffixes in one op ----------------------------------


def shared_chunk_index(P: int, B: int, L: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunks of a shared pass's rows — the prefix's P, then B suffixes of L — as fla's varlen
    kernels index them: (cu_seqlens (B + 2,), chunk_indices (chunks, 2): sequence, chunk) int32.
    Made by device ops, so a CUDA graph records it; once a pass (`dohnuts.model.state.SharedRows`)."""
    n_p, n_s = -(-P // CHUNK), -(-L // CHUNK)
    i = torch.arange(n_p + B * n_s, device=device, dtype=torch.int32)
    j = (i - n_p).clamp_min(0)
    chunk_indices = torch.stack([torch.where(i < n_p, 0, 1 + j // n_s), torch.where(i < n_p, i, j % n_s)], 1)
    cu_seqlens = torch.arange(-1, B + 1, device=device, dtype=torch.int32) * L + P
    cu_seqlens[:1] = 0
    return cu_seqlens, chunk_indices.to(torch.int32)


def gated_delta_rule_shared(q, k, v, a, b, A_log, dt_bias, prefix: int, suffix_len: int, chunk_index,
                            qk_normalised: bool):
    """The gated delta rule over a shared pass's rows: a prefix of `prefix` rows from no state, then
    suffixes of `suffix_len` rows each from its final state, forked. q, k (R, H, K), v (R, HV, V)
    and the gate logits a, b (R, HV) of all rows, prefix first (as the shared conv writes them);
    `chunk_index`: `shared_chunk_index(P, B, L)` → o (R, HV, V).

    Fused (q and k normalised by the conv, as Gated DeltaNet's fused conv does), `SharedDeltaRule`:
    one kkt_solve launch for the prefix's and the suffixes' chunks and one output buffer, the
    numbers of the two calls it replaces. Otherwise those two calls and a concatenation."""
    P, L = prefix, suffix_len
    B = (k.shape[0] - P) // L
    if use_fused(q) and qk_normalised:
        return SharedDeltaRule.apply(q, k, v, a, b, A_log, dt_bias, chunk_index, P, L, k.shape[-1] ** -0.5)
    (qp, kp, vp, ap, bp), (qs, ks, vs, as_, bs) = _shared_parts(P, B, L, q, k, v, a, b)
    o_p, state = gated_delta_rule_from_logits(qp, kp, vp, ap, bp, A_log, dt_bias, None, True,
                                              use_qk_l2norm=not qk_normalised)
    o_s, _ = gated_delta_rule_from_logits(qs, ks, vs, as_, bs, A_log, dt_bias, state.expand(B, -1, -1, -1), False,
                                          use_qk_l2norm=not qk_normalised)
    return torch.cat([o_p.reshape(P, *o_p.shape[2:]), o_s.reshape(B * L, *o_s.shape[2:])])


class SharedDeltaRule(torch.autograd.Function):
    """`gated_delta_rule_shared`'s fused path: the gates of both groups (dohnuts' gate kernel, one
    launch over every chunk of both, varlen), one launch of fla's kkt_solve kernel over every chunk
    of the prefix and the suffixes (varlen: the suffixes' chunks do not wait for the prefix's state),
    then `ChunkedDeltaRule`'s forward per group — the prefix's (fla's split path: its final state
    and its output written where they are kept, no zero fill and no copy), the suffixes' from its
    final state, forked — writing one output buffer. The numbers are those of two
    `ChunkedDeltaRule` calls: the same kernels on the same chunks.

    The backward is `ChunkedDeltaRule`'s per group, the suffixes' first: their initial state's
    gradients, summed over the branches, are the prefix's final state's; then the gate kernels'
    backward per group."""

    @staticmethod
    def forward(ctx, q, k, v, a, b, A_log, dt_bias, chunk_index, P, L, scale):
        # Triton and fla: on a GPU only (the CPU runs the reference path without them)
        from dohnuts.ops._gdn_gates_kernel import gdn_gates_varlen_triton

        f = fla()
        R, K, (HV, V) = k.shape[0], k.shape[-1], v.shape[1:]
        B = (R - P) // L
        needs_grad = any(ctx.needs_input_grad)
        if needs_grad and q.is_cuda:
            prepare_delta_rule_backward(K)
        with _device(q):
            q, k, v = (t.contiguous() for t in (q, k, v))
            (qp, kp, vp), (qs, ks, vs) = _shared_parts(P, B, L, q, k, v)
            g, beta = gdn_gates_varlen_triton(a, b, A_log, dt_bias, chunk_index, CHUNK, f.RCP_LN2)
            # A group on fla's split path, and fla's backward, read whole 64 × 64 blocks: zeros above
            # the diagonal there; the fused output kernel selects them away (as in `_kkt_solve`)
            A = torch.empty(R, HV, CHUNK, device=k.device, dtype=k.dtype)
            for rows, n in ((slice(0, P), 1), (slice(P, R), B)):
                if needs_grad or not _fused_output(n, HV, K, V, q.device):
                    A[rows].zero_()
            cu_seqlens, chunk_indices = chunk_index
            _kkt_kernel()[(chunk_indices.shape[0], HV)](
                k=k, g=g, beta=beta, A=A, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, T=R, H=k.shape[1],
                HV=HV, K=K, BT=CHUNK, BC=16, USE_G=True, IS_VARLEN=True, **_KKT_CONFIG)
            o = torch.empty(R, HV, V, device=vp.device, dtype=vp.dtype)
            parts = _shared_parts(P, B, L, g, beta, A, o)
            (gp, bp, Ap, op), (gs, bs, As, os_) = parts
            _, state, _ = _group_forward(f, qp, kp, vp, gp, bp, None, scale, True, needs_grad, A=Ap, out=op)
            _group_forward(f, qs, ks, vs, gs, bs, state.expand(B, -1, -1, -1), scale, False, needs_grad, A=As,
                           out=os_)
        if needs_grad:
            ctx.save_for_backward(q, k, v, a, b, A_log, dt_bias, g, beta, A, state)
            ctx.groups = (P, B, L)
            ctx.scale = scale
        ctx.set_materialize_grads(False)
        return o

    @staticmethod
    def backward(ctx, do):
        # Triton and fla: on a GPU only (the CPU runs the reference path without them)
        from dohnuts.ops._gdn_gates_kernel import gdn_gates_bwd_triton

        q, k, v, a, b, A_log, dt_bias, g, beta, A, state = ctx.saved_tensors
        f = fla()
        (P, B, L), (R, HV, V) = ctx.groups, v.shape
        (qp, kp, vp), (qs, ks, vs) = _shared_parts(P, B, L, q, k, v)
        do = torch.zeros(R, HV, V, device=v.device, dtype=v.dtype) if do is None else do.contiguous()
        (gp, bp, Ap, dop), (gs, bs, As, dos) = _shared_parts(P, B, L, g, beta, A, do)
        with _device(qp):
            h0 = state.expand(B, -1, -1, -1)
            dqs, dks, dvs, dgs, dbs, dh0 = _group_backward(f, qs, ks, vs, gs, bs, As, h0, _forked(h0, ks.shape[-1]),
                                                           ctx.scale, dos, None)
            dqp, dkp, dvp, dgp, dbp, _ = _group_backward(f, qp, kp, vp, gp, bp, Ap, None, False, ctx.scale, dop,
                                                         dh0.sum(0, keepdim=True))
            das, dbs_, dA_s, ddt_s = gdn_gates_bwd_triton(a[P:].view(B, L, HV), b[P:].view(B, L, HV), A_log, dt_bias,
                                                          dgs, dbs.float(), CHUNK, f.RCP_LN2)
            dap, dbp_, dA_p, ddt_p = gdn_gates_bwd_triton(a[:P].view(1, P, HV), b[:P].view(1, P, HV), A_log, dt_bias,
                                                          dgp, dbp.float(), CHUNK, f.RCP_LN2)
        da = torch.cat([dap.view(P, HV), das.view(B * L, HV)])
        db = torch.cat([dbp_.view(P, HV), dbs_.view(B * L, HV)])
        dq, dk, dv = (torch.cat([dp.reshape(P, *t.shape[1:]), ds.reshape(B * L, *t.shape[1:])]).to(t.dtype)
                      for t, dp, ds in ((q, dqp, dqs), (k, dkp, dks), (v, dvp, dvs)))
        return (dq, dk, dv, da, db, (dA_p + dA_s).to(A_log.dtype), (ddt_p + ddt_s).to(dt_bias.dtype), None, None, None,
                None)


def _shared_parts(P: int, B: int, L: int, *rows: torch.Tensor):
    """Tensors over a shared pass's rows (R, ...) → ((each as the prefix's (1, P, ...)), (each as the
    suffixes' (B, L, ...))): contiguous views."""
    return (tuple(t[:P].view(1, P, *t.shape[1:]) for t in rows),
            tuple(t[P:].view(B, L, *t.shape[1:]) for t in rows))
