"""Measuring one call, and a target's calls as one pipelined stream, into records.

A call is timed per stage (CUDA events on the GPU, host clock always: dohnuts.runtime.timing) and
as a whole (wall time, the device synchronised on both sides); the telemetry taken during it
decides its validity; the device's energy counter, read right before and right after it, gives its
energy (`energy`: joules, the sampler, or why none); the harness's own time in it is measured and
written beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dohnuts.bench.analysis.records import CallRecord, HarnessOverhead
from dohnuts.bench.calls import CallResult
from dohnuts.bench.contracts import Target, TargetCapabilities
from dohnuts.bench.measure.record import CallMeasurement, TargetContext, call_record, stages_dict, stamped
from dohnuts.bench.measure.serving.variety import ServedFacts, ServedSet, graph_counts
from dohnuts.bench.measure.telemetry import call_energy
from dohnuts.bench.sink import RecordSink
from dohnuts.runtime.timing import NULL_TIMER, NvtxRanges, StageTimer, empty_stage_cost

# The first measured calls of a target each follow an untimed twin: the same call with the
# runtime's NULL_TIMER, its wall time kept in the record (`harness_overhead.untimed_twin_ms`). The
# paired difference is the harness's cost measured from outside (dohnuts.bench.analysis.records
# .overhead_summary), what the timer's self-measured host time only bounds from above on a GPU.
HARNESS_AB_PAIRS = 8
# ... while the twins so far took less than HARNESS_AB_BUDGET_S (at least HARNESS_AB_MIN_PAIRS pairs):
# a call of seconds (a peer's training update) is a poor instrument for microseconds of harness, and
# its twins were a third of the H200 suite's time (docs/history/evolution.md M37).
HARNESS_AB_BUDGET_S = 2.0
HARNESS_AB_MIN_PAIRS = 2

# A device's energy counter advances in steps (NVML's may be ~100 ms apart), so one short call reads
# 0 or a whole step. A target's energy per call is measured instead over untimed back-to-back calls
# lasting at least ENERGY_WINDOW_S: the steps' error is then at most one step over the window.
ENERGY_WINDOW_S = 1.5
ENERGY_WINDOW_MIN_CALLS = 3


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stage_timers(device: torch.device) -> tuple[dict[int, StageTimer], Callable[[int], StageTimer]]:
    """A stage timer per request index, made when a pipelined target asks for it: the dict the
    records read afterwards, and the `timer_for(i)` the target calls."""
    timers: dict[int, StageTimer] = {}

    def timer_for(i: int) -> StageTimer:
        timers[i] = StageTimer(device)
        return timers[i]

    return timers, timer_for


def wants_twin(pairs: int, twins_ms: float) -> bool:
    """Whether the next measured call follows an untimed twin, after `pairs` pairs whose twins took
    `twins_ms` in all (HARNESS_AB_PAIRS, HARNESS_AB_BUDGET_S, HARNESS_AB_MIN_PAIRS)."""
    return pairs < HARNESS_AB_MIN_PAIRS or (pairs < HARNESS_AB_PAIRS and twins_ms < HARNESS_AB_BUDGET_S * 1e3)


def untimed_call_ms(ctx: TargetContext, target: Target, call) -> float:
    """Wall milliseconds of one call with no stage timer (the device synchronised on both sides)."""
    device = ctx.device
    synchronize(device)
    t0 = time.perf_counter()
    target.run_call(call, NULL_TIMER)
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def energy_window(ctx: TargetContext, target: Target, calls: list) -> dict | None:
    """The device energy of back-to-back untimed calls of `target` (cycling through `calls`) for at
    least ENERGY_WINDOW_S and ENERGY_WINDOW_MIN_CALLS calls: `{"joules", "calls", "seconds"}`, or
    None where the telemetry has no energy counter or it could not be read (no call is run then)."""
    device = ctx.device
    synchronize(device)
    e0 = ctx.telemetry.energy()
    if e0.joules is None:
        return None
    t0 = time.perf_counter()
    n = 0
    while n < ENERGY_WINDOW_MIN_CALLS or time.perf_counter() - t0 < ENERGY_WINDOW_S:
        target.run_call(calls[n % len(calls)], NULL_TIMER)
        synchronize(device)
        n += 1
    t1 = time.perf_counter()
    energy = call_energy(e0, ctx.telemetry.energy())
    if energy["joules"] is None:
        return None
    return {"joules": energy["joules"], "calls": n, "seconds": t1 - t0}


def measure_call(ctx: TargetContext, target: Target, call, iteration: int, phase: str = "steady",
                 twin_ms: float | None = None) -> CallRecord:
    """One call of `target`, measured: its record (without the rank stamp). `twin_ms`: the wall
    time of its untimed twin, run just before (`untimed_call_ms`). A steady call of a `--nvtx` run
    has its stages as NVTX ranges (`ctx.stage_ranges`), and its `harness_overhead` says
    `"nvtx": true`: their cost is in the timer's own time and in the A/B against the twin."""
    device = ctx.device
    calibration = harness_calibration(ctx.run, device, ctx.stage_ranges)
    ranges = ctx.stage_ranges if phase == "steady" else None
    timer = StageTimer(device, nvtx=ranges)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    e0 = ctx.telemetry.energy()  # outside the timed window: the counter's read costs no call time
    t0 = time.perf_counter()
    result: CallResult = target.run_call(call, timer)
    synchronize(device)
    t1 = time.perf_counter()
    e1 = ctx.telemetry.energy()
    window, validity = ctx.telemetry.window_and_validity(t0, t1)
    t2 = time.perf_counter()
    record = call_record(ctx, CallMeasurement(
        iteration=iteration, phase=phase, stages=stages_dict(timer), wall_ms=(t1 - t0) * 1e3,
        decisions=result.decisions, work=result.work, window=window, validity=validity,
        energy=call_energy(e0, e1), extra=result.extra))
    t3 = time.perf_counter()
    overhead = harness_overhead(timer, calibration, telemetry_s=t2 - t1, record_s=t3 - t2)
    record.harness_overhead_ms = overhead["total_ms"]
    record.harness_overhead = HarnessOverhead(**overhead, untimed_twin_ms=twin_ms, nvtx=ranges is not None)
    return record


def measure_stream(ctx: TargetContext, capabilities: TargetCapabilities, served: ServedSet, n: int,
                   out: RecordSink) -> int:
    """`n` requests of the served set (in its issue order) as one pipelined stream (prefetch,
    transfer stream, overlapped serialization, as users run a request file): one record per
    request with `phase: stream`, whose `wall_ms` is the time since the previous result (the first:
    since the stream started), so the analysis sets the pipelined per-request time against the
    critical-path bound. `extra.stream` holds each request's latency (entered the pipeline →
    result), queueing (entered → device work issued) and place in the set (`set_index`), and what
    the whole stream served of its set (`served_set`: distinct requests and pass shapes, graph
    captures while it ran; dohnuts.bench.measure.serving.variety). Targets without `run_stream` (or
    workloads a stream cannot reproduce) write nothing."""
    if capabilities.run_stream is None:
        return 0
    device = ctx.device
    order = served.issue(n)
    timers, timer_for = stage_timers(device)
    graphs = capabilities.graph_stats
    g0 = graph_counts(graphs()) if graphs is not None else None
    synchronize(device)
    e0 = ctx.telemetry.energy()
    t0 = time.perf_counter()
    rows = capabilities.run_stream([served.calls[k] for k in order], timer_for)
    synchronize(device)
    t1 = time.perf_counter()
    e1 = ctx.telemetry.energy()
    if rows is None:
        return 0
    g1 = graph_counts(graphs()) if graphs is not None else None
    done = [j for j, row in enumerate(rows) if row["work"] is not None]
    facts = ServedFacts.of(served, [order[j] for j in done], [rows[j]["work"] for j in done], g0, g1).to_dict()
    window, validity = ctx.telemetry.window_and_validity(t0, t1)
    # Streamed requests overlap one another: the counter measures the whole stream, not a request.
    stream_energy = call_energy(e0, e1)
    energy = {"joules": None, "source": stream_energy["source"],
              "reason": "a streamed request overlaps its neighbours: the stream's total is extra.stream.energy_j"}
    previous = t0
    for j, row in enumerate(rows):
        if row["work"] is None:  # a request that failed: nothing to analyse
            continue
        timer = timers.get(j) or StageTimer(device)
        stream = {"index": j, "requests": len(rows), "total_ms": (t1 - t0) * 1e3,
                  "energy_j": stream_energy["joules"],
                  "latency_ms": (row["done"] - row["submitted"]) * 1e3,
                  "queue_ms": ((row["started"] or row["done"]) - row["submitted"]) * 1e3,
                  "set_index": order[j], "served_set": facts}
        record = call_record(ctx, CallMeasurement(
            iteration=j, phase="stream", stages=stages_dict(timer), wall_ms=(row["done"] - previous) * 1e3,
            decisions=row["decisions"], work=row["work"], window=window, validity=validity, energy=energy,
            extra={"stream": stream}))
        previous = row["done"]
        out.write(stamped(record, ctx.ranks))
    return len(rows)


def harness_calibration(run, device: torch.device, nvtx: NvtxRanges | None = None) -> dict:
    """The cost of one empty stage on `device` (`empty_stage_cost`), measured once per run and
    device — before the first measured call on it — and kept in `run.measured["harness_calibration"]`;
    with its NVTX range in a `--nvtx` run (`nvtx`), as the measured calls' stages have one."""
    per_device = run.measured.setdefault("harness_calibration", {})
    key = str(device)
    if key not in per_device:
        per_device[key] = empty_stage_cost(device, nvtx=nvtx)
    return per_device[key]


def harness_overhead(timer: StageTimer, calibration: dict, telemetry_s: float, record_s: float) -> dict:
    """The harness's own time in one call, in ms.

    Inside the measured wall time: what the timer measured of itself (`timer_ms`: events, clock
    reads, bookkeeping) plus, per stage entered, the calibrated part of an empty stage it cannot see
    from inside (`timer_unaccounted_ms`: the context manager's machinery). After it: the telemetry
    window lookup (`telemetry_ms`, a synchronous sample when none fell in the call) and building
    the record (`record_ms`, including reading the stage times back). `total_ms` is their sum;
    serialising and writing the record (the run loop) is not in it.
    """
    timer_ms = timer.overhead_ms
    unaccounted_ms = timer.entries * calibration["unaccounted_ms"]
    in_call = timer_ms + unaccounted_ms
    after = (telemetry_s + record_s) * 1e3
    return {"total_ms": in_call + after, "in_call_ms": in_call, "timer_ms": timer_ms,
            "timer_unaccounted_ms": unaccounted_ms, "stage_entries": timer.entries,
            "telemetry_ms": telemetry_s * 1e3, "record_ms": record_s * 1e3,
            "empty_stage_ms": calibration["host_ms"], "empty_stage_device_ms": calibration.get("device_ms")}
