"""Scratch A/B (session 34): the shared pass's Gated DeltaNet layers — HEAD's forward_shared (two
ChunkedDeltaRule calls and a concatenation) against the tree's (SharedDeltaRule: one kkt_solve launch
over both groups, one output buffer) — two 2b sessions in one process, each captured with its variant,
taking turns by rounds. PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s34/shared_ab.py OUT.json"""
import dataclasses, json, random, statistics, sys, tempfile, time
from pathlib import Path
import torch
import dohnuts
from dohnuts.model.deltanet import GatedDeltaNet
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.runtime.tokenizer import tokenizer_for

new_fs = GatedDeltaNet.forward_shared


def old_fs(self, x, groups):  # HEAD (add5772)
    (_, p, _), (n, t, _) = groups
    mixed, b, a = self.project(x)
    qkv_p, conv_p, normalised_p = self._conv(mixed[:p].view(1, p, -1), None, True)
    o_p, rec_p = self._delta(qkv_p, b[:p].view(1, p, -1), a[:p].view(1, p, -1), None, True, normalised_p)
    qkv_s, _, normalised_s = self._conv(mixed[p:].view(n, t, -1), conv_p.expand(n, -1, -1), False)
    o_s, _ = self._delta(qkv_s, b[p:].view(n, t, -1), a[p:].view(n, t, -1), rec_p.expand(n, -1, -1, -1), False,
                         normalised_s)
    o = torch.cat([o_p.reshape(p, *o_p.shape[2:]), o_s.reshape(n * t, *o_s.shape[2:])])
    return self.finish(x, o)


pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
out = {}
for wl in ("workloads/gpu/shared-prefix-2b.yaml", "workloads/gpu/image-cache-warm-2b.yaml"):
    spec = load_workload(wl, kinds, targets, gpu=True)
    import os
    if os.environ.get("DRY"):
        spec = dataclasses.replace(spec, model="tiny")
    cfg, ckpt = resolve_source(spec.model)
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
        reqs = [c.request for c in calls]
        sessions = {}
        for name, fs in (("HEAD", old_fs), ("tree", new_fs)):
            GatedDeltaNet.forward_shared = fs
            s = dohnuts.load(spec.model, device=os.environ.get("DEV", "cuda"))
            for r in reqs[:3]:
                res = s.predict([r])
            sessions[name] = (s, fs)
        GatedDeltaNet.forward_shared = old_fs
        a = sessions["HEAD"][0].predict(reqs[:1])[0]
        GatedDeltaNet.forward_shared = new_fs
        b = sessions["tree"][0].predict(reqs[:1])[0]
        same = [qa.choice for qa in a.questions] == [qb.choice for qb in b.questions]
        score_diff = max(abs(x - y) for qa, qb in zip(a.questions, b.questions) for x, y in zip(qa.scores, qb.scores))
        times = {n: [] for n in sessions}
        for rnd in range(6):
            for name, (s, fs) in (sessions.items() if rnd % 2 == 0 else reversed(sessions.items())):
                GatedDeltaNet.forward_shared = fs
                for i in range(20):
                    r = reqs[i % len(reqs)]
                    torch.cuda.synchronize() if torch.cuda.is_available() else None
                    t0 = time.perf_counter()
                    s.predict([r])
                    times[name].append((time.perf_counter() - t0) * 1e3)
        res = {n: {"median_ms": round(statistics.median(v), 3), "p10": round(sorted(v)[len(v) // 10], 3),
                   "p90": round(sorted(v)[9 * len(v) // 10], 3),
                   "round_medians": [round(statistics.median(v[i:i + 20]), 3) for i in range(0, len(v), 20)]}
               for n, v in times.items()}
        res["same_choices"], res["max_score_difference"] = same, score_diff
        out[wl] = res
        print(wl, json.dumps(res, indent=1), flush=True)
        del sessions
        torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
