"""Scratch (session 48, call 9): why `packing.columns` lost (call 8: +4 % an update though the
kernels alone lost the 35-µs cat a layer) — two 2b models (columns; main's split and dense dx),
three updates each, then two updates each under torch.profiler (CUDA): device time by kernel name
and in all, the updates' wall.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s48/split_profile.py OUT.json
"""
import collections
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks/maintainers/s48")
import split_ab as S  # noqa: E402


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
    import random
    import tempfile
    from pathlib import Path

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload("workloads/gpu/train-step-2b.yaml", kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    with tempfile.TemporaryDirectory() as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
    patches = {"columns": (S.NEW_BWD, S.NEW_COLUMNS), "as on main": (S.MAIN_BWD, S.MAIN_COLUMNS)}
    out = {}
    for name, (bwd, cols) in patches.items():
        S.CB.conv_silu_parts_bwd_triton, S.DN.columns = bwd, cols
        model = api.load(spec.model, device="cuda", seed=spec.seed, lora=L.LoRAConfig(rank=16))
        optim = OptimConfig()
        upd = Updater(model, make_optimizer(model, optim), RLCDConfig(), optim)
        for i in range(3):
            upd.update(calls[i % len(calls)].requests)
        torch.cuda.synchronize()
        walls = []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(2):
                t0 = time.perf_counter()
                upd.update(calls[(3 + i) % len(calls)].requests)
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) * 1e3)
        by = collections.Counter()
        count = collections.Counter()
        for e in prof.key_averages():
            if e.device_time_total > 0:
                by[e.key[:70]] += e.device_time_total / 2e3
                count[e.key[:70]] += e.count / 2
        out[name] = {"wall_ms": [round(w, 2) for w in walls], "device_ms_total": round(sum(by.values()), 2),
                     "top": {k: [round(v, 3), count[k]] for k, v in by.most_common(40)}}
        print(name, out[name]["wall_ms"], out[name]["device_ms_total"], flush=True)
        del upd, model
        torch.cuda.empty_cache()
    a, b = out["columns"]["top"], out["as on main"]["top"]
    diff = {k: round(a.get(k, [0])[0] - b.get(k, [0])[0], 3) for k in set(a) | set(b)}
    out["diff_ms"] = dict(sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15])
    print(json.dumps(out["diff_ms"], indent=0), flush=True)
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
