"""Scratch (session 38): where a shared-prefix-2b call's small launches come from — the pass run
eagerly (the measurement-only EAGER policy: the same kernels a graph replays) under torch.profiler
with Python stacks; the fills, zeroings, copies, concatenations and memsets grouped by their
launching stack, per call.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s38b/small_kernels.py OUT.txt"""
import dataclasses, random, sys, tempfile
from pathlib import Path
import torch
import dohnuts
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.runtime.policy import EAGER
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.tokenizer import tokenizer_for

pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
spec = load_workload("workloads/gpu/shared-prefix-2b.yaml", kinds, targets, gpu=True)
cfg, ckpt = resolve_source(spec.model)
with tempfile.TemporaryDirectory() as tmp:
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp), random.Random(spec.seed)))
req = calls[0].request
s = dohnuts.load(spec.model, device="cuda", _policy=EAGER)
pred = Predictor(s)
for _ in range(3):
    pred.call(req)
torch.cuda.synchronize()
N = 2
acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts, with_stack=True, record_shapes=False) as prof:
    for _ in range(N):
        pred.call(req)
    torch.cuda.synchronize()
pred.close()
SMALL = ("aten::fill_", "aten::zero_", "aten::copy_", "aten::cat", "cudaMemsetAsync", "aten::index", "aten::gather",
         "aten::clone", "aten::contiguous", "aten::to", "aten::_to_copy", "aten::full", "aten::zeros", "aten::new_zeros",
         "aten::arange", "aten::mul", "aten::add", "aten::sub", "aten::exp", "aten::where", "aten::masked_fill_",
         "aten::stack", "aten::expand", "aten::scatter_", "aten::index_put_")
lines = []
for row in sorted(prof.key_averages(group_by_stack_n=7), key=lambda r: -r.count):
    if row.key not in SMALL:
        continue
    stack = [f for f in row.stack if "dohnuts" in f or "fla/" in f][:5]
    lines.append(f"{row.count / N:6.1f} a call  {row.key:22s} cuda {row.device_time_total / N:8.1f} us  " + " <- ".join(stack))
out = "\n".join(lines)
Path(sys.argv[1]).write_text(out + "\n")
print(out[:12000])
