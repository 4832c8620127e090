"""The run loop of `dohnuts-bench run`: validate everything, then measure, record, analyze.

For each workload and each of its targets, in one process and on the same calls:
warm-up calls (unrecorded), then measured calls until `repeat` calls and `min_duration_s`
have both passed. Each measured call is timed per stage (CUDA events on the GPU, host clock
always; dohnuts.bench.measure.call) and written to the run's `RecordSink` as one record, flushed at
once: an interrupted run (Ctrl-C) leaves a valid file holding every completed record. Records
are strict JSON (no bare NaN or Infinity: a non-finite number a target reports is written as null).

A target that runs out of memory (`is_out_of_memory`: torch.OutOfMemoryError, MemoryError, or a
RuntimeError saying so) fails alone: the failure is kept in `run.failures` (written to run.json
by the CLI), the records it completed stay, and the run goes on with the next target.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dohnuts.bench.analysis.compare import required_calls
from dohnuts.bench.contracts import RunContext, WorkloadContext
from dohnuts.bench.measure.call import energy_window, measure_call, untimed_call_ms, wants_twin
from dohnuts.bench.measure.provenance import provenance
from dohnuts.bench.measure.quality import (
    can_score, check_agreement, labelled_set, measure_accuracy, reference_key, reference_outputs, sample_calls,
)
from dohnuts.bench.measure.record import TargetContext, stamped
from dohnuts.bench.measure.run_clock import spent
from dohnuts.bench.measure.serving.scenario import measure_scenario
from dohnuts.bench.measure.serving.variety import ServedSet
from dohnuts.bench.measure.trace import (
    PROFILED_CALLS, measured_window, nvtx_stage_ranges, profile_calls, rank_trace_path, trace_path,
)
from dohnuts.bench.report.status import log
from dohnuts.bench.store.rundir import derived_name
from dohnuts.errors import ConfigError
from dohnuts.model.build import resolve_source
from dohnuts.runtime.collectives import any_rank, barrier, max_over_ranks
from dohnuts.runtime.process_group import SINGLE, World
from dohnuts.runtime.timing import StageTimer
from dohnuts.runtime.tokenizer import tokenizer_for
from dohnuts.schema import short

if TYPE_CHECKING:
    from dohnuts.bench.measure.telemetry import TelemetryThread
    from dohnuts.bench.measure.workload import WorkloadSpec
    from dohnuts.bench.plugins import RegisteredKind, RegisteredTarget
    from dohnuts.bench.sink import RecordSink


def resolve_device(spec: WorkloadSpec) -> torch.device | None:
    """The workload's device, or None when it needs a GPU this machine lacks."""
    if spec.device == "cuda" or spec.requires_gpu:
        return torch.device("cuda") if torch.cuda.is_available() else None
    if spec.device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def runnable_here(specs: list[WorkloadSpec], targets: dict, launchers: dict) -> list[WorkloadSpec]:
    """The workloads (their process counts and targets) this machine can run; each one left out is
    said with its reason. A workload naming a launcher no plugin registers is refused."""
    runnable = []
    for spec in specs:
        if max(spec.processes) > 1 and spec.launcher not in launchers:
            raise ConfigError(f"names launcher {spec.launcher!r}, which no plugin registers (known: "
                              f"{', '.join(sorted(launchers)) or 'none'})", source=spec.file, field="launcher")
        if resolve_device(spec) is None:
            log.warning("skipped %s: needs a CUDA GPU (requires_gpu / device: cuda)", spec.file)
            continue
        counts = []
        for n in spec.processes:  # process counts this machine cannot hold are skipped, with the reason
            reason = None if n == 1 else launchers[spec.launcher].unavailable(n, resolve_device(spec))
            if reason:
                log.warning("skipped %s at %d processes: %s", spec.file, n, reason)
            else:
                counts.append(n)
        if not counts:
            continue
        spec = dataclasses.replace(spec, processes=tuple(counts))
        kept = []
        for t in spec.targets:  # a target that cannot run here (e.g. its library is missing) is skipped
            reason = targets[t.name].unavailable()
            if reason:
                log.warning("skipped target %s of %s: %s", t.label, spec.file, reason)
            else:
                kept.append(t)
        if kept:
            runnable.append(dataclasses.replace(spec, targets=tuple(kept)))
    return runnable


def resolve_dtype(spec: WorkloadSpec, device: torch.device) -> torch.dtype:
    if spec.precision == "bf16":
        return torch.bfloat16
    if spec.precision == "fp32":
        return torch.float32
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True)
class Schedule:
    """The calls every target of one workload runs, in order, and how many warm it up first; the
    varied served set of `serving.vary` (None: the scenario serves `calls`); the reference check's
    sample and the FP32 reference's outputs on it (by `reference_key`); the accuracy mode's
    labelled set (name, requests)."""

    calls: list
    warmup: int
    varied: list | None = None
    sample: list = dataclasses.field(default_factory=list)
    references: dict = dataclasses.field(default_factory=dict)
    labelled: tuple | None = None


def measure_workload(run: RunContext, pm, spec: WorkloadSpec, kinds: dict[str, RegisteredKind],
                     targets: dict[str, RegisteredTarget], telemetry: TelemetryThread, out: RecordSink,
                     progress=None, world: World = SINGLE) -> int:
    """Measure every target of one workload; returns the number of records written.

    With several processes (`world`, started by a launcher plugin) every rank runs this on its
    own device. A *collective* kind (`kind.collective`: the train step, whose update the ranks
    share) gives every rank the same calls; other kinds shard them (rank r takes calls r, r + W,
    ...: data parallelism). The ranks agree on every count (warm-up, measured calls, the
    adaptive extension), start the measured calls and the stream together, and stamp each
    record with `rank` and `world_size`."""
    device = resolve_device(spec)
    if device.type == "cuda" and world.distributed:
        device = torch.device("cuda", world.local_rank)  # one GPU per rank
    dtype = resolve_dtype(spec, device)
    cfg, ckpt = resolve_source(spec.model)
    workdir = run.run_dir / "inputs" / derived_name(spec.name)  # one to one: `a b` and `a/b` never share
    workdir.mkdir(parents=True, exist_ok=True)
    kind = kinds[spec.kind]
    tokenizer = tokenizer_for(cfg, ckpt)
    timing = run.measured.setdefault("timing", {})
    with spent(timing, spec.name, "inputs"):
        calls = kind.calls(WorkloadContext(spec, tokenizer, cfg, workdir, random.Random(spec.seed)))
        varied = None
        if spec.serving.vary is not None:  # the served set (its text from a stream of its own)
            varied = kind.varied_calls(WorkloadContext(spec, tokenizer, cfg, workdir,
                                                       random.Random(f"served {spec.seed}")), spec.serving.vary)
    if world.distributed and not kind.collective:  # this rank's share, in the same cyclic order
        calls = [calls[(j * world.size + world.rank) % len(calls)] for j in range(len(calls))]
        if varied is not None:
            varied = [varied[(j * world.size + world.rank) % len(varied)] for j in range(len(varied))]
    warmup = spec.warmup
    if kind.warmup_every_call(spec):
        warmup = max(warmup, len(calls))  # e.g. a warm cache: every distinct call seen once
    schedule = Schedule(calls, warmup, varied)
    if not world.distributed:  # quality checks: one process (a launcher's ranks shard the calls)
        with spent(timing, spec.name, "references"):
            schedule = _quality_inputs(run, spec, targets, schedule, device, dtype, workdir)
    prov = provenance(device, telemetry)
    ranks = {"rank": world.rank, "world_size": world.size, "shard": "collective" if kind.collective else "data"}
    stage_ranges = nvtx_stage_ranges() if run.nvtx else None  # `--nvtx`: the steady calls' stages as NVTX ranges
    written = 0
    for tspec in spec.targets:
        ctx = TargetContext(run, spec, tspec, device, dtype, cfg, prov, telemetry, ranks, stage_ranges=stage_ranges)
        failed = False
        try:
            written += _measure_target(pm, ctx, targets[tspec.name], schedule, out, progress, world)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(exc):
                raise
            failure = {"workload": spec.name, "file": spec.file, "target": tspec.label,
                       "error": f"out of memory: {short(f'{type(exc).__name__}: {exc}', 300, str) if str(exc) else type(exc).__name__}"}
            run.failures.append(failure)
            log.warning("failed %s · %s: %s (recorded in run.json; the run goes on)", spec.name, tspec.label,
                        failure["error"])
            failed = True
        if failed:  # the failed call's frames are released only now: give their memory back
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return written


def _quality_inputs(run: RunContext, spec: WorkloadSpec, targets: dict[str, RegisteredTarget], schedule: Schedule,
                    device: torch.device, dtype: torch.dtype, workdir) -> Schedule:
    """The reference check's sample and its FP32 reference outputs (computed before any target
    is built: one reference model at a time), and the accuracy mode's labelled set."""
    sample = sample_calls(schedule.calls, spec.agreement.sample)
    references = {}
    for tspec in spec.targets if sample else ():
        entry = targets[tspec.name]
        if entry.reference_options is None:
            continue
        key = reference_key(entry, tspec, spec)
        if key in references:
            continue
        log.info("%s: the FP32 reference path on %d request(s) (%s's weights)", spec.name, len(sample), tspec.label)
        try:
            reference = reference_outputs(spec, entry, tspec, device, sample)
            yardstick = None
            if dtype != torch.float32:  # the same path at the targets' precision (quality.YARDSTICK)
                yardstick = reference_outputs(spec, entry, tspec, device, sample, dtype)
            references[key] = (reference, yardstick)
        except (RuntimeError, MemoryError) as exc:
            # The check cannot run on this device (no memory for an FP32 copy, a reference op that
            # fails there): the performance is still measured; the failure is said and kept in
            # run.json, and the targets' records say `agreement: null` (not checked). Bad input (an
            # adapter that cannot be loaded: a DohnutsError) is refused as the target would refuse it.
            error = f"reference check: {short(f'{type(exc).__name__}: {exc}', 300, str)}"
            run.failures.append({"workload": spec.name, "file": spec.file, "target": tspec.label, "error": error})
            log.warning("failed %s · %s: %s (recorded in run.json; the run goes on)", spec.name, tspec.label, error)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    labelled = labelled_set(spec, workdir) if spec.accuracy is not None else None
    return dataclasses.replace(schedule, sample=sample, references=references, labelled=labelled)


# The spread-driven extension stops once the measured calls would pass this many seconds, as asv's
# `repeat` tuple caps its samples by `max_time` (20 s by default): a peer's update of seconds otherwise
# ran to the cap of calls (docs/history/evolution.md M37).
EXTEND_FOR_S = 20.0


def extended_calls(walls_ms: list[float], seconds: float) -> int:
    """How many calls of the median measured so far fit in `seconds` (at least one)."""
    return max(1, int(seconds * 1e3 / max(statistics.median(walls_ms), 1e-9)))


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


def _measure_target(pm, ctx: TargetContext, entry: RegisteredTarget, schedule: Schedule, out: RecordSink, progress,
                    world: World) -> int:
    """Every call of one target of a workload (warm-up, first call, measured calls, stream)."""
    spec, tspec = ctx.spec, ctx.target
    calls, warmup = schedule.calls, schedule.warmup
    written = 0
    timing = ctx.run.measured.setdefault("timing", {})

    def phase(name: str):  # this target's seconds in `name` (run.json `measured.timing`)
        return spent(timing, spec.name, name, tspec.label)

    with phase("build"):
        target, capabilities = entry.build(spec, ctx.device, ctx.dtype, entry.options(tspec.options, source=spec.file))
    ctx = dataclasses.replace(ctx, variant=capabilities.variant, lora=capabilities.lora_info)
    task = None
    if progress is not None:
        task = progress.add_task(f"{spec.name} · {tspec.label}", total=warmup + spec.repeat)
    try:
        for i in range(warmup):
            if i == 0:
                # The target's first call (compilation, autotuning, graph capture, cold caches)
                # is part of end-to-end cost: recorded on its own, never mixed into the steady state.
                with phase("first call"):
                    record = measure_call(ctx, target, calls[0], -1, phase="first-call")
                out.write(stamped(record, ctx.ranks))
                written += 1
            else:
                with phase("warm-up"):
                    target.run_call(calls[i % len(calls)], StageTimer(ctx.device))
            if progress is not None:
                progress.advance(task)
        key = reference_key(entry, tspec, spec) if entry.reference_options is not None else None
        if key in schedule.references:  # after warm-up, before the measured calls: every record carries it
            with phase("reference check"):
                ctx = dataclasses.replace(ctx, agreement=check_agreement(ctx, target, schedule.sample,
                                                                         *schedule.references[key]))
        # the target's energy per call over a window of back-to-back calls (the counter's steps are
        # too coarse for one call); carried in every steady record like the agreement
        with phase("energy window"):
            ctx = dataclasses.replace(ctx, energy_window=energy_window(
                ctx, target, [calls[(warmup + j) % len(calls)] for j in range(len(calls))]))
        barrier(world)  # the ranks start measuring together
        start = time.perf_counter()
        i, wanted, walls, twins_ms = 0, spec.repeat, [], 0.0
        max_calls = spec.max_repeat or 4 * spec.repeat
        # the measured calls alone, bracketed for `nsys --capture-range=cudaProfilerApi` (CUDA)
        with phase("measured calls"), measured_window(ctx.device):
            while any_rank(i < wanted or time.perf_counter() - start < spec.min_duration_s, world):
                call = calls[(warmup + i) % len(calls)]
                pm.hook.dohnuts_bench_before_call(run=ctx.run, spec=spec, target_name=tspec.label, iteration=i)
                if ctx.run.before_call is not None:
                    ctx.run.before_call(world, i)
                # every rank runs a twin or none (a training call all-reduces)
                twin = untimed_call_ms(ctx, target, call) if any_rank(wants_twin(i, twins_ms), world) else None
                twins_ms += twin or 0.0
                record = measure_call(ctx, target, call, i, twin_ms=twin)
                # Even and odd calls are two interleaved halves of one measurement: their difference
                # is the run's own noise budget (A/A, dohnuts.bench.analysis.compare.aa_noise).
                record = stamped(record, ctx.ranks)
                record.aa_half = i % 2
                pm.hook.dohnuts_bench_after_call(run=ctx.run, spec=spec, target_name=tspec.label, record=record)
                out.write(record)
                written += 1
                i += 1
                walls.append(record.wall_ms)
                if i == wanted and spec.halfwidth and wanted < max_calls:
                    # As many calls as the observed spread needs for the median's confidence
                    # interval to reach ±halfwidth (capped): the count follows the noise, for
                    # EXTEND_FOR_S of measuring at most (asv's max_time; the report states the interval).
                    wanted = min(max_calls, max(wanted, required_calls(walls, spec.halfwidth)))
                    wanted = min(wanted, max(i, extended_calls(walls, EXTEND_FOR_S)))
                    wanted = max_over_ranks(wanted, world)  # the noisiest rank decides for all
                    if progress is not None:
                        progress.update(task, total=warmup + wanted)
                if progress is not None:
                    progress.update(task, completed=warmup + min(i, wanted))
        barrier(world)
        if ctx.run.profile:
            with phase("profile"):
                _profile_target(ctx, target, [calls[(warmup + j) % len(calls)] for j in range(PROFILED_CALLS)], world)
        served = (ServedSet(calls, varied=False, offset=warmup) if schedule.varied is None else
                  ServedSet(schedule.varied, varied=True, seed=spec.serving.seed if spec.serving.seed is not None
                            else spec.seed))
        with phase("stream and served"):
            written += measure_scenario(ctx, target, capabilities, served, walls, out)
        if schedule.labelled is not None and not world.distributed:
            name, requests = schedule.labelled
            reason = can_score(entry, requests)
            if reason:
                log.info("skipped accuracy of %s · %s: %s", spec.name, tspec.label, reason)
            else:
                with phase("accuracy"):
                    written += measure_accuracy(ctx, target, name, requests, out)
    finally:
        target.close()
        del target
        gc.collect()
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    return written


def _profile_target(ctx: TargetContext, target, calls: list, world: World) -> None:
    """A trace of a few more steady calls (not measurements: no record), named in run.json. A rank of
    a multi-process run writes its own (`rank_trace_path`, in the launcher's `run.trace_dir`)."""
    run, label = ctx.run, ctx.target.label
    if world.distributed:
        import torch.distributed as dist  # only a launched rank has a process group to ask

        path = rank_trace_path(run.trace_dir, label, world.rank)
        info = {"rank": world.rank, "world_size": world.size, "backend": str(dist.get_backend())}
        n = profile_calls(target, calls, ctx.device, path, ctx.telemetry, distributed=info)
        run.traces.append({"workload": ctx.spec.name, "target": label, "path": str(path.parent), "calls": n,
                           "ranks": world.size})
        return
    path = trace_path(run.run_dir, ctx.spec.name, label)
    n = profile_calls(target, calls, ctx.device, path, ctx.telemetry)
    run.traces.append({"workload": ctx.spec.name, "target": label, "path": str(path.relative_to(run.run_dir)),
                       "calls": n})
