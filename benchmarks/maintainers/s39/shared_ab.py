"""Scratch (session 39): a shared pass's small launches — the prefix's final state without fla's
zero fill, its output written into the shared buffer (no copy), the gates of both groups in one
varlen launch — against the code before them (reconstructed here by patching: fla's wrappers, the
copy, a gate launch per group). Each variant its own 2b session, its graphs captured under its
code; interleaved rounds of single calls (shared-prefix-2b, image-cache-warm-2b): the shared
stage's device time and the call's wall time (StageTimer), kernels a call (profiler), scores equal.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s39/shared_ab.py OUT.json"""
import json, random, statistics, sys, tempfile, time
from pathlib import Path

import torch

import dohnuts
import dohnuts.ops._gdn_gates_kernel as gates_mod
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.ops import delta_rule
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.timing import StageTimer
from dohnuts.runtime.tokenizer import tokenizer_for

NEW = (delta_rule._fla_state_step, delta_rule._fla_output, gates_mod.gdn_gates_varlen_triton)


def old_state_step(k, w, u, g, initial_state, output_final_state, chunk_size):
    return delta_rule.fla().chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g, initial_state=initial_state,
                                                         output_final_state=output_final_state, chunk_size=chunk_size)


def old_output(f, q, k, v_new, h, g, scale, out=None):
    o = f.chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=scale, chunk_size=64)
    return o if out is None else out.copy_(o)


def old_gates(a, b, A_log, dt_bias, chunk_index, chunk_size, scale):
    R, HV = a.shape
    g = torch.empty(R, HV, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    P, L, B = OLD_GROUPS
    for rows, shape in ((slice(0, P), (1, P, HV)), (slice(P, R), (B, L, HV))):
        gates_mod.gdn_gates_triton(a[rows].view(shape), b[rows].view(shape), A_log, dt_bias, chunk_size, scale,
                                   out=(g[rows].view(shape), beta[rows].view(shape)))
    return g, beta


def use(variant):
    if variant == "new":
        delta_rule._fla_state_step, delta_rule._fla_output, gates_mod.gdn_gates_varlen_triton = NEW
    else:
        delta_rule._fla_state_step, delta_rule._fla_output, gates_mod.gdn_gates_varlen_triton = (
            old_state_step, old_output, old_gates)


# the old gates need the groups (the new op reads them from the chunk index on the device): taken
# from SharedDeltaRule's arguments by a wrapper
OLD_GROUPS = None
_apply = delta_rule.SharedDeltaRule.apply


def apply(q, k, v, a, b, A_log, dt_bias, chunk_index, P, L, scale):
    global OLD_GROUPS
    OLD_GROUPS = (P, L, (k.shape[0] - P) // L)
    return _apply(q, k, v, a, b, A_log, dt_bias, chunk_index, P, L, scale)


delta_rule.SharedDeltaRule.apply = apply

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
    preds, res = {}, {}
    for variant in ("old", "new"):
        use(variant)
        preds[variant] = Predictor(dohnuts.load(spec.model, device="cuda"))
        for _ in range(2):
            for r in reqs:
                preds[variant].call(r)  # graphs captured (and images cached) under this variant's code
    torch.cuda.synchronize()
    scores = {}
    for variant in ("old", "new"):
        use(variant)
        r, _ = preds[variant].call(reqs[0])
        scores[variant] = [s for q in r.questions for s in q.scores]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            preds[variant].call(reqs[0])
            torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        res[f"{variant}_kernels_a_call"] = len(evs)
        res[f"{variant}_memsets_a_call"] = sum("Memset" in e.name for e in evs)
        res[f"{variant}_fills_a_call"] = sum("FillFunctor" in e.name for e in evs)
        res[f"{variant}_gates_a_call"] = sum("gdn_gates" in e.name for e in evs)
    res["max_score_gap"] = max(abs(a - b) for a, b in zip(scores["old"], scores["new"]))
    times = {v: {"shared": [], "wall": []} for v in ("old", "new")}
    n = 20
    for rnd in range(8):
        for variant in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
            use(variant)
            for i in range(n):
                timer = StageTimer(torch.device("cuda", 0))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                preds[variant].call(reqs[i % len(reqs)], timer)
                torch.cuda.synchronize()
                times[variant]["wall"].append((time.perf_counter() - t0) * 1e3)
                times[variant]["shared"].append(timer.result()["shared"].device_ms)
    for variant, v in times.items():
        res[variant] = {k: {"median": round(statistics.median(x), 4),
                            "rounds": [round(statistics.median(x[i:i + n]), 4) for i in range(0, len(x), n)]}
                        for k, x in v.items()}
    out[spec.name] = res
    print(spec.name, json.dumps(res), flush=True)
    del preds
    torch.cuda.empty_cache()
use("new")
json.dump(out, open(sys.argv[1], "w"), indent=1)
