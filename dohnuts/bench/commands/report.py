"""`dohnuts-bench report RUN --html`: a run's HTML report (dohnuts.bench.report.html_page), written as
RUN/report.html unless `--out` says where; `--against OTHER` adds the comparison with another run,
and the run store (`--store`; by default the one `run` wrote beside the runs' folder) adds trend
charts.
`dohnuts-bench run` writes the same page into every run directory."""

from __future__ import annotations

import sys
from pathlib import Path

from dohnuts.errors import DohnutsError


def trends_for(store_path: str | Path | None, summary: dict, run_id: str | None = None) -> list:
    """The store's history of the workloads and targets of `summary` (steady calls, wall time): the
    series this run belongs to (its machine, device, model, precision and hwspec), or, for a run the
    store does not hold, every machine's series of those workloads."""
    if store_path is None or not Path(store_path).is_file():
        return []
    from dohnuts.bench.store.history import history
    from dohnuts.bench.store.run_store import RunStore

    wanted = {(r["workload"], r["target"]) for r in summary.get("summary", []) if "·" not in r["target"]}
    with RunStore(store_path, read_only=True) as store:  # read only: the page never changes the store
        series = [s for s in history(store) if (s.workload, s.target) in wanted]
    mine = [s for s in series if any(p.run_id == run_id for p in s.points)]
    return mine or series


def write_html(run_dir: Path, *, store: str | Path | None = None, against: Path | None = None,
               out: Path | None = None) -> Path:
    from dohnuts.bench.report.html_page import render
    from dohnuts.schema import write_text_atomic

    from dohnuts.bench.store.summary_file import RunFile, SummaryFile, page_error, read_run_json

    summary = read_run_json(run_dir / "summary.json", SummaryFile)  # typed: a hand-edited file is one line
    if summary is None:
        raise DohnutsError("holds no summary.json (`dohnuts-bench analyze` writes it)", source=str(run_dir))
    meta = read_run_json(run_dir / "run.json", RunFile) or {}
    comparison = None
    if against is not None:
        from dohnuts.bench.analysis.compare import RULE, compare_runs
        from dohnuts.bench.analysis.compare_table import comparison_dict
        from dohnuts.bench.analysis.records import read_jsonl

        def results(d: Path) -> Path:
            return next((d / n for n in ("results.jsonl", "results.jsonl.gz") if (d / n).is_file()), d)

        comp = compare_runs(read_jsonl(results(against)), read_jsonl(results(run_dir)), label_a=str(against),
                            label_b=str(run_dir))
        comparison = comparison_dict(comp) | {"rule": RULE, "label_a": against.name, "label_b": run_dir.name}
    out = check_html_output(out or run_dir / "report.html", run_dir, store=store, against=against)
    trends = trends_for(store, summary, str(meta.get("run_id") or run_dir.name))
    try:
        page = render(summary, title=str(meta.get("run_id") or run_dir.name), meta=meta, comparison=comparison,
                      trends=trends)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        raise page_error(exc, run_dir / "summary.json") from None  # a section's inside, hand-edited
    write_text_atomic(out, page)  # a failed write is one line; the previous page (if any) stays
    return out


def check_html_output(out: str | Path, run_dir: Path, *, store=None, against: Path | None = None) -> Path:
    """The page's path by the one output rule (dohnuts.schema.output_paths): not a symbolic link, none
    of the files the page is built from (the run's and `against`'s summary, run.json and records, the
    store), and in a run folder only as its report.html."""
    from dohnuts.bench.commands.analyze import run_inputs
    from dohnuts.bench.store.run_store import store_files
    from dohnuts.schema import check_output_file

    inputs = [run_dir / "summary.json"]
    for d in (run_dir, against):
        if d is not None:
            inputs += [d / "summary.json", *run_inputs(d / "results.jsonl"), d / "results.jsonl.gz"]
    if store is not None:
        inputs += store_files(store)
    return check_output_file(out, inputs=inputs, field="--out", what="an HTML file to write",
                             run_folder_names=("report.html",))


def cmd_report(args) -> int:
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


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="a run's report: --html writes one self-contained page")
    r.add_argument("run", metavar="RUN", help="a run directory (with its summary.json)")
    r.add_argument("--html", action="store_true", help="write the HTML report (default: off)")
    r.add_argument("--against", metavar="OTHER", help="another run directory: adds the comparison of RUN against it (default: none)")
    r.add_argument("--store", help="the run store for trend charts (default: store.sqlite beside the folder of RUN, "
                                   "where `run` writes it: results/store.sqlite)")
    r.add_argument("--out", help="the HTML file (default: RUN/report.html)")
    r.set_defaults(func=cmd_report)
