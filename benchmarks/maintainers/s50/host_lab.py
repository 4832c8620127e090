"""Session 50: where a single text-2b call's host stages go on a lent host (M62: prepare 1.51 ms,
serialize 0.48 against 0.37 / 0.056 on the CPU machine). A 2b session with its graphs, the
text-2b request, `Predictor.call` as the harness runs it (a StageTimer: prepare's host time, the
serialize stage's device time = from the GPU's last kernel to the host's end of serialize),
the call's wait for the device in three forms taking turns call by call:

  sync        `done.synchronize()` (the tree: cudaEventSynchronize, spinning in the driver)
  poll        `while not done.query(): pass` (a Python loop on cudaEventQuery)
  poll_sleep  `while not done.query(): time.sleep(0)` (the GIL released between queries)

prepare is attributed to the wait form of the call before it. Inside prepare: host µs of
plan_request, collate and the pinned copy (marks). Then prepare alone after 80 ms away in three
forms: a Python busy loop, a GPU sleep waited by cudaEventSynchronize, time.sleep.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s50/host_lab.py OUT.json
"""
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def q(v):
    v = sorted(v)
    return {"median": round(statistics.median(v), 4), "p10": round(v[len(v) // 10], 4),
            "p90": round(v[(len(v) * 9) // 10], 4), "n": len(v)}


def main(path):
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

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload("workloads/gpu/text-2b.yaml", kinds, targets, gpu=True)
    cfg, ckpt = resolve_source(spec.model)
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tempfile.mkdtemp()),
                                                   random.Random(spec.seed)))
    s = api.load(spec.model, device="cuda")
    pred = Predictor(s)
    marks = {}

    def mark(owner, name, key):
        f = getattr(owner, name)

        def w(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                marks[key] = marks.get(key, 0.0) + time.perf_counter() - t
        setattr(owner, name, w)

    mark(S, "plan_request", "plan_request")
    mark(S, "collate", "collate")
    mark(B.HostBatch, "pinned", "pinned")

    def serialize_as(mode):
        def ser(hb, host, done):
            if done is not None:
                if mode == "sync":
                    done.synchronize()
                elif mode == "poll":
                    while not done.query():
                        pass
                else:
                    while not done.query():
                        time.sleep(0)
            return plain(hb, host, None)
        return ser

    plain = Predictor.serialize  # a staticmethod: the plain function
    modes = ["sync", "poll", "poll_sleep"]
    res = {m: {"prepare_after_ms": [], "serialize_dev_ms": [], "serialize_host_ms": [], "wall_ms": [],
               "parts_after_us": {"plan_request": [], "collate": [], "pinned": []}} for m in modes}
    reqs = [c.request for c in calls]
    for i in range(6):
        pred.call(reqs[i % len(reqs)])
    torch.cuda.synchronize()
    prev = None
    for i in range(246):
        mode = modes[i % 3]
        pred.serialize = serialize_as(mode)
        timer = StageTimer(torch.device("cuda"))
        marks.clear()
        t0 = time.perf_counter()
        pred.call(reqs[i % len(reqs)], timer)
        wall = (time.perf_counter() - t0) * 1e3
        parts = dict(marks)
        r = timer.result()
        if i >= 6:
            res[mode]["serialize_dev_ms"].append(r["serialize"].device_ms)
            res[mode]["serialize_host_ms"].append(r["serialize"].host_ms)
            res[mode]["wall_ms"].append(wall)
            if prev is not None:
                res[prev]["prepare_after_ms"].append(r["prepare"].host_ms)
                for k in parts:
                    res[prev]["parts_after_us"][k].append(parts[k] * 1e6)
        prev = mode
    del pred.serialize
    out = {"gpu": torch.cuda.get_device_name(0), "calls": {}}
    for m in modes:
        out["calls"][m] = {k: q(v) for k, v in res[m].items() if k != "parts_after_us"}
        out["calls"][m]["parts_after_us"] = {k: q(v) for k, v in res[m]["parts_after_us"].items()}
    # prepare alone after 80 ms away, three ways of being away
    req = reqs[0]
    away = {"busy": [], "gpu_sync": [], "sleep": [], "b2b": []}
    cycles = None
    for i in range(160):
        kind = list(away)[i % 4]
        if kind == "busy":
            t = time.perf_counter() + 0.08
            while time.perf_counter() < t:
                pass
        elif kind == "gpu_sync":
            if cycles is None:  # calibrate torch.cuda._sleep to ≈ 80 ms
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                torch.cuda._sleep(10_000_000)
                e1.record()
                e1.synchronize()
                cycles = int(10_000_000 * 80 / e0.elapsed_time(e1))
            torch.cuda._sleep(cycles)
            torch.cuda.synchronize()
        elif kind == "sleep":
            time.sleep(0.08)
        else:
            s.prepare(req)
        t0 = time.perf_counter()
        s.prepare(req)
        if i >= 8:
            away[kind].append((time.perf_counter() - t0) * 1e3)
    out["prepare_alone_ms"] = {k: q(v) for k, v in away.items()}
    try:
        out["host"] = subprocess.run("lscpu | grep -E 'Model name|Hypervisor|MHz|^CPU\\(s\\)'", shell=True,
                                     capture_output=True, text=True).stdout.strip().splitlines()
    except OSError:
        pass
    print(json.dumps(out), flush=True)
    json.dump(out, open(path, "w"), indent=1)
    pred.close()


if __name__ == "__main__":
    main(sys.argv[1])
