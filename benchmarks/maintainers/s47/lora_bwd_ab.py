"""Scratch (session 47): train-step-2b's update with the wide groups' backward reading dy once
(branch lora-bwd-wide: `_LinearGroup._wide_backward`) against the backward as on main (du = dy ·
bd_s its own GEMM, copied below) — two 2b models of one seed, each its own Updater and graphs, the
old backward patched in around every update of the second; updates taken in turn by rounds. The
first update's loss and gradient norm of each, then ms an update (CUDA-synchronised wall).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s47/lora_bwd_ab.py OUT.json
"""
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from dohnuts import api
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model import lora as L
from dohnuts.model.build import resolve_source
from dohnuts.runtime.tokenizer import tokenizer_for
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import OptimConfig, Updater, make_optimizer


def main_backward(ctx, dy):
    """`_LinearGroup.backward` as on main (5306f31)."""
    x, xd, w, a, bd_s, u = ctx.saved_tensors[:6]
    need = ctx.needs_input_grad
    dy = dy.contiguous()
    du = torch.mm(dy, bd_s)
    dbs = [None] * len(ctx.ranks)
    if any(need[6::2]):
        dbd = L._mm(dy.t(), u, ctx.dtype)
        r0 = 0
        for i, ((c0, c1), r) in enumerate(zip(ctx.spans, ctx.ranks)):
            dbs[i] = dbd[c0:c1, r0:r0 + r]
            r0 += r
    dx = dxd = None
    if need[0]:
        if ctx.dropout:
            dx = torch.mm(dy, w)
        else:
            dx = torch.mm(du, a)
            dx.addmm_(dy, w)
    if ctx.dropout and need[1]:
        dxd = torch.mm(du, a)
    das = L._mm(du.t(), x if xd is None else xd, ctx.dtype).split(ctx.ranks)
    dw = torch.mm(dy.t(), x) if need[2] else None
    dbias = dy.sum(0) if need[3] else None
    grads = [g for pair in zip(das, dbs) for g in pair]
    return dx, dxd, dw, dbias, None, None, *grads


def main(path=None, rounds=6, per_round=4):
    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    gpu = torch.cuda.is_available()  # the CPU: a dry run on the tiny preset
    spec = load_workload("workloads/gpu/train-step-2b.yaml" if gpu else "workloads/train-step.yaml", kinds, targets,
                         gpu=gpu)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    cfg, ckpt = resolve_source(spec.model)
    with tempfile.TemporaryDirectory() as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
    new_backward = L._LinearGroup.backward
    upd = {}
    for name in ("wide backward", "as on main"):
        model = api.load(spec.model, device="cuda" if gpu else "cpu", seed=spec.seed, lora=L.LoRAConfig(rank=16))
        optim = OptimConfig()
        upd[name] = Updater(model, make_optimizer(model, optim), RLCDConfig(), optim)

    def update(name, i):
        L._LinearGroup.backward = staticmethod(main_backward) if name == "as on main" else new_backward
        try:
            sync()
            t0 = time.perf_counter()
            res = upd[name].update(calls[i % len(calls)].requests)
            sync()
            return (time.perf_counter() - t0) * 1e3, res
        finally:
            L._LinearGroup.backward = new_backward

    out = {"gpu": torch.cuda.get_device_name(0) if gpu else "cpu", "first": {}, "ms": {}}
    for name in upd:
        _, res = update(name, 0)
        out["first"][name] = {"loss": float(res.loss), "grad_norm": float(res.grad_norm)}
        for i in range(1, 3):  # warm-up: captures, autotunes
            update(name, i)
    print("first update", out["first"], flush=True)
    times = {n: [] for n in upd}
    for rnd in range(rounds):
        order = list(upd) if rnd % 2 == 0 else list(reversed(list(upd)))
        for name in order:
            for i in range(per_round):
                times[name].append(update(name, 3 + rnd * per_round + i)[0])
    out["ms"] = {n: {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2),
                     "round_medians": [round(statistics.median(v[i:i + per_round]), 2) for i in range(0, len(v), per_round)]}
                 for n, v in times.items()}
    print(json.dumps(out["ms"]), flush=True)
    if path:
        json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
