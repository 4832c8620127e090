"""Scratch (session 44): a cold image's `Session.prepare` (prepare_cost.py on image-cache-cold-2b)
with the unfilter before (one row a thread), landed (four rows a thread, warps()) and four rows at 8
warps, interleaved, three rounds of 60 calls on one lease.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s44/prepare_ab.py"""
import importlib.util, sys
sys.path.insert(0, "benchmarks/maintainers")
import prepare_cost
import dohnuts.ops._unfilter_kernel as kern

spec = importlib.util.spec_from_file_location("rows4", "benchmarks/maintainers/s43/unfilter_rows4.py")
lab = importlib.util.module_from_spec(spec); spec.loader.exec_module(lab)
landed = kern.unfilter_triton
variants = {"before": lab.unfilter_triton, "landed": landed,
            "w8": lambda f, h, w: lab.unfilter4(f, h, w, 8)}
for rnd in range(3):
    for name, unf in variants.items():
        kern.unfilter_triton = unf
        print(f"round {rnd} | {name}", flush=True)
        prepare_cost.main(["--workload", "workloads/gpu/image-cache-cold-2b.yaml", "--calls", "60"])
