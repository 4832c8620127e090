"""Small self-contained SVG charts for the HTML report: a trend line, the headline's figure, and a
serving curve's latency and throughput against offered load with the critical-path bound's floor
and ceiling. (The roofline is drawn once, by matplotlib, for the PNG and the page alike:
dohnuts.bench.analysis.roofline.)

No library and no script draws them: the SVG is written here, so the report works offline and
renders the same everywhere. Labels never overlap: series are named in a legend beside the plot,
never written next to the marks.
"""

from __future__ import annotations

import math
from html import escape

W, H = 520, 300  # plot box in px
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 20, 44


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


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


class _Axes:
    """A plot box with a linear x axis and a linear or logarithmic y axis."""

    def __init__(self, xhi: float, ylo: float, yhi: float, *, log_y: bool):
        self.xhi, self.log_y = xhi, log_y
        self.ylo, self.yhi = (math.log10(ylo), math.log10(yhi)) if log_y else (ylo, yhi)

    def x(self, v: float) -> float:
        return PAD_L + min(max(v, 0.0), self.xhi) / self.xhi * (W - PAD_L - PAD_R)

    def y(self, v: float) -> float:
        t = math.log10(v) if self.log_y else v
        t = min(max(t, self.ylo), self.yhi)
        return H - PAD_B - (t - self.ylo) / (self.yhi - self.ylo) * (H - PAD_T - PAD_B)

    def frame(self, title: str, xlabel: str, ylabel: str) -> list[str]:
        out = [f'<svg class="chart load" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
               f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
               f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" fill="none" '
               'stroke="#999"/>']
        for k in range(6):
            v = self.xhi * k / 5
            out.append(f'<text x="{self.x(v):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tick">'
                       f'{_si(v)}</text>')
        if self.log_y:
            ticks = [t for t in _log_ticks(10 ** self.ylo, 10 ** self.yhi) if 10 ** self.ylo <= t <= 10 ** self.yhi]
        else:
            ticks = [self.ylo + (self.yhi - self.ylo) * k / 4 for k in range(5)]
        for t in ticks:
            out.append(f'<text x="{PAD_L - 4}" y="{self.y(t) + 3:.1f}" text-anchor="end" class="tick">{_si(t)}</text>')
        out.append(f'<text x="{(W + PAD_L) / 2}" y="{H - 6}" text-anchor="middle" class="axis">{escape(xlabel)}</text>')
        out.append(f'<text x="12" y="{H / 2}" text-anchor="middle" class="axis" transform="rotate(-90 12 {H / 2})">'
                   f'{escape(ylabel)}</text>')
        return out

    def hline(self, v: float, colour: str, dash: str, label: str) -> str:
        return (f'<line x1="{PAD_L}" y1="{self.y(v):.1f}" x2="{W - PAD_R}" y2="{self.y(v):.1f}" stroke="{colour}" '
                f'stroke-dasharray="{dash}"><title>{escape(label)}</title></line>')

    def vline(self, v: float, colour: str, dash: str, label: str) -> str:
        return (f'<line x1="{self.x(v):.1f}" y1="{PAD_T}" x2="{self.x(v):.1f}" y2="{H - PAD_B}" stroke="{colour}" '
                f'stroke-dasharray="{dash}"><title>{escape(label)}</title></line>')

    def series(self, pts: list[tuple[float, float]], colour: str, label: str) -> list[str]:
        out = [f'<polyline fill="none" stroke="{colour}" points="'
               + " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in pts) + '"/>'] if len(pts) > 1 else []
        for a, b in pts:
            out.append(f'<circle cx="{self.x(a):.1f}" cy="{self.y(b):.1f}" r="3.5" fill="{colour}" class="point">'
                       f'<title>{escape(label)}: {a:.4g} req/s → {b:.4g}</title></circle>')
        return out


def _x_range(rates: list[float], extra: list[float]) -> float:
    """The x axis reaches past the tried rates, and to a bound line when it is not far beyond them."""
    top = max(rates) if rates else 1.0
    near = [v for v in extra if v and v <= 2.5 * top]
    return max([top] + near) * 1.1


def _load_axis(curve: dict) -> tuple[str, str]:
    """(the points' key, the axis label) of a serving curve: clients for a closed loop, else the
    offered rate."""
    if curve.get("closed_loop"):
        return "concurrency", "concurrent clients (closed loop)"
    return "rate_rps", "offered rate (requests / s)"


def latency_curve(curve: dict) -> str:
    """Latency against offered load (a serving curve of summary.json; a closed loop's against its
    clients): p50 and the SLO's percentile a point (unserved requests make it unbounded: drawn at
    the top), the SLO, and the critical-path bound's latency floor (horizontal) and throughput
    ceiling (vertical, on a rate axis)."""
    key, label = _load_axis(curve)
    pts = sorted((p for p in curve["points"] if p.get(key) is not None), key=lambda p: p[key])
    if not pts:
        return '<p class="empty">no load point at an offered rate</p>'
    bound = curve.get("bound") or {}
    floor, slo = bound.get("latency_floor_ms"), curve.get("slo_ms")
    ceiling = None if curve.get("closed_loop") else bound.get("throughput_ceiling_rps")
    values = [v for p in pts for v in (p.get("p50_ms"), p.get("latency_ms")) if v]
    marks = [v for v in (floor, slo) if v]
    lo, hi = min(values + marks) / 2, max(values + marks) * 2
    ax = _Axes(_x_range([p[key] for p in pts], [ceiling]), lo, hi, log_y=True)
    pct = f"p{100 * curve['percentile']:g}"
    title = f"{curve['workload']} · {curve['target']}: latency against load"
    out = ax.frame(title, label, "latency (ms)")
    if slo:
        out.append(ax.hline(slo, "#d62728", "6 3", f"SLO: {pct} ≤ {slo:g} ms"))
    if floor:
        out.append(ax.hline(floor, "#2ca02c", "2 2", f"latency floor (critical-path bound): {floor:.3g} ms"))
    if ceiling and ceiling <= ax.xhi:
        out.append(ax.vline(ceiling, "#2ca02c", "6 3", f"throughput ceiling (critical-path bound): {ceiling:.4g} "
                                                         "req/s"))
    out += ax.series([(p[key], p["p50_ms"] or hi) for p in pts], "#1f77b4", "p50 ms")
    out += ax.series([(p[key], p["latency_ms"] or hi) for p in pts], "#ff7f0e", f"{pct} ms")
    out.append("</svg>")
    legend = [f'<li style="color:#1f77b4">p50</li><li style="color:#ff7f0e">{pct} (unbounded: at the top)</li>']
    if slo:
        legend.append(f'<li style="color:#d62728">SLO {pct} ≤ {slo:g} ms</li>')
    if floor:
        roof = "" if curve.get("closed_loop") else f', ceiling {"—" if not ceiling else f"{ceiling:.4g} req/s"}'
        legend.append(f'<li style="color:#2ca02c">floor {floor:.3g} ms{roof} (critical-path bound, '
                      f'{escape(str(bound.get("basis", "")))} basis)</li>')
    return "".join(out) + f'<ul class="legend">{"".join(legend)}</ul>'


def throughput_curve(curve: dict) -> str:
    """Throughput and goodput against offered load (a closed loop's: against its clients), under
    the bound's throughput ceiling."""
    key, label = _load_axis(curve)
    closed = bool(curve.get("closed_loop"))
    pts = sorted((p for p in curve["points"] if p.get(key) is not None), key=lambda p: p[key])
    if not pts:
        return ""
    ceiling = (curve.get("bound") or {}).get("throughput_ceiling_rps")
    xhi = _x_range([p[key] for p in pts], [] if closed else [ceiling])
    top = max([p["throughput_rps"] for p in pts] + ([] if closed else [xhi])
              + ([ceiling] if ceiling and (closed or ceiling <= 2.5 * xhi) else []))
    ax = _Axes(xhi, 0.0, top * 1.1, log_y=False)
    out = ax.frame(f"{curve['workload']} · {curve['target']}: throughput against load", label, "requests / s")
    if not closed:  # a closed loop's x is clients, not requests a second
        out.append(f'<line x1="{ax.x(0):.1f}" y1="{ax.y(0):.1f}" x2="{ax.x(xhi):.1f}" '
                   f'y2="{ax.y(min(xhi, top * 1.1)):.1f}" stroke="#bbb"><title>served = offered</title></line>')
    if ceiling and ceiling <= top * 1.1:
        out.append(ax.hline(ceiling, "#2ca02c", "6 3", f"throughput ceiling (critical-path bound): {ceiling:.4g} "
                                                         "req/s"))
    out += ax.series([(p[key], p["throughput_rps"]) for p in pts], "#1f77b4", "throughput req/s")
    good = [(p[key], p["goodput_rps"]) for p in pts if p.get("goodput_rps") is not None]
    out += ax.series(good, "#9467bd", "goodput (within the SLO) req/s")
    out.append("</svg>")
    return "".join(out) + ('<ul class="legend"><li style="color:#1f77b4">throughput</li>'
                           + ('<li style="color:#9467bd">goodput: requests within the SLO a second</li>'
                              if good else "")
                           + '<li style="color:#2ca02c">ceiling: the critical-path bound</li></ul>')


def headline_chart(rows: list[dict], target_fraction: float = 0.8) -> str:
    """The headline as one figure (summary.json's `sections.headline.rows`): a line a comparison,
    on the left dohnuts' speed-up against the other target with its 95 % interval (log scale, 1× =
    as fast), on the right dohnuts' whole-call efficiency against the bound with the target line;
    a bound-suspect call is named, never drawn as a bar (no efficiency above 100 % is shown)."""
    if not rows:
        return '<p class="empty">no workload to show.</p>'
    row_h, top, bottom = 24, 36, 30
    label_r, s0, s1, e0, e1 = 322, 334, 594, 624, 864
    width, height = 900, top + row_h * len(rows) + bottom
    ratios = [x for r in rows if r.get("speedup") for x in (r["speedup"].get("ratio"), r["speedup"].get("low"),
                                                             r["speedup"].get("high"))
              if isinstance(x, (int, float)) and 0 < x < math.inf]
    lo = min([0.5] + [x / 1.25 for x in ratios])
    hi = max([2.0] + [x * 1.25 for x in ratios])

    def sx(v: float) -> float:
        v = min(max(v, lo), hi)
        return s0 + (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (s1 - s0)

    def ex(v: float) -> float:
        return e0 + min(max(v, 0.0), 1.0) * (e1 - e0)

    title = "dohnuts against its peer and against the bound"
    out = [f'<svg class="chart headline" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
           f'<text x="{(s0 + s1) / 2}" y="14" text-anchor="middle" class="axis">dohnuts speed-up, 95 % interval '
           '(log scale)</text>',
           f'<text x="{(e0 + e1) / 2}" y="14" text-anchor="middle" class="axis">dohnuts efficiency against the '
           'bound</text>',
           f'<rect x="{s0}" y="{top - 6}" width="{s1 - s0}" height="{row_h * len(rows) + 6}" fill="none" stroke="#999"/>',
           f'<rect x="{e0}" y="{top - 6}" width="{e1 - e0}" height="{row_h * len(rows) + 6}" fill="none" stroke="#999"/>']
    bottom_y = top + row_h * len(rows)
    k = 2.0 ** math.floor(math.log2(lo))
    while k <= hi:
        if lo <= k <= hi:
            out.append(f'<text x="{sx(k):.1f}" y="{bottom_y + 14}" text-anchor="middle" class="tick">{k:g}×</text>')
        k *= 2
    out.append(f'<line x1="{sx(1.0):.1f}" y1="{top - 6}" x2="{sx(1.0):.1f}" y2="{bottom_y}" stroke="#444" '
               'stroke-dasharray="4 3"><title>1×: as fast as the other target</title></line>')
    for pct in range(0, 101, 20):
        out.append(f'<text x="{ex(pct / 100):.1f}" y="{bottom_y + 14}" text-anchor="middle" class="tick">{pct}%</text>')
    out += [f'<line x1="{ex(target_fraction):.1f}" y1="{top - 6}" x2="{ex(target_fraction):.1f}" y2="{bottom_y}" '
            f'stroke="#2ca02c" stroke-dasharray="6 3"><title>target: {target_fraction:.0%} of the bound</title></line>',
            f'<text x="{ex(target_fraction):.1f}" y="{top - 9}" text-anchor="middle" class="tick" fill="#2ca02c">'
            'target</text>',
            f'<text x="{sx(1.0):.1f}" y="{top - 9}" text-anchor="middle" class="tick">as fast</text>']
    said: set[tuple[str, str]] = set()
    for i, r in enumerate(rows):
        y = top + row_h * i + row_h / 2
        against = r.get("against") or {}
        label = r["workload"] + (f" · {against['target']}" if against.get("target") else "")
        out.append(f'<text x="{label_r}" y="{y + 4:.1f}" text-anchor="end" class="tick">{escape(label)}</text>')
        sp = r.get("speedup") or {}
        ratio = sp.get("ratio")
        if isinstance(ratio, (int, float)) and ratio > 0:
            colour = {"dohnuts faster": "#2ca02c", "dohnuts slower": "#d62728"}.get(sp.get("verdict"), "#555")
            words = f"{ratio:.2f}×" + (f" ({sp['low']:.2f}–{sp['high']:.2f})" if sp.get("low") is not None
                                       and sp.get("high") is not None else "")
            if sp.get("low") is not None and sp.get("high") is not None:
                out.append(f'<line x1="{sx(sp["low"]):.1f}" y1="{y:.1f}" x2="{sx(sp["high"]):.1f}" y2="{y:.1f}" '
                           f'stroke="{colour}" stroke-width="2"/>')
            out.append(f'<circle cx="{sx(ratio):.1f}" cy="{y:.1f}" r="4.5" fill="{colour}" class="point"><title>'
                       f'{escape(label)}: {escape(words)}, {escape(str(sp.get("verdict", "")))}</title></circle>')
        else:
            out.append(f'<text x="{(s0 + s1) / 2}" y="{y + 4:.1f}" text-anchor="middle" class="tick">'
                       f'{escape("no peer" if r.get("role") == "no peer" else "—")}</text>')
        d = r.get("dohnuts") or {}
        key = (r["workload"], str(d.get("target")))
        if not d or key in said:
            continue
        said.add(key)
        if d.get("suspect"):
            out.append(f'<text x="{e0 + 6}" y="{y + 4:.1f}" class="tick" fill="#a60">bound-suspect<title>'
                       f'{escape(d["suspect"])}</title></text>')
        elif d.get("efficiency") is None:
            out.append(f'<text x="{e0 + 6}" y="{y + 4:.1f}" class="tick">no bound</text>')
        else:
            eff = d["efficiency"]
            colour = "#2ca02c" if d.get("verdict") == "meets" else "#1f77b4"
            out.append(f'<rect x="{e0}" y="{y - 7:.1f}" width="{ex(eff) - e0:.1f}" height="14" fill="{colour}">'
                       f'<title>{escape(r["workload"])} · dohnuts: {100 * eff:.1f}% of the bound '
                       f'({escape(str(d.get("basis")))} basis), {escape(str(d.get("verdict")))}</title></rect>')
            out.append(f'<text x="{ex(eff) + 4:.1f}" y="{y + 4:.1f}" class="tick">{100 * eff:.1f}%</text>')
    out.append("</svg>")
    return "".join(out)
