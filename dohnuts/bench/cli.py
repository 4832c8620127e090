"""`dohnuts-bench`: measure complete calls of the scoring model and say how far each stage is
from what the hardware allows.

    dohnuts-bench run [WORKLOAD.yaml ...]    measure (no file: the embedded standard suite, workloads/*.yaml)
    dohnuts-bench analyze RESULTS.jsonl      re-analyse raw records (from JSONL alone; the report files go
                                             to --out DIR, by default a new temporary folder)
    dohnuts-bench compare RUN_A RUN_B        B against A per workload, target and stage: ratio of
                                             medians, bootstrap interval, rank test, verdict
                                             (run directories or results.jsonl; --json OUT);
                                             exit 1 when a whole call is slower in B (0 when
                                             the machine's load explains it, and why)
    dohnuts-bench list                       plugins, workload kinds, targets, telemetry
    dohnuts-bench history                    per machine, workload, target and stage: runs over
                                             revisions, level shifts flagged (the run store,
                                             results/store.sqlite; one line a series, --tables)
    dohnuts-bench store import RUN_DIR ...   finished runs into the store
    dohnuts-bench baseline                   this machine's gate baseline: runs spread over time, into
                                             results/baselines/<machine>/
    dohnuts-bench gate --against REV         this work tree against revision REV, both timed here in
                                             interleaved rounds (exit 0 passed, 1 regression, 2 bad input)
    dohnuts-bench gate CURRENT               a finished run against this machine's baseline (or --baseline
                                             B ...): the coarse gate, across days
    dohnuts-bench report RUN --html          one self-contained HTML page (every run writes one)
    dohnuts-bench calibrate --write OUT.yaml this device's ceilings into the measured: section of a
                                             copy of its hwspec (--hwspec NAME; the run kit's first step)
    dohnuts-bench export --format F RUN      a run as pytest-benchmark JSON, PyTorch benchmark-database
                                             records or CSV (--out FILE, never one of the run's own files)
    dohnuts-bench schema [record|workload]   the JSON Schemas of a results.jsonl record and a workload
                                             file, generated from the types that read them

The commands live beside this module: dohnuts.bench.commands.run (`run`), dohnuts.bench.commands.analyze
(`analyze`, `compare`), dohnuts.bench.commands.baseline and dohnuts.bench.commands.gate (`baseline`, `gate`; the interleaved gate's driver
is dohnuts.bench.measure.interleave), dohnuts.bench.commands.export (`export`), dohnuts.bench.commands.schema (`schema`).
Reports go to stdout; status, progress and warnings to stderr through `logging`
(dohnuts.bench.report.status).

Bad input (a malformed or invalid workload file, an unknown kind/target/preset or target option, a
size out of its bounds or a sequence over the model's context, a bad hwspec, an `--out` that is a
file) ends with one line on stderr naming the file and field, exit status 2, before anything is
measured, and leaves no run directory behind. An error met while measuring (e.g. a target's
adapter file that cannot be loaded) stops the run: what was measured is reported, then the one
line, exit 2. A target that
runs out of device memory fails alone (run.json `failures`), the run goes on, the report is
written, and the exit status is 1. Ctrl-C leaves a valid results.jsonl holding every completed
record (exit 130), a second Ctrl-C during the report too; before the first call is recorded (e.g.
while the ceilings are measured) it leaves no run behind. `analyze` refuses a file holding no
schema-1 record, a corrupt line or run.json, or a non-finite number, the same way (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from dohnuts.bench.commands.analyze import cmd_analyze, cmd_compare
from dohnuts.bench.commands.run import cmd_run
from dohnuts.errors import DohnutsError
from dohnuts.threads import DEFAULT_CPU_THREADS

DEFAULT_RESULTS = Path("results/runs")


def console_for_output():
    """The console the commands print to (stdout, no automatic highlighting)."""
    from dohnuts.bench.report.terminal import SafeConsole

    return SafeConsole(stderr=False)


def standard_files() -> list[Path]:
    """The standard suite (workloads/*.yaml, embedded as package data): text, shared prefix, image,
    cold/warm image cache and train step, each sized for a CPU and (its `on_gpu` fields) a GPU."""
    root = resources.files("dohnuts.bench") / "standard"
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml"))


def cmd_list(args) -> int:
    from rich.table import Table

    from dohnuts.bench.plugins import collect, plugin_manager, samplers

    pm = plugin_manager()
    console = console_for_output()
    t = Table(title="dohnuts-bench plugins")
    t.add_column("plugin")
    t.add_column("hooks")
    for name, plugin in pm.list_name_plugin():
        t.add_row(str(name), ", ".join(h.name.removeprefix("dohnuts_bench_") for h in pm.get_hookcallers(plugin)))
    console.print(t)
    for hook, title in (("dohnuts_bench_register_workload_kinds", "workload kinds"),
                        ("dohnuts_bench_register_targets", "targets")):
        console.print(f"{title}: {', '.join(sorted(collect(pm, hook)))}")
    from dohnuts.bench.measure.workload import shape_fields

    for name, kind in sorted(collect(pm, "dohnuts_bench_register_workload_kinds").items()):
        console.print(f"  {name} shape: " + "; ".join(shape_fields(kind)))
    console.print("telemetry: " + ", ".join(f"{s.name} ({s.unavailable or 'available'})" for s in samplers(pm)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dohnuts import __version__

    summary = " ".join(__doc__.split("\n\n")[0].split())  # the docstring's first paragraph, whole
    p = argparse.ArgumentParser(prog="dohnuts-bench", description=summary,
                                epilog="Status and progress go to stderr, reports to stdout.")
    p.add_argument("--version", action="version", version=f"dohnuts-bench {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure workloads (default: the embedded standard suite, workloads/*.yaml)")
    r.add_argument("workloads", nargs="*", help="workload YAML files")
    r.add_argument("--out", default=str(DEFAULT_RESULTS), help="folder for run directories (default: results/runs)")
    r.add_argument("--label", help="run directory label (default: the workload name)")
    r.add_argument("--hwspec", help="hardware spec name (hwspecs/NAME.yaml) or path (default: by device name)")
    r.add_argument("--telemetry-interval", type=float, default=0.1,
                   help="seconds between telemetry samples (0.001 to 60; default: 0.1)")
    r.add_argument("--threads", type=int, default=DEFAULT_CPU_THREADS,
                   help="torch threads of a CPU run (1 to 4096; default: 1 — steady on a shared machine, see "
                        "docs/measurement.md); a GPU run keeps torch's default")
    r.add_argument("--quiet", action="store_true",
                   help="no progress bars, heartbeat or status lines on stderr, warnings only (default: shown)")
    r.add_argument("--profile", action="store_true",
                   help="also write a torch.profiler trace a workload and target (RUN/traces/*.json.gz, opened by "
                        "Perfetto) of 3 more steady calls, each harness stage a named range; those calls are not "
                        "measured (default: no profiling)")
    r.add_argument("--nvtx", action="store_true",
                   help="also mark each stage of the measured calls as an NVTX range in the domain `dohnuts`, for "
                        "Nsight Systems (needs the nvtx package: pip install 'dohnuts[nvidia]'); its cost is in the "
                        "harness overhead the report shows (default: no ranges)")
    r.add_argument("--store", help="the run store every record also goes to (default: store.sqlite beside the "
                                   "--out folder: results/store.sqlite)")
    r.add_argument("--checkpoint", metavar="PATH",
                   help="benchmark a trained model: a `dohnuts train --out` directory, one of its checkpoints or an "
                        "adapter file; the prediction workloads run on its base with the adapter merged, dohnuts "
                        "alone (default: the workloads' own models)")
    r.add_argument("--output", metavar="FILE.jsonl",
                   help="also write the run's raw records (results.jsonl) to FILE.jsonl when it ends, its folder "
                        "made if needed (default: the run directory only)")
    r.set_defaults(func=cmd_run)
    a = sub.add_parser("analyze", help="re-analyse a results.jsonl")
    a.add_argument("results", help="a results.jsonl (or the run directory holding it)")
    a.add_argument("--hwspec", help="hardware spec name or path (default: the run's)")
    a.add_argument("--out", help="folder for the report files (default: a new temporary folder, named on stderr; "
                                 "never the input's folder)")
    a.add_argument("--revalidate", action="store_true",
                   help="re-apply today's validity gates to the telemetry each record kept (runs recorded "
                        "under an older rule, e.g. one that excluded power-capped calls; default: the records' own)")
    a.set_defaults(func=cmd_analyze)
    c = sub.add_parser("compare", help="compare run B against run A (ratio of medians, interval, verdict)")
    c.add_argument("run_a", metavar="RUN_A", help="run directory or results.jsonl (the baseline)")
    c.add_argument("run_b", metavar="RUN_B", help="run directory or results.jsonl (compared against RUN_A)")
    c.add_argument("--confidence", type=float, default=0.95, help="confidence of the intervals (default: 0.95)")
    c.add_argument("--min-effect", type=float, default=0.02,
                   help="smallest relative change given a verdict (default: 0.02)")
    c.add_argument("--json", metavar="OUT", help="also write the comparison as JSON to OUT (default: the table only)")
    c.set_defaults(func=cmd_compare)
    ls = sub.add_parser("list", help="list plugins, workload kinds, targets and telemetry")
    ls.set_defaults(func=cmd_list)
    from dohnuts.bench.commands.calibrate import add_parser as add_calibrate
    from dohnuts.bench.commands.export import add_parser as add_export
    from dohnuts.bench.commands.schema import add_parser as add_schema
    from dohnuts.bench.commands.baseline import add_parser as add_baseline
    from dohnuts.bench.commands.gate import add_parser as add_gate
    from dohnuts.bench.commands.report import add_parser as add_report
    from dohnuts.bench.commands.store import add_parsers

    add_parsers(sub)
    add_baseline(sub)
    add_gate(sub)
    add_report(sub)
    add_calibrate(sub)
    add_export(sub)
    add_schema(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from dohnuts.bench.report.status import configure_logging

    args = build_parser().parse_args(argv)
    configure_logging(quiet=getattr(args, "quiet", False))
    try:
        return args.func(args)
    except DohnutsError as exc:
        print(f"dohnuts-bench: error: {' '.join(str(exc).split())}", file=sys.stderr)  # always one line
        return 2
    except KeyboardInterrupt:
        print("dohnuts-bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
