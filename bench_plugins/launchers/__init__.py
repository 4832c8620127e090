"""Built-in launcher: `torchrun` — several processes of one workload, one per GPU (gloo
processes on a CPU), the way optimum-benchmark separates launchers from targets.

A workload whose `processes` lists a count N > 1 is measured by N ranks started with
`python -m torch.distributed.run --standalone --nproc-per-node N -m dohnuts.bench.measure.worker`. Each
rank runs the ordinary run loop on its own device and writes its own JSONL; when torchrun ends,
the launcher writes every rank's records to the run's record sink (rank 0's first, each
record stamped with `rank` and `world_size`), adds the all-reduce bandwidth rank 0 measured to
the run's measured ceilings (`allreduce_busbw`: the interconnect), and keeps torchrun's log in
`ranks/<workload>-p<N>/torchrun.log` (a new folder each launch, dohnuts.bench.store.rundir.new_dir). A failed rank (torchrun then stops the others) becomes one
entry of the run's `failures`, naming the rank and its exit code; the records the ranks
completed are kept. Counts above the machine's GPUs are skipped with a message. Under `run --profile`
every rank writes its trace to `RUN/traces/<workload>-p<N>/<target>/rank<k>.json.gz` (named in
run.json's `traces` by its folder); `run --nvtx` reaches the ranks too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dohnuts.bench.contracts import RunContext
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.report.status import log as status_log
from dohnuts.bench.sink import RecordSink
from dohnuts.bench.store.rundir import derived_name, new_dir


class TorchrunLauncher:
    name = "torchrun"

    def unavailable(self, processes: int, device) -> str | None:
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        import torch

        if device.type == "cuda":
            have = torch.cuda.device_count()
            if processes > have:
                return f"needs {processes} GPUs, this machine has {have}"
        return None

    def launch(self, run: RunContext, spec, processes: int, out: RecordSink, *, gpu: bool,
               telemetry_interval: float = 0.1) -> int:
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        from dohnuts.launch import torchrun_failure

        # a new folder a launch: its ranks' records are gathered once, never mixed with another's
        ranks_dir = new_dir(run.run_dir / "ranks", f"{derived_name(spec.name)}-p{processes}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "-m", "dohnuts.bench.measure.worker", "--workload", str(spec.file), "--dir", str(ranks_dir),
               "--run-id", run.run_id, "--telemetry-interval", str(telemetry_interval)] + (["--gpu"] if gpu else [])
        cmd += ["--nvtx"] if run.nvtx else []
        if run.profile:  # every rank's trace, one folder a target (what HTA reads): RUN/traces/<workload>-p<N>
            cmd += ["--traces", str(run.run_dir / "traces" / ranks_dir.name)]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
        env.setdefault("PYTHONUNBUFFERED", "1")
        log_path = ranks_dir / "torchrun.log"
        status_log.info("%s: %d processes (torchrun) …", spec.name, processes)
        t0 = time.perf_counter()
        with open(log_path, "w", encoding="utf-8") as log:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode
        written = self._gather(ranks_dir, processes, out, run)
        if code != 0:
            lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
            rank, exitcode = torchrun_failure(lines)
            what = (f"rank {rank} failed (exit code {exitcode})" if rank is not None
                    else f"torchrun exited with status {code}")
            failure = {"workload": spec.name, "file": spec.file, "target": "*",
                       "error": f"{processes} processes: {what}; log: {log_path}"}
            run.failures.append(failure)
            status_log.warning("failed %s (%d processes): %s (%d records kept; the run goes on)", spec.name, processes,
                        failure["error"], written)
        else:
            status_log.info("%s: %d processes done in %.0f s, %d records", spec.name, processes, time.perf_counter() - t0,
                     written)
        return written

    @staticmethod
    def _gather(ranks_dir: Path, processes: int, out: RecordSink, run: RunContext) -> int:
        written = 0
        for r in range(processes):
            path = ranks_dir / f"rank{r}.jsonl"
            if path.exists():
                written += out.copy_records(path)  # a last line cut by a rank killed mid-write: skipped
            failures = ranks_dir / f"failures-rank{r}.json"
            if failures.exists():
                run.failures.extend(json.loads(failures.read_text()))
        traces = ranks_dir / "traces-rank0.json"  # every rank profiled the same targets: rank 0's list names them
        if traces.exists():
            for entry in json.loads(traces.read_text()):
                run.traces.append(entry | {"path": os.path.relpath(entry["path"], run.run_dir)})
        measured = ranks_dir / "measured.json"
        if measured.exists():
            entry = json.loads(measured.read_text()).get("allreduce_busbw")
            if entry:
                run.measured.setdefault("interconnect", {})[str(processes)] = entry
                ceilings = run.measured.setdefault("ceilings", {})
                best = ceilings.get("allreduce_busbw")
                if best is None or entry["value"] > best.get("value", 0):  # a bound stays optimistic
                    ceilings["allreduce_busbw"] = entry
        return written


@hookimpl
def dohnuts_bench_register_launchers():
    return {"torchrun": TorchrunLauncher()}
