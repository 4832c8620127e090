"""The run loop of `dohnuts-bench run`: validate everything, then measure, record, analyze.

For each workload and each of its targets, in one process and on the same calls:
warm-up calls (unrecorded), then measured calls until `repeat` calls and `min_duration_s`
have both passed. Each measured call is timed per stage (CUDA events on the GPU, host clock
always) and appended to `results.jsonl` as one record, flushed at once: an interrupted run
(Ctrl-C) leaves a valid file holding every completed record. Records are strict JSON (no bare
NaN or Infinity: a non-finite number a target reports is written as null).

A target that runs out of memory (`is_out_of_memory`: torch.OutOfMemoryError, MemoryError, or a
RuntimeError saying so) fails alone: the failure is kept in `run.failures` (written to run.json
by the CLI), the records it completed stay, and the run goes on with the next target.
"""

from __future__ import annotations

import functools
import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dohnuts.bench.analysis.compare import required_calls
from dohnuts.bench.analysis.records import SCHEMA
from dohnuts.bench.calls import CallResult
from dohnuts.bench.provenance import provenance
from dohnuts.bench.rundir import safe_name
from dohnuts.bench.telemetry import DEFAULT_MIN_CLOCK_FRACTION, TelemetryThread, call_validity
from dohnuts.bench.workload import WorkloadSpec
from dohnuts.runtime.distributed import SINGLE, World, any_rank, barrier, max_over_ranks
from dohnuts.runtime.timing import StageTimer, empty_stage_cost
from dohnuts.schema import dumps, short


@dataclass
class RunContext:
    run_id: str
    run_dir: Path
    device: torch.device
    hwspec: object | None  # dohnuts.bench.analysis.HwSpec
    console: object  # rich.console.Console
    measured: dict = field(default_factory=dict)  # measured ceilings etc., written to run.json
    notes: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # {"workload", "file", "target", "error"}: written to run.json
    # Tests only: called as before_call(world, i) before measured call i (a fault injected into a rank).
    before_call: Callable[[World, int], None] | None = None


@dataclass(frozen=True)
class WorkloadContext:
    """What a workload kind needs to build its calls."""

    spec: WorkloadSpec
    tokenizer: object
    model_cfg: object
    workdir: Path  # a folder for generated inputs (e.g. images)
    rng: random.Random


def resolve_device(spec: WorkloadSpec) -> torch.device | None:
    """The workload's device, or None when it needs a GPU this machine lacks."""
    if spec.device == "cuda" or spec.requires_gpu:
        return torch.device("cuda") if torch.cuda.is_available() else None
    if spec.device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(spec: WorkloadSpec, device: torch.device) -> torch.dtype:
    if spec.precision == "bf16":
        return torch.bfloat16
    if spec.precision == "fp32":
        return torch.float32
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _stages_dict(timer: StageTimer) -> dict:
    return {name: {"host_ms": st.host_ms, "device_ms": st.device_ms, "count": st.count}
            for name, st in timer.result().items()}


def measure_workload(run: RunContext, pm, spec: WorkloadSpec, kinds: dict, targets: dict, telemetry: TelemetryThread,
                     out, progress=None, world: World = SINGLE) -> int:
    """Measure every target of one workload; returns the number of records written.

    With several processes (`world`, started by a launcher plugin) every rank runs this on its
    own device. A *collective* kind (`kind.collective`: the train step, whose update the ranks
    share) gives every rank the same calls; other kinds shard them (rank r takes calls r, r + W,
    ...: data parallelism). The ranks agree on every count (warm-up, measured calls, the
    adaptive extension), start the measured calls and the stream together, and stamp each
    record with `rank` and `world_size`."""
    from dohnuts.model.build import resolve_source
    from dohnuts.runtime.tokenizer import tokenizer_for

    device = resolve_device(spec)
    if device.type == "cuda" and world.distributed:
        device = torch.device("cuda", world.local_rank)  # one GPU per rank
    dtype = resolve_dtype(spec, device)
    cfg, ckpt = resolve_source(spec.model)
    workdir = run.run_dir / "inputs" / safe_name(spec.name)
    workdir.mkdir(parents=True, exist_ok=True)
    kind = kinds[spec.kind]
    calls = kind.calls(WorkloadContext(spec, tokenizer_for(cfg, ckpt), cfg, workdir, random.Random(spec.seed)))
    collective = bool(getattr(kind, "collective", False))
    if world.distributed and not collective:  # this rank's share, in the same cyclic order
        calls = [calls[(j * world.size + world.rank) % len(calls)] for j in range(len(calls))]
    prov = provenance(device)
    written = 0
    warmup = spec.warmup
    if getattr(kind, "warmup_every_call", lambda s: False)(spec):
        warmup = max(warmup, len(calls))  # e.g. a warm cache: every distinct call seen once
    for tspec in spec.targets:
        failed = False
        try:
            written += _measure_target(run, pm, spec, tspec, targets[tspec.name], kind, calls, warmup, device, dtype,
                                       cfg, prov, telemetry, out, progress, world, collective)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(exc):
                raise
            failure = {"workload": spec.name, "file": spec.file, "target": tspec.label,
                       "error": f"out of memory: {short(f'{type(exc).__name__}: {exc}', 300, str) if str(exc) else type(exc).__name__}"}
            run.failures.append(failure)
            run.console.print(f"[red]failed[/] {spec.name} · {tspec.label}: {failure['error']} "
                              "(recorded in run.json; the run goes on)")
            failed = True
        if failed:  # the failed call's frames are released only now: give their memory back
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return written


OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """An out-of-memory error: torch.OutOfMemoryError (torch.cuda's), Python's MemoryError, or a
    RuntimeError whose message says so (HIP and cuBLAS "out of memory", torch's CPU allocator
    "can't allocate memory"). Other device faults (an illegal memory access) are not: the device
    may be unusable after them."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if (oom is not None and isinstance(exc, oom)) or isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGES)


def _measure_target(run, pm, spec, tspec, factory, kind, calls, warmup, device, dtype, cfg, prov, telemetry, out,
                    progress, world: World = SINGLE, collective: bool = False) -> int:
    """Every call of one target of a workload (warm-up, first call, measured calls, stream)."""
    written = 0
    ranks = {"rank": world.rank, "world_size": world.size, "shard": "collective" if collective else "data"}
    target = factory(spec, device, dtype, tspec.options)
    task = None
    if progress is not None:
        task = progress.add_task(f"{spec.name} · {tspec.label}", total=warmup + spec.repeat)
    try:
        for i in range(warmup):
            if i == 0:
                # The target's first call (compilation, autotuning, graph capture, cold caches)
                # is part of end-to-end cost: recorded on its own, never mixed into the steady state.
                record = _measure_call(run, spec, tspec, target, calls[0], device, dtype, cfg, prov, telemetry,
                                       -1, phase="first-call")
                _write(out, record | ranks)
                written += 1
            else:
                target.run_call(calls[i % len(calls)], StageTimer(device))
            if progress is not None:
                progress.advance(task)
        barrier(world)  # the ranks start measuring together
        start = time.perf_counter()
        i, wanted, walls = 0, spec.repeat, []
        max_calls = spec.max_repeat or 4 * spec.repeat
        while any_rank(i < wanted or time.perf_counter() - start < spec.min_duration_s, world):
            call = calls[(warmup + i) % len(calls)]
            pm.hook.dohnuts_bench_before_call(run=run, spec=spec, target_name=tspec.label, iteration=i)
            if run.before_call is not None:
                run.before_call(world, i)
            record = _measure_call(run, spec, tspec, target, call, device, dtype, cfg, prov, telemetry, i)
            # Even and odd calls are two interleaved halves of one measurement: their difference
            # is the run's own noise budget (A/A, dohnuts.bench.analysis.compare.aa_noise).
            record["aa_half"] = i % 2
            record.update(ranks)
            pm.hook.dohnuts_bench_after_call(run=run, spec=spec, target_name=tspec.label, record=record)
            _write(out, record)
            written += 1
            i += 1
            walls.append(record["wall_ms"])
            if i == wanted and spec.halfwidth and wanted < max_calls:
                # As many calls as the observed spread needs for the median's confidence
                # interval to reach ±halfwidth (capped): the count follows the noise.
                wanted = min(max_calls, max(wanted, required_calls(walls, spec.halfwidth)))
                wanted = max_over_ranks(wanted, world)  # the noisiest rank decides for all
                if progress is not None:
                    progress.update(task, total=warmup + wanted)
            if progress is not None:
                progress.update(task, completed=warmup + min(i, wanted))
        barrier(world)
        written += _measure_stream(run, spec, tspec, target, [calls[(warmup + j) % len(calls)]
                                                              for j in range(spec.repeat)],
                                   device, dtype, cfg, prov, telemetry, out, ranks)
    finally:
        target.close()
        del target
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return written


def _write(out, record: dict) -> None:
    """Append one record as one strict-JSON line and flush it (a killed run keeps every line)."""
    out.write(dumps(record) + "\n")
    out.flush()


def _measure_call(run, spec, tspec, target, call, device, dtype, cfg, prov, telemetry, iteration,
                  phase: str = "steady") -> dict:
    calibration = harness_calibration(run, device)
    timer = StageTimer(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    result: CallResult = target.run_call(call, timer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    window, validity = _telemetry_window(telemetry, t0, t1)
    t2 = time.perf_counter()
    record = _record(run, spec, tspec, target, cfg, dtype, device, prov, iteration=iteration, phase=phase,
                     stages=_stages_dict(timer), wall_ms=(t1 - t0) * 1e3, decisions=result.decisions,
                     work=result.work, window=window, validity=validity, extra=result.extra)
    t3 = time.perf_counter()
    overhead = harness_overhead(timer, calibration, telemetry_s=t2 - t1, record_s=t3 - t2)
    record["harness_overhead_ms"] = overhead["total_ms"]
    record["harness_overhead"] = overhead
    return record


@functools.lru_cache(maxsize=16)
def _model_facts(cfg) -> tuple[dict, str]:
    """(config dict, config hash) of a model config, computed once: every record carries both,
    and building them per call was most of the harness's own time on short calls."""
    return cfg.to_dict(), cfg.config_hash()


def _record(run, spec, tspec, target, cfg, dtype, device, prov, *, iteration: int, phase: str, stages: dict,
            wall_ms: float, decisions: int, work, window: list, validity: dict, extra: dict) -> dict:
    """One raw JSONL record (schema: dohnuts.bench.analysis.records)."""
    return {
        "schema": SCHEMA,
        "run_id": run.run_id,
        "workload": {"name": spec.name, "kind": spec.kind, "file": spec.file, "file_hash": spec.file_hash},
        "target": tspec.label,
        "target_name": tspec.name,
        "target_options": tspec.options,
        # a measurement-only variant of the product (dohnuts.runtime.policy), or None
        "variant": getattr(target, "variant", None),
        "iteration": iteration,
        "phase": phase,
        "stages": stages,
        "wall_ms": wall_ms,
        "decisions": decisions,
        "tokens": token_totals(work),
        "lora": getattr(target, "lora_info", None),
        "work": work.to_dict(),
        "model": _model_facts(cfg)[0],
        "model_source": spec.model,
        "config_hash": _model_facts(cfg)[1],
        "precision": "bf16" if dtype == torch.bfloat16 else "fp32",
        "device": {"name": prov["device"]["name"], "type": device.type},
        "hwspec": getattr(run.hwspec, "name", None),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "telemetry": window,
        "validity": validity,
        "extra": extra,
        "provenance": prov,
    }


def _measure_stream(run, spec, tspec, target, calls, device, dtype, cfg, prov, telemetry, out,
                    ranks: dict | None = None) -> int:
    """The calls as one pipelined stream (prefetch, transfer stream, overlapped serialization, as
    users run a request file): one record per request with `phase: stream`, whose `wall_ms` is the
    time since the previous result (the first: since the stream started), so the analysis sets the
    pipelined per-request time against the critical-path bound. `extra.stream` holds each
    request's latency (entered the pipeline → result) and queueing (entered → device work issued).
    Targets without `run_stream` (or workloads a stream cannot reproduce) write nothing."""
    run_stream = getattr(target, "run_stream", None)
    if run_stream is None:
        return 0
    timers: dict[int, StageTimer] = {}

    def timer_for(j: int) -> StageTimer:
        timers[j] = StageTimer(device)
        return timers[j]

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    rows = run_stream(calls, timer_for)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    if rows is None:
        return 0
    window, validity = _telemetry_window(telemetry, t0, t1)
    previous = t0
    for j, row in enumerate(rows):
        if row["work"] is None:  # a request that failed: nothing to analyse
            continue
        timer = timers.get(j) or StageTimer(device)
        stream = {"index": j, "requests": len(rows), "total_ms": (t1 - t0) * 1e3,
                  "latency_ms": (row["done"] - row["submitted"]) * 1e3,
                  "queue_ms": ((row["started"] or row["done"]) - row["submitted"]) * 1e3}
        record = _record(run, spec, tspec, target, cfg, dtype, device, prov, iteration=j, phase="stream",
                         stages=_stages_dict(timer), wall_ms=(row["done"] - previous) * 1e3,
                         decisions=row["decisions"], work=row["work"], window=window, validity=validity,
                         extra={"stream": stream})
        previous = row["done"]
        _write(out, record | (ranks or {}))
    return len(rows)


def harness_calibration(run, device: torch.device) -> dict:
    """The cost of one empty stage on `device` (`empty_stage_cost`), measured once per run and
    device — before the first measured call on it — and kept in `run.measured["harness_calibration"]`."""
    per_device = run.measured.setdefault("harness_calibration", {})
    key = str(device)
    if key not in per_device:
        per_device[key] = empty_stage_cost(device)
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


def _telemetry_window(telemetry, t0: float, t1: float) -> tuple[list, dict]:
    """The call's telemetry samples and their validity (every sample in the call is checked)."""
    both = getattr(telemetry, "window_and_validity", None)
    if both is not None:
        return both(t0, t1)
    window = telemetry.window(t0, t1)
    return window, call_validity(window, getattr(telemetry, "min_clock_fraction", DEFAULT_MIN_CLOCK_FRACTION))


def token_totals(work) -> dict:
    """Useful / padded / computed tokens of a call (summed over microbatches for a train step)."""
    parts = work.passes()
    return {"useful": sum(w.useful_tokens for w in parts), "padded": sum(w.padded_tokens for w in parts),
            "computed": sum(w.computed_tokens for w in parts)}
