"""A load point: scheduled arrivals (or a closed loop of clients), a bounded queue, and a server
taking requests in order.

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
pipelined predictor instead (dohnuts.bench.measure.serving.pipelined), with the same `Admission`.

`deadline` (a point's `max_duration_s`): past it no further arrival is issued and the requests
still waiting are abandoned (`abandoned`: offered, never served — misses), so a point run far
past the target's capacity ends in bounded time; its report says so and the minimums decide
whether it is still valid.

`ClosedLoopAdmission` is the queue of a closed loop (dohnuts.bench.measure.serving.arrivals.ClosedLoop): the
same interface, but its arrivals unfold with the responses — each server calls `complete(request,
now)` when a response is out, and that request's client sends its next one after its think time.
Every client starts at time 0; a request's arrival is the time its client sent it (the previous
completion plus the think time, as scheduled: a late wake-up of the loop is the server's). The
queue never holds more than the N clients' requests, so nothing is refused. `admission(arrivals,
capacity, deadline)` gives the one a server needs: a list of times (open) or a `ClosedLoop`.

Times in a `ServedRequest` are seconds on the server's clock since the point started.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dohnuts.bench.measure.serving.arrivals import MAX_ARRIVALS, ClosedLoop
from dohnuts.bench.measure.serving.clock import Clock


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
    client: int | None = None  # the closed loop's client that sent it (None: an open schedule)

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

    def complete(self, req: ServedRequest, now: float) -> None:
        """`req`'s response is out at `now` (an open schedule does not depend on it)."""

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


class ClosedLoopAdmission:
    """The requests of a closed loop (module docstring), with `Admission`'s interface."""

    def __init__(self, loop: ClosedLoop, deadline: float | None = None):
        self.loop = loop
        self.deadline = deadline
        self.requests: list[ServedRequest] = []
        self.queue: deque[int] = deque()
        self.pending = {c: 0.0 for c in range(loop.clients)}  # client → when it sends its next request
        self.thinks = [loop.think_times(c) for c in range(loop.clients)]
        self.done_issuing = False  # both minimums met (or the cap): no client sends again
        self.stopped = False

    def _due(self, until: float) -> list[tuple[float, int]]:
        return sorted((t, c) for c, t in self.pending.items() if t <= until)

    def admit(self, now: float) -> None:
        until = now if self.deadline is None else min(now, self.deadline)
        for t, c in self._due(until):
            if self.done_issuing:
                break
            del self.pending[c]
            self.queue.append(len(self.requests))
            self.requests.append(ServedRequest(len(self.requests), t, client=c))
            self.done_issuing = ((len(self.requests) >= self.loop.min_requests and t >= self.loop.min_duration_s)
                                 or len(self.requests) >= MAX_ARRIVALS)
        if self.done_issuing:
            self.pending.clear()
        if self.deadline is not None and now > self.deadline:
            self.close()

    def complete(self, req: ServedRequest, now: float) -> None:
        """`req`'s client sends its next request after its think time."""
        if not self.done_issuing and req.client is not None:
            self.pending[req.client] = now + next(self.thinks[req.client])

    def close(self) -> None:
        """No client sends any more; what waits is abandoned. A loop stopped short of its minimums
        says so (`stopped`)."""
        if not self.done_issuing or self.queue:
            self.stopped = True
        self.done_issuing = True
        self.pending.clear()
        while self.queue:
            self.requests[self.queue.popleft()].outcome = "abandoned"

    def take(self, now: float) -> ServedRequest:
        req = self.requests[self.queue.popleft()]
        req.start = now
        req.outcome = "served"
        return req

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def next_arrival(self) -> float | None:
        """When the next client sends (None: none will until a response is out, or none will again)."""
        if self.done_issuing or not self.pending:
            return None
        t = min(self.pending.values())
        return None if self.deadline is not None and t > self.deadline else t


def admission(arrivals: Sequence[float] | ClosedLoop, capacity: int | None, deadline: float | None = None):
    """The queue a server takes requests from: `Admission` for a schedule of arrival times,
    `ClosedLoopAdmission` for a closed loop (where `capacity` has no part: N clients, N requests)."""
    if isinstance(arrivals, ClosedLoop):
        return ClosedLoopAdmission(arrivals, deadline)
    return Admission(arrivals, capacity, deadline)


def serve_serial(run_one: Callable[[ServedRequest], tuple[Any, float]], arrivals: Sequence[float] | ClosedLoop, *,
                 capacity: int | None, clock: Clock, deadline: float | None = None) -> list[ServedRequest]:
    """Serve `arrivals` (times, or a closed loop) one request at a time. `run_one(request)` serves
    one request and returns (its result, the seconds before completion at which its first byte
    existed — its serialization time, 0 when unknown). Returns every request of the point in
    arrival order (served, dropped or abandoned)."""
    adm = admission(arrivals, capacity, deadline)
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
            adm.complete(req, req.completion)
            continue
        nxt = adm.next_arrival
        if nxt is None:
            break
        clock.sleep_until(t0 + nxt)
    adm.close()
    return adm.requests
