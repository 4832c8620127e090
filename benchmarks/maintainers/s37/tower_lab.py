"""Scratch (session 37): where a 448² image's vision tower spends its time, and which fusions pay.

The 2b tower (24 blocks, 1024 wide, 784 patches) as a CUDA graph, each variant against the tower
as dohnuts runs it, interleaved (do_bench_cudagraph medians), outputs compared:
- sdpa_*: the attention forced onto one SDPA backend (flash, cuDNN, memory-efficient);
- addln: every residual add fused into the LayerNorm that follows it (one Triton kernel: the sum
  and the normed row), the position-embedding add into the first block's norm;
- gelu: fc1's bias and GELU (tanh) in cuBLASLt's epilogue (torch._addmm_activation);
- combinations. Then one replay of the tower and of the best variant profiled per kernel, and the
  tower at 2 and 4 images a call (time per image).

    python benchmarks/maintainers/s37/tower_lab.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _add_ln_kernel(X, R, W, B, Y, RO, D, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    s = tl.load(X + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        s += tl.load(R + row * D + cols, mask=mask, other=0.0).to(tl.float32)
        s = s.to(RO.dtype.element_ty)
        tl.store(RO + row * D + cols, s, mask=mask)
        s = s.to(tl.float32)
    mean = tl.sum(s, axis=0) / D
    c = tl.where(mask, s - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=0) / D + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * D + cols, (c * rstd * w + b).to(Y.dtype.element_ty), mask=mask)


def add_ln(x, r, norm):
    """(LN(x + r), x + r) with x + r rounded to x's dtype first (as `x + r` then `norm(...)`)."""
    N, D = x.shape
    y = torch.empty_like(x)
    ro = torch.empty_like(x) if r is not None else y
    _add_ln_kernel[(N,)](x, r if r is not None else x, norm.weight, norm.bias, y, ro, D, norm.eps,
                         HAS_RES=r is not None, BLOCK=triton.next_power_of_2(D), num_warps=4)
    return y, ro


def grid_inputs(tower, grid_thw, dtype):
    from dohnuts.model.vision import _check_grids
    grids = _check_grids(grid_thw, tower.cfg)
    return tower.position_embeddings(grids).to(dtype), tower.rotary(grids, tower.pos_embed.weight.device)


def forward(tower, patches, grid_thw, *, addln=False, gelu=False, sdpa=None, pre=None):
    from dohnuts.model.vision import _check_grids, block_diagonal_attention
    from dohnuts.ops import rotary_qk

    cfg = tower.cfg
    grids = _check_grids(grid_thw, cfg)
    x = tower.patch_embed(patches)
    if pre is None:
        pos = tower.position_embeddings(grids).to(x.dtype)
        rope = tower.rotary(grids, x.device)
    else:
        pos, rope = pre
    seqlens = [h * w for t, h, w in grids for _ in range(t)]

    def attn(blk, h):
        a = blk.attn
        N = h.shape[0]
        qkv = a.qkv(h).view(N, 3, a.num_heads, -1)
        q, k = rotary_qk(qkv, *rope)
        if sdpa is None:
            o = block_diagonal_attention(q, k, qkv[:, 2], seqlens)
        else:
            with torch.nn.attention.sdpa_kernel([sdpa]):
                o = block_diagonal_attention(q, k, qkv[:, 2], seqlens)
        return a.proj(o.reshape(N, -1))

    def mlp(blk, h):
        m = blk.mlp
        if gelu:
            u = torch._addmm_activation(m.linear_fc1.bias, h, m.linear_fc1.weight.t(), use_gelu=True)
        else:
            u = m.act(m.linear_fc1(h))
        return m.linear_fc2(u)

    if not addln:
        x = x + pos
        for blk in tower.blocks:
            x = x + attn(blk, blk.norm1(x))
            x = x + mlp(blk, blk.norm2(x))
        return tower.merger(x)
    # Fused: each add lands in the norm after it.
    n, x = add_ln(x, pos, tower.blocks[0].norm1)
    blocks = list(tower.blocks)
    for i, blk in enumerate(blocks):
        a = attn(blk, n)
        n, x = add_ln(a, x, blk.norm2)
        m = mlp(blk, n)
        nxt = blocks[i + 1].norm1 if i + 1 < len(blocks) else tower.merger.norm
        n, x = add_ln(m, x, nxt)
    mg = tower.merger
    return mg.linear_fc2(F.gelu(mg.linear_fc1(n.view(-1, mg.merged))))


def profile_table(fn, path: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    ev = prof.key_averages()
    path.write_text(ev.table(sort_by="self_device_time_total", row_limit=40))
    kern = [e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"busy_ms": sum(e.self_device_time_total for e in kern) / 1e3, "kernels": sum(e.count for e in kern)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from triton.testing import do_bench_cudagraph

    from dohnuts.config import preset
    from dohnuts.model.vision import build_vision_tower
    from dohnuts.runtime.images import pixel_values

    torch.manual_seed(0)
    cfg = preset("qwen3.5-2b").vision
    tower = build_vision_tower(cfg, device="cuda", dtype=torch.bfloat16, seed=0).eval()
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "cudnn": torch.backends.cudnn.version()}
    B = torch.nn.attention.SDPBackend

    inputs = {n: (torch.tensor([[1, 28, 28]] * n), torch.randint(0, 256, (784 * n, 768), dtype=torch.uint8,
                                                                   device="cuda")) for n in (1, 2, 4)}

    def make(n_img, **kw):
        grid, u8 = inputs[n_img]
        if kw.pop("pre", False):
            with torch.no_grad():
                kw["pre"] = grid_inputs(tower, grid, torch.bfloat16)

        def fn():
            with torch.no_grad():
                return forward(tower, pixel_values(u8, 2).to(torch.bfloat16), grid, **kw)
        return fn

    variants = {
        "base": {}, "sdpa_flash": {"sdpa": B.FLASH_ATTENTION}, "sdpa_cudnn": {"sdpa": B.CUDNN_ATTENTION},
        "addln": {"addln": True}, "gelu": {"gelu": True},
        "addln_gelu": {"addln": True, "gelu": True},
        "pre": {"pre": True}, "addln_pre": {"addln": True, "pre": True},
        "all": {"addln": True, "gelu": True, "pre": True},
    }
    fns, errs = {}, {}
    ref = make(1)()
    import copy
    tower32 = copy.deepcopy(tower).float()
    with torch.no_grad():
        ref32 = tower32(pixel_values(inputs[1][1], 2), inputs[1][0])
    del tower32
    for name, kw in variants.items():
        try:
            f = make(1, **dict(kw))
            y = f()
            d = (y.float() - ref.float())
            d32 = (y.float() - ref32)
            errs[name] = {"vs_base": [float((d.norm() / ref.float().norm()).item()), float(d.abs().max().item())],
                          "vs_fp32": [float((d32.norm() / ref32.norm()).item()), float(d32.abs().max().item())]}
            fns[name] = f
        except Exception as exc:  # noqa: BLE001
            errs[name] = f"{type(exc).__name__}: {exc}"[:300]
    res["rel_err"] = errs
    print("errors", errs, flush=True)
    times = {k: [] for k in fns}
    for _ in range(a.rounds):
        for k, f in fns.items():
            times[k].append(do_bench_cudagraph(f, rep=50))
    res["ms"] = {k: statistics.median(v) for k, v in times.items()}
    res["ms_all"] = times
    print(json.dumps(res["ms"], indent=1), flush=True)
    best = min(res["ms"], key=res["ms"].get)
    res["profile_base"] = profile_table(fns["base"], out / "profile_base.txt")
    res["profile_best"] = {"variant": best, **profile_table(fns[best], out / f"profile_{best}.txt")}
    per = {}
    for n_img in (1, 2, 4):
        for name in ("base", best):
            per[f"{name}_x{n_img}"] = do_bench_cudagraph(make(n_img, **dict(variants[name])), rep=50) / n_img
    res["ms_per_image"] = per
    print(json.dumps({k: res[k] for k in ("profile_base", "profile_best", "ms_per_image")}, indent=1))
    (out / "tower_lab.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
