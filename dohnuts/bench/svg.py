"""Small self-contained SVG charts for the HTML report: a roofline panel and a trend line.

No library and no script draws them: the SVG is written here, so the report works offline and
renders the same everywhere. Labels never overlap: points are numbered and named in a legend
beside the plot, never written next to the marks.
"""

from __future__ import annotations

import math
from html import escape

W, H = 520, 300  # plot box in px
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 20, 44
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22")


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


class _LogAxes:
    def __init__(self, xlo: float, xhi: float, ylo: float, yhi: float):
        self.x0, self.x1 = math.log10(xlo), math.log10(xhi)
        self.y0, self.y1 = math.log10(ylo), math.log10(yhi)

    def x(self, v: float) -> float:
        return PAD_L + (math.log10(v) - self.x0) / (self.x1 - self.x0) * (W - PAD_L - PAD_R)

    def y(self, v: float) -> float:
        return H - PAD_B - (math.log10(v) - self.y0) / (self.y1 - self.y0) * (H - PAD_T - PAD_B)


def _free_spot(placed: list, x: float, y: float, *, width: float, height: float) -> tuple[float, float]:
    """Where a label of that size goes near (x, y) (its baseline) without overlapping a label
    placed before: stepped down a line at a time, then to the right. The spot is recorded."""
    for dx in (0, 14, 28, 42):
        for k in range(12):
            box = (x + dx, y + k * height - height, x + dx + width, y + k * height)
            if all(box[2] <= b[0] or box[0] >= b[2] or box[3] <= b[1] or box[1] >= b[3] for b in placed):
                placed.append(box)
                return box[0], box[3]
    placed.append((x, y - height, x + width, y))
    return x, y


def roofline(points: list[dict], ceilings: dict[str, float], bandwidth: float | None, *, title: str) -> str:
    """A log-log roofline: `points` are {label, intensity (FLOP/B), flops (FLOP/s)}; `ceilings`
    {name: FLOP/s} horizontal roofs, `bandwidth` (B/s) the slanted one. Returns an <svg> element
    followed by its legend (an ordered list naming each numbered point)."""
    pts = [p for p in points if p.get("intensity") and p.get("flops") and p["intensity"] > 0 and p["flops"] > 0]
    roofs = [v for v in ceilings.values() if v and v > 0]
    xs = [p["intensity"] for p in pts] + [1e-1, 1e3]
    ys = [p["flops"] for p in pts] + roofs
    if not ys:
        return f'<p class="empty">{escape(title)}: no modelled stage to place on a roofline.</p>'
    ax = _LogAxes(min(xs) / 2, max(xs) * 2, min(ys) / 4, max(ys) * 2)
    out = [f'<svg class="chart roofline" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{escape(title)}"><title>{escape(title)}</title>']
    out.append(f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
               'fill="none" stroke="#999"/>')
    for t in _log_ticks(10 ** ax.x0, 10 ** ax.x1):
        if 10 ** ax.x0 <= t <= 10 ** ax.x1:
            out.append(f'<text x="{ax.x(t):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tick">{_si(t)}</text>')
    for t in _log_ticks(10 ** ax.y0, 10 ** ax.y1):
        if 10 ** ax.y0 <= t <= 10 ** ax.y1:
            out.append(f'<text x="{PAD_L - 4}" y="{ax.y(t) + 3:.1f}" text-anchor="end" class="tick">{_si(t)}</text>')
    out.append(f'<text x="{(W + PAD_L) / 2}" y="{H - 6}" text-anchor="middle" class="axis">arithmetic intensity '
               '(FLOP / byte)</text>')
    out.append(f'<text x="12" y="{H / 2}" text-anchor="middle" class="axis" transform="rotate(-90 12 {H / 2})">'
               'FLOP / s</text>')
    xlo, xhi = 10 ** ax.x0, 10 ** ax.x1
    for name, value in ceilings.items():
        if not value or value <= 0:
            continue
        start = xlo if not bandwidth else max(xlo, value / bandwidth)  # where the roof meets the slope
        out.append(f'<line x1="{ax.x(start):.1f}" y1="{ax.y(value):.1f}" x2="{ax.x(xhi):.1f}" y2="{ax.y(value):.1f}" '
                   f'stroke="#444" stroke-dasharray="4 3"><title>{escape(name)}: {_si(value)}FLOP/s</title></line>')
    if bandwidth:
        top = max(roofs) if roofs else bandwidth * xhi
        x_end = min(xhi, top / bandwidth)
        out.append(f'<line x1="{ax.x(xlo):.1f}" y1="{ax.y(max(bandwidth * xlo, 10 ** ax.y0)):.1f}" '
                   f'x2="{ax.x(x_end):.1f}" y2="{ax.y(bandwidth * x_end):.1f}" stroke="#444">'
                   f'<title>memory bandwidth: {_si(bandwidth)}B/s</title></line>')
    legend, placed = [], []  # placed: the number labels' boxes so far (x0, y0, x1, y1)
    for i, p in enumerate(pts, 1):
        colour = COLOURS[(i - 1) % len(COLOURS)]
        cx, cy = ax.x(p["intensity"]), ax.y(p["flops"])
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colour}" class="point"><title>{i}. '
                   f'{escape(p["label"])}: {p["intensity"]:.3g} FLOP/B, {_si(p["flops"])}FLOP/s</title></circle>')
        lx, ly = _free_spot(placed, cx + 7, cy - 5, width=7 * len(str(i)), height=11)
        out.append(f'<text x="{lx:.1f}" y="{ly:.1f}" class="num" fill="{colour}">{i}</text>')
        legend.append(f'<li style="color:{colour}"><span>{escape(p["label"])}: {p["intensity"]:.3g} FLOP/B, '
                      f'{_si(p["flops"])}FLOP/s</span></li>')
    out.append("</svg>")
    return "".join(out) + f'<ol class="legend">{"".join(legend)}</ol>'


def trend(values: list[float], labels: list[str], flags: list[str | None], *, title: str, unit: str = "ms") -> str:
    """A line over runs (oldest first): values on a linear axis from 0, each run's label in a
    legend below; a run whose change was flagged is drawn larger, red (slower) or green (faster)."""
    if not values:
        return f'<p class="empty">{escape(title)}: no runs.</p>'
    top = max(values) * 1.15 or 1.0
    n = len(values)

    def x(i: int) -> float:
        return PAD_L + (i + 0.5) / n * (W - PAD_L - PAD_R)

    def y(v: float) -> float:
        return H - PAD_B - v / top * (H - PAD_T - PAD_B)

    out = [f'<svg class="chart trend" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" fill="none" '
           'stroke="#999"/>']
    for k in range(5):
        v = top * k / 4
        out.append(f'<text x="{PAD_L - 4}" y="{y(v) + 3:.1f}" text-anchor="end" class="tick">{v:.3g}</text>')
    out.append(f'<text x="12" y="{H / 2}" text-anchor="middle" class="axis" transform="rotate(-90 12 {H / 2})">'
               f'median {escape(unit)}</text>')
    out.append('<polyline fill="none" stroke="#1f77b4" points="'
               + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values)) + '"/>')
    for i, (v, label, flag) in enumerate(zip(values, labels, flags)):
        colour = {"slower": "#d62728", "faster": "#2ca02c"}.get(flag or "", "#1f77b4")
        r = 6 if flag in ("slower", "faster") else 3.5
        out.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="{r}" fill="{colour}" class="point">'
                   f'<title>{i + 1}. {escape(label)}: {v:.4g} {escape(unit)}{" — " + flag if flag else ""}</title></circle>')
        out.append(f'<text x="{x(i):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tick">{i + 1}</text>')
    out.append("</svg>")
    legend = "".join(f'<li>{escape(label)}{" — <b>" + escape(flag) + "</b>" if flag else ""}</li>'
                     for label, flag in zip(labels, flags))
    return "".join(out) + f'<ol class="legend">{legend}</ol>'
