"""Session 51 lab (scratch): the MLP's gate/up GEMM with SwiGLU in its epilogue, against today's
cuBLAS GEMM (x · [Wg; Wu]ᵀ → (M, 2I)) then the packed SwiGLU kernel.

The fused kernel computes, for an output tile of h = silu(x Wgᵀ) · (x Wuᵀ), both products in two
FP32 accumulators from one read of the x tile, and writes h (M, I) alone: the (M, 2I) product is
never written nor read back. Variants: pointer loads, and TMA descriptors (host-made), each over
a handful of configs. Timings by CUDA events over 20 launches after warm-up, medians of 7 rounds,
interleaved with the reference. Shapes: text-2b's MLP (M = 32 × 512, K = 2,048, I = 6,144), text-4b's
(K = 2,560, I = 9,216), shared-prefix-2b's suffixes (M = 32 × 64) and the prefix (M = 448).

    python3 benchmarks/maintainers/s51/swiglu_gemm_lab.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from dohnuts.ops._swiglu_kernel import swiglu_packed_fn


@triton.jit
def _tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def gemm_swiglu_ptr(x, w, h, M, K, I, sxm, swn, shm,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), M, I, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rm_c = tl.where(rm < M, rm, 0).to(tl.int64)
    rn_c = tl.where(rn < I, rn, 0).to(tl.int64)
    xp = x + rm_c[:, None] * sxm + rk[None, :]
    gp = w + rn_c[None, :] * swn + rk[:, None]
    up = gp + I * swn
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kmask = rk < K - k * BK
        a = tl.load(xp, mask=kmask[None, :], other=0.0)
        bg = tl.load(gp, mask=kmask[:, None], other=0.0)
        bu = tl.load(up, mask=kmask[:, None], other=0.0)
        acc_g = tl.dot(a, bg, acc_g)
        acc_u = tl.dot(a, bu, acc_u)
        xp += BK
        gp += BK
        up += BK
    out = acc_g * tl.sigmoid(acc_g) * acc_u
    hp = h + rm.to(tl.int64)[:, None] * shm + rn[None, :]
    tl.store(hp, out.to(h.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < I))


@triton.jit
def gemm_swiglu_tma(x_desc, w_desc, h_desc, M, K, I,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), M, I, BM, BN, GROUP_M)
    om = pid_m * BM
    on = pid_n * BN
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        ok = k * BK
        a = x_desc.load([om, ok])
        bg = w_desc.load([on, ok])
        bu = w_desc.load([I + on, ok])
        acc_g = tl.dot(a, bg.T, acc_g)
        acc_u = tl.dot(a, bu.T, acc_u)
    out = acc_g * tl.sigmoid(acc_g) * acc_u
    h_desc.store([om, on], out.to(h_desc.dtype))


@triton.jit
def gemm_swiglu_tma_persistent(x_desc, w_desc, h_desc, M, K, I, NUM_SMS: tl.constexpr,
                               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                               WS: tl.constexpr):
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(I, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True, warp_specialize=WS):
        pid_m, pid_n = _tile(tile, M, I, BM, BN, GROUP_M)
        om = pid_m * BM
        on = pid_n * BN
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, k_tiles):
            ok = k * BK
            a = x_desc.load([om, ok])
            bg = w_desc.load([on, ok])
            bu = w_desc.load([I + on, ok])
            acc_g = tl.dot(a, bg.T, acc_g)
            acc_u = tl.dot(a, bu.T, acc_u)
        out = acc_g * tl.sigmoid(acc_g) * acc_u
        h_desc.store([om, on], out.to(h_desc.dtype))


PTR = [(128, 128, 64, 8, 4, 8), (128, 64, 64, 8, 4, 4), (128, 128, 64, 8, 3, 8), (64, 128, 64, 8, 4, 4),
       (128, 64, 64, 8, 3, 4), (128, 128, 32, 8, 4, 8)]  # BM, BN, BK, GROUP_M, stages, warps
TMA = [(128, 128, 64, 8, 4, 8), (128, 128, 64, 8, 3, 8), (128, 64, 64, 8, 4, 4), (128, 64, 64, 8, 3, 4),
       (64, 128, 64, 8, 4, 4), (128, 128, 32, 8, 4, 8), (128, 256, 64, 8, 3, 8)]


def launcher(kind, cfg, x, w, h):
    from triton.tools.tensor_descriptor import TensorDescriptor

    BM, BN, BK, G, S, NW = cfg
    M, K = x.shape
    I = h.shape[1]
    if kind == "ptr":
        grid = (triton.cdiv(M, BM) * triton.cdiv(I, BN),)
        return lambda: gemm_swiglu_ptr[grid](x, w, h, M, K, I, x.stride(0), w.stride(0), h.stride(0),
                                             BM=BM, BN=BN, BK=BK, GROUP_M=G, num_stages=S, num_warps=NW)
    xd = TensorDescriptor.from_tensor(x, [BM, BK])
    wd = TensorDescriptor.from_tensor(w, [BN, BK])
    hd = TensorDescriptor.from_tensor(h, [BM, BN])
    if kind == "tma":
        grid = (triton.cdiv(M, BM) * triton.cdiv(I, BN),)
        return lambda: gemm_swiglu_tma[grid](xd, wd, hd, M, K, I, BM=BM, BN=BN, BK=BK, GROUP_M=G,
                                             num_stages=S, num_warps=NW)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ws = kind == "tma_ws"
    grid = (min(sms, triton.cdiv(M, BM) * triton.cdiv(I, BN)),)
    return lambda: gemm_swiglu_tma_persistent[grid](xd, wd, hd, M, K, I, NUM_SMS=sms, BM=BM, BN=BN, BK=BK,
                                                    GROUP_M=G, WS=ws, num_stages=S, num_warps=NW)


def time_ms(fn, n=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


def main():
    out_path = sys.argv[1]
    torch.manual_seed(0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    shapes = {"2b-text": (16384, 2048, 6144), "2b-suffixes": (2048, 2048, 6144), "2b-prefix": (448, 2048, 6144),
              "4b-text": (16384, 2560, 9216)}
    report = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
              "shapes": {}}
    for name, (M, K, I) in shapes.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2 * I, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        h = torch.empty(M, I, device="cuda", dtype=torch.bfloat16)
        ref32 = torch.nn.functional.silu(x.float() @ w[:I].float().T) * (x.float() @ w[I:].float().T)
        gemm = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
        gu = gemm()
        today = lambda: swiglu_packed_fn(torch.nn.functional.linear(x, w), 0)  # noqa: E731
        swi = lambda: swiglu_packed_fn(gu, 0)  # noqa: E731
        err_today = (today().float() - ref32).abs().max().item()
        row = {"M": M, "K": K, "I": I, "err_today": err_today, "variants": {}}
        cands = {}
        for kind, cfgs in (("ptr", PTR), ("tma", TMA), ("tma_persist", TMA[:4]), ("tma_ws", TMA[:4])):
            for cfg in cfgs:
                key = f"{kind} {cfg}"
                try:
                    fn = launcher(kind, cfg, x, w, h)
                    fn()
                    torch.cuda.synchronize()
                    err = (h.float() - ref32).abs().max().item()
                    t = min(time_ms(fn, 5) for _ in range(2))
                    cands[key] = (fn, t, err)
                except Exception as exc:  # noqa: BLE001 - a lab: record and go on
                    row["variants"][key] = {"error": str(exc).splitlines()[0][:200] if str(exc) else repr(exc)}
        best = sorted(cands.items(), key=lambda kv: kv[1][1])[:4]
        rounds = {k: [] for k in ["today", "gemm", "swiglu"] + [k for k, _ in best]}
        fns = {"today": today, "gemm": gemm, "swiglu": swi} | {k: v[0] for k, v in best}
        for _ in range(7):
            for k, fn in fns.items():
                fn()
                rounds[k].append(time_ms(fn))
        for k, (fn, t, err) in cands.items():
            row["variants"][k] = {"screen_ms": round(t, 4), "err": err}
        row["medians_ms"] = {k: round(statistics.median(v), 4) for k, v in rounds.items()}
        row["rounds_ms"] = {k: [round(t, 4) for t in v] for k, v in rounds.items()}
        report["shapes"][name] = row
        print(name, json.dumps(row["medians_ms"]), f"err today {err_today:.3g}",
              "best err", {k: f"{cands[k][2]:.3g}" for k, _ in best}, flush=True)
        del x, w, h, gu, ref32
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
