"""The HTML report of a run: one self-contained file that works offline (no external script, font
or style; the charts are inline SVG, dohnuts.bench.report.svg).

It opens, as the text report does, on the headline (dohnuts.bench.analysis.headline): one table and
one figure — per workload dohnuts against its peer (the speed-up with its interval), its efficiency
against the measured bound, the verdict against the target and the peer's fast paths (a fallback
marked FALLBACK) — and on a CPU what such a run can and cannot show. Then what the text report
shows — the summary, each stage's bound and efficiency (never above 100 %: bound-suspect with the
reason), the critical path, stream against single calls, the serving scenarios (latency and
throughput against offered load with the bound's floor and ceiling, the SLO search's answer, the
distinct pass shapes served and the graph captures while measuring) and quality (accuracy, the
reference check; a target that disagrees with the FP32 reference is flagged beside its speed) — plus
a roofline a workload (steady calls apart from first calls, each point numbered and named in a
legend), the comparison with a second run when given, and trend charts from the run store. Every number a test checks carries `data-key`: the page is
checked in a real headless browser (tests/bench/test_html_report.py). A few lines of script only
hide or show the first-call rows and mark the page ready; the page reads fully without them.

Every caveat the text report gives is on the page too (tests/bench/test_report_caveats.py compares
the two): the warnings of the analysis and of the machine section (other processes' load, ceilings
that moved between their repeats, stages faster than their bound) listed first under "Caveats",
each workload · target's measurement note (a spread too large for the claimed precision, the
harness's overhead above 1 %) and calls left out, the machine section (a CPU run's scope, the load
while measuring, each ceiling's stability — "NO: moved"), and the target verdicts, "bound-suspect"
where a measurement beat its bound (whose efficiency, above 100 %, is never shown as a number).
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from dohnuts.bench.analysis.machine import STABLE_WORDS, opening_lines, timing_line
from dohnuts.bench.analysis.measurement_quality import gap_words, overhead_text, quality_cells
from dohnuts.bench.analysis.roofline import roofline_svg, stage_points
from dohnuts.bench.analysis.serving import eager_words, served_cells
from dohnuts.bench.report.svg import headline_chart, latency_curve, throughput_curve, trend
from dohnuts.bench.store.summary_file import page_error
from dohnuts.schema import write_text_atomic

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:1em}
table{border-collapse:collapse;margin:.5em 0;font-size:.85em}td,th{border:1px solid #ddd;padding:2px 6px}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}
tr.first-call{color:#777}tr.mo td:first-child::after{content:" (measurement-only)";color:#a60}
.panels{display:flex;flex-wrap:wrap;gap:1.2em}.panel{flex:0 0 auto}
svg.chart text.tick{font-size:9px;fill:#555}svg.chart text.axis{font-size:10px;fill:#333}
svg.chart text.num{font-size:10px;font-weight:bold}ol.legend{font-size:.8em;margin:.2em 0 0 1.2em;max-width:520px}
.meets{color:#070}.misses{color:#a00}.note{color:#666;font-size:.85em}
.flag{color:#a00;font-weight:bold}ul.legend{font-size:.8em;margin:.2em 0 0 1.2em}
.suspect{color:#a60}.cpu{background:#f6f6f0;padding:.4em .8em;border-left:3px solid #bb9;max-width:1000px}
"""

SCRIPT = """
(function(){
  var box=document.getElementById('show-first');
  function apply(){document.querySelectorAll('tr.first-call').forEach(function(r){r.style.display=box.checked?'':'none';});}
  box.addEventListener('change',apply);apply();
  document.body.setAttribute('data-ready','1');
})();
"""


def _ms(x) -> str:
    return "—" if x is None else f"{x:.3f}" if x < 100 else f"{x:.1f}"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _eff_cell(value, suspect: str | None, key: str | None = None, group: str | None = None, note: str = "") -> str:
    """An efficiency: a percentage up to 100 %, or bound-suspect with its reason (no number);
    `note` follows it (the basis, where not the usual one)."""
    if suspect:
        attrs = f' data-key="{escape(key)}" data-group="{escape(group or "")}"' if key else ""
        return f'<td class="n suspect" title="{escape(suspect)}"{attrs}>bound-suspect{escape(note)}</td>'
    return _cell(_pct(value) + note, key, group)


def _cell(value: str, key: str | None = None, group: str | None = None, cls: str = "n") -> str:
    attrs = f' class="{cls}"' if cls else ""
    if key:
        attrs += f' data-key="{escape(key)}"'
    if group:
        attrs += f' data-group="{escape(group)}"'
    return f"<td{attrs}>{escape(value)}</td>"


def _row_class(target: str) -> str:
    classes = []
    if "first-call" in target:
        classes.append("first-call")
    return f' class="{" ".join(classes)}"' if classes else ""


def _summary_table(rows: list[dict]) -> str:
    head = ("workload", "target", "calls", "wall ms", "p10–p90 ms", "decisions / s", "tokens / s", "energy / call",
            "harness overhead", "mean ms", "std ms")
    out = ["<table id='summary'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for r in rows:
        group = f"{r['workload']}|{r['target']}"
        energy = r.get("energy_j_per_call")
        flag = _disagreement(r.get("agreement"))
        target = _cell(r["target"], cls="") if not flag else (
            f"<td>{escape(r['target'])} <span class='flag' data-key='disagrees' data-group='{escape(group)}'>"
            f"{escape(flag)}</span></td>")
        out.append(f"<tr{_row_class(r['target'])}>" + "".join([
            _cell(r["workload"], cls=""), target, _cell(str(r["calls"])),
            _cell(_ms(r["wall_median_ms"]), "wall_median_ms", group),
            _cell(f"{_ms(r['wall_p10_ms'])}–{_ms(r['wall_p90_ms'])}"),
            _cell(f"{r['decisions_per_s']:.1f}", "decisions_per_s", group),
            _cell(f"{r.get('useful_tokens_per_s', 0):.0f}"),
            _cell("no energy counter" if energy is None else f"{energy:.3g} J", "energy_j_per_call", group),
            _cell(overhead_text(r.get("harness_overhead")), "harness_overhead", group, cls=""),
            _cell(_ms(r.get("wall_mean_ms")), "wall_mean_ms", group),
            _cell(_ms(r.get("wall_std_ms")), "wall_std_ms", group)]) + "</tr>")
    return "".join(out) + "</table>"


def _disagreement(agreement) -> str | None:
    if not isinstance(agreement, dict) or agreement.get("within") is not False:
        return None

    return f"DISAGREES with the FP32 reference: {gap_words(agreement)}"


def _serving(section: dict | None) -> str:
    """Load curves (two panels each: latency, throughput), their points and the search's answer;
    the stream scenario; quality beside speed."""
    if not section:
        return "<p class='note'>No serving scenario, accuracy mode or reference check in this run.</p>"
    out = []
    for c in section.get("curves", []):
        closed = bool(c.get("closed_loop"))
        group = f"{c['workload']}|{c['target']}|{c['scenario']}" + ("|closed-loop" if closed else "")
        pct = f"p{100 * c['percentile']:g}"
        arrivals = sorted({str((p.get("extra") or {}).get("arrivals")) for p in c["points"]
                           if (p.get("extra") or {}).get("arrivals") not in (None, "poisson")})
        loop = (f", closed loop (think {c.get('think_ms') or 0:g} ms)" if closed
                else f", arrivals {', '.join(arrivals)}" if arrivals else "")
        out.append(f"<h3>{escape(c['workload'])} · {escape(c['target'])}: {escape(c['scenario'])} "
                   f"scenario{escape(loop)}</h3>")
        served = c.get("served_set") or {}
        if served.get("set_size"):
            captures = served.get("graph_captures")
            what = (f"a varied set of {served['set_size']} requests (serving.vary) in a seeded random order"
                    if served.get("varied") else f"the workload's {served['set_size']} request(s) in order")
            graphs = ("graph captures not counted: the target runs without CUDA graphs here (a CPU, an eager target)"
                      if captures is None else
                      f"<b data-key='graph_captures' data-group='{escape(group)}'>{captures}</b> graph capture(s) "
                      "while measuring (warm-up excluded)")
            out.append(f"<p>served: {escape(what)}; <b data-key='shapes' data-group='{escape(group)}'>"
                       f"{served['shapes']}</b> distinct pass shape(s) over its points; {graphs}"
                       f"{escape(eager_words(served.get('graph_eager')))}</p>")
        search = c.get("search")
        if search and closed:
            most = search.get("max_concurrency")
            out.append(f"<p>most clients at {pct} ≤ {c['slo_ms']:g} ms: <b data-key='max_concurrency' "
                       f"data-group='{escape(group)}'>{'none' if most is None else most}</b> — "
                       f"{escape(search['words'])}</p>")
        elif search:
            rate = search.get("max_rate_rps")
            out.append(f"<p>max rate at {pct} ≤ {c['slo_ms']:g} ms: <b data-key='max_rate_rps' "
                       f"data-group='{escape(group)}'>{'none' if rate is None else f'{rate:.4g}'}</b> req/s — "
                       f"{escape(search['words'])}</p>")
            failing = next((p for p in c["points"] if search.get("failing_rate_rps") is not None
                            and p["rate_rps"] == search["failing_rate_rps"]), None)
            captured = ((failing or {}).get("extra") or {}).get("served_set") or {}
            if captured.get("graph_captures"):
                out.append(f"<p class='note'>the failing point captured {captured['graph_captures']} graph(s) while "
                           "measured (new shapes: a cost paid once)</p>")
        bound = c.get("bound")
        if bound:
            ceiling = bound.get("throughput_ceiling_rps")
            floor = bound["latency_floor_ms"]
            out.append(f"<p>bound at load ({escape(str(bound['basis']))} basis): latency floor "
                       f"<b data-key='latency_floor_ms' data-group='{escape(group)}'>{floor:.3g}</b> "
                       f"ms, throughput ceiling <b data-key='throughput_ceiling_rps' data-group='{escape(group)}'>"
                       f"{'—' if ceiling is None else f'{ceiling:.4g}'}</b> req/s</p>")
        if c.get("agreement") and c["agreement"].get("within") is False:
            out.append(f"<p class='flag'>{escape(_disagreement(c['agreement']))}: its speed is not the product's</p>")
        out.append("<div class='panels'><div class='panel'>" + latency_curve(c) + "</div><div class='panel'>"
                   + throughput_curve(c) + "</div></div>")
        head = ("clients" if closed else "offered req/s", "served / offered", "refused / abandoned",
                "throughput req/s", "goodput req/s", "p50 ms", "p99 ms", f"{pct} ms (95 % interval)", "verdict",
                "valid", "probe", "shapes", "graph captures", "e2el mean ms", "e2el std ms")
        rows = ["<table class='points'><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
        x = "concurrency" if closed else "rate_rps"
        for p in sorted(c["points"], key=lambda p: p[x] if p[x] is not None else float("inf")):
            key = f"{group}|{p[x]}"
            rate = "all" if p[x] is None else f"{p[x]:.4g}"
            interval = f"{_ms(p['latency_ms'])} ({_ms(p['latency_low_ms'])}–{_ms(p['latency_high_ms'])})"
            valid = "yes" if p["valid"] else "INVALID: " + "; ".join(p["reasons"])
            shapes, captures = served_cells((p.get("extra") or {}).get("served_set"))
            rows.append("<tr>" + "".join([
                _cell(rate), _cell(f"{p['served']}/{p['offered']}"), _cell(f"{p['dropped']}/{p['abandoned']}"),
                _cell(f"{p['throughput_rps']:.4g}", "throughput_rps", key),
                _cell("—" if p["goodput_rps"] is None else f"{p['goodput_rps']:.4g}", "goodput_rps", key),
                _cell(_ms(p["p50_ms"])), _cell(_ms(p["p99_ms"])), _cell(interval),
                _cell(p["verdict"], cls={"meets": "meets", "misses": "misses"}.get(p["verdict"], "")),
                _cell(valid, cls="" if p["valid"] else "flag"), _cell(p["role"], cls=""),
                _cell(shapes, "shapes", key), _cell(captures, "graph_captures", key),
                _cell(_ms(p.get("mean_e2el_ms")), "mean_e2el_ms", key),
                _cell(_ms(p.get("std_e2el_ms")), "std_e2el_ms", key)]) + "</tr>")
        out.append("".join(rows) + "</table>")
    streams = section.get("streams") or []
    if streams:
        out.append("<h3>Stream scenario</h3><table id='stream-scenario'><tr><th>workload</th><th>target</th>"
                   "<th>requests</th><th>seconds</th><th>req/s</th><th>valid</th><th>shapes</th>"
                   "<th>graph captures</th></tr>")
        for r in streams:
            valid = "yes" if r["valid"] else "INVALID: " + "; ".join(r["reasons"])
            out.append("<tr>" + "".join([_cell(r["workload"], cls=""), _cell(r["target"], cls=""),
                                         _cell(str(r["requests"])), _cell(f"{r['total_ms'] / 1e3:.3g}"),
                                         _cell(f"{r['throughput_rps']:.4g}"),
                                         _cell(valid, cls="" if r["valid"] else "flag"),
                                         *(_cell(x) for x in served_cells(r.get("served_set")))]) + "</tr>")
        out.append("</table>")
    quality = section.get("quality") or []
    if quality:
        out.append("<h3>Quality beside speed</h3><table id='quality'><tr><th>workload</th><th>target</th>"
                   "<th>adapter</th><th>single call ms</th><th>accuracy (95 % interval)</th><th>set</th>"
                   "<th>max |Δp| to the FP32 reference</th><th>same choice</th><th>reference check</th></tr>")
        for q in quality:
            group = f"{q['workload']}|{q['target']}"
            a, g = q.get("accuracy"), q.get("agreement")
            acc = "—" if a is None else f"{a['value']:.3f} ({a['low']:.3f}–{a['high']:.3f}, n={a['questions']})"
            if g is None:
                gap, same, verdict, cls = "—", "—", "not checked", ""
            else:
                gap = f"{g['max_abs_gap']:.3g}"
                same = "—" if g.get("choice_agreement") is None else f"{100 * g['choice_agreement']:.1f}%"
                verdict = f"agrees (≤ {g['tolerance']:g})" if g["within"] else f"DISAGREES (> {g['tolerance']:g})"
                cls = "meets" if g["within"] else "flag"
            out.append("<tr>" + "".join([
                _cell(q["workload"], cls=""), _cell(q["target"], cls=""), _cell(q.get("adapter") or "—", cls=""),
                _cell(_ms(q.get("single_call_ms"))), _cell(acc, "accuracy", group),
                _cell((a or {}).get("set") or "—", cls=""), _cell(gap, "agreement_gap", group), _cell(same),
                _cell(verdict, cls=cls)]) + "</tr>")
        out.append("</table>")
    return "".join(out)


def _efficiency(groups: list[dict], target_fraction: float) -> str:
    out = []
    for g in groups:
        group = f"{g['workload']}|{g['target']}"
        cls = "first-call" if "first-call" in g["target"] else ""
        bases = g.get("bases") or []
        call = g["call"]
        suspect = call.get("suspect") or {}
        effs = " · ".join(f"{b}: <b data-key='efficiency.{b}' data-group='{escape(group)}'"
                          + (f" class='suspect' title='{escape(suspect[b])}'>bound-suspect" if suspect.get(b)
                             else f">{_pct(call['efficiency'].get(b))}") + "</b>" for b in bases)
        verdicts = " · ".join(f"{b}: <span data-key='verdict' data-group='{escape(group)}'>"
                              f"{escape(str((call.get('verdict') or {}).get(b) or '—'))}</span>" for b in bases)
        crit = call["bound"].get(bases[0], {}) if bases else {}
        out.append(f"<div class='eff {cls}'><h3>{escape(g['workload'])} · {escape(g['target'])} "
                   f"({g['calls']} calls)</h3><p>wall {_ms(call['wall_ms'])} ms; critical-path bound "
                   f"{_ms(crit.get('critical_ms'))} ms over {' → '.join(crit.get('critical_stages') or [])}; "
                   f"efficiency {effs} (target {target_fraction:.0%}); target verdict {verdicts}</p>")
        head = (["stage", "measured ms"] + [f"bound ms ({b})" for b in bases] + [f"efficiency ({b})" for b in bases]
                + ["limiter"] + ([f"{target_fraction:.0%} target ({bases[0]})"] if bases else []))
        rows = ["<table class='stages'><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
        for s in g["stages"]:
            cells = [_cell(s["stage"], cls=""), _cell(_ms(s["measured_ms"]))]
            cells += [_cell(_ms(s["bound_ms"].get(b)) if s.get("modelled") else (s.get("unbounded") or "no model"))
                      for b in bases]
            cells += [_eff_cell(s["efficiency"].get(b), (s.get("suspect") or {}).get(b)) for b in bases]
            if bases:
                cells.append(_cell(str((s.get("limiter") or {}).get(bases[0], "")), cls=""))
                verdict = (s.get("verdict") or {}).get(bases[0])
                flag = "flag" if verdict == "bound-suspect" else ""
                cells.append(_cell(verdict or "—", "verdict", group, cls=flag))
            else:
                cells.append(_cell("", cls=""))
            rows.append("<tr>" + "".join(cells) + "</tr>")
        out.append("".join(rows) + "</table>")
        out += [f"<p class='note suspect'>bound-suspect ({escape(b)}): {escape(why)}</p>"
                for b, why in suspect.items()]
        out.append("</div>")
    return "".join(out)


def _fast_paths(row: dict) -> str:
    """A peer's fast paths, each fallback marked FALLBACK (flagged); "—" for no peer."""
    if row.get("role") != "peer":
        return "—"
    peer = row.get("peer")
    if not peer:
        return escape(str(row.get("fast_paths") or "fast paths not recorded"))
    fallbacks = set(peer.get("fallbacks") or ())
    items = [escape(f"{path} {impl or '—'}") + (" <span class='flag'>FALLBACK</span>" if path in fallbacks else "")
             for path, impl in (peer.get("paths") or {}).items()]
    items += [escape(path) + " <span class='flag'>FALLBACK</span>" for path in fallbacks
              if path not in (peer.get("paths") or {})]
    library = str(peer.get("library", "?")) + (f" {peer['version']}" if peer.get("version") else "")
    return escape(library) + ": " + (" · ".join(items) if items else "no paths recorded")


def _headline(data: dict | None) -> str:
    """The headline: its table (every number keyed for the browser test), its figure, the reasons
    behind a bound-suspect, the peers' own fallback warnings, the machine's caveats and, on a CPU,
    what the run can and cannot show."""
    if not data:
        return "<p class='note'>No headline in this summary (a run analysed before it existed).</p>"
    fraction = data.get("target_fraction", 0.8)
    head = ("workload", "against", "dohnuts ms", "efficiency (measured bound)", f"{fraction:.0%} target", "its ms",
            "its efficiency", "dohnuts speed-up", "95 % interval", "difference", "peer's fast paths")
    out = ["<table id='headline'><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    notes: dict[str, None] = {}
    for r in data.get("rows", []):
        d, a, sp = r.get("dohnuts") or {}, r.get("against") or {}, r.get("speedup") or {}
        group = f"{r['workload']}|{d.get('target', '')}"
        pair = f"{r['workload']}|{a.get('target', r.get('role', ''))}"
        verdict = d.get("verdict") or "—"

        def eff(s: dict, key: str, grp: str) -> str:
            if not s:
                return _cell("—")
            if s.get("basis") is None:
                return _cell("no bound", key, grp)
            if s.get("suspect"):
                notes[f"{r['workload']} · {s['target']} ({s['basis']} basis): {s['suspect']}"] = None
            basis = "" if s["basis"] == data.get("preferred_basis", "measured") else f" ({s['basis']})"
            return _eff_cell(s.get("efficiency"), s.get("suspect"), key, grp, basis)

        interval = "—" if sp.get("low") is None or sp.get("high") is None else f"{sp['low']:.2f}–{sp['high']:.2f}"
        out.append("<tr>" + "".join([
            _cell(r["workload"], cls=""),
            _cell("no peer" if r.get("role") == "no peer" else a.get("target", "—"), cls=""),
            _cell("not measured" if not d else f"{d['wall_ms']:.2f}", "headline.wall_ms", group if d else None),
            eff(d, "headline.efficiency", group),
            _cell(verdict, cls={"meets": "meets", "misses": "misses", "bound-suspect": "suspect"}.get(verdict, "")),
            _cell("—" if not a else f"{a['wall_ms']:.2f}"),
            eff(a, "headline.against_efficiency", pair),
            _cell("—" if sp.get("ratio") is None else f"{sp['ratio']:.2f}×", "headline.speedup", pair),
            _cell(interval, "headline.interval", pair),
            _cell(sp.get("verdict") or "—", cls=""),
            f"<td data-key='headline.fast_paths' data-group='{escape(pair)}'>{_fast_paths(r)}</td>"]) + "</tr>")
    out.append("</table>")
    out.append("<p class='note'>speed-up: the other target's median call over dohnuts' (above 1×: dohnuts is "
               "faster), with its bootstrap 95 % interval and the verdict of <code>dohnuts-bench compare</code>'s "
               "rule; efficiency: the critical-path bound over the median call, never above 100 % (a call faster "
               "than its bound reads bound-suspect, with the reason).</p>")
    out.append("<div class='panel'>" + headline_chart(data.get("rows", []), fraction) + "</div>")
    cpu = data.get("cpu")
    if cpu:
        cores = f" of {cpu['cpus']} cores" if cpu.get("cpus") else ""
        out.append(f"<div class='cpu' id='cpu-run'><p><b>This is a CPU run</b> ({escape(str(cpu.get('device')))}, "
                   f"{escape(str(cpu.get('threads') or '?'))} torch thread(s){escape(cores)}).</p>"
                   f"<p>{escape(str(cpu.get('shows', '')))}</p><p>{escape(str(cpu.get('cannot', '')))}</p></div>")
    out += [f"<p class='note suspect'>bound-suspect: {escape(n)}</p>" for n in notes]
    out += [f"<p class='note flag'>peer fallback: {escape(m)}</p>" for m in data.get("peer_messages") or []]
    out += [f"<p class='note suspect'>host-bound peer: {escape(b)}</p>" for b in data.get("host_bound") or []]
    out += [f"<p class='note suspect'>caveat: {escape(c)} (“This run's machine” in the text report)</p>"
            for c in data.get("caveats") or []]
    return "".join(out)


def _streams(rows: list[dict]) -> str:
    single = {(r["workload"], r["target"]): r for r in rows if "·" not in r["target"].replace(" (measurement-only)", "")}
    out = []
    for r in rows:
        if not r["target"].endswith("· stream"):
            continue
        base = single.get((r["workload"], r["target"].removesuffix(" · stream")))
        if base is None:
            continue
        varied = ((r.get("stream") or {}).get("served_set") or {}).get("varied")  # other requests: no gain
        gain = base["wall_median_ms"] / r["wall_median_ms"] if r["wall_median_ms"] and not varied else None
        out.append("<tr>" + "".join([_cell(r["workload"], cls=""), _cell(base["target"], cls=""),
                                     _cell(_ms(base["wall_median_ms"])), _cell(_ms(r["wall_median_ms"])),
                                     _cell("varied set" if varied else "—" if gain is None else f"{gain:.2f}×"),
                                     *(_cell(x) for x in served_cells((r.get("stream") or {}).get("served_set")))])
                   + "</tr>")
    if not out:
        return "<p class='note'>No pipelined stream in this run.</p>"
    return ("<table id='streams'><tr><th>workload</th><th>target</th><th>single call ms</th>"
            "<th>stream ms a request</th><th>stream gain</th><th>shapes</th><th>graph captures</th></tr>"
            + "".join(out) + "</table>")


def _rooflines(groups: list[dict], rooflines: dict | None) -> str:
    """A roofline panel a workload and phase (steady calls, first calls), drawn by the run's
    roofline figure (dohnuts.bench.analysis.roofline: the roofs of summary.json's `rooflines`)."""
    if not rooflines:
        return ("<p class='note'>No roofline: this summary.json holds no roofs (written before they were "
                "recorded; <code>dohnuts-bench analyze</code> writes it anew).</p>")
    precision = {g["workload"]: g.get("precision") for g in groups}
    panels = []
    for phase, first in (("steady calls", False), ("first calls", True)):
        for workload, points in stage_points(groups, first_calls=first).items():
            roofs = rooflines.get(precision.get(workload)) or next(iter(rooflines.values()))
            cls = " first-call" if first else ""
            panels.append((workload, first, f"<div class='panel{cls}'><h3>{escape(workload)}: {phase}</h3>"
                           + roofline_svg(points, roofs, f"{workload}: {phase}") + "</div>"))
    order = list(dict.fromkeys(g["workload"] for g in groups))
    panels.sort(key=lambda p: (order.index(p[0]), p[1]))
    return "<div class='panels'>" + "".join(p[2] for p in panels) + "</div>" if panels else \
        "<p class='note'>No roofline.</p>"


def _comparison(comparison: dict | None) -> str:
    if not comparison:
        return "<p class='note'>No second run given (dohnuts-bench report --html RUN --against OTHER).</p>"
    head = ("workload", "target", "stage", "median A ms", "median B ms", "ratio", "interval", "verdict")
    out = [f"<p>B = {escape(str(comparison.get('label_b', 'B')))} against A = "
           f"{escape(str(comparison.get('label_a', 'A')))}; {escape(str(comparison.get('rule', '')))}</p>",
           "<table id='comparison'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for r in comparison.get("rows", []):
        interval = "" if r.get("ci_low") is None else f"{r['ci_low']:.3f}–{r['ci_high']:.3f}"
        out.append("<tr>" + "".join([_cell(r["workload"], cls=""), _cell(r["target"], cls=""), _cell(r["stage"], cls=""),
                                     _cell(_ms(r.get("median_a"))), _cell(_ms(r.get("median_b"))),
                                     _cell("—" if r.get("ratio") is None else f"{r['ratio']:.3f}×"),
                                     _cell(interval), _cell(r["verdict"] + (f": {r['load']}" if r.get("load") else ""),
                                                            cls="")]) + "</tr>")
    return "".join(out) + "</table>"


def _trends(series: list[Any] | None) -> str:
    if not series:
        return "<p class='note'>No history in the run store for these workloads.</p>"
    panels = []
    for s in series:
        labels = [f"{p.run_id} ({(p.revision or '?')[:10]}{'+dirty' if p.dirty else ''})" for p in s.points]
        flags = [None] * len(s.points)  # the first run of each flagged level shift
        for step in s.changes:
            flags[step.at] = step.verdict
        panels.append(f"<div class='panel'><h3>{escape(s.workload)} · {escape(s.target)} · {escape(s.stage)}</h3>"
                      f"<p class='note'>{escape(s.key.context)}</p>"
                      + trend([p.median_ms for p in s.points], labels, flags, title=f"{s.workload} · {s.target}")
                      + "</div>")
    return "<div class='panels'>" + "".join(panels) + "</div>"


def caveats(summary: dict) -> list[str]:
    """Every caveat report.txt gives, worded as it words them: the analysis's warnings and the
    machine section's (each a "warning: ..." line there), and each workload · target's measurement
    note (the last column of its quality table)."""
    sections = summary.get("sections") or {}
    warnings = [w for name in ("efficiency", "machine") for w in (sections.get(name) or {}).get("warnings") or []]
    notes = [f"{r['workload']} · {r['target']}: {note}" for r in summary.get("summary", [])
             if (note := quality_cells(r)[4])]
    return [f"warning: {w}" for w in warnings] + notes


def _caveats(summary: dict) -> str:
    items = caveats(summary)
    if not items:
        return "<p class='note'>None: no warning, every spread within the claimed precision.</p>"
    return ("<ul id='caveats'>" + "".join(f"<li class='caveat' data-key='caveat'>{escape(c)}</li>" for c in items)
            + "</ul>")


def _quality(rows: list[dict]) -> str:
    """The measurement quality of each workload · target, as report.txt's table gives it."""
    head = ("workload", "target", "excluded", "GPU clock MHz median (min) / max", "A/A noise ±", "harness overhead",
            "note")
    out = ["<table id='quality-of-measurement'><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        excluded, clock, aa, over, note = quality_cells(r)
        out.append(f"<tr{_row_class(r['target'])}>" + "".join(
            [_cell(r["workload"], cls=""), _cell(r["target"], cls=""), _cell(excluded, cls=""), _cell(clock), _cell(aa),
             _cell(over, cls=""), _cell(note, "quality-note", f"{r['workload']}|{r['target']}", cls="flag" if note
                                        else "")]) + "</tr>")
    return "".join(out) + "</table>"


def _machine(m: dict | None) -> str:
    """The run's conditions (summary.json's `machine` section: dohnuts.bench.analysis.machine): a
    CPU run's scope, the load when the run started and while each workload was measured, each
    measured ceiling's stability, the run's clock; its warnings are under "Caveats"."""
    if not m:
        return "<p class='note'>This run recorded no machine section.</p>"

    out = [f"<p>{escape(line)}</p>" for line in opening_lines(m)]
    groups = m.get("groups") or []
    if groups:
        out.append("<h3>Load while measuring: cores kept busy by other processes (telemetry load)</h3><table id='load'>"
                   "<tr><th>workload</th><th>target</th><th>samples</th><th>others median</th><th>others max</th>"
                   "<th>this process</th><th>load avg max</th></tr>")
        for g in groups:
            own, load1 = g.get("own_cores_median"), g.get("load1_max")
            out.append(f"<tr{_row_class(g['target'])}>" + "".join([
                _cell(g["workload"], cls=""), _cell(g["target"], cls=""), _cell(str(g["samples"])),
                _cell(f"{g['others_cores_median']:.2f}", "others_cores", f"{g['workload']}|{g['target']}"),
                _cell(f"{g['others_cores_max']:.2f}"), _cell("—" if own is None else f"{own:.2f}"),
                _cell("—" if load1 is None else f"{load1:.2f}")]) + "</tr>")
        out.append("</table>")
    ceilings = m.get("ceilings") or []
    if ceilings:
        out.append("<h3>Measured ceilings and their stability (spread = (fastest − slowest) / fastest over the "
                   "repeats)</h3><table id='ceilings'><tr><th>ceiling</th><th>value</th><th>unit</th><th>repeats</th>"
                   "<th>spread</th><th>stable</th></tr>")
        for c in ceilings:
            stable = c.get("stable") if isinstance(c.get("stable"), bool) else None
            out.append("<tr>" + "".join([
                _cell(c["name"], cls=""), _cell(f"{c['value']:.3g}"), _cell(str(c.get("unit", "")), cls=""),
                _cell(str(c.get("repeats") or "—")),
                _cell("—" if c.get("spread") is None else f"{c['spread']:.1%}"),
                _cell(STABLE_WORDS[stable], "ceiling-stable", c["name"], cls="flag" if stable is False else "")])
                + "</tr>")
        out.append("</table>")
    if line := timing_line(m.get("timing")):
        out.append(f"<p>{escape(line)}</p>")
    return "".join(out)


WORKLOAD, TARGET = "workload", "target"
LINK_SCHEMES = ("http", "https", "file")  # and relative paths (no scheme): what a page may link to


def link_href(target) -> str | None:
    """`target` as the href of a link on the page, or None when it may not be one — the one rule for
    every link the page makes of a string it read (run.json's trace paths): a relative path (quoted,
    `:` included, so no part of it reads as a scheme) or an http, https or file URL. Any other
    scheme (`javascript:`, `data:`, `vbscript:`, in any case), a scheme-relative `//host/...`, and a
    target holding a control character, a tab or a newline or spaces around it (browsers strip
    those from a URL, so `java\tscript:` would run) are not links."""
    if not isinstance(target, str) or not target or target != target.strip() or not target.isprintable():
        return None
    if target.startswith(("//", "\\", "/\\")):
        return None
    scheme = urlsplit(target).scheme.lower()
    if not scheme:
        return quote(target, safe="/")
    return target if scheme in LINK_SCHEMES else None


def link(target, text: str, *, key: str) -> str:
    """A link to `target` labelled `text` (both escaped), or — when `link_href` refuses the target —
    the label and the target shown as text, never as a link."""
    href = link_href(target)
    if href is None:
        return f"<span data-key='{escape(key)}'>{escape(text)} ({escape(str(target))}: not a link)</span>"
    return f"<a data-key='{escape(key)}' href='{escape(href)}'>{escape(text)}</a>"


def _traces(traces: list | None) -> str:
    if not traces:
        return "<p class='note'>Not profiled (dohnuts-bench run --profile writes a trace a workload and target).</p>"
    items = "".join(
        f"<li>{link(t.get('path'), f'{t.get(WORKLOAD)} · {t.get(TARGET)}', key='trace')} "
        f"({escape(str(t.get('calls')))} steady calls, not measured"
        + (f"; {escape(str(t['ranks']))} ranks, a trace each in this folder, as HTA reads" if t.get("ranks") else "")
        + ")</li>" for t in traces if isinstance(t, dict))
    return ("<p>torch.profiler traces (gzipped Chrome JSON): open them in Perfetto (ui.perfetto.dev) or "
            "chrome://tracing. Every harness stage is a range named dohnuts:&lt;stage&gt;.</p><ul>" + items + "</ul>")


def render(summary: dict, *, title: str, meta: dict | None = None, comparison: dict | None = None,
           trends: list | None = None) -> str:
    """The page of a run's `summary` (summary.json's content), with its run.json `meta`."""
    meta = meta or {}
    rows = summary.get("summary", [])
    eff = (summary.get("sections") or {}).get("efficiency") or {}
    groups = eff.get("groups", [])
    hwspec = eff.get("hwspec") or {}
    prov = meta.get("provenance") or {}
    device = (prov.get("device") or {}).get("name", "?")
    head = (f"<p>run <b data-key='run_id'>{escape(str(meta.get('run_id', title)))}</b> · device {escape(str(device))} · "
            f"hwspec {escape(str(hwspec.get('name', meta.get('hwspec') or 'none')))} · revision "
            f"{escape(str(prov.get('git', '?')))}</p>")
    body = [f"<h1>dohnuts-bench: {escape(title)}</h1>", head,
            "<h2>Headline</h2>", _headline((summary.get("sections") or {}).get("headline")),
            "<label><input type='checkbox' id='show-first' checked> show first calls (compilation, tuning, "
            "capture: reported apart)</label>",
            "<h2>Caveats</h2>", _caveats(summary),
            "<h2>Summary</h2>", _summary_table(rows),
            "<h2>Measurement quality</h2>", _quality(rows),
            "<h2>Bounds, efficiency and the critical path</h2>", _efficiency(groups, eff.get("hwspec", {}).get(
                "target_fraction", 0.8) if isinstance(eff.get("hwspec"), dict) else 0.8),
            "<h2>Stream against single calls</h2>", _streams(rows),
            "<h2>Serving: latency and throughput against load; quality</h2>",
            _serving((summary.get("sections") or {}).get("serving")),
            "<h2>Roofline, a workload a panel</h2>", _rooflines(groups, eff.get("rooflines")),
            "<h2>This run's machine</h2>", _machine((summary.get("sections") or {}).get("machine")),
            "<h2>Comparison</h2>", _comparison(comparison),
            "<h2>Trends (the run store)</h2>", _trends(trends),
            "<h2>Profiler traces</h2>", _traces(meta.get("traces"))]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>" + escape(title)
            + "</title><style>" + STYLE + "</style></head><body>" + "".join(body)
            + "<script>" + SCRIPT + "</script></body></html>")


def write_page(out: Path, summary: dict, *, meta: dict, title: str, comparison: dict | None = None,
               trends: list | None = None, source: Path) -> Path:
    """Write report.html (`out`): the page of a run's summary.json content and its run.json `meta`,
    with a comparison and the store's trends. What the page's code cannot read of a hand-edited
    summary (`source`, the file it came from) is one line naming that file."""
    try:
        page = render(summary, title=title, meta=meta, comparison=comparison, trends=trends)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        raise page_error(exc, source) from None  # a section's inside, hand-edited
    write_text_atomic(out, page)  # a failed write is one line; the previous page (if any) stays
    return out

