"""`dohnuts-bench store`: the run store's commands (the store itself: dohnuts.bench.store.run_store).

    dohnuts-bench store import RUN_DIR ...   put finished run directories into the store
    dohnuts-bench store archive RUN_DIR DEST  the compact copy of a run to commit under results/
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

from dohnuts.bench.commands.options import add_store
from dohnuts.bench.store.run_store import DEFAULT_STORE, RunStore, import_dirs
from dohnuts.errors import DohnutsError
from dohnuts.schema import check_output_file, check_output_folder
from dohnuts.schema.output_paths import RUN_FOLDER_FILES


def setup_arguments(subparsers) -> None:
    s = subparsers.add_parser("store", help="the run store: import finished run directories")
    ssub = s.add_subparsers(dest="store_command", required=True)
    i = ssub.add_parser("import", help="put finished run directories (results.jsonl[.gz], run.json) into the store")
    i.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    add_store(i, default=str(DEFAULT_STORE), help=f"the run store (default: {DEFAULT_STORE})")
    i.set_defaults(func=import_runs)
    a = ssub.add_parser("archive", help="copy a finished run's run.json and gzipped records to DEST (the compact "
                                        "form committed under results/<machine>/<run>/)")
    a.add_argument("run_dir", metavar="RUN_DIR")
    a.add_argument("dest", metavar="DEST")
    a.set_defaults(func=archive)


def import_runs(args) -> int:
    """`store import RUN_DIR ...`: exit 0 when every run went in, 2 when one was skipped."""
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


def archive(args) -> int:
    """`store archive RUN_DIR DEST`."""
    dest = archive_run(Path(args.run_dir), Path(args.dest))
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"dohnuts-bench: archived {args.run_dir} as {dest} ({', '.join(ARCHIVED)}: {size / 1e3:.0f} kB); "
          f"`dohnuts-bench analyze {dest / 'results.jsonl.gz'} --out DIR` regenerates its reports", file=sys.stderr)
    return 0
