"""Scratch (session 39, run in session 40): LoRA's wide products at train-step-2b's shapes (a microbatch of 4,096 rows,
rank 16), as `_LinearGroup` runs them against one GEMM over an input widened by the rank-r
product (K-concatenation), device times by the stage timer, interleaved rounds.

forward  now:  y = u·bdᵀ (writes N × Σout), then y += x·Wᵀ (cuBLAS, β = 1)
         wide: y = [x | u]·[W | bd]ᵀ (one GEMM, K = in + Σr)
         cat:  wide, with x copied into the wide buffer first (what it costs unless x's producer writes there)
         rev:  y = x·Wᵀ (β = 0), then y += u·bdᵀ
         base: y = x·Wᵀ alone (β = 0), the floor
backward now:  dx = du·A (writes N × in), then dx += dy·W (β = 1)
         wide: dx = [dy | du]·[W ; A] (one GEMM, K = Σout + Σr)
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s40/lora_concat_lab.py OUT.json"""
import json
import statistics
import sys

import torch

from dohnuts.runtime.timing import device_times_ms

N = 4096
GROUPS = {  # name: (in, Σout, Σr, groups an update runs: layers × 4 microbatches)
    "in_proj (qkv, b, a)": (2048, 6176, 16, 18 * 4),
    "in_proj_z": (2048, 2048, 16, 18 * 4),
    "out_proj": (2048, 2048, 16, 18 * 4),
    "gate_up": (2048, 12288, 32, 24 * 4),
    "down": (6144, 2048, 16, 24 * 4),
    "attention qkv": (2048, 5120, 48, 6 * 4),
    "o_proj": (4096, 2048, 16, 6 * 4),
}
dev, bf = torch.device("cuda"), torch.bfloat16
out = {}
for name, (fin, fout, r, count) in GROUPS.items():
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(N, fin, device=dev, dtype=bf, generator=g)
    u = torch.randn(N, r, device=dev, dtype=bf, generator=g)
    w = torch.randn(fout, fin, device=dev, dtype=bf, generator=g) * 0.02
    bd = torch.randn(fout, r, device=dev, dtype=bf, generator=g) * 0.02
    a = torch.randn(r, fin, device=dev, dtype=bf, generator=g) * 0.02
    dy = torch.randn(N, fout, device=dev, dtype=bf, generator=g)
    du = torch.randn(N, r, device=dev, dtype=bf, generator=g)
    xw, ww = torch.cat([x, u], 1), torch.cat([w, bd], 1)  # (N, in + Σr), (Σout, in + Σr)
    dyw, wa = torch.cat([dy, du], 1), torch.cat([w, a], 0)  # (N, Σout + Σr), (Σout + Σr, in)
    y = torch.empty(N, fout, device=dev, dtype=bf)
    dx = torch.empty(N, fin, device=dev, dtype=bf)

    def fwd_now():
        torch.mm(u, bd.t(), out=y)
        y.addmm_(x, w.t())

    def fwd_wide():
        torch.mm(xw, ww.t(), out=y)

    def fwd_cat():  # the wide GEMM with the input copied into the wide buffer first (no producer writes it)
        xw[:, :fin].copy_(x)
        torch.mm(xw, ww.t(), out=y)

    def fwd_rev():  # the base GEMM first (β = 0), the adapters' update accumulated onto it
        torch.mm(x, w.t(), out=y)
        y.addmm_(u, bd.t())

    def fwd_base():
        torch.mm(x, w.t(), out=y)

    def bwd_now():
        torch.mm(du, a, out=dx)
        dx.addmm_(dy, w)

    def bwd_wide():
        torch.mm(dyw, wa, out=dx)

    fwd_now()
    ref = y.float().clone()
    fwd_wide()
    gap_f = (y.float() - ref).abs().max().item()
    bwd_now()
    ref = dx.float().clone()
    bwd_wide()
    gap_b = (dx.float() - ref).abs().max().item()
    fns = {"fwd_now": fwd_now, "fwd_wide": fwd_wide, "fwd_cat": fwd_cat, "fwd_rev": fwd_rev, "fwd_base": fwd_base, "bwd_now": bwd_now, "bwd_wide": bwd_wide}
    t = {k: [] for k in fns}
    for rnd in range(6):
        for k in (list(fns) if rnd % 2 == 0 else list(reversed(list(fns)))):
            t[k] += device_times_ms(fns[k], warmup=3, repeat=10)
    res = {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()}  # µs
    res |= {"count_an_update": count, "max_gap_fwd": gap_f, "max_gap_bwd": gap_b}
    out[name] = res
    print(name, res, flush=True)
tot = {k: round(sum(v[k] * v["count_an_update"] for v in out.values()) / 1e3, 2)
       for k in ("fwd_now", "fwd_wide", "fwd_cat", "fwd_rev", "fwd_base", "bwd_now", "bwd_wide")}
out["ms_an_update (forward counted once)"] = tot
print(tot)
json.dump(out, open(sys.argv[1], "w"), indent=1)
