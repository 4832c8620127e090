"""Scratch (session 43): the vision tower's GEMMs at 784 rows (one 448² image) as a Triton matmul with
small tiles — fc2's and proj's 56 cuBLAS tiles (128 × 128) fill under half an H100's 132 SMs; 64-row
tiles make 104–208 programs — against F.linear (what the tower runs: cuBLAS, bias in its epilogue).
Bias added in the kernel's epilogue, FP32 accumulation, BF16 out. Every config's error against an FP32
reference; CUDA graphs, interleaved medians (do_bench_cudagraph), µs a GEMM.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s43/tile_lab.py OUT.json"""
import json, statistics, sys
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph


@triton.jit
def mm_bias(x, w, b, y, M, N, K, sxm, swn, sym, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            SPLIT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    xp = x + rm[:, None].to(tl.int64) * sxm + rk[None, :]
    wp = w + rn[None, :].to(tl.int64) * swn + rk[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    mm = rm[:, None] < M
    nm = rn[None, :] < N
    for k in range(0, K, BK):
        a = tl.load(xp, mask=mm, other=0.0)
        bt = tl.load(wp, mask=nm, other=0.0)
        acc = tl.dot(a, bt, acc)
        xp += BK
        wp += BK
    acc += tl.load(b + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y + rm[:, None].to(tl.int64) * sym + rn[None, :], acc.to(y.dtype.element_ty), mask=mm & nm)


def run(x, w, b, cfg):
    BM, BN, BK, warps, stages = cfg
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    mm_bias[(triton.cdiv(M, BM), triton.cdiv(N, BN))](x, w, b, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
                                                       BM=BM, BN=BN, BK=BK, SPLIT=1, num_warps=warps,
                                                       num_stages=stages)
    return y


CONFIGS = [(bm, bn, bk, wp, st) for bm, bn in ((64, 64), (64, 128), (128, 64), (128, 128), (64, 256))
           for bk in (64, 128) for wp in (4, 8) for st in (3, 4, 5)]
M = 784
shapes = {"fc2": (4096, 1024), "proj": (1024, 1024), "qkv": (1024, 3072), "fc1": (1024, 4096)}
res = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__}
for name, (k, n) in shapes.items():
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    ref = torch.addmm(b.float(), x.float(), w.float().t())
    fns = {"linear": lambda: F.linear(x, w, b)}
    errs = {}
    for cfg in CONFIGS:
        key = "x".join(map(str, cfg))
        try:
            yv = run(x, w, b, cfg)
            torch.cuda.synchronize()
            errs[key] = round(((yv.float() - ref).abs().max() / ref.abs().max()).item(), 6)
            fns[key] = (lambda cfg=cfg: run(x, w, b, cfg))
        except Exception as exc:  # out of shared memory, etc.
            errs[key] = f"{type(exc).__name__}: {str(exc)[:100]}"
    errs["linear"] = round(((F.linear(x, w, b).float() - ref).abs().max() / ref.abs().max()).item(), 6)
    # one quick pass to rank, then the best 6 and linear interleaved over 7 rounds
    quick = {f: do_bench_cudagraph(fn, rep=10) * 1e3 for f, fn in fns.items()}
    best = sorted((f for f in quick if f != "linear"), key=quick.get)[:6]
    times = {f: [] for f in ["linear"] + best}
    for _ in range(7):
        for f in times:
            times[f].append(do_bench_cudagraph(fns[f], rep=30) * 1e3)
    res[name] = {"us": {f: round(statistics.median(v), 2) for f, v in times.items()},
                 "quick_us": {f: round(v, 2) for f, v in sorted(quick.items(), key=lambda kv: kv[1])},
                 "rel_err": errs}
    print(name, json.dumps(res[name]["us"]), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
