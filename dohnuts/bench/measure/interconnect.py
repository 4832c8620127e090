"""The interconnect's measured ceiling: the all-reduce bus bandwidth of a world of processes,
measured by rank 0 of a launched multi-process workload (dohnuts.bench.measure.worker) before it measures."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from dohnuts.bench.analysis.quantiles import quantile
from dohnuts.runtime.collectives import collective_device
from dohnuts.runtime.process_group import World


def allreduce_busbw(world: World, nbytes: int = 64 << 20, repeat: int = 10) -> dict | None:
    """The all-reduce bus bandwidth of this world (nccl-tests' busbw: algbw · 2(n−1)/n, bytes a
    rank sends per second), measured on a FP32 buffer of `nbytes` after 3 warm-up calls: the
    interconnect's measured ceiling. Every rank must call it; rank 0 gets the entry, others None."""
    if not world.distributed:
        return None

    dev = collective_device()
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    for _ in range(3):
        dist.all_reduce(x)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    t = quantile(times, 0.5)  # the median (dohnuts.bench.analysis.quantiles)
    n = world.size
    busbw = nbytes / t * 2 * (n - 1) / n
    if not world.is_main:
        return None
    return {"value": busbw, "kind": "bandwidth", "processes": n, "backend": dist.get_backend(),
            "method": f"all_reduce of {nbytes >> 20} MiB FP32 over {n} processes ({dist.get_backend()}), median of "
                      f"{repeat}, bus bandwidth = bytes · 2(n−1)/n / time",
            "date": datetime.date.today().isoformat()}
