"""Measured ceilings: what this device really sustains on the simplest possible work.

GPU: a large BF16 matmul (8192³, random data — never zeros), a large device-to-device copy
(bytes read + written), pinned host↔device copies, an FP32 element-wise multiply-add over 256 MiB
(memory-bound: recorded, bounds nothing) and FP32 multiply-add chains in registers (`fp32_fma`,
the vector ceiling; where the fused kernels run), each
timed with CUDA events (dohnuts.runtime.timing) after warm-up, median of several runs (a burst of
tens of milliseconds).
The matmul is also run back to back for `sustain_s` seconds (`bf16_matmul_sustained`, the median
of the second half): a GPU that holds a power limit lowers its clock under sustained dense work,
which a burst never shows (docs/known-issues.md KI-15); it bounds the `sustained`
basis (dohnuts.bench.analysis.hwspec). CPU: an FP32 and a BF16 matmul
(1024³), an FP32 multiply-add over a cache-resident vector, and a large memory copy, timed with
the host clock on the run's threads; the value is the fastest of 7 repeats, since on a shared
machine the slower repeats measure the other processes, and a bound must stay optimistic. These
are recorded beside the datasheet ceilings — and are the only ceilings of a device no hwspec
describes (the CPU, an unknown GPU). They are microbenchmarks, not API throughput.

Stability: every entry keeps its repeats' rates (`repeat_values`) and `spread` = (fastest −
slowest) / fastest; a ceiling whose repeats moved by more than `STABLE_SPREAD` is `stable: false`,
and the report says so beside the bounds it sets (dohnuts.bench.analysis.machine). Each ceiling is
logged as it is measured (dohnuts.bench.report.status): the measurement is never silent.
"""

from __future__ import annotations

import statistics
import time

import torch

from dohnuts.bench.report.status import log
from dohnuts.ops import kernel_status
from dohnuts.ops.fma import fma_chain_flops, fma_chain_fused
from dohnuts.runtime.timing import StageTimer, device_times_ms

STABLE_SPREAD = 0.2  # (fastest − slowest) / fastest over a ceiling's repeats above this: not stable


def stability(rates: list[float]) -> dict:
    """`repeat_values`, `spread` and `stable` of a ceiling from the rate each repeat reached."""
    best = max(rates)
    spread = (best - min(rates)) / best if best > 0 else 0.0
    return {"repeat_values": [float(r) for r in rates], "spread": spread, "stable": spread <= STABLE_SPREAD}


def _said(key: str, entry: dict) -> dict:
    """Log a ceiling as soon as it is measured (feedback while the ceilings are measured)."""
    moved = "" if entry.get("stable", True) else " — NOT STABLE"
    log.info("ceiling %s: %.3g %s (%d repeats, spread %.0f %%%s)", key, entry["value"], entry["unit"],
             len(entry.get("repeat_values", ())), 100 * entry.get("spread", 0.0), moved)
    return entry


def _time_ms(fn) -> tuple[float, list[float]]:
    """Median of 10 CUDA-event timings, and the timings."""
    times = device_times_ms(fn, warmup=3, repeat=10)
    return statistics.median(times), times


def sustained_ms(fn, seconds: float) -> float:
    """Median device time of `fn` over the second half of `seconds` of back-to-back calls."""
    timer = StageTimer(torch.device("cuda", torch.cuda.current_device()))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        with timer.stage("call"):
            fn()
        calls += 1
        if calls % 32 == 0:
            torch.cuda.synchronize()  # keep the host no more than 32 calls ahead of the device
    times = timer.device_ms_each("call")
    return statistics.median(times[len(times) // 2:])


def measure_ceilings(device: torch.device, n: int = 8192, copy_bytes: int = 2 << 30, sustain_s: float = 2.0) -> dict:
    date = time.strftime("%Y-%m-%d")
    out = {}
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    ms, times = _time_ms(lambda: a @ b)
    out["bf16_matmul"] = _said("bf16_matmul", {
        "value": 2 * n ** 3 / (ms / 1e3), "unit": "FLOP/s", "kind": "compute",
        "method": f"torch.matmul bf16 {n}x{n}x{n}, random normal, median of 10 CUDA-event timings", "date": date,
        **stability([2 * n ** 3 / (t / 1e3) for t in times])})
    if sustain_s > 0:
        ms = sustained_ms(lambda: a @ b, sustain_s)
        out["bf16_matmul_sustained"] = _said("bf16_matmul_sustained", {
            "value": 2 * n ** 3 / (ms / 1e3), "unit": "FLOP/s", "kind": "compute", "date": date,
            "method": f"torch.matmul bf16 {n}x{n}x{n} back to back for {sustain_s:g} s, median of the second half "
                      "(the clock a power limit holds under sustained dense work)"})
    del a, b
    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device).normal_(generator=gen)
    dst = torch.empty_like(src)
    ms, times = _time_ms(lambda: dst.copy_(src))
    out["device_copy"] = _said("device_copy", {
        "value": 2 * copy_bytes / (ms / 1e3), "unit": "B/s", "kind": "bandwidth",
        "method": f"{copy_bytes >> 20} MiB device-to-device copy, bytes read + written", "date": date,
        **stability([2 * copy_bytes / (t / 1e3) for t in times])})
    del src, dst
    host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    ms, times = _time_ms(lambda: dev.copy_(host, non_blocking=True))
    out["h2d_pinned"] = _said("h2d_pinned", {
        "value": (256 << 20) / (ms / 1e3), "unit": "B/s", "kind": "bandwidth",
        "method": "256 MiB pinned host-to-device copy", "date": date,
        **stability([(256 << 20) / (t / 1e3) for t in times])})
    ms, times = _time_ms(lambda: host.copy_(dev, non_blocking=True))
    out["d2h_pinned"] = _said("d2h_pinned", {
        "value": (256 << 20) / (ms / 1e3), "unit": "B/s", "kind": "bandwidth",
        "method": "256 MiB device-to-pinned-host copy", "date": date,
        **stability([(256 << 20) / (t / 1e3) for t in times])})
    del host, dev
    x = torch.randn(1 << 26, device=device, generator=gen)  # 256 MiB: a multiply-add per element
    y, z = torch.randn_like(x), torch.empty_like(x)
    ms, times = _time_ms(lambda: torch.addcmul(x, x, y, out=z))
    out["fp32_vector"] = _said("fp32_vector", {
        "value": 2 * x.numel() / (ms / 1e3), "unit": "FLOP/s", "kind": "compute",
        "method": "fp32 addcmul over 2^26 elements (2 FLOP each; memory-bound on most GPUs)", "date": date,
        **stability([2 * x.numel() / (t / 1e3) for t in times])})
    del y, z
    fma = fp32_fma(x[: 1 << 24])
    if fma is not None:
        out["fp32_fma"] = dict(fma, date=date)
    del x
    torch.cuda.empty_cache()
    return out


def fp32_fma(x: torch.Tensor, iters: int = 256) -> dict | None:
    """The FP32 vector ceiling: `iters` × 4 independent multiply-add chains per element of `x`, in
    registers (dohnuts.ops.fma: 8 · iters FLOPs per 8 bytes, compute-bound). None where the device
    does not run the fused kernels (its reference would time torch's memory-bound steps instead)."""
    if kernel_status(x.device) != "fused":
        return None
    ms, _ = _time_ms(lambda: fma_chain_fused(x, iters))
    return {"value": fma_chain_flops(x.numel(), iters) / (ms / 1e3), "unit": "FLOP/s", "kind": "compute",
            "method": f"Triton kernel: 4 independent fp32 FMA chains × {iters} steps per element, {x.numel()} "
                      "elements, in registers (dohnuts.ops.fma), median of 10 CUDA-event timings"}


def _host_times_ms(fn, warmup: int = 2, repeat: int = 7) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def _cpu_entry(key: str, work: float, times_ms: list[float], unit: str, kind: str, method: str, date: str) -> dict:
    """A CPU ceiling: the fastest repeat's rate (module docstring), with its stability."""
    rates = [work / (t / 1e3) for t in times_ms]
    return _said(key, {"value": max(rates), "unit": unit, "kind": kind, "method": method, "date": date,
                       **stability(rates)})


def measure_cpu_ceilings(n: int = 1024, copy_bytes: int = 64 << 20, vector: int = 1 << 18) -> dict:
    """The CPU's ceilings with the threads torch uses (a few seconds on a 2-core machine). The copy
    is 64 MiB each way: beyond the last-level cache of the machines this runs on (32 MiB on the
    2-core CI machine's EPYC), a quarter of the time of the 256 MiB it was."""
    date = time.strftime("%Y-%m-%d")
    threads = torch.get_num_threads()
    out = {}
    gen = torch.Generator().manual_seed(0)
    for dtype, key in ((torch.float32, "fp32_matmul"), (torch.bfloat16, "bf16_matmul")):
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        out[key] = _cpu_entry(key, 2 * n ** 3, _host_times_ms(lambda: a @ b), "FLOP/s", "compute",
                              f"torch.matmul {str(dtype).removeprefix('torch.')} {n}x{n}x{n} on {threads} threads, "
                              "random normal, fastest of 7", date)
    x = torch.randn(vector, generator=gen)  # 1 MiB: stays in cache, so this is arithmetic, not memory
    y, z = torch.randn_like(x), torch.empty_like(x)

    def fma():
        for _ in range(64):
            torch.addcmul(x, x, y, out=z)

    out["fp32_vector"] = _cpu_entry("fp32_vector", 64 * 2 * vector, _host_times_ms(fma), "FLOP/s", "compute",
                                    f"64 × fp32 addcmul over {vector} cache-resident elements on {threads} threads, "
                                    "fastest of 7", date)
    src = torch.empty(copy_bytes, dtype=torch.uint8).random_(generator=gen)
    dst = torch.empty_like(src)
    out["device_copy"] = _cpu_entry("device_copy", 2 * copy_bytes, _host_times_ms(lambda: dst.copy_(src)), "B/s",
                                    "bandwidth", f"{copy_bytes >> 20} MiB memory copy, bytes read + written, "
                                    "fastest of 7", date)
    # No host link on a CPU: a "transfer" is a copy in the same memory (the h2d stage moves nothing).
    out["host_copy"] = dict(out["device_copy"], method=out["device_copy"]["method"] + " (stands for the host link)")
    return out
