"""Measured ceilings: what this device really sustains on the simplest possible work.

A large BF16 matmul (8192³, random data — never zeros) and a large device-to-device copy
(bytes read + written), and pinned host↔device copies, each timed with CUDA events after
warm-up, median of several runs. These are recorded beside the datasheet ceilings; they are
microbenchmarks, not API throughput.
"""

from __future__ import annotations

import statistics
import time

import torch

from dohnuts.bench.cudatime import cuda_times_ms


def _time_ms(fn) -> float:
    return statistics.median(cuda_times_ms(fn, warmup=3, repeat=10))


def measure_ceilings(device: torch.device, n: int = 8192, copy_bytes: int = 2 << 30) -> dict:
    date = time.strftime("%Y-%m-%d")
    out = {}
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    ms = _time_ms(lambda: a @ b)
    out["bf16_matmul"] = {"value": 2 * n ** 3 / (ms / 1e3), "unit": "FLOP/s", "kind": "compute",
                          "method": f"torch.matmul bf16 {n}x{n}x{n}, random normal, median of 10 CUDA-event timings",
                          "date": date}
    del a, b
    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device).normal_(generator=gen)
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src))
    out["device_copy"] = {"value": 2 * copy_bytes / (ms / 1e3), "unit": "B/s", "kind": "bandwidth",
                          "method": f"{copy_bytes >> 20} MiB device-to-device copy, bytes read + written", "date": date}
    del src, dst
    host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    ms = _time_ms(lambda: dev.copy_(host, non_blocking=True))
    out["h2d_pinned"] = {"value": (256 << 20) / (ms / 1e3), "unit": "B/s", "kind": "bandwidth",
                         "method": "256 MiB pinned host-to-device copy", "date": date}
    ms = _time_ms(lambda: host.copy_(dev, non_blocking=True))
    out["d2h_pinned"] = {"value": (256 << 20) / (ms / 1e3), "unit": "B/s", "kind": "bandwidth",
                         "method": "256 MiB device-to-pinned-host copy", "date": date}
    del host, dev
    torch.cuda.empty_cache()
    return out
