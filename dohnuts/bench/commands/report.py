"""`dohnuts-bench report RUN --html`: a run's HTML report (dohnuts.bench.report.html_page), written as
RUN/report.html unless `--out` says where; `--against OTHER` adds the comparison with another run,
and the run store (`--store`; by default the one `run` wrote beside the runs' folder) adds trend
charts. `dohnuts-bench run` writes the same page into every run directory (its report phase:
dohnuts.bench.commands.run)."""

from __future__ import annotations

import sys
from pathlib import Path

from dohnuts.bench.analysis.compare import RULE, compare_runs
from dohnuts.bench.analysis.compare_table import comparison_dict
from dohnuts.bench.analysis.records import read_records
from dohnuts.bench.report.html_page import write_page
from dohnuts.bench.store.history import trends_for
from dohnuts.bench.store.run_store import store_files
from dohnuts.bench.store.rundir import run_inputs
from dohnuts.bench.store.summary_file import RunFile, SummaryFile, read_run_json
from dohnuts.errors import DohnutsError
from dohnuts.schema import check_output_file


def setup_arguments(subparsers) -> None:
    r = subparsers.add_parser("report", help="a run's report: --html writes one self-contained page")
    r.add_argument("run", metavar="RUN", help="a run directory (with its summary.json)")
    r.add_argument("--html", action="store_true", help="write the HTML report (default: off)")
    r.add_argument("--against", metavar="OTHER", help="another run directory: adds the comparison of RUN against it (default: none)")
    r.add_argument("--store", help="the run store for trend charts (default: store.sqlite beside the folder of RUN, "
                                   "where `run` writes it: runs/store.sqlite)")
    r.add_argument("--out", help="the HTML file (default: RUN/report.html)")
    r.set_defaults(func=run)


def write_html(run_dir: Path, *, store: str | Path | None = None, against: Path | None = None,
               out: Path | None = None) -> Path:
    """The page of a finished run directory, from its summary.json and run.json (read typed: a
    hand-edited file is one line), with `against`'s comparison and the store's trends."""
    summary = read_run_json(run_dir / "summary.json", SummaryFile)  # typed: a hand-edited file is one line
    if summary is None:
        raise DohnutsError("holds no summary.json (`dohnuts-bench analyze` writes it)", source=str(run_dir))
    meta = read_run_json(run_dir / "run.json", RunFile) or {}
    comparison = None
    if against is not None:
        def results(d: Path) -> Path:
            return next((d / n for n in ("results.jsonl", "results.jsonl.gz") if (d / n).is_file()), d)

        comp = compare_runs(read_records(results(against)), read_records(results(run_dir)), label_a=str(against),
                            label_b=str(run_dir))
        comparison = comparison_dict(comp) | {"rule": RULE, "label_a": against.name, "label_b": run_dir.name}
    out = check_html_output(out or run_dir / "report.html", run_dir, store=store, against=against)
    run_id = str(meta.get("run_id") or run_dir.name)
    return write_page(out, summary, meta=meta, title=run_id, comparison=comparison,
                      trends=trends_for(store, summary, run_id), source=run_dir / "summary.json")


def check_html_output(out: str | Path, run_dir: Path, *, store=None, against: Path | None = None) -> Path:
    """The page's path by the one output rule (dohnuts.schema.output_paths): not a symbolic link, none
    of the files the page is built from (the run's and `against`'s summary, run.json and records, the
    store), and in a run folder only as its report.html."""
    inputs = [run_dir / "summary.json"]
    for d in (run_dir, against):
        if d is not None:
            inputs += [d / "summary.json", *run_inputs(d / "results.jsonl"), d / "results.jsonl.gz"]
    if store is not None:
        inputs += store_files(store)
    return check_output_file(out, inputs=inputs, field="--out", what="an HTML file to write",
                             run_folder_names=("report.html",))


def run(args) -> int:
    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise DohnutsError("is not a run directory", source=str(run_dir))
    if not args.html:
        raise DohnutsError("says nothing to write: add --html", source="dohnuts-bench report")
    store = args.store or run_dir.resolve().parent.parent / "store.sqlite"  # beside the runs' folder, as `run` puts it
    against = Path(args.against) if args.against else None
    # a link, an input, a device, a FIFO, a directory or a name too long is refused before the page is built
    check_html_output(args.out or run_dir / "report.html", run_dir, store=store, against=against)
    out = write_html(run_dir, store=store, against=against, out=Path(args.out) if args.out else None)
    print(f"dohnuts-bench: wrote {out}", file=sys.stderr)
    return 0
