"""Scratch (session 41): train-step-2b's optimizer updates with the adapted groups' one GEMM over a
widened input (dohnuts.ops.spare, as landed) against two GEMMs (every claim refused: the code
before it, but for the producers' wider buffers). Each variant its own bench target (2b, rank 16,
CUDA graphs captured under its code: the claim runs inside the captured microbatch); interleaved
rounds of updates on the same calls: wall time and the forward/backward/optimizer stages' device
time (StageTimer), the losses side by side, peak memory.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s41/lora_wide_ab.py OUT.json"""
import json, random, statistics, sys, tempfile, time
from pathlib import Path

import torch

from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.ops import spare
from dohnuts.runtime.timing import StageTimer
from dohnuts.runtime.tokenizer import tokenizer_for

CLAIM = spare.claim


def use(variant):
    spare.claim = CLAIM if variant == "wide" else (lambda x, n: False)


pm = plugin_manager()  # makes dohnuts_bench_plugins (bench_plugins/) importable from a checkout
from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget  # noqa: E402
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
spec = load_workload("workloads/gpu/train-step-2b.yaml", kinds, targets, gpu=True)
cfg, ckpt = resolve_source(spec.model)
tmp = Path(tempfile.mkdtemp())
calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, tmp, random.Random(spec.seed)))
dev = torch.device("cuda", 0)
res, tg, losses = {}, {}, {"two": [], "wide": []}
for variant in ("two", "wide"):
    use(variant)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    tg[variant] = DohnutsTarget(spec, dev, torch.bfloat16, DohnutsTarget.Options())
    for c in calls[:2]:
        r = tg[variant].run_call(c, StageTimer(dev))  # graphs captured under this variant's code
        losses[variant].append(r.extra["loss"])
    torch.cuda.synchronize()
    res[f"{variant}_peak_gib_over_start"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 2)
print("losses after warm-up", losses, flush=True)
times = {v: {"wall": [], "forward": [], "backward": [], "optimizer": []} for v in ("two", "wide")}
n = 3
for rnd in range(8):
    for variant in (("two", "wide") if rnd % 2 == 0 else ("wide", "two")):
        use(variant)
        for i in range(n):
            timer = StageTimer(dev)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = tg[variant].run_call(calls[(rnd * n + i) % len(calls)], timer)
            torch.cuda.synchronize()
            times[variant]["wall"].append((time.perf_counter() - t0) * 1e3)
            st = timer.result()
            for k in ("forward", "backward", "optimizer"):
                times[variant][k].append(st[k].device_ms)
            if rnd < 2:
                losses[variant].append(r.extra["loss"])
    print(rnd, {v: round(statistics.median(t["wall"][-n:]), 2) for v, t in times.items()}, flush=True)
use("wide")
for variant, v in times.items():
    res[variant] = {k: {"median": round(statistics.median(x), 3),
                        "rounds": [round(statistics.median(x[i:i + n]), 3) for i in range(0, len(x), n)]}
                    for k, x in v.items()}
res["losses"] = losses
res["gpu"] = torch.cuda.get_device_name()
print(json.dumps(res), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
