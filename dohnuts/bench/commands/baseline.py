"""`dohnuts-bench baseline`: this machine's gate baseline, made by one command.

    dohnuts-bench baseline [WORKLOAD.yaml ...] [--runs 3] [--every 600] [--into results/baselines]

Runs the workloads (default: the standard suite, as `dohnuts-bench run` does) `--runs` times,
each run starting `--every` seconds after the one before — spread over time, so the drift between
the runs is what unchanged code does on this machine over minutes (other processes, clocks,
caches), not one quiet minute (three runs taken 6 s apart once gave a tolerance that the same
commit failed by 3.2–3.7× later). Writes `<into>/<machine id>/` (dohnuts.bench.measure.machine_id):
`run-1/`, `run-2/`, … each a run's `run.json` and `results.jsonl.gz`, and `baseline.json` naming
the machine, the runs, when they started, the workloads and the revision. A folder holding a
baseline is replaced only with `--replace` (after an intended change); the new one is built beside
it and swapped in when complete, so an interrupted baseline leaves the old one in force.

It prints, per workload · target, each run's median and their drift (max / min − 1): the
tolerance `dohnuts-bench gate` will allow for that workload (dohnuts.bench.commands.gate).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import time
from pathlib import Path

import msgspec

from dohnuts.bench.report.status import log
from dohnuts.errors import ConfigError, DohnutsError

DEFAULT_ROOT = Path("results/baselines")
MANIFEST = "baseline.json"
MAX_EVERY_S = 24 * 3600
MAX_RUNS = 100  # --runs: 100 runs 10 minutes apart is 17 hours; a typo's 100,000,000 would never end


class BaselineManifest(msgspec.Struct):
    """A baseline folder's baseline.json (what `cmd_baseline` writes; other keys are ignored)."""

    runs: list[str]  # the run folders, in the order they were measured
    machine: str | None = None  # the machine id the baseline was measured on


def _manifest(folder: Path) -> BaselineManifest:
    """A baseline folder's manifest, typed (dohnuts.schema.read_json: a regular file within bounds,
    checked by its stat; one line naming the file and the field otherwise)."""
    from dohnuts.schema import MIB, read_json

    return read_json(folder / MANIFEST, BaselineManifest, max_bytes=MIB, error=DohnutsError,
                     what="a baseline manifest")


def baseline_runs(folder: Path) -> list[Path]:
    """The run directories of a baseline folder (its baseline.json), in order."""
    return [folder / name for name in _manifest(folder).runs]


def baseline_machine(folder: Path) -> str | None:
    """The machine a baseline folder was measured on (None when its manifest does not say)."""
    try:
        return _manifest(folder).machine
    except DohnutsError:
        return None


def _compact(run_dir: Path, dest: Path) -> None:
    """Keep what the gate reads: run.json and the records, gzipped (as committed runs are)."""
    dest.mkdir(parents=True)
    shutil.copy2(run_dir / "run.json", dest / "run.json")
    with open(run_dir / "results.jsonl", "rb") as src, \
            gzip.GzipFile(dest / "results.jsonl.gz", "wb", mtime=0) as out:
        shutil.copyfileobj(src, out)


def _wait_until(start: float, label: str) -> None:
    """Sleep until `start` (time.monotonic), saying so at least every 60 s."""
    while (left := start - time.monotonic()) > 0:
        log.info("%s starts in %.0f s (the baseline's runs are spread over time)", label, left)
        time.sleep(min(left, 60.0))


def cmd_baseline(args) -> int:
    import io
    import json

    import torch
    from dohnuts.bench.report.terminal import SafeConsole

    from dohnuts.bench.commands.gate import timings
    from dohnuts.bench.measure.machine_id import this_machine
    from dohnuts.bench.measure.provenance import git_revision
    from dohnuts.threads import check_threads
    from dohnuts.bench.commands.run import cmd_run
    from dohnuts.schema import check_output_folder, write_json

    if not 2 <= args.runs <= MAX_RUNS:
        raise ConfigError(f"must be in 2..{MAX_RUNS} (at least 2: the drift between runs is the tolerance), got "
                          f"{args.runs}", source="command line", field="--runs")
    if not 0 <= args.every <= MAX_EVERY_S:
        raise ConfigError(f"must be in [0, {MAX_EVERY_S}] seconds, got {args.every:g}", source="command line",
                          field="--every")
    check_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    saved = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    machine = this_machine(device)
    torch.set_num_threads(saved)
    into = check_output_folder(args.into, field="--into", error=ConfigError, create=False, holds_new_folders=True)
    folder = into / machine
    if (folder / MANIFEST).exists() and not args.replace:
        raise ConfigError("holds this machine's baseline already; --replace makes a new one (after an intended "
                          "change)", source=str(folder))
    staging = folder.with_name(folder.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    runs, started = [], []
    t0 = time.monotonic()
    try:
        for i in range(1, args.runs + 1):
            _wait_until(t0 + (i - 1) * args.every, f"baseline run {i} of {args.runs}")
            log.info("baseline run %d of %d (machine %s)", i, args.runs, machine)
            started.append(time.strftime("%Y-%m-%dT%H:%M:%S"))
            run_args = argparse.Namespace(
                workloads=args.workloads, out=str(staging / "raw"), label=f"baseline-{i}", hwspec=args.hwspec,
                telemetry_interval=0.1, quiet=args.quiet, profile=False, nvtx=False,
                store=str(staging / "store.sqlite"), threads=args.threads)
            code = cmd_run(run_args, console=SafeConsole(file=io.StringIO(), width=120))  # reports are not wanted
            if code != 0:
                raise DohnutsError(f"baseline run {i} ended with status {code}; no baseline written",
                                   source=str(folder))
            (raw,) = [p for p in (staging / "raw").iterdir() if p.is_dir()]
            _compact(raw, staging / f"run-{i}")
            shutil.rmtree(raw)
            runs.append(f"run-{i}")
        shutil.rmtree(staging / "raw", ignore_errors=True)
        for leftover in staging.glob("store.sqlite*"):
            leftover.unlink()
        workloads = [str(w) for w in args.workloads] or ["(the standard suite)"]
        write_json(staging / MANIFEST, {"schema": 1, "machine": machine, "runs": runs, "started": started,
                                        "every_s": args.every, "workloads": workloads, "threads": args.threads,
                                        "revision": git_revision()}, indent=2)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # the old baseline stays in force
        raise
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    per_run = [timings(folder / r) for r in runs]
    print(f"baseline of {machine}: {len(runs)} runs, {args.every:g} s apart → {folder}")
    for name in sorted(set().union(*per_run)):
        medians = [statistics.median(t[name]) for t in per_run if name in t]
        drift = max(medians) / min(medians) - 1.0 if min(medians) > 0 else float("inf")
        print(f"  {name}: medians {', '.join(f'{m:.4g}' for m in medians)} ms; drift {drift:.0%}")
    print(f"gate a build with: dohnuts-bench gate RUN_DIR   (RUN_DIR: a `dohnuts-bench run --threads {args.threads}` "
          "of the same workloads on this machine)")
    return 0


def add_parser(sub) -> None:
    from dohnuts.threads import DEFAULT_CPU_THREADS

    b = sub.add_parser("baseline", help="this machine's gate baseline: the workloads run --runs times, --every "
                                        "seconds apart, into results/baselines/<machine>/")
    b.add_argument("workloads", nargs="*", help="workload YAML files (default: the embedded standard suite)")
    b.add_argument("--runs", type=int, default=3, help=f"runs of the workloads, 2 to {MAX_RUNS} (default: 3)")
    b.add_argument("--every", type=float, default=600.0,
                   help="seconds from one run's start to the next's, so the runs span time (default: 600)")
    b.add_argument("--into", default=str(DEFAULT_ROOT),
                   help="folder of the per-machine baselines (default: results/baselines)")
    b.add_argument("--replace", action="store_true",
                   help="replace this machine's baseline (default: refuse to overwrite one)")
    b.add_argument("--threads", type=int, default=DEFAULT_CPU_THREADS,
                   help="torch threads of a CPU run, as `run --threads` (default: 1)")
    b.add_argument("--hwspec", help="hardware spec name or path (default: by device name)")
    b.add_argument("--quiet", action="store_true", help="warnings only on stderr (default: status and progress)")
    b.set_defaults(func=cmd_baseline)
