"""One rank of a multi-process measurement, started by a launcher plugin (torchrun):

    python -m torch.distributed.run --standalone --nproc-per-node N -m dohnuts.bench.measure.worker \\
        --workload FILE --dir RANKS_DIR --run-id ID [--gpu] [--telemetry-interval S] [--nvtx]
        [--traces TRACE_DIR]

Every rank joins the process group (NCCL on GPUs, gloo on CPUs), measures the workload on its
own device with the same run loop as a single process (dohnuts.bench.measure.runner.measure_workload,
which shards or shares the calls and keeps the ranks' counts in step), and writes its records to
`RANKS_DIR/rank<R>.jsonl` (a RecordSink: each line flushed as it is measured). Rank 0 first measures
the all-reduce bus bandwidth of this world (dohnuts.bench.measure.interconnect: the interconnect's measured
ceiling) into `RANKS_DIR/measured.json`; a rank whose target failed (out of memory) writes
`RANKS_DIR/failures-rank<R>.json`. With `--traces` (`run --profile`) every rank writes its profiler
trace into TRACE_DIR (dohnuts.bench.measure.trace: one folder a target, a file a rank) and names it
in `RANKS_DIR/traces-rank<R>.json`; `--nvtx` is `run --nvtx`'s. The launcher gathers all of it into
the run's files.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from dohnuts.bench import plugins
from dohnuts.bench.contracts import RunContext
from dohnuts.bench.measure import runner
from dohnuts.bench.measure.interconnect import allreduce_busbw
from dohnuts.bench.measure.telemetry import TelemetryThread
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import check_target_options, collect, samplers
from dohnuts.bench.report.terminal import SafeConsole
from dohnuts.bench.sink import RecordSink
from dohnuts.runtime.collectives import barrier
from dohnuts.runtime.process_group import join, leave
from dohnuts.schema import write_json

FAULT = "DOHNUTS_BENCH_FAULT_EXIT"


def _fault_from_environment():
    """The launcher tests' fault injection: DOHNUTS_BENCH_FAULT_EXIT="rank=R,call=I" makes rank R
    of a multi-process measurement exit abruptly (status 17, nothing flushed) before its measured
    call I. A test hook of this worker only: nothing else reads it."""
    spec = os.environ.get(FAULT)
    if not spec:
        return None
    fields = dict(part.split("=", 1) for part in spec.split(","))
    rank, call = int(fields["rank"]), int(fields["call"])

    def fault(world, i: int) -> None:
        if world.rank == rank and i == call:
            os._exit(17)

    return fault


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dohnuts.bench.measure.worker")
    p.add_argument("--workload", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--gpu", action="store_true", help="measure the workload's GPU variant (on_gpu)")
    p.add_argument("--telemetry-interval", type=float, default=0.1)
    p.add_argument("--nvtx", action="store_true", help="the measured calls' stages as NVTX ranges (run --nvtx)")
    p.add_argument("--traces", help="profile every target into this folder (run --profile)")
    args = p.parse_args(argv)


    world, device = join("cuda" if args.gpu else "cpu")
    out_dir = Path(args.dir)
    pm = plugins.plugin_manager()
    kinds = collect(pm, "dohnuts_bench_register_workload_kinds")
    targets = collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(args.workload, kinds, targets, gpu=args.gpu)
    check_target_options(spec, targets)

    run = RunContext(run_id=args.run_id, run_dir=out_dir / f"rank{world.rank}", device=torch.device(device),
                     hwspec=None, console=SafeConsole(stderr=True, quiet=True),
                     before_call=_fault_from_environment(), nvtx=args.nvtx, profile=args.traces is not None,
                     trace_dir=Path(args.traces) if args.traces else None)
    busbw = allreduce_busbw(world)
    if busbw is not None:
        write_json(out_dir / "measured.json", {"allreduce_busbw": busbw}, indent=2)
    telemetry = TelemetryThread([s for s in samplers(pm) if not s.unavailable], interval_s=args.telemetry_interval)
    telemetry.start()
    try:
        with RecordSink.open(out_dir / f"rank{world.rank}.jsonl") as out:
            runner.measure_workload(run, pm, spec, kinds, targets, telemetry, out, world=world)
    finally:
        telemetry.stop()
    if run.failures:
        write_json(out_dir / f"failures-rank{world.rank}.json", run.failures)
    if run.traces:
        write_json(out_dir / f"traces-rank{world.rank}.json", run.traces)
    barrier(world)  # every rank done before any tears its process group down
    leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
