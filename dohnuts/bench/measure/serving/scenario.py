"""The run loop's side of a scenario: load points measured, one record a served request.

After a target's single calls (dohnuts.bench.measure.runner), `measure_scenario` runs the workload's
scenario on the same target, issuing its served set (dohnuts.bench.measure.serving.variety: the
workload's calls in order, or the varied set of `serving.vary` in a seeded order):

- single: the pipelined stream beside the single calls, as the harness always did
  (dohnuts.bench.measure.call.measure_stream).
- stream: that stream sized by the scenario's minimums (requests and seconds, estimated from
  the single calls); a target without a stream runs its calls back to back. Records `phase:
  stream`, each stamped with the rules (`extra.serving`).
- offline: every request handed over at time 0 (an unbounded queue), served by the target's
  `serve` (the dohnuts pipeline) or one at a time; records `phase: offline`.
- server: load points at fixed `rates` (Poisson arrivals, or gamma with `burstiness`), a replayed
  trace, closed-loop points of `concurrency` clients (each sending again when answered, after its
  `think_ms`), and/or the SLO search over rates or clients (dohnuts.bench.measure.serving.search); records
  `phase: server`.

A point's records are written when it ends (nothing is written while requests are in flight,
so writing never delays a request); one record a served request, `wall_ms` its service time
(start → completion) and `extra.serving` its times (ms since the point started: arrival, start,
first byte, completion; latency = completion − arrival, queue = start − arrival) and the point's
facts (`extra.serving.point`: rate, offered, served, dropped, abandoned, duration, rules, SLO,
validity, and what it served of its set — distinct requests and pass shapes, the graph captures
while it ran: variety.ServedFacts; a closed loop's `concurrency` and `think_ms`, its `rate_rps` the
rate its clients sent at); `extra.serving.set_index` is the request's place in the set, and
`client` the closed loop's client that sent it.
A refused or abandoned request has no record; the point's counts hold it. The telemetry of the
whole point is on its first record; every record carries the point's validity.
"""

from __future__ import annotations

import dataclasses
import math
import time

from dohnuts.bench.analysis.records import CallRecord
from dohnuts.bench.measure.call import measure_stream, stage_timers, synchronize
from dohnuts.bench.measure.record import CallMeasurement, TargetContext, call_record, stages_dict, stamped
from dohnuts.bench.measure.serving.arrivals import (
    Arrivals, ClosedLoop, all_at_once, poisson_arrivals, read_trace, trace_arrivals,
)
from dohnuts.bench.measure.serving.clock import MonotonicClock
from dohnuts.bench.measure.serving.config import MAX_CLIENTS, min_requests, percentile_fraction
from dohnuts.bench.measure.serving.queueing import md1_max_rate
from dohnuts.bench.measure.serving.search import SearchPlan, search_result, slo_search
from dohnuts.bench.measure.serving.server import ServedRequest, serve_serial
from dohnuts.bench.measure.serving.stats import PointSummary, Rules, summarize_point
from dohnuts.bench.measure.serving.variety import ServedFacts, ServedSet, graph_counts
from dohnuts.bench.measure.telemetry import call_energy
from dohnuts.bench.report.status import log
from dohnuts.runtime.timing import StageTimer
from dohnuts.schema import median

MAX_SIZED_REQUESTS = 100_000  # a stream or offline set sized from the single calls, at most
# The calls a closed loop issues are drawn ahead (its count is not known in advance): at least this
# many, a whole number of rounds of the served set; a loop that issues more goes round them again.
CLOSED_LOOP_CALLS = 10_000


def measure_scenario(ctx: TargetContext, target, capabilities, served: ServedSet, single_walls_ms: list[float],
                     out) -> int:
    """Run the workload's scenario on a built target; returns the records written."""
    spec = ctx.spec
    if spec.scenario == "single":  # the stream beside the single calls: `repeat` calls, or the varied set once
        return measure_stream(ctx, capabilities, served, spec.repeat if not served.varied else len(served.calls), out)
    service_s = median(single_walls_ms) / 1e3 if single_walls_ms else 0.0
    serving = spec.serving
    rules = Rules(min_requests(spec.scenario, serving), serving.min_duration_s)
    if spec.scenario == "stream":
        n = sized(rules, service_s)
        stamp = {"scenario": "stream", "rules": vars(rules)}
        streamer = capabilities if capabilities.run_stream is not None else dataclasses.replace(
            capabilities, run_stream=lambda cs, timer_for: _back_to_back(ctx, target, cs, timer_for))
        return measure_stream(ctx, streamer, served, n, _Stamped(out, stamp))
    runner = PointRunner(ctx, target, capabilities, served, out, rules)
    if spec.scenario == "offline":
        runner.measure(all_at_once(sized(rules, service_s)), role="offline", capacity=None)
        return runner.written
    run_server(runner, service_s)
    return runner.written


def sized(rules: Rules, service_s: float) -> int:
    """Requests for a set that meets both minimums at the single calls' pace."""
    by_time = math.ceil(rules.min_duration_s / service_s) if service_s > 0 else 1
    return min(MAX_SIZED_REQUESTS, max(rules.min_requests, by_time))


def run_server(runner: PointRunner, service_s: float) -> None:
    """The server scenario's points: fixed rates, a trace replayed, then the SLO search."""
    spec = runner.ctx.spec
    serving = spec.serving
    seed = serving.seed if serving.seed is not None else spec.seed
    trace = read_trace(serving.arrivals) if serving.arrivals != "poisson" else None
    name = serving.arrivals.rsplit("/", 1)[-1]

    def arrivals(rate: float | None) -> Arrivals:
        if trace is not None:
            return trace_arrivals(trace, name, rate)
        return poisson_arrivals(rate, seed=seed, min_requests=runner.rules.min_requests,
                                min_duration_s=runner.rules.min_duration_s, burstiness=serving.burstiness)

    def loop(clients: float) -> ClosedLoop:
        return ClosedLoop(int(clients), serving.think_ms / 1e3, seed, runner.rules.min_requests,
                          runner.rules.min_duration_s)

    queue = serving.queue or None
    for rate in serving.rates:
        runner.measure(arrivals(rate), role="fixed", capacity=queue)
    for clients in serving.concurrency:
        runner.measure(loop(clients), role="fixed", capacity=None)
    if trace is not None and not serving.rates and serving.slo_ms is None:
        runner.measure(arrivals(None), role="replay", capacity=queue)
    if serving.slo_ms is None:
        return
    if serving.search.over == "concurrency":
        search_clients(runner, service_s, loop)
        return
    search = serving.search
    p = percentile_fraction(serving)
    high = search.high_rps or (2.0 / service_s if service_s > 0 else search.low_rps * 1e3)
    first = search.first_rps or (md1_max_rate(service_s, serving.slo_ms / 1e3, p) if service_s > 0 else 0.0)
    plan = SearchPlan(low=search.low_rps, high=max(high, search.low_rps), points=search.points,
                      resolution=search.resolution, step=search.step)
    start = time.perf_counter()

    def fits(rate: float) -> bool:
        # the probe's arrivals end within what is left of the budget, and before the point's own
        # deadline (max_duration_s): a point cut there is short of its minimums, so invalid
        span = arrivals(rate).span_s
        if span > serving.max_duration_s:
            return False
        return not serving.budget_s or span <= serving.budget_s - (time.perf_counter() - start)

    first = min(plan.high, max(plan.low, first or plan.low))
    if not fits(first):  # too slow a first probe for the budget: the lowest rate that fits instead
        if not fits(plan.high):
            runner.say(f"no search probe fits budget_s {serving.budget_s:g} s and max_duration_s "
                       f"{serving.max_duration_s:g} s", warning=True)
            return
        wanted, lo, hi = first, first, plan.high
        for _ in range(30):
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        # 2 % above the boundary: at the boundary itself the arrivals fit only at the instant of the
        # bisection, and the search (checking again a moment later) would start nothing
        first = min(plan.high, hi * 1.02)
        runner.say(f"the first probe ({wanted:.3g} req/s) would outlast budget_s {serving.budget_s:g} s or "
                   f"max_duration_s {serving.max_duration_s:g} s: starting at {first:.3g} req/s, near the lowest "
                   "rate whose arrivals fit")
    tried = slo_search(lambda rate: runner.measure(arrivals(rate), role="search", capacity=queue), first, plan, fits)
    if not tried:
        runner.say(f"no search probe started: none fits budget_s {serving.budget_s:g} s and max_duration_s "
                   f"{serving.max_duration_s:g} s", warning=True)
        return
    runner.say(f"max rate at p{serving.percentile:g} ≤ {serving.slo_ms:g} ms: {search_result(tried).words()}")


def search_clients(runner: PointRunner, service_s: float, loop) -> None:
    """The SLO search over closed-loop clients (dohnuts.bench.measure.serving.search). Its first probe: the
    clients at which one server taking D = the single call's time a request reaches the SLO — N
    clients wait for each other, so a response takes about N·D − think (the asymptotic bound of a
    closed queue): N = (SLO + think) / D. A probe is started only when its estimated length (its
    minimums at that server's throughput, min(N / (D + think), 1 / D)) fits the budget."""
    serving = runner.ctx.spec.serving
    search, think = serving.search, serving.think_ms / 1e3
    slo = serving.slo_ms / 1e3
    guess = max(1.0, math.floor((slo + think) / service_s)) if service_s > 0 else float(search.low_clients)
    first = float(search.first_clients or guess)
    high = search.high_clients or min(MAX_CLIENTS, max(4 * first, search.low_clients))
    plan = SearchPlan(low=search.low_clients, high=max(high, search.low_clients), points=search.points,
                      resolution=search.resolution, step=search.step, clients=True)
    start = time.perf_counter()

    def fits(clients: float) -> bool:
        if service_s <= 0:
            return True
        throughput = min(clients / (service_s + think), 1 / service_s)
        span = max(runner.rules.min_duration_s, runner.rules.min_requests / throughput)
        if span > serving.max_duration_s:
            return False
        return not serving.budget_s or span <= serving.budget_s - (time.perf_counter() - start)

    tried = slo_search(lambda clients: runner.measure(loop(clients), role="search", capacity=None), first, plan,
                       fits)
    if not tried:
        runner.say(f"no search probe started: none fits budget_s {serving.budget_s:g} s and max_duration_s "
                   f"{serving.max_duration_s:g} s", warning=True)
        return
    runner.say(f"most clients at p{serving.percentile:g} ≤ {serving.slo_ms:g} ms: {search_result(tried).words()}")


class PointRunner:
    """Measures load points on one target and writes their records."""

    def __init__(self, ctx: TargetContext, target, capabilities, served: ServedSet, out, rules: Rules):
        self.ctx, self.target, self.capabilities, self.served, self.out, self.rules = (
            ctx, target, capabilities, served, out, rules)
        self.points = 0
        self.written = 0

    def say(self, text: str, *, warning: bool = False) -> None:
        """A status line on the bench's log (stderr; the report alone goes to stdout)."""
        (log.warning if warning else log.info)("%s · %s: %s", self.ctx.spec.name, self.ctx.target.label, text)

    def measure(self, arrivals: Arrivals | ClosedLoop, *, role: str, capacity: int | None) -> PointSummary:
        """One load point: `arrivals` into a queue of `capacity` (None: unbounded) before the target,
        or a closed loop of clients."""
        ctx, serving = self.ctx, self.ctx.spec.serving
        device = ctx.device
        timers, timer_for = stage_timers(device)
        synchronize(device)
        e0 = ctx.telemetry.energy()
        closed = isinstance(arrivals, ClosedLoop)
        n_set = len(self.served.calls)
        # request i is calls[i % len(calls)] = served.calls[order[i % len(order)]]
        order = self.served.issue(-(-max(CLOSED_LOOP_CALLS, arrivals.min_requests) // n_set) * n_set if closed
                                  else len(arrivals))
        calls = [self.served.calls[k] for k in order]
        schedule = arrivals if closed else arrivals.times_s
        graphs_before = self._graph_counts()
        t0 = time.perf_counter()
        served = None
        if self.capabilities.serve is not None:
            served = self.capabilities.serve(calls, schedule, capacity=capacity, timer_for=timer_for,
                                             deadline=serving.max_duration_s)
        server = "pipelined"
        if served is None:
            server = "serial"
            served = serve_serial(self._run_one(calls, timer_for), schedule, capacity=capacity,
                                  clock=MonotonicClock(), deadline=serving.max_duration_s)
        t1 = time.perf_counter()
        e1 = ctx.telemetry.energy()
        graphs_after = self._graph_counts()
        window, validity = ctx.telemetry.window_and_validity(t0, t1)
        if server == "serial":  # its first byte: before its serialize stage
            for r in served:
                stages = stages_dict(timers[r.index]) if r.completion is not None and r.index in timers else {}
                if "serialize" in stages:
                    r.first_byte = max(r.start, r.completion - stages["serialize"].host_ms / 1e3)
        summary, facts = self._summary(arrivals, served, role, server, capacity)
        done = [r for r in served if r.outcome == "served" and r.completion is not None]
        facts["served_set"] = ServedFacts.of(self.served, [order[r.index % len(order)] for r in done],
                                             [_work(r.result) for r in done], graphs_before, graphs_after).to_dict()
        point_energy = call_energy(e0, e1)
        facts["energy_j"] = point_energy["joules"]  # the whole point's, from the device's counter
        if not validity.get("valid", True):
            facts["valid"] = False
            facts["reasons"] = list(facts["reasons"]) + [str(r) for r in validity.get("reasons") or []]
        self._write(served, order, timers, facts, window, validity, point_energy)
        self.points += 1
        lat = "∞" if summary.latency_ms is None else f"{summary.latency_ms:.3g} ms"
        met = facts["served_set"]
        captures = "" if met["graph_captures"] is None else f", {met['graph_captures']} graph captures"
        load = f"{arrivals.clients} clients" if closed else _rate(arrivals.rate_rps)
        self.say(f"{role} {load}: {summary.served}/{summary.offered} served, "
                 f"{summary.throughput_rps:.3g} req/s, p{serving.percentile:g} {lat}"
                 + (f" ({summary.verdict})" if summary.slo_ms is not None else "")
                 + f"; {met['shapes']} shapes{captures}"
                 + ("" if facts["valid"] else f" — INVALID: {'; '.join(facts['reasons'])}"), warning=not facts["valid"])
        return summary

    def _graph_counts(self) -> dict | None:
        stats = self.capabilities.graph_stats
        return graph_counts(stats()) if stats is not None else None

    def _run_one(self, calls: list, timer_for):
        device, target = self.ctx.device, self.target

        def run_one(req: ServedRequest):
            result = target.run_call(calls[req.index % len(calls)], timer_for(req.index))
            synchronize(device)
            return result, 0.0  # the first byte is placed from the serialize stage's time (_summary)

        return run_one

    def _summary(self, arrivals: Arrivals | ClosedLoop, served: list[ServedRequest], role: str, server: str,
                 capacity) -> tuple[PointSummary, dict]:
        serving = self.ctx.spec.serving
        done = [r for r in served if r.outcome == "served" and r.completion is not None]
        duration = max((r.completion for r in done), default=0.0)
        dropped = sum(r.outcome == "dropped" for r in served)
        abandoned = sum(r.outcome == "abandoned" for r in served)
        closed = isinstance(arrivals, ClosedLoop)
        if closed:  # the rate its clients sent at; stopped: its deadline came before its minimums
            rate = len(served) / duration if duration > 0 else math.inf
            stopped = abandoned > 0 or len(served) < arrivals.min_requests or \
                max((r.arrival for r in served), default=0.0) < arrivals.min_duration_s
        else:
            rate = arrivals.rate_rps
            stopped = len(served) < len(arrivals) or abandoned > 0
        slo = serving.slo_ms if role != "offline" else None
        summary = summarize_point(
            rate, [r.completion - r.arrival for r in done], [r.start - r.arrival for r in done],
            [r.completion - r.start for r in done], offered=len(served), dropped=dropped, abandoned=abandoned,
            duration_s=duration, percentile=percentile_fraction(serving), slo_ms=slo, rules=self.rules,
            stopped=stopped, concurrency=arrivals.clients if closed else None,
            first_byte_s=[r.first_byte - r.arrival for r in done],
            metric_percentiles=[p / 100 for p in serving.metric_percentiles])
        facts = {"scenario": self.ctx.spec.scenario, "point": self.points, "role": role, "server": server,
                 "rate_rps": rate if math.isfinite(rate) else None,
                 "arrivals": arrivals.source, "seed": arrivals.seed, "scheduled": len(served) if closed
                 else len(arrivals),
                 "offered": len(served), "served": len(done), "dropped": dropped, "abandoned": abandoned,
                 "duration_s": duration, "stopped": stopped, "queue": capacity,
                 "max_duration_s": serving.max_duration_s, "rules": vars(self.rules), "slo_ms": slo,
                 "percentile": serving.percentile, "metric_percentiles": list(serving.metric_percentiles),
                 "valid": summary.valid, "reasons": list(summary.reasons)}
        if closed:
            facts |= {"concurrency": arrivals.clients, "think_ms": arrivals.think_s * 1e3}
        return summary, facts

    def _write(self, served: list[ServedRequest], order: list[int], timers: dict, facts: dict, window: list,
               validity: dict, point_energy: dict) -> None:
        ctx, first = self.ctx, True
        # Served requests overlap one another: the counter measures the point, not a request.
        energy = {"joules": None, "source": point_energy["source"],
                  "reason": "a served request overlaps its neighbours: the point's total is "
                            "extra.serving.point.energy_j"}
        phase = "offline" if facts["role"] == "offline" else "server"
        for r in served:
            if r.outcome != "served" or r.completion is None:
                continue
            res = r.result
            decisions = res["decisions"] if isinstance(res, dict) else res.decisions
            work = _work(res)
            stages = stages_dict(timers.get(r.index) or StageTimer(ctx.device))
            times = {"scenario": facts["scenario"], "request": r.index, "set_index": order[r.index % len(order)],
                     "arrival_ms": r.arrival * 1e3,
                     "start_ms": r.start * 1e3,
                     "first_byte_ms": r.first_byte * 1e3, "completion_ms": r.completion * 1e3,
                     "latency_ms": (r.completion - r.arrival) * 1e3, "queue_ms": (r.start - r.arrival) * 1e3,
                     "service_ms": (r.completion - r.start) * 1e3}
            if r.client is not None:
                times["client"] = r.client
            record = call_record(ctx, CallMeasurement(
                iteration=r.index, phase=phase, stages=stages,
                wall_ms=max((r.completion - r.start) * 1e3, 1e-6), decisions=decisions, work=work,
                window=window if first else [], validity=validity, energy=energy,
                extra={"serving": times | {"point": facts}}))
            self.out.write(stamped(record, ctx.ranks))
            self.written += 1
            first = False


def _work(result):
    """The work counts of a served request's result (the pipelined server's row, or a CallResult)."""
    return result["work"] if isinstance(result, dict) else result.work


def _back_to_back(ctx: TargetContext, target, calls: list, timer_for) -> list[dict]:
    """A stream for a target without one: its calls one after another (each enters when the
    previous is done)."""
    rows = []
    for j, call in enumerate(calls):
        t0 = time.perf_counter()
        result = target.run_call(call, timer_for(j))
        synchronize(ctx.device)
        t1 = time.perf_counter()
        rows.append({"decisions": result.decisions, "work": result.work, "submitted": t0, "started": t0, "done": t1})
    return rows


class _Stamped:
    """A sink that adds `extra.serving` (the scenario and its rules) to every record it passes on."""

    def __init__(self, out, stamp: dict):
        self.out, self.stamp = out, stamp

    def write(self, record: CallRecord) -> None:
        record.extra["serving"] = self.stamp
        self.out.write(record)


def _rate(rate: float) -> str:
    return "all at once" if not math.isfinite(rate) else f"{rate:.3g} req/s"
