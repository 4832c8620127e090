"""Triton kernel for the vision tower's attention: non-causal attention within equal segments.

`segment_attention_triton(q, k, v, length)`: q, k, v (N, H, D) rows, N a whole number of segments
of `length` rows (one a frame of an image), each row attending to every row of its own segment →
o (N, H, D), rows contiguous (the output projection's input). q, k and v may be row-strided views:
the tower reads q and k as its rotary kernel writes them and v in place from the packed qkv
projection, so nothing is transposed or copied around the call. A flash-attention forward: one
program a block of queries of one head of one segment, the keys and values in blocks with an
online softmax in FP32 (exp2 of the scaled logits), the output rounded once.

Its own kernel rather than SDPA's: inside the tower's CUDA graph SDPA's cuDNN kernel is preceded
by a memset and the graph idles between the two; the kernel and config here were chosen by
measuring the whole tower as a graph (docs/history/evolution.md M51). Inference only: the tower is frozen, so
there is no backward; under autograd, in FP32, on the CPU and for segments of several lengths the op
takes its reference path (`dohnuts.ops.attention.block_diagonal_attention_reference`). Imported
on the first fused call on a CUDA device; CPU tensors run in Triton's interpreter, which is how
the CPU tests check it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dohnuts.ops._norm_kernels import _on_device

BLOCK_M, BLOCK_N, WARPS, STAGES = 64, 64, 4, 3  # the config the tower's graph ran fastest with (M51)
HEAD_DIMS = (16, 32, 64, 128)  # a head's width must be a power of two the tensor cores take


@triton.jit
def _segment_attention_kernel(Q, K, V, O, L, scale, stride_q, stride_k, stride_v, stride_o, D: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
    """Program (query block, head, segment): o = softmax(q kᵀ · scale) v over the segment's L rows."""
    h = tl.program_id(1)
    base = tl.program_id(2).to(tl.int64) * L  # the segment's first row
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    mask_m = offs_m < L
    q = tl.load(Q + (base + offs_m)[:, None] * stride_q + h * D + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    qk_scale = scale * 1.4426950408889634  # log2(e): the softmax through exp2
    n_full = (L // BLOCK_N) * BLOCK_N
    for start in range(0, n_full, BLOCK_N):  # whole key blocks: no masks
        offs_n = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + (base + offs_n)[None, :] * stride_k + h * D + offs_d[:, None])
        s = tl.dot(q, k) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + (base + offs_n)[:, None] * stride_v + h * D + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    if not EVEN:  # the last, partial key block
        offs_n = n_full + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        k = tl.load(K + (base + offs_n)[None, :] * stride_k + h * D + offs_d[:, None], mask=mask_n[None, :], other=0.0)
        s = tl.where(mask_n[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + (base + offs_n)[:, None] * stride_v + h * D + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    o = (acc / l_i[:, None]).to(O.dtype.element_ty)
    tl.store(O + (base + offs_m)[:, None] * stride_o + h * D + offs_d[None, :], o, mask=mask_m[:, None])


def segment_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int) -> torch.Tensor:
    """q, k, v (N, H, D), each head's D values contiguous, rows at any stride; N a multiple of
    `length` → (N, H, D) contiguous, scaled by D^-½."""
    N, H, D = q.shape
    if k.shape != q.shape or v.shape != q.shape or len({q.dtype, k.dtype, v.dtype}) != 1:
        raise ValueError(f"segment_attention: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype} and "
                         f"v {tuple(v.shape)} {v.dtype} must be one shape and dtype")
    if D not in HEAD_DIMS or any(t.stride(2) != 1 or t.stride(1) != D for t in (q, k, v)):
        raise ValueError(f"segment_attention: a head of {D} values (one of {HEAD_DIMS}), contiguous within a row")
    if length < 1 or N % length:
        raise ValueError(f"segment_attention: {N} rows are not whole segments of {length}")
    o = torch.empty(N, H, D, dtype=q.dtype, device=q.device)
    if N:
        with _on_device(q):
            _segment_attention_kernel[(triton.cdiv(length, BLOCK_M), H, N // length)](
                q, k, v, o, length, D ** -0.5, q.stride(0), k.stride(0), v.stride(0), o.stride(0), D=D,
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, EVEN=length % BLOCK_N == 0, num_warps=WARPS, num_stages=STAGES)
    return o
