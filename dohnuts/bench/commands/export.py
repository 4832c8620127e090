"""`dohnuts-bench export --format pytest-benchmark|pytorch|csv RUN [--out FILE]`: a finished run in
the formats dashboards and other tools read (dohnuts.bench.report.export_formats describes each).
RUN is a run directory (results.jsonl or its archive results.jsonl.gz, and run.json when present)
or a results file. The output goes to stdout, or to `--out FILE` (written whole: a temporary file
renamed); an `--out` that is one of the run's own files (results.jsonl, results.jsonl.gz, run.json,
summary.json, or the results file named) is refused before anything is read, so an export never
overwrites what it exports.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from dohnuts.bench.analysis.records import CallRecord, check_reportable, read_records
from dohnuts.bench.report.export_formats import FORMATS, export_text
from dohnuts.bench.report.status import log
from dohnuts.bench.store.rundir import results_path
from dohnuts.bench.store.summary_file import read_run_meta
from dohnuts.errors import DohnutsError
from dohnuts.schema import check_output, write_text_atomic

RUN_FILES = ("results.jsonl", "results.jsonl.gz", "run.json", "summary.json")


def setup_arguments(subparsers) -> None:
    e = subparsers.add_parser("export", help="a run's results in a format other tools read: pytest-benchmark JSON, "
                                             "PyTorch's benchmark-database records, CSV")
    e.add_argument("run", metavar="RUN", help="a run directory or its results.jsonl")
    e.add_argument("--format", required=True, choices=FORMATS, help="the output format (required; no default)")
    e.add_argument("--out", metavar="FILE", help="write to FILE, never one of the run's own files (default: stdout)")
    e.set_defaults(func=run)


def run_files(arg: str) -> tuple[Path, Path | None]:
    """(the results file, run.json beside it or None) that `export RUN` reads."""
    results = results_path(arg)
    meta = results.parent / "run.json"
    return results, meta if os.path.lexists(meta) else None


def check_not_an_input(out: Path, results: Path) -> None:
    """An output path that is one of the run's own files (or the same file under another name: a
    link) is refused: an export never overwrites what it reads."""
    own = {results.parent / name for name in RUN_FILES} | {results}
    target = Path(os.path.abspath(out))
    for path in own:
        same = Path(os.path.abspath(path)) == target or Path(os.path.realpath(path)) == Path(os.path.realpath(out))
        if not same and os.path.exists(out) and os.path.exists(path):
            same = os.path.samefile(out, path)
        if same:
            raise DohnutsError(f"is the run's own {path.name}: an export never overwrites its input (write it "
                               "elsewhere)", source=str(out), field="--out")


def read_run(results: Path, meta_path: Path | None) -> tuple[list[CallRecord], dict]:
    """The run's records (each checked as the report reads it) and its run.json ({})."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records(results)
    for w in caught:
        log.warning("%s", w.message)
    if not records:
        raise DohnutsError("holds no records of a dohnuts-bench run", source=str(results))
    for rec in records:
        check_reportable(rec)
    return records, read_run_meta(meta_path) if meta_path is not None else {}


def run(args) -> int:
    results, meta_path = run_files(args.run)
    if args.out:  # refused before anything is read: a device, a FIFO, a folder, one of the run's own files
        check_output(args.out, field="--out", what="a file to write")
        check_not_an_input(Path(args.out), results)
    records, meta = read_run(results, meta_path)
    text = export_text(args.format, records, meta)
    if args.out:
        write_text_atomic(Path(args.out), text, error=DohnutsError)
        print(f"dohnuts-bench: wrote {args.out} ({args.format})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
