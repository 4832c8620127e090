"""Scratch (session 48): two train-step levers on branch train-fusions-s48.

1. Kernel lab (2b's MLP, 4096 rows): packed SwiGLU then u = h · A_sᵀ by cuBLAS into the spare
   columns (as on main) against `swiglu_packed_lora_kernel` writing both, at several (BM, BK, warps)
   (call 1: one program a row block looping over the columns; call 2: a program a block, partial
   products summed by `lora_u_reduce_kernel`);
   CUDA-event medians of 200 launches each, interleaved in rounds. The fastest config is used below.
2. train-step-2b's update, 2b models of one seed, each its own Updater and graphs, updates
   taken in turn by rounds: "as on main" (both levers off), "swiglu u" (the kernel writes the down
   projection's u), in call 1 also "delta kept" (the delta rule's autograd forward on the split path,
   its w, states and v_new kept for the backward; reverted after call 1: `s48/delta_kept.patch`; call 1's u kernel: `s48/swiglu_u_v1_to_v2.patch` reversed). The first update's loss and gradient norm of each, then ms an
   update (CUDA-synchronised wall).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s48/train_ab.py OUT.json
"""
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def lab():
    import triton

    from dohnuts.ops import _swiglu_kernel as K
    from dohnuts.ops import spare

    N, I, R = 4096, 6144, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = (torch.randn(N, 2 * I, device="cuda", generator=g) * 2).bfloat16()
    a = (torch.randn(R, I, device="cuda", generator=g) / I ** 0.5).bfloat16()

    def main_path():
        y = K.swiglu_packed_triton(gu, R)
        rows = y.view(N, I) if y.is_contiguous() else y
        xw = spare.with_spare(rows, R)
        torch.mm(rows, a.t(), out=xw[:, I:])
        return y

    def fused(bm, bk, w):
        def f():
            K.LORA_BM, K.LORA_BC, K.LORA_WARPS = bm, bk, w
            return K.swiglu_packed_triton(gu, R, a)
        return f

    ref = main_path()
    ref_u = spare.with_spare(ref, R)[:, I:].float()
    variants = {"main (kernel + cuBLAS u)": main_path}
    for bm in (16, 32):
        for bk in (256, 512, 1024):
            for w in (4, 8):
                if bm * bk > 16384:
                    continue
                variants[f"fused BM{bm} BK{bk} w{w}"] = fused(bm, bk, w)
    errors = {}
    for name, f in list(variants.items()):
        try:
            y = f()
            torch.cuda.synchronize()
            assert torch.equal(y, ref), "y differs"
            u = spare.with_spare(y, R)[:, I:].float()
            errors[name] = float(((u - ref_u).norm() / ref_u.norm()))
        except Exception as e:  # noqa: BLE001 — a config that does not compile is a result too
            errors[name] = f"{type(e).__name__}: {e}"[:200]
            del variants[name]
    times = {n: [] for n in variants}
    for _ in range(5):
        for name, f in variants.items():
            for _ in range(5):
                f()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(40):
                f()
            e.record()
            torch.cuda.synchronize()
            times[name].append(s.elapsed_time(e) / 40 * 1e3)
    us = {n: round(statistics.median(v), 2) for n, v in times.items()}
    best = min((n for n in us if n.startswith("fused")), key=us.get)
    print(json.dumps({"us": us, "u_rel_err": errors, "best": best}, indent=1), flush=True)
    bm, bk, w = (int(t[2:]) if t.startswith("BM") or t.startswith("BK") else int(t[1:]) for t in best.split()[1:])
    return {"us": us, "u_rel_err": errors, "best": best}, (bm, bk, w)


def ab(config, rounds=6, per_round=4):
    from dohnuts import api
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model import blocks, lora as L
    from dohnuts.model.build import resolve_source
    from dohnuts.ops import _swiglu_kernel as K
    from dohnuts.runtime.tokenizer import tokenizer_for
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer

    K.LORA_BM, K.LORA_BC, K.LORA_WARPS = config
    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload("workloads/gpu/train-step-2b.yaml", kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    with tempfile.TemporaryDirectory() as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
    new_producer = blocks.producer_a
    patches = {"as on main": lambda *a, **k: None, "swiglu u": new_producer}
    upd = {}
    for name in patches:
        model = api.load(spec.model, device="cuda", seed=spec.seed, lora=L.LoRAConfig(rank=16))
        optim = OptimConfig()
        upd[name] = Updater(model, make_optimizer(model, optim), RLCDConfig(), optim)

    def update(name, i):
        blocks.producer_a = patches[name]
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = upd[name].update(calls[i % len(calls)].requests)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3, res
        finally:
            blocks.producer_a = new_producer

    out = {"first": {}, "ms": {}, "config": config}
    for name in upd:
        _, res = update(name, 0)
        out["first"][name] = {"loss": float(res.loss), "grad_norm": float(res.grad_norm)}
        for i in range(1, 3):
            update(name, i)
    print("first update", out["first"], flush=True)
    times = {n: [] for n in upd}
    names = list(upd)
    for rnd in range(rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            for i in range(per_round):
                times[name].append(update(name, 3 + rnd * per_round + i)[0])
    out["ms"] = {n: {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2),
                     "round_medians": [round(statistics.median(v[i:i + per_round]), 2) for i in range(0, len(v), per_round)]}
                 for n, v in times.items()}
    out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    print(json.dumps(out["ms"]), flush=True)
    return out


if __name__ == "__main__":
    res = {"gpu": torch.cuda.get_device_name(0)}
    res["lab"], config = lab()
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
    res["ab"] = ab(config)
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
