"""Scratch (session 41): train-step-2b's optimizer updates with the adapted groups' one GEMM over a
widened input (dohnuts.ops.spare, as landed: `wide`, its backward reading dy once through the wide
weight) against the same forward with the backward before it (`wide_fwd`: du = dy·bd_s, then
dx = du·A + dy·W) and against two GEMMs (`two`: every claim refused, the code before it but for the
producers' wider buffers). Each variant its own bench target (2b, rank 16,
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
from dohnuts.model.lora import _LinearGroup, _mm
from dohnuts.ops import spare
from dohnuts.runtime.timing import StageTimer
from dohnuts.runtime.tokenizer import tokenizer_for

CLAIM = spare.claim
NEW_BWD = _LinearGroup.backward


def old_backward(ctx, dy):
    """The backward before it, for a wide forward too (as at commit 1739c62)."""
    x, xd, w, a, bd_s, u, a_s, ww = ctx.saved_tensors
    need = ctx.needs_input_grad
    dy = dy.contiguous()
    du = torch.mm(dy, bd_s)
    dbs = [None] * len(ctx.ranks)
    if any(need[6::2]):
        dbd = _mm(dy.t(), u, ctx.dtype)
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
    das = _mm(du.t(), x if xd is None else xd, ctx.dtype).split(ctx.ranks)
    dw = torch.mm(dy.t(), x) if need[2] else None
    dbias = dy.sum(0) if need[3] else None
    grads = [g for pair in zip(das, dbs) for g in pair]
    return dx, dxd, dw, dbias, None, None, *grads


def use(variant):
    spare.claim = CLAIM if variant != "two" else (lambda x, n, rows=None: None)
    _LinearGroup.backward = staticmethod(NEW_BWD if variant == "wide" else old_backward)


pm = plugin_manager()  # makes dohnuts_bench_plugins (bench_plugins/) importable from a checkout
from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget  # noqa: E402
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
spec = load_workload("workloads/gpu/train-step-2b.yaml", kinds, targets, gpu=True)
cfg, ckpt = resolve_source(spec.model)
tmp = Path(tempfile.mkdtemp())
calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, tmp, random.Random(spec.seed)))
dev = torch.device("cuda", 0)
VARIANTS = ("two", "wide_fwd", "wide")
res, tg, losses = {}, {}, {v: [] for v in VARIANTS}
for variant in VARIANTS:
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
times = {v: {"wall": [], "forward": [], "backward": [], "optimizer": []} for v in VARIANTS}
n = 3
for rnd in range(8):
    for variant in (VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]):
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
