"""Session 49: the adapters' gradients added into .grad by the backward's GEMMs (the tree) against
autograd's additions (`_accumulating` forced False) — two 2b models, three updates each, then two
updates each under torch.profiler (CUDA), twice in turn: device time and launches by kernel name,
the updates' wall.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s49/grad_profile.py OUT.json
"""
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grad_variants import off, on  # noqa: E402


def main(path):
    from dohnuts import api
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model import lora as L
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.tokenizer import tokenizer_for
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload("workloads/gpu/train-step-2b.yaml", kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    with tempfile.TemporaryDirectory() as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
    variants = {"into .grad": (on, on), "autograd adds": (off, on)}
    upds = {}
    for name, (enter, leave) in variants.items():
        enter()
        model = api.load(spec.model, device="cuda", seed=spec.seed, lora=L.LoRAConfig(rank=16))
        optim = OptimConfig()
        upds[name] = Updater(model, make_optimizer(model, optim), RLCDConfig(), optim)
        for i in range(3):
            upds[name].update(calls[i % len(calls)].requests)
        leave()
    torch.cuda.synchronize()
    out = {name: {"wall_ms": [], "device_ms_total": []} for name in variants}
    tops = {name: collections.Counter() for name in variants}
    counts = {name: collections.Counter() for name in variants}
    for turn in range(2):
        for name, (enter, leave) in variants.items():
            enter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for i in range(2):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    upds[name].update(calls[(3 + i) % len(calls)].requests)
                    torch.cuda.synchronize()
                    out[name]["wall_ms"].append(round((time.perf_counter() - t0) * 1e3, 2))
            leave()
            total = 0.0
            for e in prof.key_averages():
                if e.device_time_total > 0:
                    tops[name][e.key[:70]] += e.device_time_total / 4e3  # ms an update (4 updates in all)
                    counts[name][e.key[:70]] += e.count / 4
                    total += e.device_time_total / 2e3
            out[name]["device_ms_total"].append(round(total, 2))
            print(name, turn, out[name]["wall_ms"][-2:], out[name]["device_ms_total"][-1], flush=True)
    for name in variants:
        out[name]["top"] = {k: [round(v, 3), counts[name][k]] for k, v in tops[name].most_common(40)}
    a, b = tops["into .grad"], tops["autograd adds"]
    diff = {k: round(a.get(k, 0) - b.get(k, 0), 3) for k in set(a) | set(b)}
    out["diff_ms"] = dict(sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15])
    print(json.dumps(out["diff_ms"], indent=0), flush=True)
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
