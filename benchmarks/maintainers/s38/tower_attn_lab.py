"""Scratch (session 38): the vision tower's attention inside the tower's CUDA graph — SDPA as landed
(cuDNN's kernel, a memset before each call and ≈ 4 µs of idle after it in the graph, M51's trace)
against a Triton flash-attention forward (session 37's `s37b/attn_lab.py` kernel: q and k as the
rotary writes them, v read in place from the packed projection, the output in the projection's
rows) at several tile configs — each variant its own 2b session's `graphs.encode` (as a cold call
runs it), taking turns by rounds; outputs against the landed tower and the FP32 tower.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s38/tower_attn_lab.py OUT.json"""
import copy, json, statistics, sys
import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import dohnuts
from dohnuts.model import vision as V
from dohnuts.runtime.images import pixel_values
from dohnuts.runtime.timing import StageTimer


@triton.jit
def _attn_fwd(Q, K, V_, O, L, sm_scale, s_q, s_k, s_v, s_o, D: tl.constexpr,
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
        v = tl.load(V_ + (base + offs_n)[:, None] * s_v + h * D + offs_d[None, :])
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
        v = tl.load(V_ + (base + offs_n)[:, None] * s_v + h * D + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
    acc = acc / l_i[:, None]
    tl.store(O + (base + offs_m)[:, None] * s_o + h * D + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=mask_m[:, None])


LANDED = V.block_diagonal_attention


def triton_attention(cfg):
    bm, bn, warps, stages = cfg

    def attention(q, k, v, seqlens):
        if len(set(seqlens)) != 1:
            return LANDED(q, k, v, seqlens)
        N, H, D = q.shape
        L = seqlens[0]
        o = torch.empty(N, H * D, dtype=q.dtype, device=q.device)
        _attn_fwd[(triton.cdiv(L, bm), H, len(seqlens))](q, k, v, o, L, D ** -0.5, q.stride(0), k.stride(0),
                                                         v.stride(0), o.stride(0), D=D, BLOCK_M=bm, BLOCK_N=bn,
                                                         EVEN=L % bn == 0, num_warps=warps, num_stages=stages)
        return o.view(N, H, D)
    return attention


CONFIGS = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 128, 4, 2), (128, 128, 8, 2),
           (128, 32, 8, 2), (64, 32, 4, 2)]
VARIANTS = {"sdpa": LANDED, **{"triton_m{}_n{}_w{}_s{}".format(*c): triton_attention(c) for c in CONFIGS}}

torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
sessions = {}
for name in VARIANTS:
    sessions[name] = dohnuts.load("qwen3.5-2b", device="cuda")
out = {}
for label, grid, n_img in (("448x448", [1, 28, 28], 1), ("4 x 448x448", [1, 28, 28], 4), ("512x512", [1, 32, 32], 1)):
    grids = torch.tensor([grid] * n_img)
    n = grid[1] * grid[2] * n_img
    imgs = [torch.randint(0, 256, (n, 768), dtype=torch.uint8, generator=g).cuda() for _ in range(4)]
    V.block_diagonal_attention = LANDED
    tower32 = copy.deepcopy(sessions["sdpa"].model.visual).float()
    with torch.no_grad():
        ref32 = tower32(pixel_values(imgs[0], 2).float(), grids).float()
    del tower32
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    res = {"rel_err_fp32": {}, "rel_err_landed": {}, "ms": {}}
    with torch.no_grad():
        feats = {}
        for name, s in sessions.items():
            V.block_diagonal_attention = VARIANTS[name]
            try:
                feats[name] = s.graphs.encode(imgs[0], grids).float()
            except Exception as exc:  # noqa: BLE001
                res["rel_err_fp32"][name] = f"{type(exc).__name__}: {exc}"[:200]
        for name, f in feats.items():
            res["rel_err_fp32"][name] = rel(f, ref32)
            res["rel_err_landed"][name] = rel(f, feats["sdpa"])
        times = {nm: [] for nm in feats}
        for rnd in range(6):
            order = list(feats) if rnd % 2 == 0 else list(reversed(list(feats)))
            for name in order:
                V.block_diagonal_attention = VARIANTS[name]
                for i in range(25):
                    timer = StageTimer(torch.device("cuda", 0))
                    with timer.stage("tower"):
                        sessions[name].graphs.encode(imgs[i % 4], grids)
                    times[name].append(timer.result()["tower"].device_ms)
    res["ms"] = {nm: {"median": round(statistics.median(v), 4), "p10": round(float(np.percentile(v, 10)), 4),
                      "p90": round(float(np.percentile(v, 90)), 4),
                      "round_medians": [round(statistics.median(v[i:i + 25]), 4) for i in range(0, len(v), 25)]}
                 for nm, v in times.items()}
    out[label] = res
    best = sorted(res["ms"], key=lambda nm: res["ms"][nm]["median"])
    print(label, {nm: (res["ms"][nm]["median"], round(res["rel_err_fp32"][nm], 5)) for nm in best}, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
