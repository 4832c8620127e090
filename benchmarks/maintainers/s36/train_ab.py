"""Scratch A/B (session 36): training updates with main's forward_shared (two conv launches, the cat of
k; `old_delta_rule.py`) against the tree's (the shared conv) — two train-step-2b targets in one
process (the bench's dohnuts target: LoRA, 4 microbatches, CUDA graphs), each built and warmed with its
variant, four alternating rounds of 5 updates; the first update's losses compared.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s36/train_ab.py OUT.json
"""
import json, random, statistics, sys, tempfile, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from conv_ab import kinds, new_fs, old_fs, targets  # noqa: E402  (conv_ab's module level runs nothing else when imported)

from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.model.build import resolve_source
from dohnuts.model.deltanet import GatedDeltaNet
from dohnuts.runtime.timing import NULL_TIMER
from dohnuts.runtime.tokenizer import tokenizer_for

import dataclasses, os
spec = load_workload("workloads/gpu/train-step-2b.yaml", kinds, targets, gpu=True)
DEV = "cpu" if os.environ.get("DRY") else "cuda"  # DRY=1: the tiny preset on the CPU (a smoke run)
if DEV == "cpu":
    spec = dataclasses.replace(spec, model="tiny")
    torch.cuda.synchronize = lambda: None
cfg, ckpt = resolve_source(spec.model)
entry = targets["dohnuts"]
with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
    calls = list(kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                        random.Random(spec.seed))))
    built, losses = {}, {}
    for name, fs in (("main", old_fs), ("tree", new_fs)):
        GatedDeltaNet.forward_shared = fs
        tgt, _ = entry.build(spec, torch.device(DEV), torch.bfloat16 if DEV == "cuda" else torch.float32, entry.options({}, source=spec.file))
        losses[name] = [tgt.run_call(calls[i % len(calls)], NULL_TIMER).extra["loss"] for i in range(3)]
        built[name] = (tgt, fs)
    times = {n: [] for n in built}
    for rnd in range(4):
        for name, (tgt, fs) in (built.items() if rnd % 2 == 0 else reversed(built.items())):
            GatedDeltaNet.forward_shared = fs
            for i in range(5):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                tgt.run_call(calls[i % len(calls)], NULL_TIMER)
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) * 1e3)
res = {n: {"median_ms": round(statistics.median(v), 2),
           "round_medians": [round(statistics.median(v[i:i + 5]), 2) for i in range(0, len(v), 5)]}
       for n, v in times.items()}
res["first_losses"] = losses
print("train-step-2b", json.dumps(res), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
