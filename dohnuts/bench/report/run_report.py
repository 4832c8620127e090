"""The end of a run's analysis, shared by `dohnuts-bench run` (its analyse, store and report
phases: dohnuts.bench.commands.session) and `dohnuts-bench analyze`: the records read back and
checked, the built-in analysis's sections then every analyzer plugin's, summary.json written
once, the text report then every reporter plugin's."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from dohnuts.bench.analysis.records import CallRecord, RecordError, check_reportable, read_records
from dohnuts.bench.analysis.run_sections import run_sections
from dohnuts.bench.report.status import log
from dohnuts.bench.report.text_report import print_report
from dohnuts.schema import dumps, write_text_atomic


def checked_records(results: Path) -> list[CallRecord]:
    """A run's records, each checked as the report reads it; none is one line naming the file."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records(results)
    if not records:  # the one line names what was skipped
        skipped = f" ({caught[0].message})" if caught else ""
        raise RecordError(f"holds no records of a dohnuts-bench run{skipped}", source=str(results))
    for w in caught:
        log.warning("%s", w.message)
    for rec in records:
        check_reportable(rec)
    return records


def analysis_sections(pm, records: list[CallRecord], hwspec, measured: dict, run_dir: Path) -> list:
    """The built-in analysis's sections, then those of every analyzer plugin (`dohnuts_bench_analyze`)."""
    extra = pm.hook.dohnuts_bench_analyze(records=records, hwspec=hwspec, measured=measured, run_dir=run_dir)
    return run_sections(records, hwspec, measured) + [s for group in extra if group for s in group]


def report_analysis(pm, console, records: list[CallRecord], rows: list[dict], sections: list, out_dir: Path) -> None:
    """The text report of summary.json's `rows` and the `sections` (on `console`, and report.txt),
    then every reporter plugin's (`dohnuts_bench_report`)."""
    report_txt = print_report(console, rows, sections, out_dir)
    pm.hook.dohnuts_bench_report(console=console, records=records, sections=sections, run_dir=out_dir)
    log.info("report: %s  summary: %s", report_txt, out_dir / "summary.json")


def write_summary(out_dir: Path, summary: dict) -> dict:
    """Write summary.json (strict JSON: a non-finite number is null; atomically: an interrupted
    write leaves none) and return its content as the file holds it."""
    text = dumps(summary, indent=2, default=str)
    write_text_atomic(out_dir / "summary.json", text)
    return json.loads(text)
