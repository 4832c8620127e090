"""Scratch (session 38): the shared pass's cuBLAS memsets — a shared-prefix-2b call (CUDA graphs, as
measured) with torch's default BLAS back end against cuBLASLt preferred (torch.backends.cuda.
preferred_blas_library), each its own 2b session captured under its setting, interleaved rounds;
the memsets a replayed call holds (profiler) and the shared stage's device time.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s38b/blas_lab.py OUT.json"""
import json, random, statistics, sys, tempfile
from pathlib import Path
import torch
import dohnuts
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.timing import StageTimer
from dohnuts.runtime.tokenizer import tokenizer_for

pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
spec = load_workload("workloads/gpu/shared-prefix-2b.yaml", kinds, targets, gpu=True)
cfg, ckpt = resolve_source(spec.model)
with tempfile.TemporaryDirectory() as tmp:
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp), random.Random(spec.seed)))
reqs = [c.request for c in calls]
default = torch.backends.cuda.preferred_blas_library()
variants = {"default": default, "cublaslt": torch._C._BlasBackend.Cublaslt}
preds, out = {}, {"default_backend": str(default)}
for name, lib in variants.items():
    torch.backends.cuda.preferred_blas_library(lib)
    preds[name] = Predictor(dohnuts.load(spec.model, device="cuda"))
    for r in reqs:
        preds[name].call(r)  # captures the pass graphs under this setting
torch.cuda.synchronize()
scores = {}
for name, lib in variants.items():
    torch.backends.cuda.preferred_blas_library(lib)
    res, _ = preds[name].call(reqs[0])
    scores[name] = [s for q in res.questions for s in q.scores]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        preds[name].call(reqs[0])
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    out[f"{name}_memsets_a_call"] = sum("Memset" in e.name for e in evs)
    out[f"{name}_kernels_a_call"] = len(evs)
out["max_score_gap"] = max(abs(a - b) for a, b in zip(scores["default"], scores["cublaslt"]))
times = {n: {"shared": [], "wall": []} for n in variants}
for rnd in range(8):
    for name in (list(variants) if rnd % 2 == 0 else list(reversed(list(variants)))):
        torch.backends.cuda.preferred_blas_library(variants[name])
        for i in range(20):
            timer = StageTimer(torch.device("cuda", 0))
            preds[name].call(reqs[i % len(reqs)], timer)
            r = timer.result()
            times[name]["shared"].append(r["shared"].device_ms)
torch.backends.cuda.preferred_blas_library(default)
out["shared_ms"] = {n: {"median": round(statistics.median(v["shared"]), 4),
                        "rounds": [round(statistics.median(v["shared"][i:i + 20]), 4) for i in range(0, 160, 20)]}
                    for n, v in times.items()}
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
