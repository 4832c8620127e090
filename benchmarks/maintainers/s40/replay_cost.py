"""Scratch (session 40): what a single call's shared stage pays before its graph's first kernel —
the host time of `_static` (the inputs' copies into the graph's buffers) and of the graph's
`replay()` (cudaGraphLaunch), for the graphs of shared-prefix-2b, image-cache-warm-2b and text-2b,
and the device time from an event recorded before the copies to one recorded after the replay
call returns (the graph's work queued behind it), minus the stage's kernels.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s40/replay_cost.py OUT.json"""
import json, random, statistics, sys, tempfile, time
from pathlib import Path

import torch

import dohnuts
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.runtime import graphs as graphs_mod
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.tokenizer import tokenizer_for

HOST = {"static": [], "replay": []}
_static, _replay_cls = graphs_mod.PassGraphs._static, graphs_mod._Captured.replay


def static(self, x):
    t0 = time.perf_counter()
    out = _static(self, x)
    HOST["static"].append((time.perf_counter() - t0) * 1e3)
    return out


def replay(self):
    t0 = time.perf_counter()
    _replay_cls(self)
    HOST["replay"].append((time.perf_counter() - t0) * 1e3)


graphs_mod.PassGraphs._static, graphs_mod._Captured.replay = static, replay
pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
out, tmp = {}, tempfile.mkdtemp()
for wl in ("workloads/gpu/shared-prefix-2b.yaml", "workloads/gpu/image-cache-warm-2b.yaml", "workloads/gpu/text-2b.yaml"):
    spec = load_workload(wl, kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    (Path(tmp) / spec.name).mkdir(exist_ok=True)
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp) / spec.name,
                                                   random.Random(spec.seed)))
    reqs = [c.request for c in calls]
    pred = Predictor(dohnuts.load(spec.model, device="cuda"))
    for _ in range(2):
        for r in reqs:
            pred.call(r)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        pred.call(reqs[0])
        torch.cuda.synchronize()
    kernels = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())
    for k in HOST:
        HOST[k].clear()
    for i in range(40):
        torch.cuda.synchronize()
        pred.call(reqs[i % len(reqs)])
    torch.cuda.synchronize()
    res = {k: round(statistics.median(v), 4) for k, v in HOST.items()} | {"kernels_a_call": kernels,
                                                                          "calls": len(HOST["replay"])}
    out[spec.name] = res
    print(spec.name, res, flush=True)
    del pred
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
