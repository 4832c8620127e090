"""Built-in reporters: the per-stage timing summary (median, p10/p90, spread, throughput,
memory), the analyzers' sections, and `report.txt` / `summary.json` in the run directory.

Width: the tables are `dohnuts.bench.analysis.render.FitTable`s, which pick their layout from the
width they are printed at (its module docstring has the rule). On the console that is the
terminal's width (or COLUMNS; 80 in a log): the full table when it fits, else narrower tables
with the names as headings, else one block per row — never a cell cut with "…". `report.txt` is
written at the natural width of the widest renderable (at least 80 columns), so it always holds
the full tables, whatever the terminal. summary.json does not depend on any width."""

from __future__ import annotations

import io
import json
import statistics
from collections import defaultdict

from rich.console import Console
from rich.measure import Measurement

from dohnuts.bench.analysis.records import group_key
from dohnuts.bench.analysis.render import UNBOUNDED, Col, FitTable
from dohnuts.bench.hookspecs import hookimpl


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stage_ms(entry: dict) -> float:
    return entry["device_ms"] if entry.get("device_ms") is not None else entry["host_ms"]


def summarize(records: list[dict]) -> list[dict]:
    """Per (workload, target): per-stage and whole-call statistics over the measured calls."""
    groups = defaultdict(list)
    for r in records:
        groups[group_key(r)].append(r)
    out = []
    for (workload, target), recs in groups.items():
        walls = [r["wall_ms"] for r in recs]
        med = statistics.median(walls)
        decisions = statistics.median(r["decisions"] for r in recs)
        useful = statistics.median(r["tokens"]["useful"] for r in recs)
        stages = {}
        for name in dict.fromkeys(n for r in recs for n in r["stages"]):
            xs = [stage_ms(r["stages"][name]) for r in recs if name in r["stages"]]
            stages[name] = {"median_ms": statistics.median(xs), "p10_ms": _quantile(xs, 0.1),
                            "p90_ms": _quantile(xs, 0.9)}
        peak = [r["peak_mem_bytes"] for r in recs if r.get("peak_mem_bytes")]
        out.append({
            "workload": workload, "target": target, "calls": len(recs), "wall_median_ms": med,
            "wall_p10_ms": _quantile(walls, 0.1), "wall_p90_ms": _quantile(walls, 0.9),
            "spread": (_quantile(walls, 0.9) - _quantile(walls, 0.1)) / med if med else 0.0,
            "decisions_per_s": decisions / (med / 1e3), "useful_tokens_per_s": useful / (med / 1e3),
            "padded_tokens": statistics.median(r["tokens"]["padded"] for r in recs),
            "peak_mem_bytes": max(peak) if peak else None, "stages": stages,
            "device": recs[0]["device"]["name"], "precision": recs[0]["precision"],
        })
    return out


def summary_table(rows: list[dict]) -> FitTable:
    """One row per (workload, target); narrow: a table per workload, split in two if need be."""
    t = FitTable("Measured calls (median over calls; p10–p90; spread = (p90 − p10) / median)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("calls"), Col("wall ms"),
                  Col("p10–p90"), Col("spread"), Col("decisions/s"), Col("tokens/s"), Col("peak mem")],
                 sections=1, groups=[(2,), (3, 4), (5,), (6,), (7,), (8,)], title_justify="center")
    for r in rows:
        mem = f"{r['peak_mem_bytes'] / 2**30:.2f} GiB" if r["peak_mem_bytes"] else "—"
        t.add_row(r["workload"], r["target"], str(r["calls"]), f"{r['wall_median_ms']:.2f}",
                  f"{r['wall_p10_ms']:.2f}–{r['wall_p90_ms']:.2f}", f"{100 * r['spread']:.1f}%",
                  f"{r['decisions_per_s']:.1f}", f"{r['useful_tokens_per_s']:.0f}", mem)
    return t


def stage_table(rows: list[dict]) -> FitTable:
    """One row per (workload, target, stage); narrow: a table per workload · target."""
    t = FitTable("Stages (median ms, device time where measured; p10–p90)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("stage", "left", wrap=True),
                  Col("median ms"), Col("p10–p90"), Col("share of wall")],
                 sections=2, groups=[(3, 4), (5,)], title_justify="center")
    for r in rows:
        for name, s in r["stages"].items():
            t.add_row(r["workload"], r["target"], name, f"{s['median_ms']:.3f}", f"{s['p10_ms']:.3f}–{s['p90_ms']:.3f}",
                      f"{100 * s['median_ms'] / r['wall_median_ms']:.1f}%")
    return t


def full_width(renderables: list, minimum: int = 80) -> int:
    """The console width at which every renderable prints at its natural width (nothing wraps
    that would not wrap on an unbounded console): the widest natural width, at least `minimum`."""
    probe = Console(width=UNBOUNDED, file=io.StringIO())
    return max([minimum] + [Measurement.get(probe, probe.options, r).maximum for r in renderables])


@hookimpl
def dohnuts_bench_report(console, records, sections, run_dir):
    rows = summarize(records)
    report = [summary_table(rows), stage_table(rows), *(s.renderable for s in sections)]
    file_console = Console(record=True, width=full_width(report), file=io.StringIO())
    for c in (console, file_console):
        for renderable in report:
            c.print(renderable)
    (run_dir / "report.txt").write_text(file_console.export_text())
    summary = {"summary": rows, "sections": {s.title: s.data for s in sections}}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    for s in sections:
        for f in s.files:
            console.print(f"[dim]wrote {f}[/]")
    console.print(f"[dim]report: {run_dir / 'report.txt'}  summary: {run_dir / 'summary.json'}[/]")
