"""Scratch (session 46, for the next GPU session): M59's lab found the tower's fc2 (784 rows, 4096 → 1024)
31 % faster as W · xᵀ (the output transposed) than as x · Wᵀ. Is it the tower's alone? The 2b language
model's GEMMs (packed in-projection, out-projection, gate/up, down, attention q/kv/o) at the row counts
of its passes — a 448² image's tower rows (784), a shared pass (2,368: a prefix of 448 and 32 suffixes
of 60), a training microbatch's (≈ 4,096) and text-2b's (16,384) — both ways, µs, medians of
interleaved rounds in CUDA graphs (triton's do_bench_cudagraph).

    python3 benchmarks/maintainers/s47/lm_orient.py OUT.json
"""
import json
import statistics
import sys

import torch
from triton.testing import do_bench_cudagraph

dev, dt = "cuda", torch.bfloat16
H, I = 2048, 6144
SHAPES = {  # name: (in, out)
    "in_proj (qkvz + ab)": (H, 4096 + 2048 + 2048 + 32), "out_proj": (H, H), "gate_up": (H, 2 * I), "down": (I, H),
    "attn q + gate": (H, 2 * 8 * 256), "attn kv": (H, 2 * 2 * 256), "attn o": (8 * 256, H),
}
ROWS = (784, 2368, 4096, 16384)


def ab(fns: dict, rounds: int = 5) -> dict:
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(do_bench_cudagraph(f, rep=30) * 1e3)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def main(path=None):
    torch.manual_seed(0)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "us": {}}
    for name, (k, n) in SHAPES.items():
        w = (torch.randn(n, k, device=dev) * 0.02).to(dt)
        for m in ROWS:
            x = torch.randn(m, k, device=dev).to(dt)
            r = ab({"x·Wᵀ": lambda x=x, w=w: torch.mm(x, w.t()), "W·xᵀ": lambda x=x, w=w: torch.mm(w, x.t())})
            r["ratio"] = round(r["W·xᵀ"] / r["x·Wᵀ"], 3)
            out["us"][f"{name} @ {m}"] = r
            print(f"{name:22s} rows {m:6d}: {r}", flush=True)
    if path:
        json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
