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
                                             runs/store.sqlite; one line a series, --tables)
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

Each command is a module of dohnuts.bench.commands (`run` is dohnuts.bench.commands.run, `list`
dohnuts.bench.commands.list_plugins): its `setup_arguments(subparsers)` adds its parser, its `run(args)`
does the work and returns the exit status; this module builds the parser from them and maps errors
to exit statuses. Reports go to stdout; status, progress and warnings to stderr through `logging`
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
while the ceilings are measured) it leaves no run behind. `run` takes SIGTERM (a scheduler's time
limit, `timeout`) as Ctrl-C, so a stopped run still has its run.json and report (exit 143).
`analyze` refuses a file holding no record it reads, a corrupt line or run.json, or a non-finite
number, the same way (exit 2).
"""

from __future__ import annotations

import argparse
import sys

from dohnuts import __version__
from dohnuts.bench.commands import (
    analyze, baseline, calibrate, compare, export, gate, history, list_plugins, report, run, schema, store,
)
from dohnuts.bench.report.status import configure_logging
from dohnuts.errors import DohnutsError

# every subcommand, in the order `dohnuts-bench --help` lists them
COMMANDS = (run, analyze, compare, list_plugins, history, store, baseline, gate, report, calibrate, export, schema)


def build_parser() -> argparse.ArgumentParser:
    summary = " ".join(__doc__.split("\n\n")[0].split())  # the docstring's first paragraph, whole
    p = argparse.ArgumentParser(prog="dohnuts-bench", description=summary,
                                epilog="Status and progress go to stderr, reports to stdout.")
    p.add_argument("--version", action="version", version=f"dohnuts-bench {__version__}")
    subparsers = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.setup_arguments(subparsers)  # each sets `func`: the function `main` calls
    return p


def main(argv: list[str] | None = None) -> int:
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
