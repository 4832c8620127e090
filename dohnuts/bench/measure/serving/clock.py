"""The clocks a server loop runs on: the real one, and a simulated one for exact arithmetic.

A server loop only reads the time (`now`) and waits for the next arrival (`sleep_until`). On the
real clock that is `time.perf_counter` and `time.sleep`; a request's latency is counted from its
*scheduled* arrival, so a late wake-up is charged to the server, never hidden (LoadGen's rule:
no coordinated omission). The simulated clock moves only when told: a fake target advances it by
its service time, and the queueing arithmetic of a run is then exact and independent of how busy
the machine is (the tests' M/D/1 checks).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock."""

    def sleep_until(self, t: float) -> None:
        """Return at (or after) time `t` on this clock."""


class MonotonicClock:
    """The host's monotonic clock (time.perf_counter), the one the stage timers use."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, t: float) -> None:
        wait = t - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


class SimulatedClock:
    """A clock that moves only by `advance` and `sleep_until` (tests; a fake target's service)."""

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def sleep_until(self, t: float) -> None:
        self.t = max(self.t, float(t))

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self.t += seconds
