"""Reports of an Analysis: rich terminal tables and a roofline plot.

Tables: per workload and target, one row per stage (measured, bound, efficiency, limiter,
target verdict, useful / padded / repeated GFLOP), then the call summary (sum, max, critical
path and latency of bounds and of measurements, wall time, whole-call efficiency, decisions/s).
The roofline places each stage at its arithmetic intensity (useful FLOPs per necessary byte)
and achieved rate (useful FLOPs per measured second) under the device's roofs, datasheet solid
and measured dashed. matplotlib is used through its object API on the Agg canvas: no pyplot, no
global backend switch, nothing opened on screen.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from dohnuts.bench.analysis.report import Analysis, GroupAnalysis


def _ms(x: float | None) -> str:
    if x is None:
        return "—"
    if 0 < x < 0.01:  # transfers of a few bytes: keep the digits visible
        return f"{x:.2e}"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _verdict(x: bool | None) -> str:
    return "—" if x is None else ("[green]meets[/]" if x else "[red]misses[/]")


def _gflop(x: float) -> str:
    return f"{x / 1e9:.3g}" if x else "0"


def stage_table(g: GroupAnalysis, target_fraction: float = 0.8) -> Table:
    """Per stage: measured, bound and efficiency for each basis, limiter, verdict, work split."""
    t = Table(title=f"{g.workload} · {g.target} · {g.precision} · {g.model} · {g.device} ({g.calls} calls)",
              title_justify="left")
    t.add_column("stage", no_wrap=True)
    t.add_column("measured\nms", justify="right")
    for b in g.bases:
        t.add_column(f"bound ms\n{b}", justify="right")
        t.add_column(f"eff\n{b}", justify="right")
    t.add_column("limiter\n(datasheet)")
    t.add_column(f"{target_fraction:.0%}\ntarget", justify="center")
    t.add_column("GFLOP\nuseful", justify="right")
    t.add_column("GFLOP\npadded", justify="right")
    t.add_column("GFLOP\nrepeated", justify="right")
    for r in g.stages:
        cells = [r.stage, _ms(r.measured_ms)]
        for b in g.bases:
            cells += [_ms(r.bound_ms[b]) if r.modelled else "no model", _pct(r.efficiency[b])]
        cells += [r.limiter["datasheet"], _verdict(r.meets_target["datasheet"]),
                  _gflop(sum(r.useful_flops.values())), _gflop(r.padded_flops), _gflop(r.repeated_flops)]
        t.add_row(*cells)
    return t


def call_table(g: GroupAnalysis) -> Table:
    """The whole call: combinations of stage times, wall time, efficiency, throughput, work split."""
    t = Table(title=f"{g.workload} · {g.target}: whole call", title_justify="left")
    t.add_column("quantity")
    for b in g.bases:
        t.add_column(f"bound\n{b}", justify="right")
    t.add_column("measured", justify="right")
    c = g.call
    for label, attr in (("sum of stages ms (no overlap)", "sum_ms"), ("max stage ms (ideal overlap)", "max_ms"),
                        ("critical path ms (pipelined)", "critical_ms"), ("single-call latency ms", "latency_ms")):
        t.add_row(label, *[_ms(getattr(c.bound[b], attr)) for b in g.bases], _ms(getattr(c.measured, attr)))
    t.add_row("wall ms", *["" for _ in g.bases], _ms(c.wall_ms))
    t.add_row("efficiency (critical-path bound / wall)", *[_pct(c.efficiency[b]) for b in g.bases], "")
    t.add_row("target verdict", *[_verdict(c.meets_target[b]) for b in g.bases], "")
    t.add_row("decisions / s", *[f"{c.ceiling_decisions_per_s[b]:.1f}" if c.ceiling_decisions_per_s[b] else "—"
                                 for b in g.bases], f"{c.decisions_per_s:.1f}" if c.decisions_per_s else "—")
    t.add_row("critical cycle", *[" → ".join(c.bound[b].critical_stages) for b in g.bases],
              " → ".join(c.measured.critical_stages))
    tok = c.tokens
    t.add_row("tokens useful / padded / repeated / recomputed", *["" for _ in g.bases],
              f"{tok['useful']:.0f} / {tok['padded']:.0f} / {tok['repeated']:.0f} / {tok['recomputed']:.0f}")
    t.add_row("GFLOP useful / padded / repeated", *["" for _ in g.bases],
              " / ".join(_gflop(c.flops[k]) for k in ("useful", "padded", "repeated")))
    return t


def analysis_tables(analysis: Analysis) -> list[Table]:
    out = []
    for g in analysis.groups:
        out += [stage_table(g, analysis.hwspec.target_fraction), call_table(g)]
    return out


def print_analysis(analysis: Analysis, console: Console | None = None) -> None:
    """Print every group's tables, then the warnings."""
    console = console or Console()
    spec = analysis.hwspec
    console.print(f"[bold]{spec.name}[/] ({spec.source or 'built in'}); target {spec.target_fraction:.0%}")
    for table in analysis_tables(analysis):
        console.print(table)
    for w in analysis.warnings:
        console.print(f"[yellow]warning:[/] {w}")


def roofline_png(analysis: Analysis, path: str | Path, precision: str | None = None) -> Path:
    """Write the roofline plot (PNG) of every stage with FLOPs, bytes and a measurement."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    spec = analysis.hwspec
    precision = precision or (analysis.groups[0].precision if analysis.groups else spec.precisions()[0])
    fig = Figure(figsize=(9, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    points = []
    for gi, g in enumerate(analysis.groups):
        for r in g.stages:
            flops = sum(r.useful_flops.values())
            if r.intensity is None or not r.measured_ms:
                continue
            points.append((gi, g, r, r.intensity, flops / (r.measured_ms / 1e3)))
    xs = [p[3] for p in points] or [1.0]
    lo, hi = min(xs + [1.0]) / 4, max(xs + [1e4]) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    bases = ("datasheet", "measured") if spec.has_measured(precision) else ("datasheet",)
    for basis, style in zip(bases, ("-", "--")):
        mem = spec.ceiling("memory", precision, basis)
        for role, colour in (("matrix", "black"), ("vector", "grey")):
            peak = spec.ceiling(role, precision, basis)
            ax.plot(grid, [min(peak.value, x * mem.value) for x in grid], style, color=colour, linewidth=1,
                    label=f"{role} roof: {peak.name} {peak.value / 1e12:.4g} TFLOP/s, "
                          f"{mem.name} {mem.value / 1e9:.4g} GB/s ({basis})")
    markers = "osD^v<>p*h"
    for gi, g, r, x, y in points:
        ax.scatter([x], [y], marker=markers[gi % len(markers)], color=f"C{gi % 10}", zorder=3,
                   label=f"{g.workload} · {g.target}" if r is next(p[2] for p in points if p[0] == gi) else None)
        ax.annotate(r.stage, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (useful FLOP / necessary byte)")
    ax.set_ylabel("achieved useful FLOP/s")
    ax.set_title(f"Roofline · {spec.name} · {precision}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
