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

import io
import shutil
import statistics
import time

from dohnuts.bench.commands import run as run_command
from dohnuts.bench.commands.gate import timings
from dohnuts.bench.commands.options import add_hwspec, add_quiet, add_threads, add_workloads
from dohnuts.bench.measure import machine_id
from dohnuts.bench.report.status import log
from dohnuts.bench.report.terminal import SafeConsole
from dohnuts.bench.store.baselines import DEFAULT_ROOT, MANIFEST, compact_run
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema import check_output_folder, write_json
from dohnuts.threads import check_threads

MAX_EVERY_S = 24 * 3600
MAX_RUNS = 100  # --runs: 100 runs 10 minutes apart is 17 hours; a typo's 100,000,000 would never end


def setup_arguments(subparsers) -> None:
    b = subparsers.add_parser("baseline", help="this machine's gate baseline: the workloads run --runs times, "
                                               "--every seconds apart, into results/baselines/<machine>/")
    add_workloads(b, help="workload YAML files (default: the embedded standard suite)")
    b.add_argument("--runs", type=int, default=3, help=f"runs of the workloads, 2 to {MAX_RUNS} (default: 3)")
    b.add_argument("--every", type=float, default=600.0,
                   help="seconds from one run's start to the next's, so the runs span time (default: 600)")
    b.add_argument("--into", default=str(DEFAULT_ROOT),
                   help="folder of the per-machine baselines (default: results/baselines)")
    b.add_argument("--replace", action="store_true",
                   help="replace this machine's baseline (default: refuse to overwrite one)")
    add_threads(b, help="torch threads of a CPU run, as `run --threads` (default: 1)")
    add_hwspec(b, default="by device name")
    add_quiet(b, help="warnings only on stderr (default: status and progress)")
    b.set_defaults(func=run)


def _wait_until(start: float, label: str) -> None:
    """Sleep until `start` (time.monotonic), saying so at least every 60 s."""
    while (left := start - time.monotonic()) > 0:
        log.info("%s starts in %.0f s (the baseline's runs are spread over time)", label, left)
        time.sleep(min(left, 60.0))


def run(args) -> int:
    # torch (and the provenance module, which imports it): after the command line's checks, torch's
    # import takes seconds
    import torch

    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.bench.measure.provenance import git_revision

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
    machine = machine_id.this_machine(device)
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
            run_args = run_command.run_arguments([
                *map(str, args.workloads), "--out", str(staging / "raw"), "--label", f"baseline-{i}",
                "--store", str(staging / "store.sqlite"), "--threads", str(args.threads),
                *(["--hwspec", args.hwspec] if args.hwspec else []), *(["--quiet"] if args.quiet else [])])
            code = run_command.run(run_args, console=SafeConsole(file=io.StringIO(), width=120))  # no report wanted
            if code != 0:
                raise DohnutsError(f"baseline run {i} ended with status {code}; no baseline written",
                                   source=str(folder))
            (raw,) = [p for p in (staging / "raw").iterdir() if p.is_dir()]
            compact_run(raw, staging / f"run-{i}")
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
