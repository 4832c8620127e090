"""The serving and quality section of the text report (and its summary.json data).

Per target under a serving scenario: a table of its load points (offered rate — or a closed
loop's clients — and its share of the throughput ceiling, served/offered, refused, throughput,
goodput, latency p50/p99 and the SLO's percentile with its interval, the verdict, validity, the
distinct pass shapes served and the graph captures while it was measured, the end-to-end latency's
mean and standard deviation), the latency-against-load curve drawn in text (one row a point: p50 ▒
and the percentile █ on a log scale, the SLO ┃, the floor │), the served set (and bursty or traced
arrivals) in words, the search's answer with its bracket, and the bound at load (floor and
ceiling). Then the stream scenario's validity and the quality table (accuracy beside speed, the reference check).
"""

from __future__ import annotations

import math

from rich.console import Group
from rich.text import Text

from dohnuts.bench.analysis.measurement_quality import gap_words
from dohnuts.bench.analysis.render import Col, FitTable
from dohnuts.bench.analysis.serving import LoadCurve, QualityRow, StreamScenario, eager_words, served_cells
from dohnuts.bench.sections import Section
from dohnuts.schema import printable

CHART_WIDTH = 48


def _ms(x: float | None) -> str:
    return "∞" if x is None else f"{x:.3g}"


def _rate(x: float) -> str:
    return "all" if not math.isfinite(x) else f"{x:.3g}"


def _mean_std(metrics: dict) -> str:
    """A point's end-to-end latency, mean/sample standard deviation over its served requests."""
    mean, std = metrics.get("mean_e2el_ms"), metrics.get("std_e2el_ms")
    return "—" if mean is None else f"{mean:.3g}/" + ("—" if std is None else f"{std:.3g}")


def _load(c: LoadCurve, point) -> str:
    """A point's load as its curve's rows name it: clients (a closed loop), else the offered rate."""
    return str(point.concurrency) if c.closed_loop else _rate(point.rate_rps)


def _mode(c: LoadCurve) -> str:
    return (f"closed loop (think {c.think_ms or 0:g} ms), latency against clients" if c.closed_loop
            else "latency against load")


def points_table(c: LoadCurve) -> FitTable:
    p = f"p{100 * c.percentile:g}"
    t = FitTable(f"{c.workload} · {c.target}: {c.scenario} scenario, {_mode(c)}"
                 + (f" (SLO {p} ≤ {c.slo_ms:g} ms)" if c.slo_ms is not None else ""),
                 [Col("clients") if c.closed_loop else Col("offered\nreq/s"), Col("of ceiling"),
                  Col("served /\noffered"), Col("refused /\nabandoned"),
                  Col("throughput\nreq/s"), Col("goodput\nreq/s"), Col("p50 ms"), Col("p99 ms"),
                  Col(f"{p} ms\n(95 % interval)"), Col("verdict"), Col("valid", "left", wrap=True),
                  Col("probe", "left"), Col("shapes"), Col("graph\ncaptures"), Col("e2el mean/std\nms")],
                 groups=[(1, 2), (3, 4), (5,), (6, 7), (8, 9), (10,), (11,), (12, 13), (14,)])
    ceiling = c.bound.throughput_ceiling_rps if c.bound else None
    for point, role in sorted(zip(c.points, c.roles), key=lambda x: x[0].load):
        share = f"{point.rate_rps / ceiling:.0%}" if ceiling and math.isfinite(point.rate_rps) else "—"
        interval = f"{_ms(point.latency_ms)} ({_ms(point.latency_low_ms)}–{_ms(point.latency_high_ms)})"
        verdict = Text(point.verdict, style={"meets": "green", "misses": "red"}.get(point.verdict, ""))
        valid = Text("yes") if point.valid else Text("INVALID: " + "; ".join(point.reasons), style="bold red")
        t.add_row(_load(c, point), share, f"{point.served}/{point.offered}",
                  f"{point.dropped}/{point.abandoned}", f"{point.throughput_rps:.3g}",
                  "—" if point.goodput_rps is None else f"{point.goodput_rps:.3g}", _ms(point.p50_ms),
                  _ms(point.p99_ms), interval, verdict, valid, role, *served_cells(point.extra.get("served_set")),
                  _mean_std(point.metrics))
    return t


def latency_chart(c: LoadCurve) -> Text:
    """The latency-against-load curve in text: one row a point, log-scaled latency."""
    pts = sorted(c.points, key=lambda p: p.load)
    values = [v for p in pts for v in (p.p50_ms, p.latency_ms) if v]
    floor = c.bound.latency_floor_ms if c.bound else None
    marks = [v for v in (floor, c.slo_ms) if v]
    lo = max(1e-3, min(values + marks) / 1.5) if values else 1.0
    hi = max(values + marks) * 1.2 if values else 10.0
    span = math.log(hi / lo)

    def col(v: float | None) -> int:
        if v is None:
            return CHART_WIDTH
        return max(0, min(CHART_WIDTH, round(math.log(max(v, lo) / lo) / span * CHART_WIDTH)))

    p = f"p{100 * c.percentile:g}"
    against = "clients (closed loop)" if c.closed_loop else "offered load"
    out = Text(f"{c.workload} · {c.target}: latency against {against} (log scale {lo:.3g}–{hi:.3g} ms; "
               f"▒ p50, █ {p}, ┃ SLO, │ floor: the critical-path bound)\n", style="bold")
    for point in pts:
        row = [" "] * (CHART_WIDTH + 1)
        for i in range(col(point.latency_ms)):
            row[i] = "▒" if i < col(point.p50_ms) else "█"
        if point.latency_ms is None:
            row[CHART_WIDTH] = "»"
        line = Text(f"{_load(c, point):>8} {'clients' if c.closed_loop else 'req/s'} ")
        for i, ch in enumerate(row):
            if c.slo_ms is not None and i == col(c.slo_ms):
                line.append("┃", style="red")
            elif floor is not None and i == col(floor):
                line.append("│", style="green")
            else:
                line.append(ch, style="cyan" if ch in "▒█»" else "")
        line.append(f" {p} {_ms(point.latency_ms)} ms" + ("" if point.valid else " (invalid)"))
        out.append_text(line)
        out.append("\n")
    return out


def served_words(c: LoadCurve) -> str | None:
    """The served set and what the curve met of it, in words (None: records without the facts)."""
    sets = c.served_sets
    if not sets:
        return None
    size = max(s["set_size"] for s in sets)
    what = (f"a varied set of {size} requests (serving.vary) in a seeded random order" if c.varied
            else f"the workload's {size} request{'s' if size != 1 else ''} in order, one shape each (no serving.vary)")
    captures = c.graph_captures
    graphs = ("graph captures not counted: the target runs without CUDA graphs here (a CPU, an eager target)"
              if captures is None
              else f"{captures} graph capture{'s' if captures != 1 else ''} while measuring (warm-up excluded)")
    return (f"served: {what}; {c.shapes} distinct pass shape{'s' if c.shapes != 1 else ''} over its points; {graphs}"
            f"{eager_words(c.graph_eager)}")


def curve_lines(c: LoadCurve) -> Text:
    """The served set, the search's answer and the bound at load, in words."""
    out = Text()
    served = served_words(c)
    if served is not None:
        out.append(served + "\n")
    arrivals = sorted({str(p.extra.get("arrivals")) for p in c.points if p.extra.get("arrivals")})
    if arrivals and arrivals != ["poisson"] and not c.closed_loop:  # bursty (gamma) or a trace

        out.append(f"arrivals: {printable(', '.join(arrivals))}\n")  # a trace's file name is the user's
    s = c.search
    if s is not None:
        p = f"p{100 * c.percentile:g}"
        out.append(f"{'most clients' if c.closed_loop else 'max rate'} at {p} ≤ {c.slo_ms:g} ms: ", style="bold")
        out.append(s.words() + "\n")
        captured = ((s.failing.extra.get("served_set") or {}).get("graph_captures") if s.failing else None)
        if captured:  # a one-time cost of new shapes can be what failed it
            out.append(f"the failing point captured {captured} graph{'s' if captured != 1 else ''} while measured "
                       "(new shapes: a cost paid once); its neighbours' captures are in the table\n",
                       style="yellow")
    if c.bound is not None:
        b = c.bound
        ceiling = "—" if b.throughput_ceiling_rps is None else f"{b.throughput_ceiling_rps:.4g} req/s"
        out.append(f"bound at load ({b.basis} basis): latency floor {b.latency_floor_ms:.3g} ms (one call alone), "
                   f"throughput ceiling {ceiling} (one call a critical path: {' → '.join(b.critical_stages)})")
        if c.single_call_ms:
            out.append(f"; measured single call {c.single_call_ms:.3g} ms = {1e3 / c.single_call_ms:.4g} req/s one "
                       "at a time")
        out.append("\n")
    if c.agreement and c.agreement.get("within") is False:
        g = c.agreement

        out.append(f"this target DISAGREES with the FP32 reference ({gap_words(g)}): its speed is not the "
                   "product's\n", style="bold red")
    return out


def streams_table(rows: list[StreamScenario]) -> FitTable:
    t = FitTable("Stream scenario (the pipelined stream sized by its minimums)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("requests"),
                  Col("seconds"), Col("req/s"), Col("latency p50/p99 ms"), Col("minimums"),
                  Col("valid", "left", wrap=True), Col("shapes"), Col("graph\ncaptures")], sections=1)
    for r in rows:
        t.add_row(r.workload, r.target, str(r.requests), f"{r.total_ms / 1e3:.3g}", f"{r.throughput_rps:.3g}",
                  f"{r.latency_p50_ms:.3g}/{r.latency_p99_ms:.3g}",
                  f"{r.rules.get('min_requests')} req, {r.rules.get('min_duration_s', 0):g} s",
                  "yes" if r.valid else Text("INVALID: " + "; ".join(r.reasons), style="bold red"),
                  *served_cells(r.served_set))
    return t


def quality_table(rows: list[QualityRow]) -> FitTable:
    t = FitTable("Quality beside speed: accuracy on the labelled set (95 % interval) and the reference check "
                 "(probabilities against the FP32 reference path)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True),
                  Col("adapter", "left", wrap=True),
                  Col("single call ms"), Col("decisions/s"), Col("accuracy"), Col("set", "left", wrap=True),
                  Col("max |Δp|"), Col("same choice"), Col("reference", "left", wrap=True)], sections=1,
                 groups=[(2,), (3, 4), (5, 6), (7, 8, 9)])
    for q in rows:
        a, g = q.accuracy, q.agreement
        acc = "—" if a is None else f"{a['value']:.3f} ({a['low']:.3f}–{a['high']:.3f}, n={a['questions']})"
        if g is None:
            gap, same, verdict = "—", "—", Text("not checked")
        else:
            gap = f"{g['max_abs_gap']:.3g}"
            same = "—" if g.get("choice_agreement") is None else f"{g['choice_agreement']:.1%}"
            verdict = (Text(f"agrees (≤ {g['tolerance']:g})", style="green") if g["within"]
                       else Text(f"DISAGREES (> {g['tolerance']:g})", style="bold red"))
        t.add_row(q.workload, q.target, q.adapter or "—", _ms(q.single_call_ms),
                  "—" if q.decisions_per_s is None else f"{q.decisions_per_s:.3g}", acc,
                  (a or {}).get("set") or "—", gap, same, verdict)
    return t


def serving_section(curves: list[LoadCurve], streams: list[StreamScenario], quality: list[QualityRow]
                    ) -> Section | None:
    """The section, or None when the run has no scenario beyond single calls and no quality check."""
    if not curves and not streams and not quality:
        return None
    parts: list = []
    for c in curves:
        parts += [points_table(c), latency_chart(c), curve_lines(c)]
    if streams:
        parts.append(streams_table(streams))
    if quality:
        parts.append(quality_table(quality))
    data = {"curves": [c.to_dict() for c in curves], "streams": [vars(s) | {"reasons": list(s.reasons)}
                                                                 for s in streams],
            "quality": [vars(q) for q in quality]}
    return Section("serving", Group(*parts), data=data)
