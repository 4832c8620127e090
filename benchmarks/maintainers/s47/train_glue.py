"""Scratch (session 47): where train-step-2b's device time outside the GEMMs comes from — updates
run eagerly (the measurement-only EAGER policy: the kernels a graph replays) under torch.profiler
with Python stacks; every op's self device time grouped by op and launching stack (the first
dohnuts/fla frames), per update. Answers M51's profile (`profile_ops.tar.gz` beside
results/h100/2026-12-06-s38-fresh-suite): which code launches the concatenations (3.4 ms an
update), the element-wise kernels (4.6 ms), the reductions (1.6 ms), the rank-r GEMMs (22.7 ms).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s47/train_glue.py OUT.txt [WORKLOAD.yaml]
"""
import collections
import random
import sys
import tempfile
from pathlib import Path

import torch

import dohnuts.api as api
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.model.lora import LoRAConfig
from dohnuts.runtime.policy import EAGER
from dohnuts.runtime.tokenizer import tokenizer_for
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import OptimConfig, Updater, make_optimizer

gpu = torch.cuda.is_available()
path = sys.argv[2] if len(sys.argv) > 2 else "workloads/gpu/train-step-2b.yaml"
pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
spec = load_workload(path, kinds, targets, gpu=gpu)
cfg, ckpt = resolve_source(spec.model)
with tempfile.TemporaryDirectory() as tmp:
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp), random.Random(spec.seed)))
model = api.load(spec.model, device="cuda" if gpu else "cpu", seed=spec.seed, lora=LoRAConfig(rank=16), _policy=EAGER)
optim = OptimConfig()
upd = Updater(model, make_optimizer(model, optim), RLCDConfig(), optim)
for i in range(3):
    upd.update(calls[i % len(calls)].requests)
if gpu:
    torch.cuda.synchronize()
N = 2
acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
cfg_x = torch._C._profiler._ExperimentalConfig(verbose=True)  # Python frames in the stacks
with torch.profiler.profile(activities=acts, with_stack=True, record_shapes=True, experimental_config=cfg_x) as prof:
    for i in range(N):
        upd.update(calls[i % len(calls)].requests)
    if gpu:
        torch.cuda.synchronize()
dev_us, count = collections.Counter(), collections.Counter()
total = 0.0
for evt in prof.events():
    if evt.device_type != torch.autograd.DeviceType.CPU:
        continue
    t = evt.self_device_time_total if gpu else evt.self_cpu_time_total
    if not t:
        continue
    total += t
    frames = [f.split("site-packages/")[-1].split("/work/")[-1] for f in (evt.stack or [])
              if ("dohnuts" in f or "fla/" in f) and "profiler" not in f][:4]
    key = (evt.name, " <- ".join(frames) or "(no dohnuts frame)", str(evt.input_shapes)[:70])
    dev_us[key] += t
    count[key] += 1
by_name = collections.Counter()
for (name, _, _), t in dev_us.items():
    by_name[name] += t
lines = [f"self {'device' if gpu else 'CPU'} time of CPU ops, ms an update (total {total / N / 1e3:.1f})"]
lines += [f"{t / N / 1e3:8.3f}  {name}" for name, t in by_name.most_common(40)]
lines += ["", "by op and stack, ms an update, launches an update"]
lines += [f"{t / N / 1e3:8.3f} {count[k] / N:6.1f}  {k[0]:28s} {k[2]:70s} {k[1]}" for k, t in dev_us.most_common(90)]
out = "\n".join(lines)
Path(sys.argv[1]).write_text(out + "\n")
print(out[:9000])
