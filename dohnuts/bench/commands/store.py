"""`dohnuts-bench history` and `dohnuts-bench store import`: the run store's commands.

    dohnuts-bench store import RUN_DIR ...   put finished run directories into the store
    dohnuts-bench store archive RUN_DIR DEST  the compact copy of a run to commit under results/
    dohnuts-bench history [--machine M] [--device D] [--model P] [--precision X] [--hwspec H]
                          [--workload W] [--target T] [--stage S] [--tables] [--json OUT]

`history` prints one line a series (a machine · device · model · precision · hwspec heading, then
each workload · target · stage: its runs, its first and last median, how far its runs scatter, and
its flagged level shifts: dohnuts.bench.store.history); `--tables` adds every series' table, a row a
run. Without a store file, `history` first builds one from the run archives committed under
`results/` (every folder holding a results.jsonl or results.jsonl.gz), so the project's own GPU
history can be queried from a fresh clone (a few seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dohnuts.bench.store.run_store import DEFAULT_STORE, RunStore, store_files
from dohnuts.errors import DohnutsError
from dohnuts.schema.output_paths import RUN_FOLDER_FILES

ARCHIVE_ROOT = Path("results")


def run_dirs(root: Path) -> list[Path]:
    """Every run directory below `root` (a folder holding results.jsonl or results.jsonl.gz)."""
    found = {p.parent for name in ("results.jsonl", "results.jsonl.gz") for p in root.rglob(name)}
    return sorted(found)


def import_dirs(store: RunStore, dirs: list[Path], log=lambda msg: None) -> int:
    n = 0
    for d in dirs:
        try:
            run_id, records = store.import_run(d)
        except DohnutsError as exc:
            log(f"skipped {d}: {exc}")
            continue
        log(f"imported {d} as {run_id} ({records} records)")
        n += 1
    return n


def cmd_store_import(args) -> int:
    from dohnuts.schema import check_output_file

    dirs = [Path(d) for d in args.run_dirs]
    for d in dirs:
        if not d.is_dir():
            raise DohnutsError("is not a run directory", source=str(d))
    check_output_file(args.store, inputs=[d / n for d in dirs for n in RUN_FOLDER_FILES], field="--store",
                      what="a run store", make_folder=True)
    with RunStore(args.store) as store:
        n = import_dirs(store, dirs, log=lambda m: print(f"dohnuts-bench: {m}", file=sys.stderr))
    print(f"dohnuts-bench: {n} of {len(dirs)} runs in {args.store}", file=sys.stderr)
    return 0 if n == len(dirs) else 2


ARCHIVED = ("run.json", "results.jsonl.gz")  # what a committed run holds; analyze regenerates the rest


def archive_run(run_dir: Path, dest: Path) -> Path:
    """Copy a finished run's source of truth to `dest`: run.json and the records gzipped
    reproducibly (no name or time in the gzip header, level 9) — the form the store imports and
    `analyze` reads; summary, reports and plots are derived and left out."""
    import gzip
    import shutil

    from dohnuts.schema import check_output_folder

    src = run_dir / "results.jsonl"
    gz = run_dir / "results.jsonl.gz"
    if not (run_dir / "run.json").is_file() or not (src.is_file() or gz.is_file()):
        raise DohnutsError("is not a finished run directory (needs run.json and results.jsonl)", source=str(run_dir))
    if dest.is_dir() and not dest.is_symlink() and any(dest.iterdir()):
        raise DohnutsError("exists and is not empty: an archive is never overwritten", source=str(dest))
    check_output_folder(dest, inputs=[src], field="DEST")  # not a link, not in a run folder (the one output rule)
    shutil.copyfile(run_dir / "run.json", dest / "run.json")
    if gz.is_file():
        shutil.copyfile(gz, dest / "results.jsonl.gz")
    else:
        with src.open("rb") as fin, (dest / "results.jsonl.gz").open("wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as fout:
            shutil.copyfileobj(fin, fout)
    return dest


def cmd_store_archive(args) -> int:
    dest = archive_run(Path(args.run_dir), Path(args.dest))
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"dohnuts-bench: archived {args.run_dir} as {dest} ({', '.join(ARCHIVED)}: {size / 1e3:.0f} kB); "
          f"`dohnuts-bench analyze {dest / 'results.jsonl.gz'} --out DIR` regenerates its reports", file=sys.stderr)
    return 0


FILTERS = ("machine", "device", "model", "precision", "hwspec", "workload", "target")


def stage_names(store: RunStore) -> list[str]:
    """Every stage a steady-state record of the store measured, sorted."""
    names = set()
    for call in store.steady_calls(with_record=True):
        stages = call["record"].get("stages")
        if isinstance(stages, dict):
            names.update(str(k) for k in stages)
    return sorted(names)


def cmd_history(args) -> int:
    from dohnuts.bench.cli import console_for_output
    from dohnuts.bench.store.history import history, history_dict, history_lines, history_tables
    from dohnuts.schema import write_json
    from dohnuts.schema.values import printable

    path = Path(args.store)
    if args.json:  # the one output rule: a link, the store, a run folder, a device, a FIFO refused before any work
        from dohnuts.schema import check_output_file

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
    console = console_for_output()
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


def add_parsers(sub) -> None:
    h = sub.add_parser("history", help="per machine, workload, target and stage: the runs in the store over "
                                       "revisions, level shifts flagged (one line a series; --tables for every run)")
    h.add_argument("--store", default=str(DEFAULT_STORE), help=f"the run store (default: {DEFAULT_STORE})")
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
    h.add_argument("--json", metavar="OUT", help="also write the series as JSON to OUT (default: the lines only)")
    h.set_defaults(func=cmd_history)
    s = sub.add_parser("store", help="the run store: import finished run directories")
    ssub = s.add_subparsers(dest="store_command", required=True)
    i = ssub.add_parser("import", help="put finished run directories (results.jsonl[.gz], run.json) into the store")
    i.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    i.add_argument("--store", default=str(DEFAULT_STORE), help=f"the run store (default: {DEFAULT_STORE})")
    i.set_defaults(func=cmd_store_import)
    a = ssub.add_parser("archive", help="copy a finished run's run.json and gzipped records to DEST (the compact "
                                        "form committed under results/<machine>/<run>/)")
    a.add_argument("run_dir", metavar="RUN_DIR")
    a.add_argument("dest", metavar="DEST")
    a.set_defaults(func=cmd_store_archive)
