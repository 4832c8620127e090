"""The gated delta rule (Gated DeltaNet's token mixer), with recurrent state in and out.

Per value head, with state S (K × V), log-decay g_t <= 0 and write strength beta_t in (0, 1):

    S_t = exp(g_t) · S_{t-1}
    S_t = S_t + k_t (beta_t · (v_t − k_tᵀ S_t))ᵀ      (delta rule: write only the correction)
    o_t = (scale · q_t)ᵀ S_t

q and k are L2-normalised first (Qwen3.5 always does). Query/key heads are shared by
HV / H consecutive value heads (grouped value attention). Shapes: q, k (B, T, H, K);
v (B, T, HV, V); g, beta (B, T, HV); state (B, HV, K, V) in FP32.

Three implementations with one signature: the fused fla chunked kernel (GPU), a chunked FP32
torch reference (CPU; the WY/UT-transform algorithm of fla and transformers), and a naive
token-by-token recurrence used only by tests as the ground truth.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import recording, use_fused

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
    from dohnuts.ops._fla import allow_hopper_backward_for_bk128, fla, hopper_backward_hazard

    needs_grad = recording(q, k, v, g, beta)
    if needs_grad and hopper_backward_hazard():
        K = q.shape[-1]
        if 1 << (K - 1).bit_length() < 128:  # fla picks BK = min(next_pow2(K), 128) on Hopper
            raise RuntimeError(
                f"gated delta rule backward at key head dim {K} would run at block size BK<128 on Hopper "
                "with a Triton that miscompiles it (fla #640); dohnuts allows only BK=128 there "
                "(docs/known-issues.md KI-1)"
            )
        allow_hopper_backward_for_bk128()
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    return fla().chunk_gated_delta_rule(
        q, k, v, g.float(), beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm,
    )


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
                                 use_qk_l2norm=True, before_state=None):
    """`gated_delta_rule` with the gates still raw: a, b (B, T, HV) are the projections that
    `gdn_gates_reference` turns into g and beta; A_log, dt_bias (HV,).

    Fused, without autograd: `_inference_fused` — fla's forward steps with the decay computed
    inside its chunk cumsum and the sigmoid in one kernel (about six fewer kernels a layer than the
    torch gates), and a state kernel that reads a forked initial state without copies. With
    autograd, and on the reference path, the gates are computed in torch and passed on.

    `before_state()`, when given, is called right before the first kernel that reads
    `initial_state`: the kernels before it (gates, the intra-chunk solve) do not need the state, so
    a caller whose state is still being computed on another CUDA stream waits there (the merged
    shared pass, `TextBackbone.forward_shared`)."""
    if use_fused(q) and not recording(q, k, v, a, b, A_log, dt_bias, initial_state):
        return _inference_fused(q, k, v, a, b, A_log, dt_bias, initial_state, output_final_state, use_qk_l2norm,
                                before_state)
    if before_state is not None:
        before_state()
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


def _kkt_solve(f, k, g, beta):
    """fla's fused kkt + solve_tril kernel alone (the first step of its
    `chunk_gated_delta_rule_fwd_intra`, whose second step, recompute_w_u, the fused output kernel
    does itself): A = (I + tril(β·k·kᵀ·2^(g_i − g_j), −1))⁻¹ per chunk, (N, T, HV, CHUNK) in k's dtype.
    Only its lower blocks are written: the upper ones hold whatever the allocation held, which the
    fused output kernel selects away (fla's recompute_w_u would need them zero)."""
    import triton

    N, T, H, K = k.shape
    HV = beta.shape[2]
    A = torch.empty(N, T, HV, CHUNK, device=k.device, dtype=k.dtype)  # the upper blocks: not written
    f.chunk_gated_delta_rule_fwd_kkt_solve_kernel[(triton.cdiv(T, CHUNK), N * HV)](
        k=k, g=g, beta=beta, A=A, cu_seqlens=None, chunk_indices=None, T=T, H=H, HV=HV, K=K, BT=CHUNK, BC=16)
    return A


def _inference_fused(q, k, v, a, b, A_log, dt_bias, initial_state, output_final_state, use_qk_l2norm,
                     before_state=None):
    """fla's `chunk_gated_delta_rule` forward (`use_gate_in_kernel`, `use_beta_sigmoid_in_kernel`),
    step by step, without its autograd wrapper. The gates come from dohnuts.ops._gdn_gates_kernel
    (one launch reading the logits in place, with fla's exp and softplus). Then, when the batch
    fills the GPU (`_fused_output`): fla's kkt_solve kernel gives each chunk's solved matrix A, and
    one dohnuts kernel does the rest — fla's recompute_w_u, the state recurrence and each chunk's
    output from the state still in registers (`delta_rule_output_wy_triton`): w, u, the per-chunk
    states and v_new (in all 2.5× the size of k and v; the states alone 128 MiB a layer of a 2b
    32 × 512 pass) are never written. Otherwise (a lone shared prefix; K > 128) fla's intra-chunk
    step gives w and u, then fla's state kernel — dohnuts' copy for a forked state — and fla's
    output kernel. Both paths read a forked state (an expanded (1, HV, K, V) view, batch stride 0)
    in place, never copied."""
    from dohnuts.ops._delta_h_kernel import delta_h_triton, delta_rule_output_wy_triton
    from dohnuts.ops._fla import fla
    from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton

    f = fla()
    with torch.cuda.device(q.device):
        q, k, v = (t.contiguous() for t in (q, k, v))  # fla's input guard did the same
        if use_qk_l2norm:
            q, k = f.l2norm_fwd(q)[0], f.l2norm_fwd(k)[0]
        # The decay and β in one kernel reading a and b in place (fla's two gate kernels and two
        # copies of the strided logits before them).
        g, beta = gdn_gates_triton(a, b, A_log, dt_bias, chunk_size=CHUNK, scale=f.RCP_LN2)
        K = k.shape[-1]
        scale = K ** -0.5
        N, _, HV, V = v.shape
        fused = _fused_output(N, HV, K, V, q.device)
        if fused:
            A = _kkt_solve(f, k, g, beta)
        else:
            w, u, _ = f.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=CHUNK)
        if before_state is not None:
            before_state()  # everything above is independent of the state
        forked = (initial_state is not None and initial_state.shape[0] > 1 and initial_state.stride(0) == 0
                  and K <= 128 and initial_state[0].is_contiguous())
        if initial_state is not None:
            initial_state = initial_state.float()
            if not forked and not initial_state.is_contiguous():
                initial_state = initial_state.contiguous()
        if fused:
            o, final = delta_rule_output_wy_triton(q, k, v, beta, A, g, scale, initial_state, output_final_state,
                                                   chunk_size=CHUNK)
            return o.to(q.dtype), final
        state_step = delta_h_triton if forked else f.chunk_gated_delta_rule_fwd_h
        h, v_new, final = state_step(k=k, w=w, u=u, g=g, initial_state=initial_state,
                                     output_final_state=output_final_state, chunk_size=CHUNK)
        o = f.chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=scale, chunk_size=CHUNK)
    return o.to(q.dtype), final
