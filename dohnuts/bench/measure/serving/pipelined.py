"""The dohnuts predictor as a server: requests taken from a bounded queue into its pipeline.

The same stages as `Predictor.run` (dohnuts.runtime.predict): CPU workers prepare up to `depth`
requests ahead, the copy stream moves the next batch while the compute stream scores the current
one, and the previous result is serialized while the device works. What differs is the intake:
`Predictor.run` pulls the next request from an iterator that always has one; a server's next
request may not have arrived yet. So the loop polls an `Admission` (dohnuts.bench.measure.serving.server)
and never waits for an arrival while it holds work: with nothing to prepare it finishes the
request in flight, and only an empty pipeline sleeps until the next arrival.

Per request (seconds since the point started, the host clock): `start` when it left the queue
(its preparation was handed to a worker), `first_byte` when its scores were on the host (the
device→host copy done), `completion` when its response line was serialized.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import torch

from dohnuts.bench.measure.serving.arrivals import ClosedLoop
from dohnuts.bench.measure.serving.clock import Clock, MonotonicClock
from dohnuts.bench.measure.serving.server import ServedRequest, admission
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.requests import Request

DEPTH = 3  # requests prepared ahead, as Predictor.run keeps


def serve_pipelined(predictor: Predictor, requests: Sequence[Request], arrivals: Sequence[float] | ClosedLoop, *,
                    capacity: int | None, timer_for: Callable[[int], object], deadline: float | None = None,
                    clock: Clock | None = None, depth: int = DEPTH) -> list[ServedRequest]:
    """Serve `arrivals` (times, or a closed loop: dohnuts.bench.measure.serving.server.admission; request i
    is `requests[i % len(requests)]`) through the pipeline; every request of the point in arrival
    order. `result` of a served request: {"decisions", "work", "output"} (the RequestResult)."""
    clock = clock or MonotonicClock()
    adm = admission(arrivals, capacity, deadline)
    inflight: deque = deque()  # (request, future of its HostBatch), in order
    previous = None  # (request, host batch, host tensors, done event, work): awaiting serialization
    t0 = clock.now()

    def finish(prev) -> None:
        req, hb, host, done, work = prev
        if done is not None:
            done.synchronize()
        req.first_byte = clock.now() - t0
        result = Predictor.serialize(hb, host, None)
        result.to_json()
        req.completion = clock.now() - t0
        req.result = {"decisions": len(result.questions), "work": work, "output": result}
        adm.complete(req, req.completion)  # a closed loop's client sends its next request

    while True:
        now = clock.now() - t0
        adm.admit(now)
        while adm.waiting and len(inflight) < depth:
            req = adm.take(now)
            r = requests[req.index % len(requests)]
            inflight.append((req, predictor.pipeline.submit(predictor.prepare, r, r.id)))
        if not inflight:
            if previous is not None:  # nothing else to do: this result goes out now
                finish(previous)
                previous = None
                continue
            nxt = adm.next_arrival
            if nxt is None:
                break
            clock.sleep_until(t0 + nxt)
            continue
        req, fut = inflight.popleft()
        hb = fut.result()
        timer = timer_for(req.index)
        dev, ready = predictor.pipeline.transfer(hb, timer)
        host, done, work = predictor.compute(hb, dev, ready, timer)
        if previous is not None:
            finish(previous)  # overlaps the device work just launched
        previous = (req, hb, host, done, work)
    adm.close()
    if predictor.pipeline.cuda:
        torch.cuda.synchronize(predictor.session.device)
    return adm.requests
