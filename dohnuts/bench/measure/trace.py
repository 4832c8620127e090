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
- on a GPU, each stage's device time and its costliest kernels (`stage_kernels`). The kernels
  are placed by the stage's range on the device timeline, so a stage replayed as a CUDA graph,
  whose kernels have no launching operator, is attributed too.

The profiled calls are not measurements: no record is written for them, so a profiled run's
numbers are those of an unprofiled one. Single-process workloads only.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from dohnuts.bench.store.rundir import derived_name, new_file
from dohnuts.runtime.timing import StageTimer

PROFILED_CALLS = 3  # enough to see a steady call whole, short enough to keep the trace small
OPS_ROWS = 50  # rows of the operator table
SHAPE_ROWS = 30  # rows of the table by input shape
STAGE_KERNELS = 8  # kernels named per stage


def trace_path(run_dir: Path, workload: str, target: str) -> Path:
    """A new trace file of this workload and target (dohnuts.bench.store.rundir: derived names never collide,
    `a b` and `a/b` included; a clash left anyway takes `-N`)."""
    return new_file(run_dir / "traces", f"{derived_name(workload)}__{derived_name(target)}", ".json.gz")


def ops_path(trace: Path) -> Path:
    return trace.with_name(trace.name.removesuffix(".json.gz") + ".ops.txt")


def profile_calls(target, calls: list, device: torch.device, path: Path) -> int:
    """Run `calls` on `target` under torch.profiler, each stage a named range; write the trace to
    `path` (gzipped Chrome JSON) and the operator table beside it (`ops_path`). Returns the number
    of calls profiled."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities, record_shapes=True) as prof:
        for i, call in enumerate(calls):
            with record_function(f"dohnuts call {i}"):
                target.run_call(call, StageTimer(device, ranges=True))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    tmp = path.with_name(path.name.removesuffix(".json.gz") + ".tmp.json.gz")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(path)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=OPS_ROWS, max_name_column_width=90)
    shapes = prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=SHAPE_ROWS,
                                                                 max_name_column_width=50, max_shapes_column_width=70)
    parts = [f"{len(calls)} steady calls under torch.profiler, by {key}\n{table}",
             f"The same, grouped by the operators' input shapes\n{shapes}"]
    if device.type == "cuda":

        with gzip.open(path, "rt") as f:
            parts.append(stage_kernels_text(stage_kernels(json.load(f), len(calls))))
    ops = ops_path(path)
    ops.write_text("\n\n".join(parts) + "\n")
    return len(calls)


def stage_kernels(trace: dict, calls: int) -> dict[str, dict]:
    """Per harness stage, the device time of the kernels (and copies, sets) that ran inside its
    range on the device, per call: {stage: {"ms": total, "kernels": {name: ms}}}; kernels outside
    every stage range go under "(outside the stages)". Ranges are the "dohnuts:<stage>" annotations
    the profiler places on the device timeline (`gpu_user_annotation`)."""
    events = trace.get("traceEvents") or []
    ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"].removeprefix("dohnuts:")) for e in events
                    if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("dohnuts:"))
    out: dict[str, dict] = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset") or "ts" not in e:
            continue
        stage = next((name for start, end, name in ranges if start <= e["ts"] < end), "(outside the stages)")
        entry = out.setdefault(stage, {"ms": 0.0, "kernels": {}})
        ms = e.get("dur", 0) / 1000 / max(calls, 1)
        entry["ms"] += ms
        entry["kernels"][e["name"]] = entry["kernels"].get(e["name"], 0.0) + ms
    return out


def stage_kernels_text(stages: dict[str, dict]) -> str:
    lines = ["Device time per stage and call, by the stage's range on the device, with its costliest kernels"]
    for stage, entry in sorted(stages.items(), key=lambda kv: -kv[1]["ms"]):
        lines.append(f"{stage}: {entry['ms']:.3f} ms")
        top = sorted(entry["kernels"].items(), key=lambda kv: -kv[1])[:STAGE_KERNELS]
        lines += [f"    {ms:9.3f} ms  {ms / entry['ms']:6.1%}  {name[:110]}" for name, ms in top if entry["ms"] > 0]
    return "\n".join(lines)
