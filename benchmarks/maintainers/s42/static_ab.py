"""Scratch (session 42): a graph's integer inputs copied into their static buffers in one copy
(the packed batch's span, `dohnuts.runtime.graphs.static_inputs`) against one copy each (`apart`:
`_adjacent` answering None, as before). The same session and graphs for both (the static views
are the same either way): interleaved rounds of single calls (shared-prefix-2b,
image-cache-warm-2b, text-2b's first request): the stage's device time (its start event is
recorded before the copies) and the call's wall time (StageTimer), copies a call (profiler),
scores equal.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s42/static_ab.py OUT.json"""
import json, random, statistics, sys, tempfile, time
from pathlib import Path

import torch

import dohnuts
import dohnuts.runtime.graphs as graphs
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.timing import StageTimer
from dohnuts.runtime.tokenizer import tokenizer_for

ADJACENT = graphs._adjacent


def use(variant):
    graphs._adjacent = ADJACENT if variant == "one" else (lambda ts: None)


pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
out = {}
tmp = tempfile.mkdtemp()
for wl in ("workloads/gpu/shared-prefix-2b.yaml", "workloads/gpu/image-cache-warm-2b.yaml"):
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
    res, scores = {}, {}
    for variant in ("apart", "one"):
        use(variant)
        r, _ = pred.call(reqs[0])
        scores[variant] = [s for q in r.questions for s in q.scores]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            pred.call(reqs[0])
            torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        res[f"{variant}_kernels_a_call"] = len(evs)
        res[f"{variant}_dtod_a_call"] = sum("DtoD" in e.name for e in evs)
    res["max_score_gap"] = max(abs(a - b) for a, b in zip(scores["apart"], scores["one"]))
    times = {v: {"stage": [], "wall": []} for v in ("apart", "one")}
    n = 25
    for rnd in range(10):
        for variant in (("apart", "one") if rnd % 2 == 0 else ("one", "apart")):
            use(variant)
            for i in range(n):
                timer = StageTimer(torch.device("cuda", 0))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                pred.call(reqs[i % len(reqs)], timer)
                torch.cuda.synchronize()
                times[variant]["wall"].append((time.perf_counter() - t0) * 1e3)
                stages = timer.result()
                times[variant]["stage"].append(stages["shared" if "shared" in stages else "forward"].device_ms)
    for variant, v in times.items():
        res[variant] = {k: {"median": round(statistics.median(x), 4),
                            "rounds": [round(statistics.median(x[i:i + n]), 4) for i in range(0, len(x), n)]}
                        for k, x in v.items()}
    out[spec.name] = res
    print(spec.name, json.dumps(res))
    del pred
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
