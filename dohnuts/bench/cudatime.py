"""CUDA-event timing of a callable after warm-up (the one way the project times GPU work)."""

from __future__ import annotations

import torch


def cuda_times_ms(fn, warmup: int = 3, repeat: int = 10) -> list[float]:
    """Device milliseconds of `repeat` calls of `fn`, each bracketed by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times
