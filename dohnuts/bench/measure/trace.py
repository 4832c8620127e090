"""Profiler traces of a run (`dohnuts-bench run --profile`).

After a target's measured calls (and before its stream), a few more of its steady calls run under
torch.profiler and their trace is written as gzipped Chrome-trace JSON, which Perfetto
(ui.perfetto.dev) and chrome://tracing open: `RUN/traces/<workload>__<target>.json.gz`. Each call
is a range "dohnuts call <i>" and each harness stage inside it a range "dohnuts:<stage>"
(record_function; on CUDA also an NVTX range, for Nsight Systems), beside the operators and, on a
GPU, the kernels. Beside it, `<workload>__<target>.ops.txt` is torch.profiler's own table of the
operators and kernels by their self time (device time on a GPU): the trace's answer to "which
kernel costs most" in a few kilobytes, for a GPU whose traces are too large to bring back. It
holds three tables:
- the operators and kernels by self time;
- the same grouped by the operators' input shapes (which `aten::copy_` moves which tensor);
- on a GPU, each stage's device time and its costliest kernels (`stage_kernels`), and how much
  of the stage's range on the device no kernel ran, with its longest gap. The kernels are placed
  by the stage's range on the device timeline, so a stage replayed as a CUDA graph, whose kernels
  have no launching operator, is attributed too.

The profiled calls are not measurements: no record is written for them, so a profiled run's
numbers are those of an unprofiled one.

The telemetry sampled while the profiled calls ran (GPU clock, power, utilisation; the host's CPU
load) is in the trace as counter tracks (`"ph": "C"`, named "dohnuts telemetry: <sampler>
<field>"), placed on the trace's clock by `trace_clock_offset_us` (`telemetry_counters`).

A multi-process workload (a launcher's ranks) is profiled on every rank: each writes
`RUN/traces/<workload>-p<N>/<target>/rank<k>.json.gz` carrying `distributedInfo` {rank,
world_size, backend} — one folder per workload, process count and target holding one trace per
rank, the layout HolisticTraceAnalysis's `TraceAnalysis(trace_dir=...)` reads.

Two more conventions of the profilers live here: `nvtx_stage_ranges` (`run --nvtx`: each stage of
a measured call an NVTX range in the domain `dohnuts`) and `measured_window` (the measured calls
bracketed by `torch.cuda.profiler.start()`/`stop()`, what `nsys profile
--capture-range=cudaProfilerApi` captures).
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from dohnuts.bench.store.rundir import derived_name, new_file
from dohnuts.errors import ConfigError
from dohnuts.runtime.timing import NvtxRanges, StageTimer

PROFILED_CALLS = 3  # enough to see a steady call whole, short enough to keep the trace small
OPS_ROWS = 50  # rows of the operator table
SHAPE_ROWS = 30  # rows of the table by input shape
STAGE_KERNELS = 8  # kernels named per stage
COUNTER_SAMPLES = 10_000  # telemetry samples a trace's counter tracks hold at most
CALL_RANGE = "dohnuts call "  # the profiled calls' ranges: "dohnuts call 0", ...


def nvtx_stage_ranges() -> NvtxRanges:
    """The stage ranges of `run --nvtx`: NVIDIA's `nvtx` package, domain `dohnuts`. Without the
    package `--nvtx` is refused in one line (never a silent fallback to another domain or API)."""
    try:
        import nvtx  # optional (the nvidia extra): only `run --nvtx` needs it
    except ImportError:
        raise ConfigError("needs NVIDIA's nvtx package, which is not installed: pip install 'dohnuts[nvidia]' "
                          "(or pip install nvtx)", source="command line", field="--nvtx") from None
    return NvtxRanges(nvtx)


@contextmanager
def measured_window(device: torch.device) -> Iterator[None]:
    """A target's measured calls bracketed by `torch.cuda.profiler.start()` and `stop()`
    (cudaProfilerStart/Stop) on a CUDA device, so that `nsys profile --capture-range=cudaProfilerApi
    --capture-range-end=repeat` captures them and nothing else (not the warm-up, the first call,
    the energy window or the stream). Without a profiler attached the two calls do nothing."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.profiler.start()
    try:
        yield
    finally:
        torch.cuda.profiler.stop()


def rank_trace_path(trace_dir: Path, target: str, rank: int) -> Path:
    """Rank `rank`'s trace of `target` in a multi-process launch's folder (`trace_dir`:
    RUN/traces/<workload>-p<N>): `<target>/rank<k>.json.gz`, one folder per target, as HTA reads."""
    return trace_dir / derived_name(target) / f"rank{rank}.json.gz"


def trace_path(run_dir: Path, workload: str, target: str) -> Path:
    """A new trace file of this workload and target (dohnuts.bench.store.rundir: derived names never collide,
    `a b` and `a/b` included; a clash left anyway takes `-N`)."""
    return new_file(run_dir / "traces", f"{derived_name(workload)}__{derived_name(target)}", ".json.gz")


def ops_path(trace: Path) -> Path:
    return trace.with_name(trace.name.removesuffix(".json.gz") + ".ops.txt")


def profile_calls(target, calls: list, device: torch.device, path: Path, telemetry=None,
                  distributed: dict | None = None) -> int:
    """Run `calls` on `target` under torch.profiler, each stage a named range; write the trace to
    `path` (gzipped Chrome JSON) with the telemetry sampled meanwhile as counter tracks
    (`telemetry`: a TelemetryThread, or None) and, for a rank of a multi-process run, its
    `distributedInfo` (`distributed`: {"rank", "world_size", "backend"}; torch.profiler adds it when
    the process group is up, this fills in what it left out), and the operator table beside it
    (`ops_path`). Returns the number of calls profiled."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    starts = []  # perf_counter right before each call's range opens: the trace's clock is set against it
    with profile(activities=activities, record_shapes=True) as prof:
        for i, call in enumerate(calls):
            starts.append(time.perf_counter())
            with record_function(f"{CALL_RANGE}{i}"):
                target.run_call(call, StageTimer(device, ranges=True))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        end = time.perf_counter()
    stem = path.name.removesuffix(".json.gz")
    exported = path.with_name(stem + ".tmp.json")
    prof.export_chrome_trace(str(exported))
    trace = json.loads(exported.read_text(encoding="utf-8"))
    exported.unlink()
    if telemetry is not None:  # the samples around the calls too: a short trace falls between two samples
        t0 = starts[0] - telemetry.interval_s
        rows = telemetry.window(t0, end + telemetry.interval_s, limit=COUNTER_SAMPLES)
        trace["traceEvents"] = trace.get("traceEvents", []) + telemetry_counters(trace, rows, t0, starts)
    if distributed is not None:
        trace["distributedInfo"] = distributed | (trace.get("distributedInfo") or {})
    tmp = path.with_name(stem + ".tmp.json.gz")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(trace, f)
    tmp.replace(path)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=OPS_ROWS, max_name_column_width=90)
    shapes = prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=SHAPE_ROWS,
                                                                 max_name_column_width=50, max_shapes_column_width=70)
    parts = [f"{len(calls)} steady calls under torch.profiler, by {key}\n{table}",
             f"The same, grouped by the operators' input shapes\n{shapes}"]
    if device.type == "cuda":
        parts.append(stage_kernels_text(stage_kernels(trace, len(calls))))
    ops = ops_path(path)
    ops.write_text("\n\n".join(parts) + "\n")
    return len(calls)


def trace_clock_offset_us(trace: dict, starts: list[float]) -> tuple[float, object] | None:
    """(trace time − perf_counter time, in µs; the calls' pid) of a trace whose call `i` is the host
    range "dohnuts call <i>" opened right after `starts[i]` (perf_counter seconds): the median over
    the calls of (the range's `ts` − starts[i]). torch.profiler's clock (Kineto's, with its own
    origin) then maps to the telemetry's to within the few µs between the clock read and the
    range's start. None when the trace holds none of the calls' ranges."""
    events = {e["name"]: e for e in trace.get("traceEvents") or []
              if e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation" and "ts" in e
              and str(e.get("name", "")).startswith(CALL_RANGE)}
    matched = [(events[f"{CALL_RANGE}{i}"], t) for i, t in enumerate(starts) if f"{CALL_RANGE}{i}" in events]
    if not matched:
        return None
    return statistics.median(float(e["ts"]) - t * 1e6 for e, t in matched), matched[0][0].get("pid")


def telemetry_counters(trace: dict, rows: list[dict], t0: float, starts: list[float]) -> list[dict]:
    """Chrome-trace counter events (`"ph": "C"`) of the telemetry samples `rows` (a
    TelemetryThread.window from perf_counter `t0`: each sample's `dt_ms` after it, a dict of readings
    per sampler), one track per sampler and numeric field ("dohnuts telemetry: nvml sm_clock_mhz"),
    on the trace's clock (`trace_clock_offset_us`), in the calls' process. Readings that are not
    finite numbers (an error, a missing sensor) are left out."""
    aligned = trace_clock_offset_us(trace, starts)
    if aligned is None:
        return []
    offset_us, pid = aligned
    out = []
    for row in rows:
        ts = (t0 + row["dt_ms"] / 1e3) * 1e6 + offset_us
        for sampler, readings in row.items():
            if not isinstance(readings, dict):
                continue
            for field, value in readings.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    continue
                out.append({"ph": "C", "name": f"dohnuts telemetry: {sampler} {field}", "pid": pid, "ts": ts,
                            "args": {field: value}})
    return out


def stage_kernels(trace: dict, calls: int) -> dict[str, dict]:
    """Per harness stage, the device time of the kernels (and copies, sets) that ran inside its
    range on the device, per call: {stage: {"ms": total, "kernels": {name: ms}}}; kernels outside
    every stage range go under "(outside the stages)". Ranges are the "dohnuts:<stage>" annotations
    the profiler places on the device timeline (`gpu_user_annotation`).

    A stage with ranges also gets, per call, its ranges' device time ("range_ms") and the part of
    it no kernel ran ("idle_ms": the range less the union of its kernels, so kernels on two streams
    at once count once), and its longest idle gap ("gap": µs, and the kernels before and after it —
    or the range's start or end): where a host that issues late, or a launch's own setup, leaves
    the device waiting inside the stage."""
    events = trace.get("traceEvents") or []
    ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"].removeprefix("dohnuts:")) for e in events
                    if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("dohnuts:"))
    out: dict[str, dict] = {}
    inside: dict[int, list] = {}  # range index → its kernels' (start, end, name)
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset") or "ts" not in e:
            continue
        i = next((i for i, (start, end, _) in enumerate(ranges) if start <= e["ts"] < end), None)
        stage = ranges[i][2] if i is not None else "(outside the stages)"
        entry = out.setdefault(stage, {"ms": 0.0, "kernels": {}})
        ms = e.get("dur", 0) / 1000 / max(calls, 1)
        entry["ms"] += ms
        entry["kernels"][e["name"]] = entry["kernels"].get(e["name"], 0.0) + ms
        if i is not None:
            inside.setdefault(i, []).append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    for i, (start, end, stage) in enumerate(ranges):
        if stage not in out:  # a range no kernel ran in: nothing to attribute
            continue
        entry = out[stage]
        busy, at, prev = 0.0, start, "the range's start"
        gaps = [] if "gap" not in entry else [entry["gap"]]
        for k0, k1, name in sorted(inside.get(i, [])):
            k1 = min(k1, end)
            if k0 > at:
                gaps.append({"us": k0 - at, "after": prev, "before": name})
            busy += max(0.0, k1 - max(k0, at))
            if k1 > at:
                at, prev = k1, name
        if end > at:
            gaps.append({"us": end - at, "after": prev, "before": "the range's end"})
        entry["range_ms"] = entry.get("range_ms", 0.0) + (end - start) / 1000 / max(calls, 1)
        entry["idle_ms"] = entry.get("idle_ms", 0.0) + (end - start - busy) / 1000 / max(calls, 1)
        if gaps:
            entry["gap"] = max(gaps, key=lambda g: g["us"])
    return out


def stage_kernels_text(stages: dict[str, dict]) -> str:
    lines = ["Device time per stage and call, by the stage's range on the device, with its costliest kernels"]
    for stage, entry in sorted(stages.items(), key=lambda kv: -kv[1]["ms"]):
        line = f"{stage}: {entry['ms']:.3f} ms"
        if "range_ms" in entry:
            line += f" of kernels in a {entry['range_ms']:.3f} ms range, {entry['idle_ms']:.3f} ms idle"
            if entry.get("gap", {}).get("us", 0) >= 0.1:
                g = entry["gap"]
                line += f" (the longest gap {g['us']:.1f} µs, after {g['after'][:50]}, before {g['before'][:50]})"
        lines.append(line)
        top = sorted(entry["kernels"].items(), key=lambda kv: -kv[1])[:STAGE_KERNELS]
        lines += [f"    {ms:9.3f} ms  {ms / entry['ms']:6.1%}  {name[:110]}" for name, ms in top if entry["ms"] > 0]
    return "\n".join(lines)
