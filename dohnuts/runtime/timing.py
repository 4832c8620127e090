"""GPU and host timing: the one timer of the project, shared by the runtime, the harness and the
microbenchmarks (every CUDA timing event the project records is recorded here).

`StageTimer.stage(name)` brackets a piece of one call. On a CUDA device each stage records a
pair of CUDA events on the current stream (device time, read after the call with one
synchronisation) and always a host perf_counter interval (host time). On the CPU only the host
clock exists. Production code receives `NULL_TIMER`, whose stages cost nothing.

A stage may be entered several times in one call (e.g. one `h2d` per microbatch): its times add.

The timer also measures its own cost: the host time each `stage()` spends outside the interval it
reports (creating and recording the CUDA events, the clock reads, its bookkeeping) is added to
`overhead_ms`, and `entries` counts the stages entered. What it cannot see from inside — the
context manager's own enter/exit machinery — is what `empty_stage_cost()` measures from outside.

With `ranges=True` (`dohnuts-bench run --profile`) each stage is also a named range in a profiler
trace: a torch.profiler `record_function` ("dohnuts:<stage>") and, on a CUDA device, an NVTX range
of the same name (what Nsight Systems shows). Measured calls carry none of those.

With `nvtx=NvtxRanges(...)` (`dohnuts-bench run --nvtx`) each stage of a measured call is an NVTX
range named after the stage in the NVTX domain `dohnuts` (NVIDIA's `nvtx` package), pushed before
the stage's start event and popped after its end event: its cost falls inside the timer's
`overhead_ms`, and `empty_stage_cost(device, nvtx=...)` calibrates a stage with its range.

Microbenchmarks (the measured ceilings, benchmarks/*.py) time whole callables with the same timer:
`device_times_ms(fn)` for a burst of calls, `StageTimer.device_ms_each(name)` for every entry of a
stage run back to back.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class StageTime:
    host_ms: float = 0.0
    device_ms: float | None = None
    count: int = 0


class _NullTimer:
    @contextmanager
    def stage(self, name: str):
        yield


NULL_TIMER = _NullTimer()


_EVENT_POOLS: dict[int, list[tuple]] = {}  # CUDA device index → (start, end) timing events, reused across timers
_EVENT_POOL_MAX = 512


def _event_pair() -> tuple:
    """A (start, end) pair of timing events for the current CUDA device: a used pair from its pool
    when there is one (creating two CUDA events each stage is host time inside the measured call),
    else new ones."""
    try:
        return _EVENT_POOLS.setdefault(torch.cuda.current_device(), []).pop()  # atomic under the GIL
    except IndexError:
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


class _NamedRange:
    """A profiler range (record_function, and NVTX on CUDA) open until `close()`."""

    def __init__(self, name: str, nvtx: bool):
        self._fn = torch.profiler.record_function(name)
        self._fn.__enter__()
        self._nvtx = nvtx
        if nvtx:
            torch.cuda.nvtx.range_push(name)

    def close(self) -> None:
        if self._nvtx:
            torch.cuda.nvtx.range_pop()
        self._fn.__exit__(None, None, None)


NVTX_DOMAIN = "dohnuts"  # the NVTX domain of the stage ranges of `--nvtx` (Nsight Systems groups ranges by domain)


class NvtxRanges:
    """Stage ranges in the NVTX domain `dohnuts`, through NVIDIA's `nvtx` module (passed in: the
    caller imports it and says what to do when it is missing). Without a tool attached (Nsight
    Systems) nvtx's calls return at once."""

    def __init__(self, nvtx_module):
        self._nvtx = nvtx_module

    def push(self, name: str) -> None:
        self._nvtx.push_range(name, domain=NVTX_DOMAIN)

    def pop(self) -> None:
        self._nvtx.pop_range(domain=NVTX_DOMAIN)


@dataclass
class StageTimer:
    device: torch.device
    ranges: bool = False  # also a named profiler range a stage (profiled calls only)
    nvtx: NvtxRanges | None = None  # also an NVTX range a stage in the domain `dohnuts` (`run --nvtx`)
    _events: dict[str, list[tuple]] = field(default_factory=dict)
    _host: dict[str, StageTime] = field(default_factory=dict)
    _device_ms: dict[str, float] = field(default_factory=dict)  # stage device times already read back
    _overhead_s: float = 0.0  # host seconds the timer spent on itself (outside the stage intervals)
    entries: int = 0  # stages entered

    @contextmanager
    def stage(self, name: str):
        o0 = time.perf_counter()
        use_cuda = self.device.type == "cuda"
        named = _NamedRange(f"dohnuts:{name}", use_cuda) if self.ranges else None
        if self.nvtx is not None:
            self.nvtx.push(name)
        if use_cuda:
            start, end = _event_pair()
            start.record()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            if use_cuda:
                end.record()
                self._events.setdefault(name, []).append((start, end))
            if self.nvtx is not None:
                self.nvtx.pop()
            if named is not None:
                named.close()
            st = self._host.setdefault(name, StageTime())
            st.host_ms += (t1 - t0) * 1e3
            st.count += 1
            self.entries += 1
            self._overhead_s += (t0 - o0) + (time.perf_counter() - t1)

    @property
    def overhead_ms(self) -> float:
        """Host milliseconds the timer itself spent in its stages, outside the intervals it reports
        (event creation and recording, clock reads, bookkeeping), summed over every stage entered."""
        return self._overhead_s * 1e3

    def result(self) -> dict[str, StageTime]:
        """Per-stage times, in the order stages were first entered (synchronises the device). The
        events, once read, go back to the pool; a stage entered again later adds to its time."""
        if self._events:
            torch.cuda.synchronize(self.device)
        out = {}
        for name, st in self._host.items():
            dev = self._device_ms.get(name)
            if name in self._events:
                dev = (dev or 0.0) + sum(s.elapsed_time(e) for s, e in self._events[name])
                self._device_ms[name] = dev
            out[name] = StageTime(host_ms=st.host_ms, device_ms=dev, count=st.count)
        if self._events:
            pool = _EVENT_POOLS.setdefault(torch.cuda.current_device(), [])
            for pairs in self._events.values():
                if len(pool) < _EVENT_POOL_MAX:
                    pool.extend(pairs)
            self._events.clear()
        return out

    def device_ms_each(self, name: str) -> list[float]:
        """The device time of every entry of stage `name`, in order (CUDA; synchronises the device),
        where `result` gives their sum: for microbenchmarks that run one stage back to back. Read
        it before `result`, which hands the events back to the pool."""
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) for s, e in self._events.get(name, ())]


def device_times_ms(fn, warmup: int = 3, repeat: int = 10, device: torch.device | None = None) -> list[float]:
    """Device milliseconds of `repeat` calls of `fn` after `warmup` calls, each call timed alone (a
    stage of its own timer, read back before the next call starts) on `device` (default: the
    current CUDA device)."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeat):
        timer = StageTimer(device)
        with timer.stage("call"):
            fn()
        times.append(timer.result()["call"].device_ms)
    return times


def empty_stage_cost(device: torch.device, n: int = 200, warmup: int = 20, batches: int = 5,
                     nvtx: NvtxRanges | None = None) -> dict:
    """What one stage entered and left with no work costs on `device` (calibration), with its NVTX
    range when `nvtx` is given (the stages of `run --nvtx`'s measured calls; the result then says
`"nvtx": True`).

    `host_ms`: the median, over `batches` batches of `n` empty stages, of the host time per stage
    seen from outside (the context manager included); `accounted_ms`: the part of it the timer's
    own `overhead_ms` sees; `unaccounted_ms` = the difference (≥ 0), the per-stage cost no timer
    can measure about itself; `device_ms` (CUDA): the median device time between an empty stage's
    events, the floor of every stage's device time.
    """
    timer = StageTimer(device, nvtx=nvtx)
    for _ in range(warmup):
        with timer.stage("empty"):
            pass
    per_stage, accounted = [], []
    for _ in range(batches):
        timer = StageTimer(device, nvtx=nvtx)
        t0 = time.perf_counter()
        for _ in range(n):
            with timer.stage("empty"):
                pass
        t1 = time.perf_counter()
        per_stage.append((t1 - t0) * 1e3 / n)
        accounted.append(timer.overhead_ms / n)
    host = statistics.median(per_stage)
    acc = statistics.median(accounted)
    out = {"host_ms": host, "accounted_ms": acc, "unaccounted_ms": max(0.0, host - acc), "device_ms": None,
           "stages": n * batches}
    if nvtx is not None:
        out["nvtx"] = True
    if device.type == "cuda":
        out["device_ms"] = statistics.median(timer.device_ms_each("empty"))
    return out
