"""A load point: scheduled arrivals, a bounded queue, and a server taking requests in order.

`Admission` is the queue in front of any server: at each poll it admits, in arrival order, every
request whose scheduled time has come; a request that finds `capacity` requests already waiting
is refused (`dropped`: never served, a miss of any latency objective). A server polls only when
it is free to take work, and between two polls nothing leaves the queue, so the queue length a
request finds is the one it would have found at its own arrival time: the admission is exact for
a server that takes requests at its polls (both servers here do).

`serve_serial` is the server every target has: one request at a time through `run_call`
(`run_one`), idle until the next arrival when the queue is empty — a single-server FIFO queue.
With a deterministic service time D and Poisson arrivals it is an M/D/1 queue, whose mean wait
ρ / (2μ(1 − ρ)) the tests check on the simulated clock. The dohnuts target serves through its
pipelined predictor instead (dohnuts.bench.serving.pipelined), with the same `Admission`.

`deadline` (a point's `max_duration_s`): past it no further arrival is issued and the requests
still waiting are abandoned (`abandoned`: offered, never served — misses), so a point run far
past the target's capacity ends in bounded time; its report says so and the minimums decide
whether it is still valid.

Times in a `ServedRequest` are seconds on the server's clock since the point started.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dohnuts.bench.serving.clock import Clock


@dataclass
class ServedRequest:
    """One arrival of a load point and what became of it."""

    index: int  # its place in the arrival order (request index % calls picks its call)
    arrival: float  # scheduled arrival
    start: float | None = None  # taken from the queue: its service began (None: never served)
    first_byte: float | None = None  # its result existed on the host (before serialization)
    completion: float | None = None  # its response was serialized
    outcome: str = "pending"  # served | dropped (queue full) | abandoned (past the deadline)
    result: Any = None  # what the server returned for it (a CallResult, or the pipelined row)

    @property
    def latency(self) -> float | None:
        return None if self.completion is None else self.completion - self.arrival


class Admission:
    """Arrivals into a bounded FIFO queue (module docstring). `capacity` None: unbounded;
    `deadline` None: every arrival is issued."""

    def __init__(self, arrivals: Sequence[float], capacity: int | None, deadline: float | None = None):
        if capacity is not None and capacity < 1:
            raise ValueError(f"a queue holds at least one request, got capacity {capacity}")
        self.requests = [ServedRequest(i, float(t)) for i, t in enumerate(arrivals)]
        self.capacity = capacity
        self.deadline = deadline
        self.queue: deque[int] = deque()
        self.issued = 0  # arrivals admitted or dropped so far
        self.stopped = False  # the deadline passed while requests were still due

    def admit(self, now: float) -> None:
        """Admit (or refuse) every arrival scheduled at or before `now` (and before the
        deadline), in order; past the deadline, abandon what waits and issue nothing more."""
        until = now if self.deadline is None else min(now, self.deadline)
        while self.issued < len(self.requests) and self.requests[self.issued].arrival <= until:
            req = self.requests[self.issued]
            if self.capacity is not None and len(self.queue) >= self.capacity:
                req.outcome = "dropped"
            else:
                self.queue.append(self.issued)
            self.issued += 1
        if self.deadline is not None and now > self.deadline:
            self.close()

    def close(self) -> None:
        """No arrival is issued any more: those not yet issued are removed from the point (never
        offered), those waiting are abandoned."""
        if self.issued < len(self.requests) or self.queue:
            self.stopped = True
        while self.queue:
            self.requests[self.queue.popleft()].outcome = "abandoned"
        del self.requests[self.issued:]

    def take(self, now: float) -> ServedRequest:
        """The request at the head of the queue, its service starting at `now`."""
        req = self.requests[self.queue.popleft()]
        req.start = now
        req.outcome = "served"
        return req

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def next_arrival(self) -> float | None:
        """The next arrival still to be issued (None: none is, by the schedule or the deadline)."""
        if self.issued >= len(self.requests):
            return None
        t = self.requests[self.issued].arrival
        return None if self.deadline is not None and t > self.deadline else t


def serve_serial(run_one: Callable[[ServedRequest], tuple[Any, float]], arrivals: Sequence[float], *,
                 capacity: int | None, clock: Clock, deadline: float | None = None) -> list[ServedRequest]:
    """Serve `arrivals` one request at a time. `run_one(request)` serves one request and returns
    (its result, the seconds before completion at which its first byte existed — its
    serialization time, 0 when unknown). Returns every request of the point in arrival order
    (served, dropped or abandoned)."""
    adm = Admission(arrivals, capacity, deadline)
    t0 = clock.now()
    while True:
        now = clock.now() - t0
        adm.admit(now)
        if adm.waiting:
            req = adm.take(now)
            result, serialize_s = run_one(req)
            req.completion = clock.now() - t0
            req.first_byte = max(req.start, req.completion - max(0.0, serialize_s))
            req.result = result
            continue
        nxt = adm.next_arrival
        if nxt is None:
            break
        clock.sleep_until(t0 + nxt)
    adm.close()
    return adm.requests
