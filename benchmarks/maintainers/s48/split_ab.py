"""Scratch (session 48): Gated DeltaNet's packed in-projection split by `packing.columns`, its
gradient written once — the conv's dx as the first columns of a buffer as wide as the projection,
the gates' beside it (branch split-grad-once) — against torch's split and a dense dx as on main.
Adapted from the conv du A/B (this header's older text follows):
the conv backward's du in x's dtype (BF16 in training; branch conv-du-bf16) against FP32 as on main — the conv's two backward kernels alone at train-step-2b's
shape (CUDA-event medians, interleaved, in both orders; and by kernel under torch.profiler), then
train-step-2b updates of 2b models of one seed, each its own Updater and graphs, main's FP32 du
patched in around some models' updates (call 5: two models, six rounds of four; call 6: four
models, two of each — the spread between equal models beside the A/B — four rounds of four,
rotated), CUDA-synchronised wall; the first update's loss and gradient norm of each.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s48/conv_du_ab.py OUT.json
"""
import inspect
import json
import random
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from dohnuts.ops import _conv_bwd_kernel as CB

_src = textwrap.dedent(inspect.getsource(CB.conv_silu_parts_bwd_triton))
assert "wide = row > C and" in _src
_ns = {}
exec(compile(_src.replace("wide = row > C and", "wide = False and"), CB.__file__, "exec"), CB.__dict__, _ns)
MAIN_BWD, NEW_BWD = _ns["conv_silu_parts_bwd_triton"], CB.conv_silu_parts_bwd_triton
from dohnuts.model import deltanet as DN  # noqa: E402

NEW_COLUMNS = DN.columns


def MAIN_COLUMNS(y, sizes):
    return y.split(sizes, dim=-1)


def kernels():
    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, C = 8, 512, 6144
    x = (torch.randn(B, T, C + 32, device="cuda", generator=g)).bfloat16()[..., :C]
    w = (torch.randn(C, 4, device="cuda", generator=g) * 0.3).bfloat16().t().contiguous().t()
    grads = [torch.randn(B, T, 2048, device="cuda", generator=g).bfloat16() for _ in range(3)]
    args = (x, w, 128, [2048, 2048, 2048], 2, grads, None, None, False, False)
    b32 = torch.randn(B, T, 32, device="cuda", generator=g).bfloat16()

    def _beside(dx, rest):
        full = dx._base
        full[..., C:].copy_(rest)
        return full
    ref = MAIN_BWD(*args)[0].float()
    got = NEW_BWD(*args)[0].float()
    err = float((got - ref).norm() / ref.norm())
    fns = {"dense dx then cat (main)": lambda: torch.cat([MAIN_BWD(*args)[0], b32], -1),
           "wide dx, the rest copied beside": lambda: _beside(NEW_BWD(*args)[0], b32)}
    times = {n: [] for n in fns}
    for _ in range(5):
        for n, f in fns.items():
            for _ in range(3):
                f()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(50):
                f()
            e.record()
            torch.cuda.synchronize()
            times[n].append(s.elapsed_time(e) / 50 * 1e3)
    out = {"us": {n: round(statistics.median(v), 2) for n, v in times.items()}, "dx_rel_diff": err}
    times = {n: [] for n in fns}
    for _ in range(5):  # the other order
        for n, f in reversed(list(fns.items())):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(50):
                f()
            e.record()
            torch.cuda.synchronize()
            times[n].append(s.elapsed_time(e) / 50 * 1e3)
    out["us_reversed"] = {n: round(statistics.median(v), 2) for n, v in times.items()}
    from torch.profiler import ProfilerActivity, profile
    out["by_kernel_us"] = {}
    for n, f in fns.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                f()
            torch.cuda.synchronize()
        out["by_kernel_us"][n] = {e.key[:60]: round(e.device_time_total / 20, 2) for e in prof.key_averages()
                                  if e.device_time_total > 0}
    print(json.dumps(out), flush=True)
    return out


def ab(rounds=4, per_round=4):
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
    patches = {"columns": (NEW_BWD, NEW_COLUMNS), "as on main": (MAIN_BWD, MAIN_COLUMNS),
               "columns (2)": (NEW_BWD, NEW_COLUMNS), "as on main (2)": (MAIN_BWD, MAIN_COLUMNS)}
    upd = {}
    for name in patches:
        model = api.load(spec.model, device="cuda", seed=spec.seed, lora=L.LoRAConfig(rank=16))
        optim = OptimConfig()
        upd[name] = Updater(model, make_optimizer(model, optim), RLCDConfig(), optim)

    def update(name, i):
        CB.conv_silu_parts_bwd_triton, DN.columns = patches[name]
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = upd[name].update(calls[i % len(calls)].requests)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3, res
        finally:
            CB.conv_silu_parts_bwd_triton, DN.columns = NEW_BWD, NEW_COLUMNS

    out = {"first": {}}
    for name in upd:
        _, res = update(name, 0)
        out["first"][name] = {"loss": float(res.loss), "grad_norm": float(res.grad_norm)}
        for i in range(1, 3):
            update(name, i)
    print("first update", out["first"], flush=True)
    times = {n: [] for n in upd}
    names = list(upd)
    for rnd in range(rounds):
        for name in names[rnd % 4:] + names[:rnd % 4]:
            for i in range(per_round):
                times[name].append(update(name, 3 + rnd * per_round + i)[0])
    out["ms"] = {n: {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2),
                     "round_medians": [round(statistics.median(v[i:i + per_round]), 2) for i in range(0, len(v), per_round)]}
                 for n, v in times.items()}
    print(json.dumps(out["ms"]), flush=True)
    return out


if __name__ == "__main__":
    res = {"gpu": torch.cuda.get_device_name(0), "kernels": kernels()}
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
    res["ab"] = ab()
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
