"""Scratch (session 44): the landed four-rows unfilter (warps() a thread a row group's channel)
against libspng on every case of s43/unfilter_rows4.py, and its µs a launch at 4, 8, 16 and 32 warps
beside the kernel before (one row a thread), five interleaved medians of do_bench.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s44/unfilter_warps.py OUT.json"""
import importlib.util, json, statistics, sys
import numpy as np
import triton
from triton.testing import do_bench

import dohnuts.ops._unfilter_kernel as kern

spec = importlib.util.spec_from_file_location("rows4", "benchmarks/maintainers/s43/unfilter_rows4.py")
lab = importlib.util.module_from_spec(spec); spec.loader.exec_module(lab)
res = {"equal": {}, "us": {}, "warps": {}}
sizes = [(1, 9), (1, 1), (5, 7), (33, 40), (447, 449), (449, 447), (448, 448), (1024, 1024), (768, 1024)]
for what, f, want in lab.cases(sizes, "cuda"):
    key = "x".join(map(str, what))
    res["equal"][key] = bool(np.array_equal(kern.unfilter_triton(f, what[0], what[1]).cpu().numpy(), want))
    res["warps"][key] = kern.warps(what[0])
    if what[0] >= 448 and what[2] == "mixed":
        fns = {"before": lambda: lab.unfilter_triton(f, what[0], what[1]),
               "landed": lambda: kern.unfilter_triton(f, what[0], what[1])}
        for wp in (4, 8, 16, 32):
            fns[f"w{wp}"] = (lambda wp=wp: lab.unfilter4(f, what[0], what[1], wp))
        t = {n: [] for n in fns}
        for _ in range(5):
            for n, fn in fns.items():
                t[n].append(do_bench(fn, warmup=5, rep=40) * 1e3)
        res["us"][key] = {n: round(statistics.median(v), 1) for n, v in t.items()}
        print(what, "warps()", kern.warps(what[0]), res["us"][key], flush=True)
print("all equal:", all(res["equal"].values()), [k for k, v in res["equal"].items() if not v])
json.dump(res, open(sys.argv[1], "w"), indent=1)
