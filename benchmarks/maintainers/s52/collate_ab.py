"""Session 52 (scratch): the collate as landed (970a888: the batch's integer tensors handed out as
torch views of the pinned buffer) against the form session 50 measured on a GPU host (`from_numpy`
views of the same buffer), all else the tree's — the one line differs. A 2b session with its
graphs, each workload's requests through `Predictor.call` as the harness runs it (a StageTimer),
the two forms taking turns call by call: prepare (host ms), h2d (device ms, the copy stream's
events), the wall; and the collate alone (host µs).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s52/collate_ab.py OUT.json WORKLOAD.yaml ...
"""
import inspect
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

LANDED = "views = {name: buf[offset:offset + shape.numel()].view(shape) for name, (offset, shape) in layout.items()}"
BEFORE = "views = {name: torch.from_numpy(arrays[name]) for name in layout}"


def q(v):
    v = sorted(v)
    return {"median": round(statistics.median(v), 4), "p10": round(v[len(v) // 10], 4),
            "p90": round(v[(len(v) * 9) // 10], 4), "n": len(v)}


def one(workload, calls_each=150):
    from dohnuts import api
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime import batch as B
    from dohnuts.runtime import session as S
    from dohnuts.runtime.predict import Predictor
    from dohnuts.runtime.timing import StageTimer
    from dohnuts.runtime.tokenizer import tokenizer_for

    src = inspect.getsource(B.collate)
    assert LANDED in src, "the tree's collate changed: update the lab"
    ns = dict(vars(B))
    exec(src.replace(LANDED, BEFORE), ns)
    forms = {"landed": B.collate, "from_numpy": ns["collate"]}
    spent = {}

    def timed(fn, name):
        def w(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = (time.perf_counter() - t) * 1e6
        return w

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(workload, kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tempfile.mkdtemp()),
                                                   random.Random(spec.seed)))
    if calls[0].request.image is not None:  # a steady state: image files older than the digest memo's racy window
        from dohnuts.runtime.images import ImageKeyMemo

        time.sleep(ImageKeyMemo.RACY_S)
    pred = Predictor(api.load(spec.model, device="cuda"))
    reqs = [c.request for c in calls]
    wrapped = {n: timed(f, n) for n, f in forms.items()}
    for i in range(8):
        S.collate = wrapped["landed" if i % 2 else "from_numpy"]
        pred.call(reqs[i % len(reqs)])
    torch.cuda.synchronize()
    res = {n: {"prepare_ms": [], "h2d_dev_ms": [], "wall_ms": [], "collate_us": []} for n in forms}
    order = list(forms)
    for i in range(2 * calls_each):
        name = order[i % 2] if (i // 2) % 2 == 0 else order[1 - i % 2]
        S.collate = wrapped[name]
        timer = StageTimer(torch.device("cuda"))
        t0 = time.perf_counter()
        pred.call(reqs[(i // 2) % len(reqs)], timer)
        res[name]["wall_ms"].append((time.perf_counter() - t0) * 1e3)
        r = timer.result()
        res[name]["prepare_ms"].append(r["prepare"].host_ms)
        res[name]["h2d_dev_ms"].append(r["h2d"].device_ms)
        res[name]["collate_us"].append(spent[name])
    S.collate = forms["landed"]
    pred.close()
    return {"gpu": torch.cuda.get_device_name(0), "calls_each": calls_each,
            "forms": {n: {k: q(v) for k, v in r.items()} for n, r in res.items()}}


def main(path, workloads):
    out = {}
    for w in workloads:
        out[w] = one(w)
        f = out[w]["forms"]
        print(w, {n: {k: v["median"] for k, v in f[n].items()} for n in f}, flush=True)
        json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
