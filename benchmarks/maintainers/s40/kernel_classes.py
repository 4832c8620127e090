"""Session 38 scratch (session 40 copy): a profiled run's Chrome trace (`dohnuts-bench run --profile`) → device time
per kernel class inside each stage's range (median-free: the mean over the profiled calls).

    python benchmarks/maintainers/s40/kernel_classes.py TRACE.json.gz [STAGE ...]

cuBLAS GEMMs (nvjet) are split by tile: at most 64 rows or 32 columns a tile, or split-K, are the
skinny GEMMs of LoRA's rank-r products; the rest are the projections."""

import collections
import gzip
import json
import re
import sys


def kind(name: str) -> str:
    if name.startswith("nvjet") or "splitKreduce" in name:
        m = re.search(r"tss?_(\d+)x(\d+)", name)
        small = "splitK" in name or (m is not None and (int(m.group(1)) <= 64 or int(m.group(2)) <= 32))
        return "GEMMs, skinny tiles (LoRA rank-r)" if small else "GEMMs (cuBLAS)"
    return name[:60]


def main(path: str, stages: list[str]) -> None:
    ev = json.load(gzip.open(path))["traceEvents"]
    ranges = [e for e in ev if e.get("cat") == "gpu_user_annotation"]
    kernels = [e for e in ev if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    names = stages or sorted({r["name"] for r in ranges if r["name"].startswith("dohnuts:")})
    for stage in names:
        rs = [r for r in ranges if r["name"] == stage]
        tot, cnt = collections.Counter(), collections.Counter()
        for r in rs:
            for k in kernels:
                if r["ts"] <= k["ts"] < r["ts"] + r["dur"]:
                    tot[kind(k["name"])] += k["dur"]
                    cnt[kind(k["name"])] += 1
        calls = sum(r["name"].startswith("dohnuts call ") for r in ranges)  # a profiled call's range
        n = calls or max(len(rs), 1)
        print(f"== {stage}: range {sum(r['dur'] for r in rs) / n / 1e3:.2f} ms a call, kernels "
              f"{sum(tot.values()) / n / 1e3:.2f} ms ({sum(cnt.values()) // n} launches), {len(rs)} ranges")
        for c, t in tot.most_common(24):
            print(f"  {t / n / 1e3:8.3f} ms {cnt[c] // n:5d}  {c}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])


def sequence(path: str, stage: str, count: int) -> None:
    """The first `count` kernels of the stage's first range, in order: start (µs from the range's
    start), duration, grid, name."""
    ev = json.load(gzip.open(path))["traceEvents"]
    r = min((e for e in ev if e.get("cat") == "gpu_user_annotation" and e["name"] == stage), key=lambda e: e["ts"])
    ks = sorted((k for k in ev if k.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
                 and r["ts"] <= k["ts"] < r["ts"] + r["dur"]), key=lambda k: k["ts"])
    print(f"== {stage}: the first {count} of {len(ks)} kernels of its first range ({r['dur']:.1f} µs)")
    for k in ks[:count]:
        print(f"  {k['ts'] - r['ts']:9.1f} {k['dur']:7.1f}  {str(k['args'].get('grid')):14s} {k['name'][:70]}")
