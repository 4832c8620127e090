"""Session 49: what a CUDA graph's launch costs by its node types — call 5 found a graph of 600
element-wise kernels (or the 2b tower) launched in 7–9 µs of host time and its first kernel ≈ 7 µs
later from an idle GPU, where M52 timed the shared pass's replay call at 0.52 ms. Here: synthetic
chains of 600 kernels with 0, 10 and 50 device-to-device memcpy nodes among them (a contiguous
`copy_`), and the captured passes of real 2b calls (shared-prefix-2b, image-cache-warm-2b, text-2b):
each graph's replay host time, and the time from an event before it to one after it from an idle GPU
against a busy one (`launch_lab.measure`); the real graphs' node types from `debug_dump`.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s49/launch_nodes.py OUT.json
"""
import collections
import json
import random
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_lab import capture, measure  # noqa: E402


def synthetic(pool):
    res = {}
    x = torch.zeros(1 << 18, device="cuda")
    a, b = torch.zeros(1 << 16, device="cuda"), torch.zeros(1 << 16, device="cuda")
    for copies in (0, 10, 50):
        def f():
            for i in range(300):
                x.mul_(1.0001).add_(1e-4)
                if copies and i % (300 // copies) == 0:
                    b.copy_(a)
        g = capture(f, pool)
        res[f"600 kernels, {copies} memcpy"] = measure({"g": [g]}, reps=60)["g"]
        print(copies, res[f"600 kernels, {copies} memcpy"], flush=True)
    return res


def node_types(g) -> dict:
    path = tempfile.mktemp(suffix=".dot")
    g.debug_dump(path)
    text = Path(path).read_text()
    kinds = collections.Counter(re.findall(r"\b(KERNEL|MEMSET|MEMCPY|HOST|EVENT_RECORD|WAIT_EVENT|EMPTY)\b", text))
    return dict(kinds)


def real(pool):
    from dohnuts import api
    from dohnuts.bench.contracts import WorkloadContext
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.tokenizer import tokenizer_for

    class DebugGraph(torch.cuda.CUDAGraph):  # keeps its cudaGraph_t for debug_dump
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.enable_debug_mode()

    torch.cuda.CUDAGraph = DebugGraph
    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    s = api.load("qwen3.5-2b", device="cuda")
    out = {}
    for wl in ("shared-prefix-2b", "image-cache-warm-2b", "text-2b"):
        spec = load_workload(f"workloads/gpu/{wl}.yaml", kinds, targets, gpu=True)
        cfg, ckpt = resolve_source(spec.model)
        with tempfile.TemporaryDirectory() as tmp:
            calls = kinds[spec.kind].calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, Path(tmp),
                                                           random.Random(spec.seed)))
            before = set(s.graphs._graphs)
            for _ in range(3):
                s.predict([calls[0].request])
        for key in set(s.graphs._graphs) - before:
            g = s.graphs._graphs[key]
            name = f"{wl} {key[0]}"
            out[name] = measure({"g": [g.graph]}, reps=60)["g"]
            try:
                out[name]["nodes"] = node_types(g.graph)
            except Exception as exc:  # noqa: BLE001 (a lab: say why)
                out[name]["nodes"] = f"{type(exc).__name__}: {exc}"[:200]
            print(name, out[name], flush=True)
    return out


if __name__ == "__main__":
    pool = torch.cuda.graph_pool_handle()
    res = {"gpu": torch.cuda.get_device_name(0), "synthetic": synthetic(pool), "real": real(pool)}
    json.dump(res, open(sys.argv[1], "w"), indent=1)
