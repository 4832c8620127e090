"""Profiler traces of a run (`dohnuts-bench run --profile`).

After a target's measured calls (and before its stream), a few more of its steady calls run under
torch.profiler and their trace is written as gzipped Chrome-trace JSON, which Perfetto
(ui.perfetto.dev) and chrome://tracing open: `RUN/traces/<workload>__<target>.json.gz`. Each call
is a range "dohnuts call <i>" and each harness stage inside it a range "dohnuts:<stage>"
(record_function; on CUDA also an NVTX range, for Nsight Systems), beside the operators and, on a
GPU, the kernels. Beside it, `<workload>__<target>.ops.txt` is torch.profiler's own table of the
operators and kernels by their self time (device time on a GPU): the trace's answer to "which
kernel costs most" in a few kilobytes, for a GPU whose traces are too large to bring back. The
profiled calls are not measurements: no record is written for them, so a profiled run's numbers
are those of an unprofiled one. Single-process workloads only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dohnuts.bench.rundir import safe_name
from dohnuts.runtime.timing import StageTimer

PROFILED_CALLS = 3  # enough to see a steady call whole, short enough to keep the trace small
OPS_ROWS = 50  # rows of the operator table


def trace_path(run_dir: Path, workload: str, target: str) -> Path:
    return run_dir / "traces" / f"{safe_name(workload)}__{safe_name(target)}.json.gz"


def ops_path(trace: Path) -> Path:
    return trace.with_name(trace.name.removesuffix(".json.gz") + ".ops.txt")


def profile_calls(target, calls: list, device: torch.device, path: Path) -> int:
    """Run `calls` on `target` under torch.profiler, each stage a named range; write the trace to
    `path` (gzipped Chrome JSON) and the operator table beside it (`ops_path`). Returns the number
    of calls profiled."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities) as prof:
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
    ops = ops_path(path)
    ops.write_text(f"{len(calls)} steady calls under torch.profiler, by {key}\n{table}\n")
    return len(calls)
