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
cfg_x = torch._C._profiler._ExperimentalConfig(verbose=True)  # Python frames in the stacks
with torch.profiler.profile(activities=acts, with_stack=True, record_shapes=True, experimental_config=cfg_x) as prof:
    for _ in range(N):
        pred.call(req)
    torch.cuda.synchronize()
pred.close()
SMALL = ("aten::fill_", "aten::zero_", "aten::copy_", "aten::cat", "cudaMemsetAsync", "aten::index", "aten::gather",
         "aten::clone", "aten::contiguous", "aten::to", "aten::_to_copy", "aten::full", "aten::zeros", "aten::new_zeros",
         "aten::arange", "aten::mul", "aten::add", "aten::sub", "aten::exp", "aten::where", "aten::masked_fill_",
         "aten::stack", "aten::expand", "aten::scatter_", "aten::index_put_")
import collections
groups = collections.Counter()
for evt in prof.events():
    if evt.name not in SMALL:
        continue
    frames = [f.split("site-packages/")[-1].split("/work/")[-1] for f in (evt.stack or [])
              if ("dohnuts" in f or "fla/" in f) and "profiler" not in f][:4]
    groups[(evt.name, " <- ".join(frames) or "(no dohnuts frame)", str(evt.input_shapes)[:60])] += 1
lines = [f"{n / N:6.1f} a call  {name:18s} {shapes:60s} {stack}" for (name, stack, shapes), n in groups.most_common(60)]
out = "\n".join(lines)
Path(sys.argv[1]).write_text(out + "\n")
print(out[:12000])
