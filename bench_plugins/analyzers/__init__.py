"""Built-in analyzers: measured ceilings at the start of a run (GPU), and the efficiency
analysis — per stage and whole call, against the hwspec's datasheet and measured ceilings."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.report import Section


@hookimpl
def dohnuts_bench_prepare_run(run):
    if run.device.type != "cuda":
        run.notes.append("measured ceilings: skipped (no GPU)")
        return
    from bench_plugins.analyzers.microbench import measure_ceilings

    run.console.print("[dim]measuring ceilings (bf16 matmul, device copy, host link)…[/]")
    run.measured["ceilings"] = measure_ceilings(run.device)


@hookimpl
def dohnuts_bench_analyze(records, hwspec, measured, run_dir):
    if hwspec is None:
        device = records[0]["device"]["name"] if records else "?"
        return [Section("efficiency", Text(f"efficiency: no hardware spec for device {device!r}; "
                                           "pass --hwspec NAME (hwspecs/NAME.yaml) or a path"))]
    from dohnuts.bench.analysis import analysis_tables, analyze_records, roofline_png
    from dohnuts.bench.analysis.hwspec import with_measured_ceilings

    spec = with_measured_ceilings(hwspec, (measured or {}).get("ceilings", {}))
    analysis = analyze_records(records, spec)
    png = roofline_png(analysis, run_dir / "roofline.png")
    parts = [Text(f"{spec.name}: bounds and efficiency ({spec.source or 'built in'})", style="bold")]
    parts += analysis_tables(analysis)
    parts += [Text(f"warning: {w}", style="yellow") for w in analysis.warnings]
    return [Section("efficiency", Group(*parts), data=analysis.to_dict(), files=[str(png)])]
