"""The roofline, drawn once: the PNG every run writes (`roofline.png`) and the panels of `report.html`
come from the same data through the same matplotlib drawing, so both show the same roofs.

The data is summary.json's `sections.efficiency` (`Analysis.to_dict`): its groups' stages (arithmetic
intensity, measured time, useful FLOPs) and `rooflines`, per precision the roofs `roofs(spec,
precision)` returns — for every basis the spec reports bounds on (datasheet, measured, sustained) a
matrix roof (the basis' matrix ceiling meeting its memory bandwidth) and a vector roof, the same
ceilings the stage bounds use. (The HTML page once drew its own SVG from every compute ceiling and
the largest bandwidth of the spec, the host link's included: other roofs than the PNG's.)

A point is a stage of a workload · target at its intensity (useful FLOPs per necessary byte) and its
achieved rate (useful FLOPs per measured second); a panel is a workload (steady calls; the page adds
a panel of first calls). Roofs: matrix black, vector grey; datasheet solid, measured dashed,
sustained dotted; named once, in a legend below the panels, so no legend covers data. matplotlib
through its object API on the Agg (PNG) or SVG canvas: no pyplot, no global backend switch,
nothing opened on screen. The SVG for the page is inline and self-contained: no clip paths (every
artist lies inside its axes' limits, so they clip nothing), no style sheet, no metadata.
"""

from __future__ import annotations

import io
import math
import re
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from dohnuts.schema import printable, write_bytes_atomic

if TYPE_CHECKING:
    from dohnuts.bench.analysis.hwspec import HwSpec
    from dohnuts.bench.analysis.report import Analysis

ROLES = {"matrix": "black", "vector": "grey"}
STYLES = {"datasheet": "-", "measured": "--", "sustained": ":"}  # a measured-only spec draws dashed
MARKERS = "osD^v<>p*h"
OFFSETS = ((4, 4), (4, -10), (-8, 8), (-8, -12))  # stage labels alternate around their points
SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def roofs(spec: HwSpec, precision: str) -> list[dict]:
    """The roofs of `precision`: a matrix and a vector roof for every basis the spec reports on."""
    out = []
    for basis in spec.bases(precision):
        memory = spec.ceiling("memory", precision, basis)
        for role in ROLES:
            peak = spec.ceiling(role, precision, basis)
            out.append({"basis": basis, "role": role, "peak": peak.name, "peak_flops": peak.value,
                        "memory": memory.name, "memory_bytes_s": memory.value})
    return out


def stage_points(groups: list[dict], *, first_calls: bool = False) -> dict[str, list[tuple[str, str, float, float]]]:
    """workload → [(target, stage, intensity, achieved FLOP/s)] of the steady calls' groups (or
    their first calls'), from `Analysis.to_dict()["groups"]`: stages with an intensity, a time
    and useful FLOPs."""
    out: dict[str, list] = {}
    for g in groups:
        if ("first-call" in g["target"]) != first_calls:
            continue
        for s in g["stages"]:
            flops = sum((s.get("useful_flops") or {}).values())
            if s.get("intensity") and s.get("measured_ms") and flops > 0:
                out.setdefault(g["workload"], []).append((g["target"], s["stage"], s["intensity"],
                                                          flops / (s["measured_ms"] / 1e3)))
    return out


def plot_text(text: str) -> str:
    """A user-named string (a workload, a target, a stage) as plain text on a figure: control
    characters as escapes (dohnuts.schema.printable; a missing glyph's warning once carried a raw
    ESC to stderr), a `$` never read as the start of mathtext."""
    return printable(text).replace("$", r"\$")


def save_png(fig, path: Path) -> Path:
    """`fig` as a PNG at `path`, written whole and renamed into place (dohnuts.schema.write_bytes_atomic):
    a symbolic link planted at `path` is replaced, never written through."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes_atomic(path, buf.getvalue())
    return path


def decade_label(value: float, _position=None) -> str:
    """A log axis' tick label as plain text: a decade as 10 and its exponent in superscript digits
    (10³, 10⁻²), any other value none. matplotlib's own log formatter writes every label as
    mathtext, whose parsing was most of the drawing's time (docs/history/evolution.md, M59); the
    same label drawn as text is also one `<text>` element of the page's SVG instead of several."""
    if not value > 0:
        return ""
    exponent = round(math.log10(value))
    return f"10{str(exponent).translate(SUPERSCRIPTS)}" if math.isclose(value, 10.0 ** exponent) else ""


def roof_vertices(peak: float, memory: float, lo: float, hi: float, ylo: float) -> tuple[list, list]:
    """The roof min(peak, x · memory) over [lo, hi] as its vertices (a straight line and a flat one
    on log-log axes: exact with three points), starting where it rises above `ylo`."""
    start = max(lo, ylo / memory)
    knee = min(max(peak / memory, start), hi)
    xs = [start, knee, hi]
    return xs, [min(peak, x * memory) for x in xs]


def figure(panels: dict[str, list], roof_list: list[dict], title: str, *, canvas: str = "agg"):
    """The roofline figure: a panel a key of `panels` (at most 3 columns) with its points, every
    roof in every panel, one legend below (the roofs, then a marker a target)."""
    # matplotlib: only when a figure is drawn
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    if canvas == "svg":
        # matplotlib: only when a figure is drawn
        from matplotlib.backends.backend_svg import FigureCanvasSVG as Canvas
    else:
        # matplotlib: only when a figure is drawn
        from matplotlib.backends.backend_agg import FigureCanvasAgg as Canvas

    names = list(panels) or ["(no measured stage)"]
    targets = list(dict.fromkeys(t for ps in panels.values() for t, *_ in ps))
    xs = [p[2] for ps in panels.values() for p in ps] or [1.0]
    ys = [p[3] for ps in panels.values() for p in ps] + [r["peak_flops"] for r in roof_list]
    lo, hi = min(xs + [1.0]) / 4, max(xs + [1e4]) * 4
    ylo = min([p[3] for ps in panels.values() for p in ps] + [r["memory_bytes_s"] * lo for r in roof_list]
              or [1.0]) / 2
    yhi = max(ys or [1.0]) * 2
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows + 1.2), layout="constrained")
    Canvas(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    for i, ax in enumerate(axes.flat):
        if i >= len(names):
            ax.set_visible(False)
            continue
        for roof in roof_list:
            peak, mem = roof["peak_flops"], roof["memory_bytes_s"]
            ax.plot(*roof_vertices(peak, mem, lo, hi, ylo), STYLES[roof["basis"]],
                    color=ROLES[roof["role"]], linewidth=1, clip_on=False,
                    label=(f"{roof['role']} roof: {plot_text(roof['peak'])} {peak / 1e12:.4g} TFLOP/s, "
                           f"{plot_text(roof['memory'])} {mem / 1e9:.4g} GB/s ({roof['basis']})") if i == 0 else None)
        labelled: list[tuple[str, float, float]] = []
        for target, stage, x, y in panels.get(names[i], []):
            k = targets.index(target)
            ax.scatter([x], [y], marker=MARKERS[k % len(MARKERS)], color=f"C{k % 10}", zorder=3, s=22, clip_on=False)
            # a stage is named once where its points of several targets sit together (within 2×)
            if any(st == stage and 0.5 < x / lx < 2 and 0.5 < y / ly < 2 for st, lx, ly in labelled):
                continue
            ax.annotate(plot_text(stage), (x, y), textcoords="offset points", xytext=OFFSETS[len(labelled) % len(OFFSETS)],
                        fontsize=7, annotation_clip=False)
            labelled.append((stage, x, y))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(ylo, yhi)
        ax.minorticks_off()  # decades are enough to read a roofline (and keep the page's SVG small)
        ax.xaxis.set_major_formatter(FuncFormatter(decade_label))
        ax.yaxis.set_major_formatter(FuncFormatter(decade_label))
        ax.set_title(plot_text(names[i]), fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        if i % cols == 0:
            ax.set_ylabel("achieved useful FLOP/s")
        if i >= len(names) - cols:
            ax.set_xlabel("useful FLOP / necessary byte")
    for k, target in enumerate(targets):  # one legend entry a target, drawn off the axes
        axes.flat[0].scatter([], [], marker=MARKERS[k % len(MARKERS)], color=f"C{k % 10}", label=plot_text(target))
    fig.suptitle(plot_text(title), fontsize=10)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    return fig


def roofline_png(analysis: Analysis, path: str | Path, precision: str | None = None) -> Path:
    """Write the run's roofline plot (PNG): a panel a workload, steady calls (first calls are
    never in an analysis group's steady work), the roofs of `precision` (default: the first
    group's)."""
    spec = analysis.hwspec
    precision = precision or (analysis.groups[0].precision if analysis.groups else spec.precisions()[0])
    data = analysis.to_dict()
    return roofline_png_of(data | {"rooflines": {precision: roofs(spec, precision)}}, path)


def roofline_png_of(data: dict, path: str | Path) -> Path:
    """The roofline plot of an analysis in its summary form (`Analysis.to_dict`: the efficiency
    section's data), the roofs of its first group's precision (none: its first precision)."""
    precision = data["groups"][0]["precision"] if data["groups"] else next(iter(data["rooflines"]))
    fig = figure(stage_points(data["groups"]), data["rooflines"][precision],
                 f"Roofline · {data['hwspec']['name']} · {precision} · steady calls")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_png(fig, path)  # written whole and renamed: never through a planted link


def roofline_svg(points: list, roof_list: list[dict], title: str) -> str:
    """One panel as an inline <svg> element (class `chart roofline`) for the HTML page: the same
    figure as the PNG's, written by matplotlib's SVG canvas (text as text), its XML prologue,
    metadata and style sheet left out (an inline style would style the whole page)."""
    # matplotlib: only when a figure is drawn
    import matplotlib

    fig = figure({title: points}, roof_list, "", canvas="svg")
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dohnuts-roofline"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r"<style[^>]*>.*?</style>", "", svg, flags=re.S)
    # every artist lies within its axes' limits (`figure`): the clip paths clip nothing
    svg = re.sub(r'\s*clip-path="url\(#[^)]*\)"', "", svg)
    svg = re.sub(r"<clipPath .*?</clipPath>", "", svg, flags=re.S)
    svg = re.sub(r">\s+<", "><", svg)  # indentation between elements: nothing is drawn of it


    label = escape(printable(title))
    return svg.replace("<svg ", f'<svg class="chart roofline" role="img" aria-label="{label}" ', 1)
