"""Scratch (session 42): the vision tower's GEMMs at 784 rows split along K — one strided batched
GEMM over s slices of the reduction (s × the output tiles: fc2's and proj's 56 tiles are under half
an H100's 132 SMs), its partials summed — against F.linear (what the tower runs), cuBLASLt
preferred, and two streams forked inside the graph. Partials in BF16 or FP32 (`bmm(out_dtype=)`);
the error of each against an FP32 reference beside it. CUDA graphs, interleaved medians
(do_bench_cudagraph), µs a GEMM.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s42/splitk_lab.py OUT.json"""
import json, statistics, sys
import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

M = 784
shapes = {"fc2": (4096, 1024), "proj": (1024, 1024), "qkv": (1024, 3072), "fc1": (1024, 4096)}
res = {}
side = torch.cuda.Stream()


def split(x, w, s):
    k = x.shape[1]
    return x.view(M, s, k // s).transpose(0, 1), w.view(w.shape[0], s, k // s).permute(1, 2, 0)


for name, (k, n) in shapes.items():
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    ref = torch.addmm(b.float(), x.float(), w.float().t())
    fns = {"linear": lambda: F.linear(x, w, b)}
    for s in (2, 4, 8):
        xs, ws = split(x, w, s)
        fns[f"bmm{s}_bf16"] = (lambda xs=xs, ws=ws: torch.bmm(xs, ws).sum(0).add_(b))
        fns[f"bmm{s}_f32"] = (lambda xs=xs, ws=ws: torch.bmm(xs, ws, out_dtype=torch.float32).sum(0).add_(b).to(
            torch.bfloat16))
        fns[f"bmm{s}_f32sum_bf16"] = (lambda xs=xs, ws=ws: torch.bmm(xs, ws, out_dtype=torch.float32).sum(
            0, dtype=torch.bfloat16).add_(b))
    x1, x2 = x[:, :k // 2], x[:, k // 2:]
    w1, w2 = w[:, :k // 2], w[:, k // 2:]

    def streams2():
        part = torch.empty(M, n, device="cuda", dtype=torch.bfloat16)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mm(x2, w2.t(), out=part)
        y = F.linear(x1, w1, b)
        torch.cuda.current_stream().wait_stream(side)
        return y.add_(part)

    fns["streams2_bf16"] = streams2
    errs = {}
    for f, fn in fns.items():
        try:
            y = fn()
            torch.cuda.synchronize()
            errs[f] = round(((y.float() - ref).abs().max() / ref.abs().max()).item(), 6)
        except Exception as exc:
            errs[f] = f"{type(exc).__name__}: {str(exc)[:120]}"
    ok = {f: fn for f, fn in fns.items() if not isinstance(errs[f], str)}
    times = {f: [] for f in ok}
    for _ in range(5):
        for f, fn in ok.items():
            times[f].append(do_bench_cudagraph(fn, rep=30) * 1e3)
    torch.backends.cuda.preferred_blas_library("cublaslt")
    lt = [do_bench_cudagraph(fns["linear"], rep=30) * 1e3 for _ in range(5)]
    torch.backends.cuda.preferred_blas_library("cublas")
    res[name] = {"us": {f: round(statistics.median(v), 2) for f, v in times.items()},
                 "linear_cublaslt_us": round(statistics.median(lt), 2), "rel_err": errs}
    print(name, json.dumps(res[name]), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
