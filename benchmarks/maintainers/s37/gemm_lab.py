"""Scratch (session 37): the vision tower's GEMMs at 784 rows — with the bias in cuBLASLt's epilogue
(F.linear, what the tower runs), without a bias (torch.mm), and at other row counts — CUDA graphs,
interleaved medians (do_bench_cudagraph). Which tiles cuBLAS picks is in the kernel names.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s37/gemm_lab.py OUT.json"""
import json, statistics, sys
import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

shapes = {"qkv": (1024, 3072), "proj": (1024, 1024), "fc1": (1024, 4096), "fc2": (4096, 1024)}
res = {}
for name, (k, n) in shapes.items():
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    fns = {}
    for m in (784, 768, 832, 1568):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fns[f"linear_bias_m{m}"] = (lambda x=x: F.linear(x, w, b))
        fns[f"mm_m{m}"] = (lambda x=x: torch.mm(x, w.t()))
    xt = torch.randn(784, k, device="cuda", dtype=torch.bfloat16)
    fns["mm_transposed_m784"] = lambda: torch.mm(w, xt.t())  # the output transposed (n, 784)
    times = {f: [] for f in fns}
    for _ in range(5):
        for f, fn in fns.items():
            times[f].append(do_bench_cudagraph(fn, rep=30) * 1e3)
    res[name] = {f: round(statistics.median(v), 2) for f, v in times.items()}
    res[name]["tflops_linear_bias_m784"] = round(2 * 784 * k * n / res[name]["linear_bias_m784"] / 1e6, 1)
    print(name, json.dumps(res[name]), flush=True)
# the attention at the tower's shape: SDPA's pick (cuDNN on this torch) and its kernels
q, kk, v = (torch.randn(1, 16, 784, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
res["sdpa_us"] = round(statistics.median(do_bench_cudagraph(lambda: F.scaled_dot_product_attention(q, kk, v), rep=30)
                                         for _ in range(5)) * 1e3, 2)
print("sdpa", res["sdpa_us"])
json.dump(res, open(sys.argv[1], "w"), indent=1)
