"""Scratch (session 37): the vision tower's attention (16 heads of 64, 784 patches, non-causal) —
SDPA as the tower calls it (cuDNN's kernel on torch 2.11) against a Triton flash-attention forward
that reads q and k as the rotary writes them and v in place from the packed projection and writes
the (N, H·D) rows the output projection reads — at several tile configs, CUDA graphs, interleaved
medians; errors against the FP32 attention.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s37b/attn_lab.py OUT.json"""
import itertools, json, statistics, sys
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph


@triton.jit
def _attn_fwd(Q, K, V, O, L, sm_scale, s_q, s_k, s_v, s_o, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    base = tl.program_id(2) * L
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    mask_m = offs_m < L
    q = tl.load(Q + (base + offs_m)[:, None] * s_q + h * D + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    n_full = (L // BLOCK_N) * BLOCK_N
    for start in range(0, n_full, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + (base + offs_n)[None, :] * s_k + h * D + offs_d[:, None])
        qk = tl.dot(q, k) * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(V + (base + offs_n)[:, None] * s_v + h * D + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    if not EVEN:
        offs_n = n_full + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        k = tl.load(K + (base + offs_n)[None, :] * s_k + h * D + offs_d[:, None], mask=mask_n[None, :], other=0.0)
        qk = tl.dot(q, k) * qk_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(V + (base + offs_n)[:, None] * s_v + h * D + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
    acc = acc / l_i[:, None]
    tl.store(O + (base + offs_m)[:, None] * s_o + h * D + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=mask_m[:, None])


def triton_attn(q, k, qkv, n_seg, L, bm, bn, warps, stages):
    N, H, D = q.shape
    o = torch.empty(N, H * D, dtype=q.dtype, device=q.device)
    v = qkv[:, 2]
    _attn_fwd[(triton.cdiv(L, bm), H, n_seg)](q, k, v, o, L, D ** -0.5, q.stride(0), k.stride(0), v.stride(0),
                                             o.stride(0), D=D, BLOCK_M=bm, BLOCK_N=bn, EVEN=L % bn == 0,
                                             num_warps=warps, num_stages=stages)
    return o


def sdpa(q, k, qkv, n_seg, L):
    N, H, D = q.shape
    qs, ks, vs = (x.view(n_seg, L, H, D).transpose(1, 2) for x in (q, k, qkv[:, 2]))
    return F.scaled_dot_product_attention(qs, ks, vs, scale=D ** -0.5).transpose(1, 2).reshape(N, H * D)


out = {}
for n_seg, L in ((1, 784), (4, 784), (1, 1024)):
    N, H, D = n_seg * L, 16, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(N, 3, H, D, device="cuda", generator=g).bfloat16()
    q, k = qkv[:, 0].contiguous(), qkv[:, 1].contiguous()
    qf, kf, vf = (x.float().view(n_seg, L, H, D).transpose(1, 2) for x in (q, k, qkv[:, 2]))
    ref = F.scaled_dot_product_attention(qf, kf, vf, scale=D ** -0.5).transpose(1, 2).reshape(N, H * D)
    fns = {"sdpa": lambda: sdpa(q, k, qkv, n_seg, L)}
    for bm, bn, warps, stages in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)):
        if bm == 128 and warps == 4 and bn == 128:
            continue
        fns[f"triton_m{bm}_n{bn}_w{warps}_s{stages}"] = (lambda bm=bm, bn=bn, w=warps, s=stages:
                                                        triton_attn(q, k, qkv, n_seg, L, bm, bn, w, s))
    errs = {}
    for name, fn in list(fns.items()):
        try:
            y = fn().float()
            errs[name] = float((y - ref).norm() / ref.norm())
        except Exception as exc:  # noqa: BLE001
            errs[name] = f"{type(exc).__name__}: {exc}"[:200]
            del fns[name]
    times = {n: [] for n in fns}
    for _ in range(5):
        for n, fn in fns.items():
            times[n].append(do_bench_cudagraph(fn, rep=25) * 1e3)
    med = {n: round(statistics.median(v), 2) for n, v in times.items()}
    best = min((n for n in med if n != "sdpa"), key=med.get)
    out[f"{n_seg}x{L}"] = {"us": med, "rel_err": errs, "best": best}
    print(f"{n_seg}x{L}: sdpa {med['sdpa']} us (err {errs['sdpa']:.2e}); best {best} {med[best]} us "
          f"(err {errs[best]:.2e})", flush=True)
    print("  ", sorted(med.items(), key=lambda kv: kv[1])[:8], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
