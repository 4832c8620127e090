"""Scratch A/B (session 36): the shared pass's Gated DeltaNet layers — main's forward_shared (a conv
launch for the prefix, one for the suffixes from its forked state, then the concatenation of k inside
the shared delta rule; `old_delta_rule.py`, main at 78e3dbb) against the tree's (the shared conv's one
launch over every row, each part one buffer) — two 2b sessions in one process, each captured with
its variant, six alternating rounds of 20 `predict` calls, choices and scores compared.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s36/conv_ab.py OUT.json
"""
import importlib.util, json, random, statistics, sys, tempfile, time
from pathlib import Path

import torch

import dohnuts
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.model.deltanet import GatedDeltaNet
from dohnuts.runtime.tokenizer import tokenizer_for

spec_ = importlib.util.spec_from_file_location("old_delta_rule", Path(__file__).with_name("old_delta_rule.py"))
old = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(old)
new_fs = GatedDeltaNet.forward_shared


def old_fs(self, x, groups):  # main at 78e3dbb
    (_, p, _), (n, t, _) = groups
    mixed, b, a = self.project(x)
    qkv_p, conv_p, normalised = self._conv(mixed[:p].view(1, p, -1), None, True)
    qkv_s, _, _ = self._conv(mixed[p:].view(n, t, -1), conv_p.expand(n, -1, -1), False)
    o = old.gated_delta_rule_shared(self._heads(qkv_p), self._heads(qkv_s), a, b, self.A_log, self.dt_bias,
                                    groups.chunk_index(x.device), normalised)
    return self.finish(x, o)


pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
out = {}
for wl in ([] if __name__ != "__main__" else ("workloads/gpu/shared-prefix-2b.yaml", "workloads/gpu/image-cache-warm-2b.yaml")):
    spec = load_workload(wl, kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                       random.Random(spec.seed)))
        reqs = [c.request for c in calls]
        sessions = {}
        for name, fs in (("main", old_fs), ("tree", new_fs)):
            GatedDeltaNet.forward_shared = fs
            s = dohnuts.load(spec.model, device="cuda")
            for r in reqs[:3]:
                s.predict([r])
            sessions[name] = (s, fs)
        results = {}
        for name, (s, fs) in sessions.items():
            GatedDeltaNet.forward_shared = fs
            results[name] = s.predict(reqs[:1])[0]
        a, b = results["main"], results["tree"]
        same = [qa.choice for qa in a.questions] == [qb.choice for qb in b.questions]
        diff = max(abs(x - y) for qa, qb in zip(a.questions, b.questions) for x, y in zip(qa.scores, qb.scores))
        times = {n: [] for n in sessions}
        for rnd in range(6):
            for name, (s, fs) in (sessions.items() if rnd % 2 == 0 else reversed(sessions.items())):
                GatedDeltaNet.forward_shared = fs
                for i in range(20):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    s.predict([reqs[i % len(reqs)]])
                    times[name].append((time.perf_counter() - t0) * 1e3)
        res = {n: {"median_ms": round(statistics.median(v), 3),
                   "round_medians": [round(statistics.median(v[i:i + 20]), 3) for i in range(0, len(v), 20)]}
               for n, v in times.items()}
        res["same_choices"], res["max_score_difference"] = same, diff
        out[wl] = res
        print(wl, json.dumps(res), flush=True)
        del sessions
        torch.cuda.empty_cache()
if __name__ == "__main__":
    json.dump(out, open(sys.argv[1], "w"), indent=1)
