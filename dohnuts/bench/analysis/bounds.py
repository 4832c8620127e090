"""Lower bounds on stage and call times, efficiency, limiter and the target verdict.

Per stage, with useful FLOPs F_k of each kind k (matrix, attention, scan, vector), necessary
device bytes Q and host-link bytes Q_link (cost.py), and the hwspec's ceilings P_k, W, W_link
for the run's precision and a basis (datasheet or measured):

    T_compute = Σ_k F_k / P_k      if the device cannot overlap kinds (hwspec
                                     overlap_compute_kinds: false — RDNA 3 runs WMMA on the same
                                     SIMD ALUs as vector code, so their times add);
              = max_k F_k / P_k    if it can (Hopper: tensor cores and FP32 pipes are separate).
    T_lower   = max(T_compute, Q / W, Q_link / W_link)

Compute and memory always combine by max (docs/measurement.md: different constraints, not two
readings that must hold at once). Efficiency = T_lower / T_measured, shown only up to 100 %
(`shown_efficiency`). The limiter is the term that sets T_lower, named with its ceiling. The
target verdict (`target_verdict`) is "meets" when T_measured <= T_lower / fraction (0.8),
compared with a relative tolerance of 1e-9 so a measurement written in decimals exactly at the
boundary (12.5 ms against a 10 ms bound) passes; "misses" above it; and "bound-suspect" when the
measurement is faster than the lower bound itself (efficiency above 100 %): a bound a
measurement beats is wrong (the cost model overstates the work, or a ceiling — e.g. one measured
while other processes loaded the machine — understates the hardware), so it supports no verdict,
never "meets", and no efficiency is shown for it, only the reason. Padded and repeated work
never enter T_lower.

Whole call: the plain sum of stage bounds (no overlap), the single maximum (ideal overlap) and
the critical path of critical_path.CallGraph (max <= critical path <= sum, proved there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dohnuts.bench.analysis.cost import StageCost, Work
from dohnuts.bench.analysis.critical_path import CallGraph
from dohnuts.bench.analysis.flops import FLOP_KINDS
from dohnuts.bench.analysis.hwspec import HwSpec

VERDICT_RTOL = 1e-9


@dataclass(frozen=True)
class StageBound:
    stage: str
    basis: str  # "datasheet" | "measured"
    ms: float  # T_lower
    terms_ms: dict[str, float]  # matrix, attention, scan, vector, compute, memory, host_link
    limiter: str  # "compute" | "bandwidth" | "none" (no work)
    ceiling: str  # the ceiling that sets T_lower ("" when none)

    def describe(self) -> str:
        return "—" if self.limiter == "none" else f"{self.limiter} ({self.ceiling})"


def work_bound(work: Work, spec: HwSpec, precision: str, basis: str = "datasheet", stage: str = "") -> StageBound:
    """T_lower of a slice of work (see the module docstring), in milliseconds."""
    kinds = work.kinds()
    terms: dict[str, float] = {}
    for k in FLOP_KINDS:
        terms[k] = kinds[k] / spec.ceiling(k, precision, basis).value * 1e3 if kinds[k] else 0.0
    compute = [terms[k] for k in FLOP_KINDS]
    terms["compute"] = max(compute) if spec.overlap_compute_kinds else sum(compute)
    terms["memory"] = work.device_bytes / spec.ceiling("memory", precision, basis).value * 1e3
    terms["host_link"] = work.link_bytes / spec.ceiling("host_link", precision, basis).value * 1e3
    # The interconnect bounds only data sent between devices; a spec without one leaves it unbounded.
    terms["interconnect"] = (work.interconnect_bytes / spec.ceiling("interconnect", precision, basis).value * 1e3
                             if work.interconnect_bytes and spec.has_role("interconnect", precision, basis) else 0.0)
    ms = max(terms["compute"], terms["memory"], terms["host_link"], terms["interconnect"])
    if ms <= 0.0:
        return StageBound(stage, basis, 0.0, terms, "none", "")
    if terms["compute"] >= max(terms["memory"], terms["host_link"], terms["interconnect"]):
        top = max(FLOP_KINDS, key=lambda k: terms[k])
        return StageBound(stage, basis, ms, terms, "compute", spec.ceiling(top, precision, basis).name)
    role = max(("memory", "host_link", "interconnect"), key=lambda r: terms[r])
    return StageBound(stage, basis, ms, terms, "bandwidth", spec.ceiling(role, precision, basis).name)


def stage_bound(cost: StageCost, spec: HwSpec, precision: str, basis: str = "datasheet") -> StageBound:
    """T_lower of a stage's useful work (padding and repetition excluded by construction)."""
    return work_bound(cost.useful, spec, precision, basis, cost.name)


def efficiency(bound_ms: float | None, measured_ms: float | None) -> float | None:
    """T_lower / T_measured; None when either is unknown or nothing was measured. Above 1 it is no
    efficiency but a broken bound: reports show `shown_efficiency`, never this raw ratio."""
    if bound_ms is None or not measured_ms or measured_ms <= 0:
        return None
    return bound_ms / measured_ms


MEETS, MISSES, BOUND_SUSPECT = "meets", "misses", "bound-suspect"


def shown_efficiency(bound_ms: float | None, measured_ms: float | None,
                     limiter: str = "") -> tuple[float | None, str | None]:
    """(efficiency, None), or (None, why) where the measurement beat its lower bound.

    An efficiency above 100 % is impossible: the bound is wrong, so no report (text, HTML,
    summary.json) shows it as a number; it reads bound-suspect with this reason. A ratio above 1
    only by the verdict's tolerance (VERDICT_RTOL) is the bound itself: 1."""
    eff = efficiency(bound_ms, measured_ms)
    if eff is None or eff <= 1.0:
        return eff, None
    if target_verdict(measured_ms, bound_ms) != BOUND_SUSPECT:
        return 1.0, None
    ceiling = f" ({limiter})" if limiter and limiter != "—" else ""
    return None, (f"measured {measured_ms:.3g} ms, under its {bound_ms:.3g} ms lower bound{ceiling}: the bound is "
                  "wrong (the cost model overstates the work, or a ceiling understates the hardware)")


def target_verdict(measured_ms: float | None, bound_ms: float | None, fraction: float = 0.8) -> str | None:
    """"meets" (T_measured <= T_lower / fraction, within VERDICT_RTOL), "misses", or "bound-suspect"
    (T_measured < T_lower: efficiency above 100 %, the bound is wrong); None when unknown."""
    if measured_ms is None or bound_ms is None:
        return None
    if measured_ms < bound_ms * (1.0 - VERDICT_RTOL):
        return BOUND_SUSPECT
    return MEETS if measured_ms <= bound_ms / fraction * (1.0 + VERDICT_RTOL) else MISSES


@dataclass(frozen=True)
class CallBounds:
    """Stage times combined over a call: the three ways docs/measurement.md names, plus the latency."""

    sum_ms: float  # no overlap at all
    max_ms: float  # ideal overlap
    critical_ms: float  # steady-state critical path of the pipeline (the headline)
    latency_ms: float  # one call alone (longest within-call path)
    critical_stages: tuple[str, ...]  # the cycle that sets the critical path


def combine(durations: Mapping[str, float], graph: CallGraph) -> CallBounds:
    """Combine per-stage times (bounds or measurements) over `graph`'s stages."""
    values = [float(durations.get(s, 0.0)) for s in graph.names]
    cp, cycle = graph.critical_cycle(durations)
    return CallBounds(sum(values), max(values, default=0.0), cp, graph.latency(durations), cycle)
