"""`dohnuts-bench analyze RESULTS`: re-analyse a finished run (results.jsonl or its archive
results.jsonl.gz, and the run.json beside it) — the analysis and report `run` ends with, from the
JSONL alone.

`analyze` never writes beside its input (a committed run stays as committed): its report files go
to `--out DIR`, or by default to a new temporary folder, named on stderr. Every output path follows
the one rule of dohnuts.schema.output_paths (never a symbolic link, an input or a run folder).

A run.json is read as `RunMeta` (dohnuts.bench.store.summary_file: one line naming the file and the
field when it is not usable); the records as dohnuts.bench.analysis.records reads them.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from dohnuts.bench import plugins
from dohnuts.bench.analysis.hwspec import find_hwspec, stored_hwspec
from dohnuts.bench.analysis.records import RecordError, Validity
from dohnuts.bench.analysis.summary import summarize, summary_json
from dohnuts.bench.commands.options import add_hwspec
from dohnuts.bench.measure.telemetry import call_validity, default_min_clock_fraction
from dohnuts.bench.report.run_report import analysis_sections, checked_records, report_analysis, write_summary
from dohnuts.bench.report.status import log
from dohnuts.bench.report.terminal import stdout_console
from dohnuts.bench.store.rundir import results_path, run_inputs
from dohnuts.bench.store.summary_file import read_run_meta
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema import check_output_folder


def setup_arguments(subparsers) -> None:
    a = subparsers.add_parser("analyze", help="re-analyse a results.jsonl")
    a.add_argument("results", help="a results.jsonl (or the run directory holding it)")
    add_hwspec(a, default="the run's")
    a.add_argument("--out", help="folder for the report files (default: a new temporary folder, named on stderr; "
                                 "never the input's folder)")
    a.add_argument("--revalidate", action="store_true",
                   help="re-apply today's validity gates to the telemetry each record kept (runs recorded "
                        "under an older rule, e.g. one that excluded power-capped calls; default: the records' own)")
    a.set_defaults(func=run)


def analyze_and_report(results: Path, hwspec, measured: dict, out_dir: Path, console, pm=None, *,
                       revalidate: bool = False) -> None:
    """The analysis and the report of a run's records into `out_dir` (dohnuts.bench.report.run_report):
    what `run` ends with, from the JSONL alone."""
    pm = pm or plugins.plugin_manager()
    records = checked_records(results)
    if revalidate:  # the validity gates of today, applied to the telemetry each record kept
        fraction = default_min_clock_fraction()
        for rec in records:
            rec.validity = Validity(**call_validity(rec.telemetry, fraction))
    sections = analysis_sections(pm, records, hwspec, measured, out_dir)
    rows = summarize(records)
    write_summary(out_dir, summary_json(rows, sections))
    report_analysis(pm, console, records, rows, sections, out_dir)


def _temporary_output(results: Path) -> Path:
    """A new folder for the report files of `analyze` without --out: never the input's folder."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", results.parent.name or "run").strip("-")[:60] or "run"
    return Path(tempfile.mkdtemp(prefix=f"dohnuts-bench-analyze-{name}-"))


def _analysed(path: Path, hwspec, meta: dict, out_dir: Path, revalidate: bool) -> None:
    try:
        analyze_and_report(path, hwspec, meta.get("measured") or {}, out_dir, stdout_console(), revalidate=revalidate)
    except DohnutsError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        # Records that pass the structural checks but that an analysis still cannot read (a
        # foreign or hand-edited file): one line naming the file, not a traceback.
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise RecordError(f"cannot be analysed ({reason})", source=str(path)) from None


def run(args) -> int:
    path = results_path(args.results)
    meta = read_run_meta(path.parent / "run.json")
    hwspec = find_hwspec(args.hwspec) if args.hwspec else (
        stored_hwspec(meta["hwspec"]) if meta.get("hwspec") else None)
    hwspec_file = Path(hwspec.source) if hwspec is not None and hwspec.source else None
    # the one output rule: never a run folder (nor the input's), never through a planted link
    out_dir = (check_output_folder(args.out, inputs=[*run_inputs(path), hwspec_file], field="--out", error=ConfigError)
               if args.out else _temporary_output(path))
    try:
        _analysed(path, hwspec, meta, out_dir, args.revalidate)
    except BaseException:
        if not args.out:  # the temporary folder was never named to the user: it goes with the failure
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    if not args.out:
        log.info("report files: %s (a new temporary folder; --out DIR chooses one)", out_dir)
    return 0
