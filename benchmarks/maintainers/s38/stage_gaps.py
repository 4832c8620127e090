"""Session 38 scratch: each range of a stage in a profiled run's Chrome trace → its device time,
the kernels' busy time inside it, the idle before its first kernel, after its last, and between
kernels (the largest gaps with the kernels around them).

    python benchmarks/maintainers/s38/stage_gaps.py TRACE.json.gz dohnuts:vision [dohnuts:shared ...]"""

import gzip
import json
import sys


def main(path: str, stages: list[str]) -> None:
    ev = json.load(gzip.open(path))["traceEvents"]
    ranges = sorted((e for e in ev if e.get("cat") == "gpu_user_annotation"), key=lambda e: e["ts"])
    kernels = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")), key=lambda e: e["ts"])
    for stage in stages:
        for r in (r for r in ranges if r["name"] == stage):
            t0, t1 = r["ts"], r["ts"] + r["dur"]
            ks = [k for k in kernels if t0 <= k["ts"] < t1]
            if not ks:
                print(f"{stage}: {r['dur']:.1f} us, no kernels")
                continue
            busy = sum(min(k["ts"] + k["dur"], t1) - k["ts"] for k in ks)
            gaps = [(ks[i + 1]["ts"] - (ks[i]["ts"] + ks[i]["dur"]), ks[i]["name"][:40], ks[i + 1]["name"][:40])
                    for i in range(len(ks) - 1)]
            inner = sum(max(g, 0) for g, _, _ in gaps)
            print(f"{stage}: {r['dur']:.1f} us, {len(ks)} kernels busy {busy:.1f}, before the first "
                  f"{ks[0]['ts'] - t0:.1f} ({ks[0]['name'][:40]}), after the last {t1 - ks[-1]['ts'] - ks[-1]['dur']:.1f}, "
                  f"between {inner:.1f}")
            for g, a, b in sorted(gaps, reverse=True)[:4]:
                print(f"    gap {g:6.1f} us after {a} before {b}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
