"""Host time of `Session.prepare` for one request of a workload (tokens, plan, batch tensors),
median of N calls after warm-up — the CPU work a single prediction call pays before the device.

    python benchmarks/prepare_cost.py --workload workloads/gpu/shared-prefix-2b.yaml --calls 20

The workload's GPU sizes (`on_gpu`) are used; the model is the tiny preset (preparation does not
depend on the model's size with the byte tokenizer of the presets). A warm image-cache workload
scores its request once first, so that its image's features are cached, as in the benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="workloads/gpu/shared-prefix-2b.yaml")
    p.add_argument("--calls", type=int, default=20)
    a = p.parse_args(argv)

    import dohnuts
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.bench.runner import WorkloadContext
    from dohnuts.bench.workload import load_workload
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.tokenizer import tokenizer_for

    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = dataclasses.replace(load_workload(a.workload, kinds, targets, gpu=True), model="tiny")
    cfg, ckpt = resolve_source("tiny")
    calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tempfile.mkdtemp(prefix="dohnuts-prepare-")),
                                                   random.Random(spec.seed)))
    session = dohnuts.load("tiny")
    req = calls[0].request
    if spec.shape.get("cache") == "warm":  # score it once: its image's features enter the cache
        from dohnuts.runtime.predict import Predictor

        Predictor(session).call(req)
    for _ in range(3):
        session.prepare(req)
    times = []
    for _ in range(a.calls):
        t0 = time.perf_counter()
        session.prepare(req)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"{a.workload}: prepare {statistics.median(times):.2f} ms (median of {a.calls})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
