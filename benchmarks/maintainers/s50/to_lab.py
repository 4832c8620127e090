"""Session 50: `Batch.to`'s host time for a text-2b batch collated by the tree (one pinned buffer
written by numpy, from_numpy views) against bfde253's (arrays packed into a pinned buffer after),
each after a 20-ms busy wait, taking turns; and the same with the copy alone (`buf.to`)."""
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main(path):
    import batch_before as OB

    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime import batch as B
    from dohnuts.runtime.plan import plan_request
    from dohnuts.runtime.tokenizer import tokenizer_for

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload("workloads/gpu/text-2b.yaml", kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    tok = tokenizer_for(cfg, ckpt)
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tok, cfg, Path(tempfile.mkdtemp()), random.Random(spec.seed)))
    plan = plan_request(calls[0].request, tok, max_len=8192)
    dev = torch.device("cuda")
    s = torch.cuda.Stream()
    make = {"tree": lambda: B.collate(plan, pad_id=256, allocate=B.pinned_long).tensors,
            "before": lambda: OB.collate(plan, pad_id=256).tensors.pin()}
    res = {f"{k}/{w}": [] for k in make for w in ("to", "buf.to")}
    for i in range(600):
        k = "tree" if i % 2 else "before"
        w = "to" if (i // 2) % 2 else "buf.to"
        t = make[k]()
        torch.cuda.synchronize()
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            pass
        with torch.cuda.stream(s):
            t0 = time.perf_counter()
            if w == "to":
                t.to(dev, non_blocking=True)
            else:
                t.__dict__["_packed"][0].to(dev, non_blocking=True)
            dt = time.perf_counter() - t0
        if i >= 40:
            res[f"{k}/{w}"].append(dt * 1e6)
    out = {k: round(statistics.median(v), 1) for k, v in res.items()}
    print(json.dumps(out))
    json.dump(out, open(path, "w"))


if __name__ == "__main__":
    main(sys.argv[1])
