"""Scratch (session 43): a cold image's `Session.prepare` (prepare_cost.py on image-cache-cold-2b) with
today's unfilter kernel and the two of unfilter_rows4.py (four rows a thread; four rows by two
columns), interleaved, two rounds of 60 calls on one lease.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s43/prepare_ab.py"""
import importlib.util, sys
sys.path.insert(0, "benchmarks/maintainers")
import prepare_cost
import dohnuts.ops._unfilter_kernel as kern

spec = importlib.util.spec_from_file_location("rows4", "benchmarks/maintainers/s43/unfilter_rows4.py")
lab = importlib.util.module_from_spec(spec); spec.loader.exec_module(lab)
variants = {"one row a thread (before)": lab.unfilter_triton, "rows4 (landed)": kern.unfilter_triton, "rows4cols2": lab.unfilter42}
for rnd in range(2):
    for name, unf in variants.items():
        kern.unfilter_triton = unf
        print(f"round {rnd} | {name}", flush=True)
        prepare_cost.main(["--workload", "workloads/gpu/image-cache-cold-2b.yaml", "--calls", "60"])
