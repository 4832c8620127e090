"""Causal grouped-query attention with keys/values that may include a cached past, and the vision
tower's non-causal attention within segments (`block_diagonal_attention`).

q holds the last Tq positions of a sequence whose keys/values span Tk >= Tq positions (the
first Tk - Tq come from a KV cache, e.g. a shared prefix). Query i sits at absolute position
Tk - Tq + i and sees keys 0..Tk - Tq + i.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import recording, use_fused


def _suffix_causal_mask(tq: int, tk: int, device: torch.device) -> torch.Tensor:
    """(Tq, Tk) bool, True where attention is allowed (bottom-right aligned causal mask)."""
    qpos = torch.arange(tk - tq, tk, device=device)[:, None]
    kpos = torch.arange(tk, device=device)[None, :]
    return kpos <= qpos


def causal_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    kr = k.repeat_interleave(group, dim=1).float()  # (B, Hq, Tk, D)
    vr = v.repeat_interleave(group, dim=1).float()
    scores = (q.float() @ kr.transpose(-1, -2)) * scale  # (B, Hq, Tq, Tk)
    scores = scores.masked_fill(~_suffix_causal_mask(Tq, Tk, q.device), float("-inf"))
    probs = scores.softmax(dim=-1)
    return (probs @ vr).to(q.dtype)  # (B, Hq, Tq, D)


def causal_attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk:
        # No cached past: plain causal attention, which SDPA runs on its flash kernel.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    # A cached past: bottom-right aligned causal attention. Passed as a CausalBias, SDPA runs it on
    # the flash kernel (which aligns causal masks bottom-right); a boolean mask tensor sends it to a
    # slower masked kernel. Imported here, on the fused (GPU) path only: torch.nn.attention.bias
    # imports torch._dynamo and Triton, 2 of the 4.5 s `dohnuts.load("tiny")` took on a 2-core CPU.
    from torch.nn.attention.bias import causal_lower_right

    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(Tq, Tk), scale=scale,
                                          enable_gqa=True)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: (B, Hq, Tq, D); k, v: (B, Hkv, Tk, D) with Hq % Hkv == 0 → (B, Hq, Tq, D)."""
    fn = causal_attention_fused if use_fused(q) else causal_attention_reference
    return fn(q, k, v, scale)


def attention_at_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_limit: torch.Tensor,
                           scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    kr = k.repeat_interleave(group, dim=1).float()  # (B, Hq, S, D)
    vr = v.repeat_interleave(group, dim=1).float()
    scores = (q.float() @ kr.transpose(-1, -2)) * scale  # (B, Hq, Q, S)
    allowed = torch.arange(k.shape[2], device=q.device) <= key_limit[:, None, :, None]  # (B, 1, Q, S)
    return (scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ vr).to(q.dtype)


def attention_at_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_limit: torch.Tensor,
                       scale: float) -> torch.Tensor:
    B, Hq, Q, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    # The G query heads of a KV head become G·Q queries of that head (head h reads KV head h // G):
    # SDPA then runs without repeating the keys, on its masked (memory-efficient) kernel.
    qf = q.reshape(B, Hkv, G * Q, D)
    allowed = torch.arange(S, device=q.device) <= key_limit[:, None, None, :, None]  # (B, 1, 1, Q, S)
    mask = allowed.expand(B, 1, G, Q, S).reshape(B, 1, G * Q, S)
    o = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)  # (B, Hkv, G·Q, D)
    return o.reshape(B, Hq, Q, D)


def attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_limit: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """Attention of a few queries per sequence, each over its own causal prefix of the keys.

    q: (B, Hq, Q, D) contiguous; k, v: (B, Hkv, S, D) with Hq % Hkv == 0; key_limit (B, Q) long:
    query j of row b sees keys 0..key_limit[b, j] (its absolute position) → (B, Hq, Q, D). What
    the last layer of a scoring pass runs for the scored positions alone (`causal_attention` on
    every query, then picking Q of them, gives the same numbers)."""
    fn = attention_at_fused if use_fused(q) else attention_at_reference
    return fn(q, k, v, key_limit, scale)


def gated_output_reference(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    B, H, T, D = o.shape
    # The sigmoid reads the strided gate view and writes it contiguous (B, T, H·D).
    return o.transpose(1, 2).reshape(B, T, H * D) * torch.sigmoid(gate).reshape(B, T, H * D)


def gated_output_fused(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._gate_kernel import gated_output_fn

    return gated_output_fn(o, gate)


def gated_output(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Gated attention's output: o (B, H, T, D) times sigmoid(gate) (B, T, H, D) → (B, T, H·D).

    Fused: one Triton kernel reading both in place, with a one-kernel Triton backward."""
    fn = gated_output_fused if use_fused(o) else gated_output_reference
    return fn(o, gate)


def block_diagonal_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                       seqlens: list[int]) -> torch.Tensor:
    """SDPA per group of equal segments: segments of one length run as one batched call (one
    launch for many same-sized images); no N×N mask is ever built."""
    N, H, D = q.shape
    if len(set(seqlens)) == 1:  # all segments equal (one image, or same-sized images): a plain view
        n, length = len(seqlens), seqlens[0]
        qs, ks, vs = (x.view(n, length, H, D).transpose(1, 2) for x in (q, k, v))  # (n, H, L, D)
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=D ** -0.5)  # (n, H, L, D)
        return o.transpose(1, 2).reshape(N, H, D)
    out = torch.empty_like(q)
    starts = [0, *itertools.accumulate(seqlens[:-1])]
    by_length: dict[int, list[int]] = {}
    for start, length in zip(starts, seqlens):
        by_length.setdefault(length, []).append(start)
    for length, group in by_length.items():
        idx = (torch.tensor(group, device=q.device)[:, None] + torch.arange(length, device=q.device)).flatten()
        n = len(group)
        # (n·L, H, D) → (n, H, L, D): one batch row per segment.
        qs, ks, vs = (x[idx].view(n, length, H, D).transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=D ** -0.5)  # (n, H, L, D)
        out[idx] = o.transpose(1, 2).reshape(n * length, H, D)
    return out


def _segments_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlens: list[int]) -> bool:
    # Triton: on a GPU only (the CPU runs the reference path without it)
    from dohnuts.ops._segment_attention_kernel import HEAD_DIMS

    return (len(set(seqlens)) == 1 and q.shape[-1] in HEAD_DIMS and q.dtype in (torch.bfloat16, torch.float16)
            and q.dtype == k.dtype == v.dtype
            and all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (q, k, v)))


def block_diagonal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
    """Non-causal attention within each segment of a packed sequence, never across segments: q, k,
    v (N, H, D) with N = sum(seqlens), rows at any stride → (N, H, D), scaled by D^-½. The fused
    path (one Triton kernel, `dohnuts.ops._segment_attention_kernel`) takes 16-bit inputs in segments
    of one length and is inference-only (the vision tower is frozen); under autograd, in FP32 (its
    products would run in TF32), for segments of several lengths and on the CPU, the reference (SDPA)
    runs."""
    if use_fused(q) and not recording(q, k, v) and _segments_fused(q, k, v, seqlens):
        # Triton: on a GPU only (the CPU runs the reference path without it)
        from dohnuts.ops._segment_attention_kernel import segment_attention_triton

        return segment_attention_triton(q, k, v, seqlens[0])
    return block_diagonal_attention_reference(q, k, v, seqlens)
