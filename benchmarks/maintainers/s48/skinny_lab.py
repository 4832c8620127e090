"""Scratch (session 48): train-step's rank-r GEMMs (M60's map: ≈ 37 ms an update, 2.0–2.7 TB/s)
against a Triton split-K kernel — the headroom to the device's copy rate, measured before any
integration. Shapes (2b, one microbatch of 4096 rows): du = dy · B for gate/up (4096 × 12288 by 32),
u = h · Aᵀ for down (4096 × 6144 by 16), dB = dyᵀ · u for gate/up (12288 × 4096 by 32, dy read
transposed), dA = duᵀ · h for down as (hᵀ · du)ᵀ (6144 × 4096 by 16). cuBLAS (torch.mm, both
layouts of the skinny operand) against the kernel's configs: CUDA-event medians, interleaved rounds;
each config's result against torch's in FP32. A device copy of the same bytes as the yardstick.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s48/skinny_lab.py OUT.json
"""
import itertools
import json
import statistics
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def skinny_kernel(a, b, part, M, K, sam, sak, sbk, sbn, N: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                  KLEN: tl.constexpr, STAGES: tl.constexpr):
    pid_m, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < M
    rows = rows.to(tl.int64)
    n = tl.arange(0, N)
    acc = tl.zeros((BM, N), dtype=tl.float32)
    k_start = pid_k * KLEN
    for k0 in tl.range(k_start, k_start + KLEN, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        kmask = ks < K
        at = tl.load(a + rows[:, None] * sam + ks[None, :] * sak, mask=rmask[:, None] & kmask[None, :], other=0.0)
        bt = tl.load(b + ks[:, None] * sbk + n[None, :] * sbn, mask=kmask[:, None], other=0.0)
        acc = tl.dot(at, bt, acc)
    tl.store(part + (pid_k * M + rows[:, None]) * N + n[None, :], acc, mask=rmask[:, None])


def skinny(a, b, bm, bk, split, warps, stages):
    M, K = a.shape
    N = b.shape[1]
    klen = triton.cdiv(triton.cdiv(K, split), bk) * bk
    nsplit = triton.cdiv(K, klen)
    part = torch.empty(nsplit, M, N, device=a.device, dtype=torch.float32)
    skinny_kernel[(triton.cdiv(M, bm), nsplit)](a, b, part, M, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                                N=N, BM=bm, BK=bk, KLEN=klen, STAGES=stages, num_warps=warps)
    return part.sum(0) if nsplit > 1 else part[0]


def timed(fns, rounds=5, reps=50):
    times = {n: [] for n in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            for _ in range(3):
                f()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(reps):
                f()
            e.record()
            torch.cuda.synchronize()
            times[name].append(s.elapsed_time(e) / reps * 1e3)
    return {n: round(statistics.median(v), 2) for n, v in times.items()}


def main(path):
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s):
        return torch.randn(*s, device="cuda", generator=g).bfloat16()

    dy, h = r(4096, 12288), r(4096, 6144)
    cases = {
        "du = dy·B (4096x12288 · 12288x32)": (dy, r(12288, 32)),
        "u = h·A^T (4096x6144 · 6144x16)": (h, r(16, 6144).t()),
        "dB = dy^T·u (12288x4096 · 4096x32)": (dy.t(), r(4096, 32)),
        "dA^T = h^T·du (6144x4096 · 4096x16)": (h.t(), r(4096, 16)),
    }
    out = {"gpu": torch.cuda.get_device_name(0), "cases": {}}
    for name, (a, b) in cases.items():
        want = a.float() @ b.float()
        bytes_ = a.numel() * 2
        src = torch.empty(bytes_ // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        fns = {"copy of A's bytes (read+write)": lambda: dst.copy_(src),
               "cublas": lambda a=a, b=b: torch.mm(a, b),
               "cublas, skinny other layout": lambda a=a, bt=b.t().contiguous(): torch.mm(a, bt.t())}
        errs = {}
        for bm, bk, split, warps, stages in itertools.product((64, 128), (64, 128), (1, 4, 8, 16), (4,), (3,)):
            key = f"triton BM{bm} BK{bk} split{split} w{warps} s{stages}"
            try:
                got = skinny(a, b, bm, bk, split, warps, stages)
                torch.cuda.synchronize()
                errs[key] = float((got - want).norm() / want.norm())
                if errs[key] > 1e-2:
                    continue
                fns[key] = lambda a=a, b=b, c=(bm, bk, split, warps, stages): skinny(a, b, *c)
            except Exception as e:  # noqa: BLE001
                errs[key] = f"{type(e).__name__}: {e}"[:160]
        us = timed(fns)
        best = min((k for k in us if k.startswith("triton")), key=us.get)
        out["cases"][name] = {"us": us, "best": best, "best_us": us[best], "cublas_us": us["cublas"],
                              "copy_us": us["copy of A's bytes (read+write)"],
                              "read_TBps_cublas": round(bytes_ / us["cublas"] / 1e6, 2),
                              "read_TBps_best": round(bytes_ / us[best] / 1e6, 2),
                              "errors": {k: v for k, v in errs.items() if not isinstance(v, float) or v > 1e-2}}
        print(name, "cublas", us["cublas"], "other layout", us["cublas, skinny other layout"], "best", best, us[best],
              "copy", us["copy of A's bytes (read+write)"], flush=True)
        json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
