"""Scratch (session 46): the vision tower's GEMMs at 784 rows (a 448² image) — does the transposed
orientation (output (N, 784): out-features as cuBLAS' rows) pick a kernel with fewer wasted
tiles? Each GEMM alone both ways, then the MLP as landed (GELU + bias in fc1's epilogue, fc2 with
its bias) against fc1 transposed — its bias folded into the inner dimension ([W | b | 0] against
[x | 1 | 0]: cuBLASLt's epilogue bias runs along the other axis) — and fc2 reading that output
transposed. Medians of interleaved rounds, each op replayed in a CUDA graph (triton's
do_bench_cudagraph), µs.

    python3 benchmarks/maintainers/s46/gemm_orient.py OUT.json
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
M, H, I = 784, 1024, 4096
PAD = 8  # the inner dimension's extra columns: 1 (the bias) rounded up to 16 bytes


def rnd(*s, scale=0.02):
    return (torch.randn(*s, device=dev) * scale).to(dt)


x = rnd(M, H, scale=1.0)
shapes = {"qkv": (H, 3 * H), "proj": (H, H), "fc1": (H, I), "fc2": (I, H)}
W = {k: rnd(n, kk) for k, (kk, n) in shapes.items()}
B = {k: rnd(n) for k, (kk, n) in shapes.items()}
inputs = {"qkv": x, "proj": x, "fc1": x, "fc2": rnd(M, I, scale=1.0)}


def ab(fns: dict, rounds: int = 7) -> dict:
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(do_bench_cudagraph(f, rep=40) * 1e3)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


out: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": M}
for name, w in W.items():
    a = inputs[name]
    fns = {
        "linear (as landed)": lambda a=a, w=w, b=B[name]: F.linear(a, w, b),
        "mm": lambda a=a, w=w: torch.mm(a, w.t()),
        "mm transposed": lambda a=a, w=w: torch.mm(w, a.t()),
    }
    if name == "fc1":
        fns["gelu epilogue (as landed)"] = lambda a=a, w=w, b=B[name]: torch._addmm_activation(b, a, w.t(), use_gelu=True)
    out[name] = ab(fns)
    print(name, out[name], flush=True)

# The MLP: as landed against fc1 transposed (bias folded into K) and fc2 reading it transposed
xa = torch.zeros(M, H + PAD, device=dev, dtype=dt)
xa[:, :H] = x
xa[:, H] = 1
w1a = torch.zeros(I, H + PAD, device=dev, dtype=dt)
w1a[:, :H] = W["fc1"]
w1a[:, H] = B["fc1"]
zero_m = torch.zeros(M, device=dev, dtype=dt)


def mlp_landed():
    h = torch._addmm_activation(B["fc1"], x, W["fc1"].t(), use_gelu=True)
    return torch.addmm(B["fc2"], h, W["fc2"].t())


def mlp_transposed():
    # hT (I, M) = gelu(W1a · xaᵀ); the zero bias runs along hT's columns (M of them)
    ht = torch._addmm_activation(zero_m, w1a, xa.t(), use_gelu=True)
    return torch.addmm(B["fc2"], ht.t(), W["fc2"].t())


def mlp_transposed_out():
    ht = torch._addmm_activation(zero_m, w1a, xa.t(), use_gelu=True)
    return torch.mm(W["fc2"], ht)  # yT (H, M), fc2's bias left out: the GEMM alone


ref = mlp_landed().float()
got = mlp_transposed().float()
out["mlp_rel_err"] = float((got - ref).norm() / ref.norm())
out["mlp"] = ab({"as landed": mlp_landed, "fc1 transposed": mlp_transposed, "both transposed (no fc2 bias)": mlp_transposed_out})
print("mlp", out["mlp"], "rel err", out["mlp_rel_err"], flush=True)
text = json.dumps(out, indent=1)
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(text + "\n")
