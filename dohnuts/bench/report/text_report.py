"""The text report of a run: the headline first (a section that `leads`: dohnuts against its peer
and the bound), the measured calls and their stages (median, p10/p90, spread, mean and standard
deviation, throughput, memory, energy: summary.json's rows, dohnuts.bench.analysis.summary), the
pipelined streams, the measurement's quality, then the other sections of the analysis (the
built-in one's and any analyzer plugin's). Printed on stdout and written to `report.txt`.

Width: the tables are `dohnuts.bench.analysis.render.FitTable`s, which pick their layout from the
width they are printed at (its module docstring has the rule). On the console that is the
terminal's width (or COLUMNS; 80 in a log): the full table when it fits, else narrower tables
with the names as headings, else one block per row — never a cell cut with "…". `report.txt` is
written at the natural width of the widest renderable (at least 80 columns), so it always holds
the full tables, whatever the terminal."""

from __future__ import annotations

import io
from pathlib import Path

from rich.measure import Measurement
from rich.text import Text

from dohnuts.bench.analysis.measurement_quality import gap_words, quality_cells
from dohnuts.bench.analysis.render import UNBOUNDED, Col, FitTable
from dohnuts.bench.analysis.serving import served_cells
from dohnuts.bench.analysis.summary import CLAIMED_PRECISION
from dohnuts.bench.report.terminal import SafeConsole
from dohnuts.bench.sections import Section
from dohnuts.schema import write_text_atomic

NO_ENERGY = "no energy counter"  # what the reports say where no call read the device's energy counter


def quality_table(rows: list[dict]) -> FitTable:
    """How far the numbers can be trusted, per (workload, target): calls left out (and power-capped
    calls kept), the GPU clock the calls ran at, the A/A noise, the harness's overhead."""
    t = FitTable(f"Measurement quality (claimed precision ±{CLAIMED_PRECISION:.0%}; A/A = interleaved halves)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("excluded"),
                  Col("GPU clock MHz\nmedian (min) / max"), Col("A/A noise ±"), Col("harness overhead"),
                  Col("note", "left", wrap=True)],
                 sections=1, groups=[(2,), (3,), (4,), (5,), (6,)], title_justify="center")
    for r in rows:
        t.add_row(r["workload"], r["target"], *quality_cells(r))
    return t


def stream_table(rows: list[dict]) -> FitTable | None:
    """Pipelined streams: throughput, latency percentiles, queueing, overlap against single calls."""
    rows = [r for r in rows if "stream" in r]
    if not rows:
        return None
    t = FitTable("Pipelined streams (Predictor.run: prefetch, copy stream, overlapped serialization; "
                 "training: Updater.run, the next update prepared while one computes); overlap against the "
                 "single calls (none for a varied served set: other requests)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("requests"),
                  Col("ms / request"), Col("requests/s"), Col("latency p50/p90/p99 ms"), Col("queue p50 ms"),
                  Col("single call ms"), Col("overlap"), Col("shapes"), Col("graph\ncaptures"),
                  Col("latency mean/std ms")],
                 sections=1, groups=[(2,), (3, 4), (5,), (6,), (7, 8), (9, 10), (11,)], title_justify="center")
    for r in rows:
        s = r["stream"]
        varied = (s.get("served_set") or {}).get("varied")
        t.add_row(r["workload"], r["target"], str(s["requests"]), f"{r['wall_median_ms']:.2f}",
                  f"{s['throughput_rps']:.1f}",
                  f"{s['latency_p50_ms']:.1f}/{s['latency_p90_ms']:.1f}/{s['latency_p99_ms']:.1f}",
                  f"{s['queue_p50_ms']:.2f}", f"{s['single_call_ms']:.2f}" if "single_call_ms" in s else "—",
                  f"{100 * s['overlap']:.0f}%" if "overlap" in s else ("varied set" if varied else "—"),
                  *served_cells(s.get("served_set")), _mean_std(s.get("latency_mean_ms"), s.get("latency_std_ms")))
    return t


def _mean_std(mean: float | None, std: float | None) -> str:
    """`mean/std` (one decimal), "—" for what is not there (no value; one value has no deviation)."""
    return "—" if mean is None else f"{mean:.1f}/" + ("—" if std is None else f"{std:.1f}")


def summary_table(rows: list[dict]) -> FitTable:
    """One row per (workload, target); narrow: a table per workload, split in two if need be.
    Energy: the device's joules per call and per decision (`energy_summary`), or "no energy
    counter" where no call read one."""
    t = FitTable("Measured calls (median over calls; p10–p90; spread = (p90 − p10) / median; mean and sample "
                 "standard deviation)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("calls"), Col("wall ms"),
                  Col("p10–p90"), Col("spread"), Col("decisions/s"), Col("tokens/s"), Col("peak mem"),
                  Col("energy / call"), Col("J/decision"), Col("mean ms"), Col("std ms")],
                 sections=1, groups=[(2,), (3, 4), (5,), (6,), (7,), (8,), (9, 10), (11, 12)], title_justify="center")
    for r in rows:
        mem = f"{r['peak_mem_bytes'] / 2**30:.2f} GiB" if r["peak_mem_bytes"] else "—"
        per_call, per_decision = r.get("energy_j_per_call"), r.get("energy_j_per_decision")
        mean, std = r.get("wall_mean_ms"), r.get("wall_std_ms")
        t.add_row(r["workload"], flagged_target(r), str(r["calls"]), f"{r['wall_median_ms']:.2f}",
                  f"{r['wall_p10_ms']:.2f}–{r['wall_p90_ms']:.2f}", f"{100 * r['spread']:.1f}%",
                  f"{r['decisions_per_s']:.1f}", f"{r['useful_tokens_per_s']:.0f}", mem,
                  NO_ENERGY if per_call is None else f"{per_call:.3g} J",
                  "—" if per_decision is None else f"{per_decision:.3g}",
                  "—" if mean is None else f"{mean:.2f}", "—" if std is None else f"{std:.2f}")
    return t


def disagreement(agreement: dict | None) -> str | None:
    """A flag for a target whose probabilities are further from the FP32 reference than the
    tolerance (dohnuts.bench.measure.quality), else None."""
    if not isinstance(agreement, dict) or agreement.get("within") is not False:
        return None
    return f"DISAGREES with the FP32 reference: {gap_words(agreement)}"


def flagged_target(row: dict) -> str | Text:
    """The target's name, with the disagreement flag where its speed is reported."""
    flag = disagreement(row.get("agreement"))
    return row["target"] if flag is None else Text(f"{row['target']} — {flag}", style="bold red")


def stage_table(rows: list[dict]) -> FitTable:
    """One row per (workload, target, stage); narrow: a table per workload · target."""
    t = FitTable("Stages (median ms, device time where measured; p10–p90; mean and sample standard deviation)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("stage", "left", wrap=True),
                  Col("median ms"), Col("p10–p90"), Col("share of wall"), Col("mean ms"), Col("std ms")],
                 sections=2, groups=[(3, 4), (5,), (6, 7)], title_justify="center")
    for r in rows:
        for name, s in r["stages"].items():
            mean, std = s.get("mean_ms"), s.get("std_ms")
            t.add_row(r["workload"], r["target"], name, f"{s['median_ms']:.3f}", f"{s['p10_ms']:.3f}–{s['p90_ms']:.3f}",
                      f"{100 * s['median_ms'] / r['wall_median_ms']:.1f}%", "—" if mean is None else f"{mean:.3f}",
                      "—" if std is None else f"{std:.3f}")
    return t


def full_width(renderables: list, minimum: int = 80) -> int:
    """The console width at which every renderable prints at its natural width (nothing wraps
    that would not wrap on an unbounded console): the widest natural width, at least `minimum`."""
    probe = SafeConsole(width=UNBOUNDED, file=io.StringIO())
    return max([minimum] + [Measurement.get(probe, probe.options, r).maximum for r in renderables])


def report_renderables(rows: list[dict], sections: list[Section]) -> list:
    """The report, in order: the leading sections (the headline), the tables of summary.json's
    `rows`, then the other sections."""
    streams = stream_table(rows)
    return [*(s.renderable for s in sections if s.leads),  # the headline first
            summary_table(rows), stage_table(rows), *([streams] if streams else []), quality_table(rows),
            *(s.renderable for s in sections if not s.leads)]


def print_report(console, rows: list[dict], sections: list[Section], out_dir: Path) -> Path:
    """Print the report on `console` and write it, at its full width, to `out_dir`/report.txt."""
    report = report_renderables(rows, sections)
    file_console = SafeConsole(record=True, width=full_width(report), file=io.StringIO())
    for c in (console, file_console):
        for renderable in report:
            c.print(renderable)
    path = out_dir / "report.txt"
    write_text_atomic(path, file_console.export_text())  # a planted link is replaced, not followed
    return path
