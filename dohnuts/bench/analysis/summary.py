"""summary.json's rows: per workload · target, the statistics of its measured calls — per stage and
whole call (median, p10/p90, spread, mean and standard deviation), throughput, memory, energy,
the calls the validity gate left out, the harness's overhead, the A/A noise, a pipelined
stream's latency and queueing, the agreement with the FP32 reference. Quantiles, means and
deviations are dohnuts.bench.analysis.quantiles' (one method, named there). The text report
(dohnuts.bench.report.text_report), the HTML page and `export` read these rows."""

from __future__ import annotations

import statistics
from collections import defaultdict

import msgspec

from dohnuts.bench.analysis.compare import aa_noise, spread_warning
from dohnuts.bench.analysis.headline import peer_dict
from dohnuts.bench.analysis.quantiles import mean_and_std, quantiles
from dohnuts.bench.analysis.measurement_quality import overhead_summary, validity_summary
from dohnuts.bench.analysis.records import (
    CallRecord, StreamTimes, extra_part, group_key, peer_paths, per_call_records, stage_ms, valid_records,
)
from dohnuts.bench.measure.telemetry import clock_summary

CLAIMED_PRECISION = 0.05  # the report's claim: medians within ±5 % (95 % interval)


def summarize(records: list[CallRecord]) -> list[dict]:
    """Per (workload, target): per-stage and whole-call statistics over the measured calls, and
    the quality of the measurement: calls left out by the validity gate (throttling, low clocks),
    the harness's own overhead, the A/A noise budget of the interleaved halves, a warning when the
    spread is too large for the claimed precision, and for a pipelined stream its latency,
    queueing and throughput."""
    records = per_call_records(records)  # load points and accuracy: their own section (analysis.serving)
    validity = validity_summary(records)
    overhead = overhead_summary(records)
    records, _ = valid_records(records)
    groups = defaultdict(list)
    for r in records:
        groups[group_key(r)].append(r)
    out = []
    for (workload, target), recs in groups.items():
        walls = [r.wall_ms for r in recs]
        med = statistics.median(walls)
        decisions = statistics.median(r.decisions for r in recs)
        useful = statistics.median(r.tokens.useful for r in recs)
        stages = {}
        for name in dict.fromkeys(n for r in recs for n in r.stages):
            xs = [stage_ms(r.stages[name]) for r in recs if name in r.stages]
            p10, p90 = quantiles(xs, [0.1, 0.9])
            mean, std = mean_and_std(xs)
            stages[name] = {"median_ms": statistics.median(xs), "p10_ms": p10, "p90_ms": p90, "mean_ms": mean,
                            "std_ms": std}
        peak = [r.peak_mem_bytes for r in recs if r.peak_mem_bytes]
        p10, p90 = quantiles(walls, [0.1, 0.9])
        mean, std = mean_and_std(walls)
        row = {
            "workload": workload, "target": target, "calls": len(recs), "wall_median_ms": med,
            "wall_p10_ms": p10, "wall_p90_ms": p90, "wall_mean_ms": mean, "wall_std_ms": std,
            "spread": (p90 - p10) / med if med else 0.0,
            "decisions_per_s": decisions / (med / 1e3), "useful_tokens_per_s": useful / (med / 1e3),
            "padded_tokens": statistics.median(r.tokens.padded for r in recs),
            "peak_mem_bytes": max(peak) if peak else None, "stages": stages,
            **energy_summary(recs),
            "device": recs[0].device.name, "precision": recs[0].precision,
            "excluded_calls": validity.get((workload, target), {}).get("invalid", 0),
            "excluded_reasons": validity.get((workload, target), {}).get("reasons", {}),
            "power_capped_calls": validity.get((workload, target), {}).get("power_capped", 0),
            "gpu_clock": clock_summary(recs),
            "harness_overhead": overhead.get((workload, target)),
            "aa_noise_halfwidth": None,
            "spread_warning": spread_warning(walls, CLAIMED_PRECISION) if len(walls) >= 2 else None,
            # the target against the FP32 reference path (dohnuts.bench.measure.quality); None: not checked
            "agreement": next((msgspec.to_builtins(r.agreement) for r in recs if r.agreement is not None), None),
            # a peer target's fast paths (`extra.peer`, a fallback marked FALLBACK); None: not recorded
            "peer": peer_dict(next((p for p in map(peer_paths, recs) if p is not None), None)),
        }
        halves = [r.aa_half for r in recs]
        if halves.count(0) >= 3 and halves.count(1) >= 3:
            row["aa_noise_halfwidth"] = aa_noise(recs, (workload, target)).halfwidth()
        streamed = [r for r in recs if "stream" in r.extra]
        streams = [extra_part(r, "stream", StreamTimes) for r in streamed]
        if streams:
            lat = [x.latency_ms for x in streams]
            p50, p90, p99 = quantiles(lat, [0.5, 0.9, 0.99])
            mean, std = mean_and_std(lat)
            row["stream"] = {"requests": len(streams), "total_ms": streams[0].total_ms,
                             "throughput_rps": len(streams) / (streams[0].total_ms / 1e3),
                             "latency_p50_ms": p50, "latency_p90_ms": p90, "latency_p99_ms": p99,
                             "latency_mean_ms": mean, "latency_std_ms": std,
                             "queue_p50_ms": quantiles([x.queue_ms for x in streams], [0.5])[0],
                             # what it served of its set (dohnuts.bench.measure.serving.variety; None: older records)
                             "served_set": streamed[0].extra["stream"].get("served_set")}
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


def energy_summary(records: list[CallRecord]) -> dict:
    """The device energy of a group of calls: `energy_j_per_call` and `energy_j_per_decision`.

    From the target's energy window where the records carry one (`energy.window`: the counter over
    back-to-back calls lasting over a second, dohnuts.bench.measure.call.energy_window); otherwise the
    mean of the per-call readings — a counter advances in steps, so one short call reads 0 or a
    step and only a sum over calls means anything (`energy_method` says which). Both None where no
    call has joules (a CPU run, a GPU without a counter); `energy_source` names the counter (nvml,
    amdsmi) and `energy_calls` counts the calls metered."""
    metered = [r for r in records if r.energy is not None and r.energy.joules is not None]
    sources = sorted({str(r.energy.source) for r in metered})
    windows = [r.energy.window for r in records if r.energy is not None and r.energy.window is not None]
    decisions = statistics.median(r.decisions for r in records) if records else 0
    if windows:
        w = windows[0]  # one window per target: every record carries the same
        per_call = w.joules / w.calls
        return {"energy_j_per_call": per_call, "energy_j_per_decision": per_call / decisions if decisions else None,
                "energy_source": ", ".join(sources) or None, "energy_calls": w.calls,
                "energy_method": f"window of {w.calls} calls, {w.seconds:.1f} s"}
    joules = sum(r.energy.joules for r in metered)
    decided = sum(r.decisions for r in metered)
    return {"energy_j_per_call": joules / len(metered) if metered else None,
            "energy_j_per_decision": joules / decided if decided else None,
            "energy_source": ", ".join(sources) or None, "energy_calls": len(metered),
            "energy_method": "per-call readings" if metered else None}


def summary_json(rows: list[dict], sections: list) -> dict:
    """summary.json's content: the rows (`summarize`), and each section's data under its title."""
    return {"summary": rows, "sections": {s.title: s.data for s in sections}}
