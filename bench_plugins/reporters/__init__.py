"""Built-in reporters: the headline first (a section that `leads`: dohnuts against its peer and
the bound), the per-stage timing summary (median, p10/p90, spread, mean and standard deviation,
throughput, memory), the analyzers' other sections, and `report.txt` / `summary.json` in the run
directory. Quantiles, means and deviations are dohnuts.bench.analysis.quantiles' (one method,
named there).

Width: the tables are `dohnuts.bench.analysis.render.FitTable`s, which pick their layout from the
width they are printed at (its module docstring has the rule). On the console that is the
terminal's width (or COLUMNS; 80 in a log): the full table when it fits, else narrower tables
with the names as headings, else one block per row — never a cell cut with "…". `report.txt` is
written at the natural width of the widest renderable (at least 80 columns), so it always holds
the full tables, whatever the terminal. summary.json does not depend on any width."""

from __future__ import annotations

import io
import statistics
from collections import defaultdict

from rich.measure import Measurement
from rich.text import Text

from dohnuts.bench.analysis.records import group_key, overhead_text, quality_cells
from dohnuts.bench.analysis.render import UNBOUNDED, Col, FitTable
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.report.terminal import SafeConsole
from dohnuts.bench.report.status import log
from dohnuts.schema import write_json, write_text_atomic


def stage_ms(entry: dict) -> float:
    return entry["device_ms"] if entry.get("device_ms") is not None else entry["host_ms"]


NO_ENERGY = "no energy counter"  # what the reports say where no call read the device's energy counter
CLAIMED_PRECISION = 0.05  # the report's claim: medians within ±5 % (95 % interval)


def summarize(records: list[dict]) -> list[dict]:
    """Per (workload, target): per-stage and whole-call statistics over the measured calls, and
    the quality of the measurement: calls left out by the validity gate (throttling, low clocks),
    the harness's own overhead, the A/A noise budget of the interleaved halves, a warning when the
    spread is too large for the claimed precision, and for a pipelined stream its latency,
    queueing and throughput."""
    from dohnuts.bench.analysis.compare import aa_noise, spread_warning
    from dohnuts.bench.analysis.headline import peer_dict
    from dohnuts.bench.analysis.quantiles import mean_and_std, quantiles
    from dohnuts.bench.analysis.records import (
        overhead_summary, peer_paths, per_call_records, valid_records, validity_summary,
    )
    from dohnuts.bench.measure.telemetry import clock_summary

    records = per_call_records(records)  # load points and accuracy: their own section (analysis.serving)
    validity = validity_summary(records)
    overhead = overhead_summary(records)
    records, _ = valid_records(records)
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
            p10, p90 = quantiles(xs, [0.1, 0.9])
            mean, std = mean_and_std(xs)
            stages[name] = {"median_ms": statistics.median(xs), "p10_ms": p10, "p90_ms": p90, "mean_ms": mean,
                            "std_ms": std}
        peak = [r["peak_mem_bytes"] for r in recs if r.get("peak_mem_bytes")]
        p10, p90 = quantiles(walls, [0.1, 0.9])
        mean, std = mean_and_std(walls)
        row = {
            "workload": workload, "target": target, "calls": len(recs), "wall_median_ms": med,
            "wall_p10_ms": p10, "wall_p90_ms": p90, "wall_mean_ms": mean, "wall_std_ms": std,
            "spread": (p90 - p10) / med if med else 0.0,
            "decisions_per_s": decisions / (med / 1e3), "useful_tokens_per_s": useful / (med / 1e3),
            "padded_tokens": statistics.median(r["tokens"]["padded"] for r in recs),
            "peak_mem_bytes": max(peak) if peak else None, "stages": stages,
            **energy_summary(recs),
            "device": recs[0]["device"]["name"], "precision": recs[0]["precision"],
            "excluded_calls": validity.get((workload, target), {}).get("invalid", 0),
            "excluded_reasons": validity.get((workload, target), {}).get("reasons", {}),
            "power_capped_calls": validity.get((workload, target), {}).get("power_capped", 0),
            "gpu_clock": clock_summary(recs),
            "harness_overhead": overhead.get((workload, target)),
            "aa_noise_halfwidth": None,
            "spread_warning": spread_warning(walls, CLAIMED_PRECISION) if len(walls) >= 2 else None,
            # the target against the FP32 reference path (dohnuts.bench.measure.quality); None: not checked
            "agreement": next((r["agreement"] for r in recs if isinstance(r.get("agreement"), dict)), None),
            # a peer target's fast paths (`extra.peer`, a fallback marked FALLBACK); None: not recorded
            "peer": peer_dict(next((p for p in map(peer_paths, recs) if p is not None), None)),
        }
        halves = [r.get("aa_half") for r in recs]
        if halves.count(0) >= 3 and halves.count(1) >= 3:
            row["aa_noise_halfwidth"] = aa_noise(recs, (workload, target)).halfwidth()
        streams = [r["extra"]["stream"] for r in recs if "stream" in (r.get("extra") or {})]
        if streams:
            lat = [x["latency_ms"] for x in streams]
            p50, p90, p99 = quantiles(lat, [0.5, 0.9, 0.99])
            mean, std = mean_and_std(lat)
            row["stream"] = {"requests": len(streams), "total_ms": streams[0]["total_ms"],
                             "throughput_rps": len(streams) / (streams[0]["total_ms"] / 1e3),
                             "latency_p50_ms": p50, "latency_p90_ms": p90, "latency_p99_ms": p99,
                             "latency_mean_ms": mean, "latency_std_ms": std,
                             "queue_p50_ms": quantiles([x["queue_ms"] for x in streams], [0.5])[0],
                             # what it served of its set (dohnuts.bench.measure.serving.variety; None: older records)
                             "served_set": streams[0].get("served_set")}
        out.append(row)
    # A stream's per-request time against the same target's single calls: the overlap measured
    # (not for a varied served set: its requests are not the single calls').
    single = {(r["workload"], r["target"]): r["wall_median_ms"] for r in out if "stream" not in r}
    for r in out:
        base = single.get((r["workload"], r["target"].removesuffix(" · stream")))
        if "stream" in r and base and not (r["stream"]["served_set"] or {}).get("varied"):
            r["stream"]["single_call_ms"] = base
            r["stream"]["overlap"] = 1.0 - r["wall_median_ms"] / base
    return out


def energy_summary(records: list[dict]) -> dict:
    """The device energy of a group of calls: `energy_j_per_call` and `energy_j_per_decision`.

    From the target's energy window where the records carry one (`energy.window`: the counter over
    back-to-back calls lasting over a second, dohnuts.bench.measure.call.energy_window); otherwise the
    mean of the per-call readings — a counter advances in steps, so one short call reads 0 or a
    step and only a sum over calls means anything (`energy_method` says which). Both None where no
    call has joules (a CPU run, a GPU without a counter); `energy_source` names the counter (nvml,
    amdsmi) and `energy_calls` counts the calls metered."""
    metered = [r for r in records if isinstance((r.get("energy") or {}).get("joules"), (int, float))]
    sources = sorted({str(r["energy"].get("source")) for r in metered})
    windows = [r["energy"]["window"] for r in records if isinstance((r.get("energy") or {}).get("window"), dict)]
    decisions = statistics.median(r["decisions"] for r in records) if records else 0
    if windows:
        w = windows[0]  # one window per target: every record carries the same
        per_call = w["joules"] / w["calls"]
        return {"energy_j_per_call": per_call, "energy_j_per_decision": per_call / decisions if decisions else None,
                "energy_source": ", ".join(sources) or None, "energy_calls": w["calls"],
                "energy_method": f"window of {w['calls']} calls, {w['seconds']:.1f} s"}
    joules = sum(r["energy"]["joules"] for r in metered)
    decided = sum(r["decisions"] for r in metered)
    return {"energy_j_per_call": joules / len(metered) if metered else None,
            "energy_j_per_decision": joules / decided if decided else None,
            "energy_source": ", ".join(sources) or None, "energy_calls": len(metered),
            "energy_method": "per-call readings" if metered else None}


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
    from dohnuts.bench.analysis.serving import served_cells

    t = FitTable("Pipelined streams (Predictor.run: prefetch, copy stream, overlapped serialization); overlap "
                 "against the single calls (none for a varied served set: other requests)",
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
    from dohnuts.bench.measure.quality import gap_words

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


@hookimpl
def dohnuts_bench_report(console, records, sections, run_dir):
    rows = summarize(records)
    streams = stream_table(rows)
    report = [*(s.renderable for s in sections if s.leads),  # the headline first
              summary_table(rows), stage_table(rows), *([streams] if streams else []), quality_table(rows),
              *(s.renderable for s in sections if not s.leads)]
    file_console = SafeConsole(record=True, width=full_width(report), file=io.StringIO())
    for c in (console, file_console):
        for renderable in report:
            c.print(renderable)
    write_text_atomic(run_dir / "report.txt", file_console.export_text())  # a planted link is replaced, not followed
    summary = {"summary": rows, "sections": {s.title: s.data for s in sections}}
    # Strict JSON (a non-finite number is written as null, never a bare NaN), written atomically:
    # an interrupted report leaves no half-written summary.json.
    write_json(run_dir / "summary.json", summary, indent=2, default=str)
    for s in sections:
        for f in s.files:
            log.info("wrote %s", f)
    log.info("report: %s  summary: %s", run_dir / "report.txt", run_dir / "summary.json")
