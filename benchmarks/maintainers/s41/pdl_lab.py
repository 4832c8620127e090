"""Scratch (session 40, run in 41): what programmatic dependent launch (PDL) saves at a kernel boundary inside a
CUDA graph — a chain of L small Triton kernels (y = 1.0001·x over n BF16 elements, ping-pong
buffers) captured as one graph, launched plainly or with `launch_pdl=True` (each kernel waits on
`gdc_wait()` before its loads and lets the next launch after them), at three sizes; device time of
the graph's replay per kernel (median of 20 replays, interleaved rounds), outputs equal.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s41/pdl_lab.py OUT.json"""
import json, statistics, sys

import torch
import triton
import triton.language as tl


@triton.jit
def _scale(X, Y, n, PDL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(Y + offs, (x * 1.0001).to(Y.dtype.element_ty), mask=offs < n)


L, BLOCK = 200, 1024
out = {"kernels_a_graph": L}
for n in (64 * 1024, 2496 * 512, 2496 * 2048):
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    grid = (triton.cdiv(n, BLOCK),)

    def chain(pdl):
        for i in range(L):
            src, dst = (a, b) if i % 2 == 0 else (b, a)
            _scale[grid](src, dst, n, PDL=pdl, BLOCK=BLOCK, launch_pdl=pdl)

    graphs, results = {}, {}
    a0 = a.clone()
    for pdl in (False, True):
        a.copy_(a0)
        chain(pdl)  # compile, warm
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                chain(pdl)
        torch.cuda.current_stream().wait_stream(s)
        graphs[pdl] = g
        a.copy_(a0)
        g.replay()
        torch.cuda.synchronize()
        results[pdl] = a.float().clone()
    times = {False: [], True: []}
    for rnd in range(6):
        for pdl in ((False, True) if rnd % 2 == 0 else (True, False)):
            for _ in range(20):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                graphs[pdl].replay()
                e1.record()
                e1.synchronize()
                times[pdl].append(e0.elapsed_time(e1) * 1e3 / L)  # µs a kernel
    res = {"plain_us": round(statistics.median(times[False]), 3), "pdl_us": round(statistics.median(times[True]), 3),
           "programs": grid[0], "max_gap": (results[False] - results[True]).abs().max().item()}
    out[f"n={n}"] = res
    print(n, res, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
