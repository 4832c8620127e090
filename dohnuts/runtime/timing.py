"""Stage timing shared by the runtime and the harness.

`StageTimer.stage(name)` brackets a piece of one call. On a CUDA device each stage records a
pair of CUDA events on the current stream (device time, read after the call with one
synchronisation) and always a host perf_counter interval (host time). On the CPU only the host
clock exists. Production code receives `NULL_TIMER`, whose stages cost nothing.

A stage may be entered several times in one call (e.g. one `h2d` per microbatch): its times add.
"""

from __future__ import annotations

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


@dataclass
class StageTimer:
    device: torch.device
    _events: dict[str, list[tuple]] = field(default_factory=dict)
    _host: dict[str, StageTime] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str):
        use_cuda = self.device.type == "cuda"
        if use_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            if use_cuda:
                end.record()
                self._events.setdefault(name, []).append((start, end))
            st = self._host.setdefault(name, StageTime())
            st.host_ms += (t1 - t0) * 1e3
            st.count += 1

    def result(self) -> dict[str, StageTime]:
        """Per-stage times, in the order stages were first entered (synchronises the device)."""
        if self._events:
            torch.cuda.synchronize(self.device)
        out = {}
        for name, st in self._host.items():
            dev = None
            if name in self._events:
                dev = sum(s.elapsed_time(e) for s, e in self._events[name])
            out[name] = StageTime(host_ms=st.host_ms, device_ms=dev, count=st.count)
        return out
