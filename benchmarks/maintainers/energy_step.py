"""How often the GPU's energy counter advances: the harness's energy window lasts 1.5 s so that one
step of the counter is at most ≈ 7 % of it at 100 ms steps (dohnuts.bench.measure.call.energy_window,
docs/measurement.md). A counter that steps faster would allow a shorter window at the same bound, and
the windows are a visible part of a fresh standard suite (docs/known-issues.md KI-20). This measures the step
on the machine at hand, through the harness's own sampler (NVML on NVIDIA, amdsmi on AMD): the counter
read back to back for `--seconds`, idle and then under back-to-back matmuls, and the intervals between
its changes.

    python benchmarks/maintainers/energy_step.py [--seconds 1.0] [--out energy_step.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def intervals(counter, seconds: float, work=None) -> dict:
    """Read `counter` back to back for `seconds` (running `work` between reads if given): the reads,
    the changes, and the intervals between changes (ms)."""
    changes, reads, last = [], 0, counter()
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        if work is not None:
            work()
        value = counter()
        reads += 1
        if value != last:
            changes.append(time.perf_counter())
            last = value
    gaps = [(b - a) * 1e3 for a, b in zip(changes, changes[1:])]
    return {"reads": reads, "changes": len(changes),
            "interval_ms": {"median": round(statistics.median(gaps), 2), "min": round(min(gaps), 2),
                            "max": round(max(gaps), 2)} if gaps else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--out", default="energy_step.json")
    a = p.parse_args(argv)
    import torch

    from dohnuts.bench.plugins import plugin_manager

    sampler = plugin_manager().get_plugin("telemetry").own_gpu_sampler()
    if sampler.unavailable:
        print(f"no GPU sampler: {sampler.unavailable}")
        return 1
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def busy():
        torch.mm(x, x)
        torch.cuda.synchronize()

    out = {"idle": intervals(sampler.energy_counter, a.seconds),
           "busy": intervals(sampler.energy_counter, a.seconds, busy)}
    print(json.dumps(out))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
