"""The quality of a run's measurement, per workload · target, as the reports state it: the calls
the validity gate left out (and the power-capped calls kept), the harness's own overhead (from
inside the call, and from outside by the untimed twins), the agreement with the FP32 reference in
words, and the quality cells both reports write (report.txt's quality table, report.html's)."""

from __future__ import annotations

import numpy as np

from dohnuts.bench.analysis.quantiles import bootstrap_rng
from dohnuts.bench.analysis.records import CallRecord, HarnessOverhead, group_key, left_out
from dohnuts.schema import median


def validity_summary(records: list[CallRecord]) -> dict[tuple[str, str], dict]:
    """Per `group_key` (workload, target): {"n", "invalid", "reasons": {reason: calls},
    "power_capped"} — how many calls the validity gate left out and why, and how many ran (and
    were kept) at the device's power limit."""
    out: dict[tuple[str, str], dict] = {}
    for rec in records:
        g = out.setdefault(group_key(rec), {"n": 0, "invalid": 0, "reasons": {}, "power_capped": 0})
        g["n"] += 1
        if rec.validity is not None and rec.validity.power_capped:
            g["power_capped"] += 1
        if left_out(rec):
            g["invalid"] += 1
            for reason in rec.validity.reasons or ["(no reason given)"]:
                g["reasons"][reason] = g["reasons"].get(reason, 0) + 1
    return out


OVERHEAD_TARGET_FRACTION = 0.01  # the harness may cost at most 1 % of the measured (wall) time


def overhead_summary(records: list[CallRecord]) -> dict[tuple[str, str], dict]:
    """Per `group_key` (workload, target), over the records that carry `harness_overhead_ms`:
    {"n", "median_ms", "median_fraction" (of wall_ms), "max_fraction", "median_in_call_ms",
    "median_in_call_fraction", "ab", "within_target", "basis", "host_bound"}.

    Two figures. The self-measured one: the timer's own host time inside the measured interval
    (`in_call`; the rest, telemetry lookup and building the record, runs between calls). On the
    CPU that host time is the call's time; on a GPU the host usually runs ahead of the device and
    hides it, so there it is only an upper bound. The figure from outside (`ab`): the records
    whose call followed an untimed twin (`harness_overhead.untimed_twin_ms`, the same call with no
    timer), paired: {"pairs", "median_ms" (of timed − untimed), "fraction" (of the untimed median),
    "low", "high" (95 % bootstrap interval of that fraction)}.

    `within_target` (≤ 1 % of the call) decides the report's warning, on the evidence that holds
    (`basis`): on the CPU the in-call figure (the timer's host work is the call's time there, and
    measured far more precisely than a difference of two noisy walls); on a GPU the A/B where it
    has ≥ 5 pairs — over the target only when its whole interval is; a GPU without an A/B claims
    nothing: True, with `basis` "upper bound". `host_bound`: the in-call figure is only an upper
    bound (a GPU). `nvtx` (present when true): the calls carried NVTX stage ranges (`run --nvtx`),
    whose cost both figures include. Groups without the field are left out."""
    groups: dict[tuple[str, str], list[tuple[float, float, float | None, float | None, str]]] = {}
    with_ranges: set[tuple[str, str]] = set()  # groups measured with NVTX stage ranges (`run --nvtx`)
    for rec in records:
        ms, wall = rec.harness_overhead_ms, rec.wall_ms
        if ms is None or wall <= 0:
            continue
        detail = rec.harness_overhead or HarnessOverhead()
        twin = detail.untimed_twin_ms
        if detail.nvtx:
            with_ranges.add(group_key(rec))
        groups.setdefault(group_key(rec), []).append((
            ms, wall, detail.in_call_ms, twin if twin else None, rec.device.type or "cpu"))
    out = {}
    for key, rows in groups.items():
        fractions = [m / w for m, w, _, _, _ in rows]
        in_call = [c for _, _, c, _, _ in rows if c is not None]
        in_call_fraction = [c / w for _, w, c, _, _ in rows if c is not None]
        in_frac = median(in_call_fraction) if in_call_fraction else None
        ab = _paired_overhead([(w, t) for _, w, _, t, _ in rows if t is not None])
        on_cpu = all(d == "cpu" for *_, d in rows)
        if on_cpu:
            within = (median(fractions) if in_frac is None else in_frac) <= OVERHEAD_TARGET_FRACTION
            basis = "in call"
        elif ab is not None:
            within, basis = ab["low"] <= OVERHEAD_TARGET_FRACTION, "A/B"
        else:
            within, basis = True, "upper bound"
        out[key] = {"n": len(rows), "median_ms": median([m for m, *_ in rows]), "median_fraction": median(fractions),
                    "max_fraction": max(fractions), "median_in_call_ms": median(in_call) if in_call else None,
                    "median_in_call_fraction": in_frac, "ab": ab, "within_target": within, "basis": basis,
                    "host_bound": not on_cpu}
        if key in with_ranges:
            out[key]["nvtx"] = True
    return out


def gap_words(agreement: dict) -> str:
    """'probabilities 0.12 apart (tolerance 0.05; BF16 plain ops 0.03 apart)' for the reports."""
    words = f"probabilities {agreement['max_abs_gap']:.3g} apart (tolerance {agreement['tolerance']:.3g}"
    if agreement.get("yardstick_gap") is not None:
        words += f"; the same mathematics in plain ops at this precision: {agreement['yardstick_gap']:.3g} apart"
    return words + ")"


def overhead_text(o: dict | None) -> str:
    """The harness overhead as the report prints it: the A/B from outside where the run has one
    (with its interval), the self-measured in-call time beside it — labelled an upper bound where
    the host can run ahead of the device; "NVTX ranges on" where the calls carried them."""
    if not o:
        return "—"
    text = _overhead_figures(o)
    return f"{text}; NVTX ranges on" if o.get("nvtx") else text


def _overhead_figures(o: dict) -> str:
    inside = ""
    if o.get("median_in_call_fraction") is not None:
        bound = "≤ " if o.get("host_bound") else ""
        inside = f"{bound}{o['median_in_call_ms']:.3f} ms in call ({100 * o['median_in_call_fraction']:.2f}%)"
    ab = o.get("ab")
    if ab:
        ab_text = (f"A/B {100 * ab['fraction']:+.2f}% ({100 * ab['low']:+.2f}…{100 * ab['high']:+.2f}%, "
                   f"{ab['pairs']} pairs)")
        if o.get("basis") == "in call" and inside:  # the CPU: the self-measure is the precise figure
            return f"{inside}; {ab_text}"
        return ab_text + (f"; self-measured {inside}" if inside else "")
    if inside:
        return inside + (" (upper bound)" if o.get("basis") == "upper bound" else "") + f", {o['median_ms']:.2f} ms in all"
    return f"{o['median_ms']:.2f} ms ({100 * o['median_fraction']:.2f}%)"


AB_MIN_PAIRS = 5


def _paired_overhead(pairs: list[tuple[float, float]], confidence: float = 0.95, resamples: int = 2000) -> dict | None:
    """The timer's cost from (timed wall, untimed wall) pairs of the same call: the median paired
    difference as a fraction of the untimed median, with its percentile bootstrap interval
    (`scipy.stats.bootstrap` over the differences, the untimed median held fixed; seeded)."""
    if len(pairs) < AB_MIN_PAIRS:
        return None
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy import stats


    timed = np.array([t for t, _ in pairs])
    untimed = np.array([u for _, u in pairs])
    base = float(np.median(untimed))
    if base <= 0:
        return None
    diff = timed - untimed
    boot = stats.bootstrap((diff,), lambda x, axis=-1: np.median(x, axis=axis) / base, n_resamples=resamples,
                           method="percentile", confidence_level=confidence, vectorized=True, **bootstrap_rng([0]))
    low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
    med = float(np.median(diff))
    return {"pairs": len(pairs), "median_ms": med, "fraction": med / base, "low": low, "high": high}


def quality_cells(r: dict) -> tuple[str, str, str, str, str]:
    """A summary row's measurement quality as both reports write it (report.txt's quality table,
    report.html's): calls left out (and power-capped calls kept), the GPU clock, the A/A noise, the
    harness's overhead, and the note — the spread too large for the claimed precision, or the
    harness overhead above 1 %."""
    o = r.get("harness_overhead")
    over = overhead_text(o)
    aa = "—" if r.get("aa_noise_halfwidth") is None else f"{100 * r['aa_noise_halfwidth']:.1f}%"
    excluded = str(r.get("excluded_calls", 0))
    if r.get("excluded_calls"):
        excluded += " (" + ", ".join(f"{k}: {v}" for k, v in (r.get("excluded_reasons") or {}).items()) + ")"
    if r.get("power_capped_calls"):
        excluded += f"; {r['power_capped_calls']} power-capped, kept"
    note = r.get("spread_warning") or (f"harness overhead above 1 % ({o['basis']})" if o and not o["within_target"]
                                       else "")
    c = r.get("gpu_clock")
    clock = "—" if not c else (f"{c['median_mhz']:.0f} ({c['min_mhz']:.0f})"
                               + (f" / {c['max_mhz']:.0f}" if c["max_mhz"] else ""))
    return excluded, clock, aa, over, note or ""
