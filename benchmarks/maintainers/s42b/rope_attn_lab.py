"""Scratch (session 42): the vision tower's rotary folded into its attention kernel — queries and
keys rotated as the attention loads them from the packed qkv projection (their partner channels and
cos/sin rows beside them) — against today's two launches (`rotary_qk_triton`, then
`segment_attention_triton`). At the tower's shape (784 rows, 16 heads of 64), CUDA graphs,
interleaved medians (do_bench_cudagraph), µs a layer; the outputs' largest difference.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s42b/rope_attn_lab.py OUT.json"""
import json, statistics, sys

import torch
import triton
import triton.language as tl

from dohnuts.ops._rope_kernel import rotary_qk_triton
from dohnuts.ops._segment_attention_kernel import segment_attention_triton


@triton.jit
def _rot(P, row, col, s_row, D: tl.constexpr, C, S, s_c):
    """Rows `row` × channels `col` of one head at P (row stride s_row), rotated by rotate_half's
    convention with cos/sin rows at C/S (row stride s_c), in FP32."""
    half = D // 2
    part = tl.where(col < half, col + half, col - half)
    x = tl.load(P + row * s_row + col).to(tl.float32)
    xp = tl.load(P + row * s_row + part).to(tl.float32)
    c = tl.load(C + row * s_c + col)
    s = tl.load(S + row * s_c + col)
    return x * c + tl.where(col < half, -xp, xp) * s


@triton.jit
def _rope_attn_kernel(QKV, C, S, O, L, scale, s_n, s_3, s_c, s_o, D: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (query block, head, segment): rotary then attention over the segment's L rows."""
    h = tl.program_id(1)
    base = tl.program_id(2).to(tl.int64) * L
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = tl.minimum(offs_m, L - 1)  # clamped (the stores are masked)
    q = _rot(QKV + base * s_n + h * D, rows[:, None], offs_d[None, :], s_n, D, C + base * s_c, S + base * s_c,
             s_c).to(QKV.dtype.element_ty)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    qk_scale = scale * 1.4426950408889634
    for start in range(0, L, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        cols = tl.minimum(offs_n, L - 1)
        k = _rot(QKV + base * s_n + s_3 + h * D, cols[None, :], offs_d[:, None], s_n, D, C + base * s_c,
                 S + base * s_c, s_c).to(QKV.dtype.element_ty)
        s = tl.where(mask_n[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(QKV + (base + cols)[:, None] * s_n + 2 * s_3 + h * D + offs_d[None, :])
        v = tl.where(mask_n[:, None], v, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    o = (acc / l_i[:, None]).to(O.dtype.element_ty)
    tl.store(O + (base + offs_m)[:, None] * s_o + h * D + offs_d[None, :], o, mask=(offs_m < L)[:, None])


def fused(qkv, cos, sin, length, bm, bn, warps, stages):
    N, _, H, D = qkv.shape
    o = torch.empty(N, H, D, dtype=qkv.dtype, device=qkv.device)
    _rope_attn_kernel[(triton.cdiv(length, bm), H, N // length)](
        qkv, cos, sin, o, length, D ** -0.5, qkv.stride(0), qkv.stride(1), cos.stride(0), o.stride(0), D=D,
        BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    return o


def today(qkv, cos, sin, length):
    q, k = rotary_qk_triton(qkv, cos, sin)
    return segment_attention_triton(q, k, qkv[:, 2], length)


torch.manual_seed(0)
res = {}
for n_img, L in ((1, 784),):
    N, H, D = n_img * L, 16, 64
    qkv = torch.randn(N, 3, H, D, device="cuda", dtype=torch.bfloat16)
    ang = torch.rand(N, D // 2, device="cuda") * 6.28
    cos = torch.cat([ang.cos(), ang.cos()], 1).contiguous()
    sin = torch.cat([ang.sin(), ang.sin()], 1).contiguous()
    ref = today(qkv, cos, sin, L)
    fns = {"today": lambda: today(qkv, cos, sin, L)}
    for bm, bn, w, st in ((64, 64, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3), (64, 64, 4, 2)):
        fns[f"fused_m{bm}_n{bn}_w{w}_s{st}"] = (lambda bm=bm, bn=bn, w=w, st=st: fused(qkv, cos, sin, L, bm, bn, w, st))
    out = {}
    for f, fn in list(fns.items()):
        try:
            y = fn()
            torch.cuda.synchronize()
            out[f] = {"max_diff": round((y.float() - ref.float()).abs().max().item(), 5)}
        except Exception as exc:
            out[f] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            del fns[f]
    times = {f: [] for f in fns}
    for _ in range(5):
        for f, fn in fns.items():
            times[f].append(triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3)
    for f, v in times.items():
        out[f]["us"] = round(statistics.median(v), 2)
    res[f"L{L}"] = out
    print(L, json.dumps(out), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
