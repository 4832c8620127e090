"""`dohnuts-bench run`: validate every workload file, skip what cannot run here, measure the rest
into a new run directory, then analyse, keep and report what was measured.

A run is a `RunSession` (pytest-benchmark's BenchmarkSession), its phases its methods, in order:

    prepare   every input checked — the workload files against the registered kinds and targets,
              each target's options against its `Options`, the launchers, the hwspec, `--out`,
              `--store`, `--output` —, then the run directory made (a refusal before it leaves none)
    measure   the machine first (the plugins' `dohnuts_bench_prepare_run`: its ceilings, its load),
              then every workload and target into results.jsonl, each record also into the run store
    analyse   the records read back: the built-in analysis (dohnuts.bench.analysis.run_sections:
              its sections) and summary.json's rows (dohnuts.bench.analysis.summary), then the
              sections of any analyzer plugin (`dohnuts_bench_analyze`)
    store     run.json and summary.json, each written once, the store's copy of both, `--output`
    report    the text report on stdout and in report.txt (dohnuts.bench.report.text_report), the
              reporter plugins' files (`dohnuts_bench_report`: the built-in one draws the plots),
              report.html (dohnuts.bench.report.html_page)

`store` comes before `report`: an interrupted or failed report leaves the run's data whole. The
built-in analysis and report are called here directly; the hooks are the extensions' way in. The
exit statuses are those of dohnuts.bench.cli (0; 1: a target failed, out of memory; 2: refused;
130: interrupted; 143: terminated). SIGTERM — a job scheduler's time limit, `timeout`, a container
stopping — is taken as Ctrl-C: the completed calls kept, then run.json, the analysis and the report.

Status, progress and warnings go to stderr through `logging` (dohnuts.bench.report.status); the
report alone goes to stdout. A CPU run measures with `--threads` torch threads (default 1, as every
command's: dohnuts.threads says why; the ceilings scatter on more threads the way the calls do,
docs/measurement.md, "A CPU run").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import signal
import sys
from pathlib import Path

from dohnuts.bench import plugins
from dohnuts.bench.commands.options import DEFAULT_RESULTS, add_hwspec, add_quiet, add_store, add_threads, add_workloads
from dohnuts.bench.measure.workload import check_workload_file, standard_files
from dohnuts.bench.plugins import collect
from dohnuts.bench.report.terminal import stdout_console
from dohnuts.errors import ConfigError
from dohnuts.threads import check_threads  # shared with `dohnuts train` and `dohnuts predict`

TELEMETRY_INTERVAL_S = (0.001, 60.0)  # bounds of --telemetry-interval


def setup_arguments(subparsers) -> None:
    r = subparsers.add_parser("run", help="measure workloads (default: the embedded standard suite, workloads/*.yaml)")
    add_arguments(r)
    r.set_defaults(func=run)


def add_arguments(r: argparse.ArgumentParser) -> None:
    add_workloads(r, help="workload YAML files")
    r.add_argument("--out", default=str(DEFAULT_RESULTS), help="folder for run directories (default: runs/bench)")
    r.add_argument("--label", help="run directory label (default: the workload name)")
    add_hwspec(r, default="by device name", what="hardware spec name (hwspecs/NAME.yaml) or path")
    r.add_argument("--telemetry-interval", type=float, default=0.1,
                   help="seconds between telemetry samples (0.001 to 60; default: 0.1)")
    add_threads(r, help="torch threads of a CPU run (1 to 4096; default: 1 — steady on a shared machine, see "
                        "docs/measurement.md); a GPU run keeps torch's default")
    add_quiet(r, help="no progress bars, heartbeat or status lines on stderr, warnings only (default: shown)")
    r.add_argument("--profile", action="store_true",
                   help="also write a torch.profiler trace a workload and target (RUN/traces/*.json.gz, opened by "
                        "Perfetto) of 3 more steady calls, each harness stage a named range; those calls are not "
                        "measured (default: no profiling)")
    r.add_argument("--nvtx", action="store_true",
                   help="also mark each stage of the measured calls as an NVTX range in the domain `dohnuts`, for "
                        "Nsight Systems (needs the nvtx package: pip install 'dohnuts[nvidia]'); its cost is in the "
                        "harness overhead the report shows (default: no ranges)")
    add_store(r, help="the run store every record also goes to (default: store.sqlite beside the --out folder: "
                      "runs/store.sqlite)")
    r.add_argument("--checkpoint", metavar="PATH",
                   help="benchmark a trained model: a `dohnuts train --out` directory, one of its checkpoints or an "
                        "adapter file; the prediction workloads run on its base with the adapter merged, dohnuts "
                        "alone (default: the workloads' own models)")
    r.add_argument("--output", metavar="FILE.jsonl",
                   help="also write the run's raw records (results.jsonl) to FILE.jsonl when it ends, its folder "
                        "made if needed (default: the run directory only)")


def run_arguments(argv: list[str]) -> argparse.Namespace:
    """`dohnuts-bench run ARGV`'s arguments as its parser reads them, defaults and all (a command that
    runs a suite itself, `baseline`, builds its runs' arguments here)."""
    parser = argparse.ArgumentParser(prog="dohnuts-bench run")
    add_arguments(parser)
    return parser.parse_args(argv)


def check_telemetry_interval(value: float) -> None:
    lo, hi = TELEMETRY_INTERVAL_S
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ConfigError(f"must be a number of seconds in [{lo:g}, {hi:g}], got {value!r}", source="command line",
                          field="--telemetry-interval")


@dataclasses.dataclass(frozen=True)
class Registries:
    """The plugin manager and what its plugins register, built once a run."""

    pm: object
    kinds: dict
    targets: dict
    launchers: dict


def check_before_torch(args) -> tuple[Registries, list[Path]]:
    """What can be checked before torch is imported, checked: the command line's numbers and every
    workload file's existence, YAML and fields (dohnuts.bench.measure.workload.check_workload_file).
    Torch's import takes seconds (18–30 s on a busy 2-core machine); a typo is reported before it, in
    one line. The plugin manager imports no torch (the targets import it where they run)."""
    check_telemetry_interval(args.telemetry_interval)
    check_threads(args.threads)
    pm = plugins.plugin_manager()
    registries = Registries(pm, collect(pm, "dohnuts_bench_register_workload_kinds"),
                            collect(pm, "dohnuts_bench_register_targets"),
                            collect(pm, "dohnuts_bench_register_launchers"))
    files = [Path(f) for f in args.workloads] or standard_files()
    for f in files:
        check_workload_file(f, registries.kinds, registries.targets)
    return registries, files


def run(args, console=None) -> int:
    """`dohnuts-bench run`; the report goes to `console` (default: stdout)."""
    registries, files = check_before_torch(args)
    # torch, and the session that measures with it: only once the checks above have passed
    import torch

    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.bench.commands.session import RunSession

    threads = torch.get_num_threads()
    try:
        session = RunSession(args, registries, files, console or stdout_console())
        with sigterm_as_interrupt() as terminated:
            try:
                code = session.run()
            except KeyboardInterrupt:
                if not terminated:
                    raise
                code = 130  # before the first record (the session left no run behind) or past its own handling
        if terminated and code == 130:
            print("dohnuts-bench: terminated (SIGTERM), handled as Ctrl-C", file=sys.stderr)
            return 128 + signal.SIGTERM
        return code
    finally:
        torch.set_num_threads(threads)  # a CPU run sets its own (--threads); the process gets its own back


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raised as KeyboardInterrupt in the main thread while the block runs, so that a run
    stopped by a scheduler keeps what Ctrl-C keeps (without it Python dies at once: no run.json, so
    neither the run's measured ceilings nor its bounds). Yields a list that holds the signal once
    one arrived; the previous handler comes back after. Off the main thread (an embedding caller)
    nothing is installed."""
    arrived: list[int] = []

    def handler(signum, frame):
        arrived.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # signal.signal works in the main thread only
        yield arrived
        return
    try:
        yield arrived
    finally:
        signal.signal(signal.SIGTERM, previous)
