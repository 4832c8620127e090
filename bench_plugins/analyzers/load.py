"""The machine's load, as telemetry: how many cores other processes kept busy.

`LoadSampler` (telemetry name `load`) reads the system's and this process's CPU time at every
poll: `others_cores` is the busy CPU time of every other process since the previous poll over
the wall time between them (0 on an idle machine, up to `cpus`), `load1` the one-minute load
average. Every record carries the samples taken during its call, so the report can say how busy
the machine was while each workload was measured (dohnuts.bench.analysis.machine), and
`dohnuts-bench analyze` can say it again from the records alone. `own_cores` is this process's
share over the same interval (1.0: one core all the time): a one-thread run that gets much less
than a core was waiting for the CPU. It is read from the process's CPU clock
(`time.process_time`, nanoseconds), not from the kernel's per-process counters in clock ticks
(10 ms): the run polls every few milliseconds, and in ticks most polls of a busy process read 0
CPU seconds, so a fast workload's median share read no core at all (docs/history/evolution.md M38).
The system's busy time exists in ticks alone, so `others_cores` stays coarse over a short poll.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

from dohnuts.bench.measure.telemetry import BUSY_FIELDS, Sampler


def _busy_s(times) -> float:
    return sum(getattr(times, f, 0.0) for f in BUSY_FIELDS)


class LoadSampler(Sampler):
    name = "load"

    def __init__(self):
        self.cpus = psutil.cpu_count() or 1
        self._lock = threading.Lock()  # polled by the telemetry thread, and at times by the run loop
        self._last = self._read()

    def _read(self) -> tuple[float, float, float]:
        return time.monotonic(), _busy_s(psutil.cpu_times()), time.process_time()

    def sample(self) -> dict:
        with self._lock:
            now = self._read()
            (t0, busy0, own0), self._last = self._last, now
        dt = now[0] - t0
        others = max(0.0, ((now[1] - busy0) - (now[2] - own0)) / dt) if dt > 0 else None
        own = (now[2] - own0) / dt if dt > 0 else None
        return {"others_cores": others, "own_cores": own, "cpus": self.cpus, "load1": os.getloadavg()[0]}


def load_before(seconds: float = 0.5) -> dict:
    """Other processes' load while this one waits `seconds`: the machine as the run found it."""
    sampler = LoadSampler()
    time.sleep(seconds)
    reading = sampler.sample()
    return {"others_cores": reading["others_cores"], "load1": reading["load1"], "cpus": reading["cpus"],
            "seconds": seconds}
