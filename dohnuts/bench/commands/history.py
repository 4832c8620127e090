"""`dohnuts-bench history`: per machine, workload, target and stage, the runs in the store over
revisions, level shifts flagged.

    dohnuts-bench history [--machine M] [--device D] [--model P] [--precision X] [--hwspec H]
                          [--workload W] [--target T] [--stage S] [--tables] [--json OUT]

It prints one line a series (a machine · device · model · precision · hwspec heading, then each
workload · target · stage: its runs, its first and last median, how far its runs scatter, and its
flagged level shifts: dohnuts.bench.store.history); `--tables` adds every series' table, a row a
run. Without a store file, `history` first builds one from the run archives committed under
`results/` (every folder holding a results.jsonl or results.jsonl.gz), so the project's own GPU
history can be queried from a fresh clone (a few seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dohnuts.bench.commands.options import add_json_output, add_store
from dohnuts.bench.report.terminal import stdout_console
from dohnuts.bench.store.history import history, history_dict, history_lines, history_tables
from dohnuts.bench.store.run_store import DEFAULT_STORE, RunStore, import_dirs, store_files
from dohnuts.bench.store.rundir import run_dirs
from dohnuts.errors import DohnutsError
from dohnuts.schema import check_output_file, printable, write_json

ARCHIVE_ROOT = Path("results")


def setup_arguments(subparsers) -> None:
    h = subparsers.add_parser("history", help="per machine, workload, target and stage: the runs in the store "
                                              "over revisions, level shifts flagged (one line a series; --tables "
                                              "for every run)")
    add_store(h, default=str(DEFAULT_STORE), help=f"the run store (default: {DEFAULT_STORE})")
    h.add_argument("--machine", help="only this machine id (run.json measured.machine.id, e.g. nvidia-h200; "
                                     "default: all)")
    h.add_argument("--device", help="only this device name (e.g. 'NVIDIA H200'; default: all)")
    h.add_argument("--model", help="only this model preset or checkpoint (e.g. qwen3.5-2b; default: all)")
    h.add_argument("--precision", help="only this precision (bf16, fp32; default: all)")
    h.add_argument("--hwspec", help="only this hwspec (its name, e.g. h200, or none; default: all)")
    h.add_argument("--workload", help="only this workload (as reports name it; default: all)")
    h.add_argument("--target", help="only this target (as reports name it; default: all)")
    h.add_argument("--stage", default="wall", help="a stage, or wall for the whole call (default: wall)")
    h.add_argument("--min-effect", type=float, default=0.02,
                   help="smallest relative change flagged, raised to the noise measured within and between runs "
                        "(default: 0.02)")
    h.add_argument("--tables", action="store_true",
                   help="also print every series' table: a row a run, its load and the level shifts (default: "
                        "one line a series)")
    add_json_output(h, help="also write the series as JSON to OUT (default: the lines only)")
    h.set_defaults(func=run)


FILTERS = ("machine", "device", "model", "precision", "hwspec", "workload", "target")


def stage_names(store: RunStore) -> list[str]:
    """Every stage a steady-state record of the store measured, sorted."""
    names = set()
    for call in store.steady_calls(with_record=True):
        names.update(call["record"].stages)
    return sorted(names)


def run(args) -> int:
    path = Path(args.store)
    if args.json:  # the one output rule: a link, the store, a run folder, a device, a FIFO refused before any work
        check_output_file(args.json, inputs=store_files(path), field="--json", what="a JSON file to write")
    if not path.exists() and Path(args.store) == DEFAULT_STORE and ARCHIVE_ROOT.is_dir():
        dirs = run_dirs(ARCHIVE_ROOT)
        print(f"dohnuts-bench: no store at {path}: building it from the {len(dirs)} runs committed under "
              f"{ARCHIVE_ROOT}/", file=sys.stderr)
        with RunStore(path) as store:
            import_dirs(store, dirs)
    if not path.exists():
        raise DohnutsError("does not exist (a run store: `dohnuts-bench run` writes one, `dohnuts-bench store "
                           "import` fills one)", source=str(path))
    chosen = {f: getattr(args, f) for f in FILTERS if getattr(args, f) is not None}
    with RunStore(path, read_only=True) as store:  # read only: a store the user may not write is still read
        series = history(store, stage=args.stage, min_effect=args.min_effect, **chosen)
        if not series and args.stage != "wall":
            stages = stage_names(store)
            if args.stage not in stages:
                raise DohnutsError(f"is not a stage of any steady-state record in {path} (stages: "
                                   f"{', '.join(['wall', *map(printable, stages)])})", source="history",
                                   field="--stage")
        if not series:
            machines = sorted({m for (m,) in store.db.execute("SELECT DISTINCT machine FROM runs") if m})
            said = ", ".join(f"--{f} {printable(v)}" for f, v in chosen.items())
            raise DohnutsError("holds no steady-state records" + (f" of {said}" if said else "")
                               + (f" (machines: {', '.join(machines)})" if machines else ""), source=str(path))
    console = stdout_console()
    for line in history_lines(series):
        console.print(line)
    if args.tables:
        for table in history_tables(series):
            console.print(table)
    changes = sum(len(s.changes) for s in series)
    machines = len({s.key.machine for s in series})
    print(f"dohnuts-bench: {len(series)} series on {machines} machine(s), {changes} flagged level shift(s)"
          + ("" if args.tables else " (--tables: every run of each series)"), file=sys.stderr)
    if args.json:
        write_json(args.json, history_dict(series, args.stage), indent=2)
    return 0


