"""What the harness's stage timer costs a call, measured from outside: the same prediction call
with the harness's `StageTimer` and with the runtime's `NULL_TIMER`, interleaved, wall time of
each (synchronised), medians and their ratio.

The timer's self-reported `overhead_ms` counts the host time spent in its own code, which on a
GPU includes CUDA API calls (event records) that may wait for the launch queue: time the host
would otherwise wait for at the next synchronisation. This A/B is the cost the timer adds to the
wall time.

    python benchmarks/timer_ab.py --preset qwen3.5-2b --workload workloads/gpu/shared-prefix-2b.yaml --calls 30
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny")
    p.add_argument("--workload", default="workloads/shared-prefix.yaml")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args(argv)

    import torch

    import dohnuts
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.predict import Predictor
    from dohnuts.runtime.timing import NULL_TIMER, StageTimer
    from dohnuts.runtime.tokenizer import tokenizer_for

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(a.workload, kinds, targets)
    cfg, ckpt = resolve_source(a.preset)
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path("/tmp"),
                                                   random.Random(spec.seed)))
    model = dohnuts.load(a.preset)
    pred = Predictor(model)
    dev = model.device

    def one(timer) -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        pred.call(calls[0].request, timer)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        if isinstance(timer, StageTimer):
            timer.result()
        return (t1 - t0) * 1e3

    for _ in range(5):
        one(StageTimer(dev))
        one(NULL_TIMER)
    timed, plain, self_reported = [], [], []
    for _ in range(a.calls):
        t = StageTimer(dev)
        timed.append(one(t))
        self_reported.append(t.overhead_ms)
        plain.append(one(NULL_TIMER))
    out = {"preset": a.preset, "workload": a.workload, "calls": a.calls, "device": str(dev),
           "timed_ms": statistics.median(timed), "plain_ms": statistics.median(plain),
           "self_reported_overhead_ms": statistics.median(self_reported)}
    out["added_ms"] = out["timed_ms"] - out["plain_ms"]
    out["added_fraction"] = out["added_ms"] / out["plain_ms"]
    print(json.dumps(out, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))
    pred.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
