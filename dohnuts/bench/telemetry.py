"""Background telemetry: samplers polled by one thread while a run measures.

A `Sampler` has a `name`, an `unavailable` reason (None when it works) and `sample()` → dict.
The runner calls every available sampler every `interval_s` and attaches to each call record the
samples taken during that call (at least the one nearest its end), so short calls still carry
clocks, power and temperature.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


class Sampler:
    name = "sampler"
    unavailable: str | None = None

    def sample(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class TelemetryThread:
    samplers: list
    interval_s: float = 0.1
    _samples: list = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _poll_once(self) -> None:
        t = time.perf_counter()
        row = {"t": t}
        for s in self.samplers:
            try:
                row[s.name] = s.sample()
            except Exception as exc:  # a flaky sensor must not end a measurement
                row[s.name] = {"error": str(exc)}
        with self._lock:
            self._samples.append(row)
            if len(self._samples) > 100_000:
                del self._samples[: len(self._samples) // 2]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll_once()

    def start(self) -> None:
        if self.samplers and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dohnuts-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def window(self, t0: float, t1: float, limit: int = 8) -> list[dict]:
        """Samples taken in [t0, t1] (perf_counter), at most `limit`; a fresh one if none."""
        if not self.samplers:
            return []
        with self._lock:
            rows = [r for r in self._samples if t0 <= r["t"] <= t1]
        if not rows:
            self._poll_once()
            with self._lock:
                rows = [self._samples[-1]]
        if len(rows) > limit:
            step = len(rows) / limit
            rows = [rows[int(i * step)] for i in range(limit)]
        return [{k: v for k, v in r.items() if k != "t"} | {"dt_ms": (r["t"] - t0) * 1e3} for r in rows]
