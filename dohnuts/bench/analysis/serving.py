"""Serving scenarios and quality, from the records alone: load points, the SLO search's answer, the
bound at load, the stream scenario's validity, accuracy and the reference check.

- Load points (records `phase: server | offline`, one a served request; the point's counts in
  `extra.serving.point`): each point summarised again from its records with the same function
  the run used (dohnuts.bench.measure.serving.stats.summarize_point): latency percentiles with their
  intervals, throughput, goodput (requests within the SLO a second), the verdict, validity (the
  point's minimums, its deadline, the telemetry's gate).
- What a point served of its set (`extra.serving.point.served_set`, dohnuts.bench.measure.serving.variety):
  whether the set was varied, the distinct requests and pass shapes served, and the graph
  captures while it was measured; per curve the distinct pass shapes over all its points (from
  the records' work counts) and the captures summed.
- The search's answer (dohnuts.bench.measure.serving.search.search_result): the highest valid rate that
  met the SLO below the lowest valid one that missed it — or, for closed-loop points (a curve of
  their own, `closed_loop`: x is the clients), the most clients.
- The bound at load: the critical-path bound of the same target's single calls (the efficiency
  analysis of this run) is the *floor* of the latency curve (`latency_ms`: one call alone, the
  longest within-call path) and its reciprocal the *ceiling* of the throughput (`critical_ms`:
  one call a critical path in steady state). Where the measured latency leaves the floor while
  the offered rate is still far below the ceiling, the queue (and the server's own overheads)
  is what costs.
- Quality: per target the accuracy on the labelled set (Wilson 95 % interval) and the reference
  check, beside its single-call speed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

import msgspec

from dohnuts.bench.analysis.quantiles import quantiles
from dohnuts.bench.analysis.records import CallRecord, StreamTimes, extra_part, target_label, work_of, workload_label
from dohnuts.bench.measure.serving.search import SearchResult, search_result
from dohnuts.bench.measure.serving.stats import (
    METRIC_PERCENTILES, PointSummary, Rules, summarize_point, wilson_interval,
)
from dohnuts.bench.measure.serving.variety import pass_shape
from dohnuts.schema import median

SERVING_PHASES = ("server", "offline")


@dataclass(frozen=True)
class Bound:
    """The critical-path bound of a target's single calls, read as a serving floor and ceiling."""

    basis: str
    latency_floor_ms: float
    throughput_ceiling_rps: float | None
    critical_stages: tuple[str, ...]


@dataclass
class LoadCurve:
    """One target's load points in one workload (a scenario), with its bound and single call."""

    workload: str
    target: str
    scenario: str
    percentile: float
    slo_ms: float | None
    points: list[PointSummary] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)
    bound: Bound | None = None
    single_call_ms: float | None = None
    agreement: dict | None = None
    shapes: int = 0  # distinct pass shapes over all points (from the records' work counts)
    closed_loop: bool = False  # its points are closed loops of clients (`concurrency`), not offered rates
    think_ms: float | None = None  # a closed loop's mean think time

    @property
    def served_sets(self) -> list[dict]:
        """Each point's served-set facts (records before they were written have none)."""
        return [p.extra["served_set"] for p in self.points if p.extra.get("served_set")]

    @property
    def varied(self) -> bool:
        return any(s["varied"] for s in self.served_sets)

    @property
    def graph_captures(self) -> int | None:
        """Captures while its points were measured, summed (None: no point counted graphs)."""
        counted = [s["graph_captures"] for s in self.served_sets if s["graph_captures"] is not None]
        return sum(counted) if counted else None

    @property
    def graph_eager(self) -> int | None:
        """Passes run eagerly while its points were measured, summed (None: no point counted graphs)."""
        counted = [s.get("graph_eager") for s in self.served_sets if s.get("graph_eager") is not None]
        return sum(counted) if counted else None

    @property
    def search(self) -> SearchResult | None:
        searched = [p for p, role in zip(self.points, self.roles) if role in ("search", "fixed")]
        return search_result(searched) if self.slo_ms is not None and searched else None

    def to_dict(self) -> dict:
        s = self.search
        return {"workload": self.workload, "target": self.target, "scenario": self.scenario,
                "percentile": self.percentile, "slo_ms": self.slo_ms,
                "points": [p.to_dict() | {"role": r, "server": sv} for p, r, sv in zip(self.points, self.roles,
                                                                                        self.servers)],
                "closed_loop": self.closed_loop, "think_ms": self.think_ms,
                "search": None if s is None else {"max_rate_rps": s.max_rate_rps, "max_concurrency": s.max_concurrency,
                                                  "words": s.words(),
                                                  "failing_rate_rps": s.failing.rate_rps if s.failing else None,
                                                  "failing_concurrency": s.failing.concurrency if s.failing else None,
                                                  "verdict": s.point.verdict if s.point else None},
                "bound": None if self.bound is None else vars(self.bound) | {"critical_stages":
                                                                             list(self.bound.critical_stages)},
                "single_call_ms": self.single_call_ms, "agreement": self.agreement,
                "served_set": {"varied": self.varied, "set_size": max((s["set_size"] for s in self.served_sets),
                                                                      default=None),
                               "shapes": self.shapes, "graph_captures": self.graph_captures,
                               "graph_eager": self.graph_eager}}


def load_curves(records: list[CallRecord]) -> list[LoadCurve]:
    """Every (workload, target, scenario)'s load points, in the order they were measured. A served
    request's `extra.serving` (and its `point`: the load point's facts) is read as it goes."""
    points: dict[tuple, list[CallRecord]] = defaultdict(list)
    for r in records:
        if r.phase not in SERVING_PHASES:
            continue
        s = r.extra.get("serving") or {}
        facts = s.get("point") or {}
        closed = facts.get("concurrency") is not None
        key = (workload_label(r), target_label(r), facts.get("scenario", r.phase), closed, r.run_id,
               facts.get("point", 0))
        points[key].append(r)
    curves: dict[tuple, LoadCurve] = {}
    shapes: dict[tuple, set] = defaultdict(set)
    for (workload, target, scenario, closed, _run, _k), recs in points.items():
        shapes[(workload, target, scenario, closed)].update(record_shape(r) for r in recs)
        facts = recs[0].extra["serving"]["point"]
        curve = curves.setdefault((workload, target, scenario, closed), LoadCurve(
            workload, target, scenario, float(facts.get("percentile", 99.0)) / 100.0, facts.get("slo_ms"),
            agreement=_agreement_dict(recs),
            closed_loop=closed, think_ms=facts.get("think_ms") if closed else None))
        curve.points.append(point_summary(recs))
        curve.roles.append(str(facts.get("role", "fixed")))
        curve.servers.append(str(facts.get("server", "?")))
    for key, curve in curves.items():
        curve.shapes = len(shapes[key])
    return list(curves.values())


def served_cells(facts: dict | None) -> tuple[str, str]:
    """A point's or stream's distinct pass shapes and graph captures while measured, as report
    cells ("—": not counted — records before the facts, or a target without graphs); the passes
    that ran eagerly beside the captures where there were any ("3 (12 eager)")."""
    if not facts:
        return "—", "—"
    captures = facts.get("graph_captures")
    if captures is None:
        return str(facts["shapes"]), "—"
    eager = facts.get("graph_eager") or 0
    return str(facts["shapes"]), f"{captures} ({eager} eager)" if eager else str(captures)


def eager_words(eager: int | None) -> str:
    """The passes a curve ran eagerly while measured, in words ("" where none did)."""
    if not eager:
        return ""
    return (f"; {eager} pass{'es' if eager != 1 else ''} run eagerly (outside every graph bucket, past the "
            "graph budget or a failed capture)")


def _agreement_dict(recs: list[CallRecord]) -> dict | None:
    """The first record's `agreement` that has one, as plain values (the curve's JSON)."""
    return next((msgspec.to_builtins(r.agreement) for r in recs if r.agreement is not None), None)


def record_shape(record: CallRecord) -> tuple:
    """The pass shape a served request's record ran (dohnuts.bench.measure.serving.variety.pass_shape)."""
    return pass_shape(work_of(record))


def point_summary(recs: list[CallRecord]) -> PointSummary:
    """One load point summarised from its records (module docstring)."""
    facts = recs[0].extra["serving"]["point"]
    times = [r.extra["serving"] for r in recs]
    rules = facts.get("rules") or {}
    rate = facts.get("rate_rps")
    first_byte = [(t["first_byte_ms"] - t["arrival_ms"]) for t in times if "first_byte_ms" in t]
    percentiles = [float(p) / 100 for p in facts.get("metric_percentiles") or [100 * p for p in METRIC_PERCENTILES]]
    summary = summarize_point(
        math.inf if rate is None else float(rate), [t["latency_ms"] / 1e3 for t in times],
        [t["queue_ms"] / 1e3 for t in times], [t["service_ms"] / 1e3 for t in times],
        offered=int(facts.get("offered", len(recs))), dropped=int(facts.get("dropped", 0)),
        abandoned=int(facts.get("abandoned", 0)), duration_s=float(facts.get("duration_s", 0.0)),
        percentile=float(facts.get("percentile", 99.0)) / 100.0, slo_ms=facts.get("slo_ms"),
        rules=Rules(int(rules.get("min_requests", 1)), float(rules.get("min_duration_s", 0.0))),
        stopped=bool(facts.get("stopped", False)),
        concurrency=int(facts["concurrency"]) if facts.get("concurrency") is not None else None,
        first_byte_s=[x / 1e3 for x in first_byte] if len(first_byte) == len(times) else None,
        metric_percentiles=percentiles)
    gate = [x for r in recs[:1] if r.validity is not None and not r.validity.valid for x in r.validity.reasons]
    extra = {"first_byte_p50_ms": quantiles(first_byte, [0.5])[0] if first_byte else None,
             "arrivals": facts.get("arrivals"), "queue": facts.get("queue"), "served_set": facts.get("served_set")}
    if gate:
        return replace(summary, valid=False, reasons=summary.reasons + tuple(gate), extra=extra)
    return replace(summary, extra=extra)


def attach_bounds(curves: list[LoadCurve], analysis, records: list[CallRecord]) -> None:
    """Each curve's floor and ceiling from the target's single calls in `analysis` (an Analysis of
    this run's per-call records), and its single call's median wall time."""
    groups = {(g.workload, g.target): g for g in (analysis.groups if analysis is not None else ())}
    for c in curves:
        g = groups.get((c.workload, c.target))
        if g is None:
            continue
        basis = "measured" if "measured" in g.bases else g.bases[0]
        b = g.call.bound[basis]
        c.bound = Bound(basis, b.latency_ms, 1e3 / b.critical_ms if b.critical_ms > 0 else None,
                        tuple(b.critical_stages))
        c.single_call_ms = g.call.wall_ms


@dataclass(frozen=True)
class StreamScenario:
    workload: str
    target: str
    requests: int
    total_ms: float
    throughput_rps: float
    latency_p50_ms: float
    latency_p99_ms: float
    rules: dict
    valid: bool
    reasons: tuple[str, ...]
    served_set: dict | None = None  # dohnuts.bench.measure.serving.variety.ServedFacts (None: records before them)


def stream_scenarios(records: list[CallRecord]) -> list[StreamScenario]:
    """The stream scenario's runs (records `phase: stream` stamped with their rules)."""
    groups: dict[tuple, list[CallRecord]] = defaultdict(list)
    for r in records:
        s = r.extra.get("serving")
        if r.phase == "stream" and isinstance(s, dict) and s.get("scenario") == "stream":
            groups[(workload_label(r), target_label(r), r.run_id)].append(r)
    out = []
    for (workload, target, _run), recs in groups.items():
        rules = recs[0].extra["serving"].get("rules") or {}
        streams = [extra_part(r, "stream", StreamTimes) for r in recs]
        total = streams[0].total_ms
        lat = [s.latency_ms for s in streams]
        reasons = []
        if len(recs) < rules.get("min_requests", 0):
            reasons.append(f"{len(recs)} requests < the minimum {rules['min_requests']}")
        if total / 1e3 < rules.get("min_duration_s", 0):
            reasons.append(f"{total / 1e3:.3g} s < the minimum {rules['min_duration_s']:g} s")
        out.append(StreamScenario(workload, target, len(recs), total, len(recs) / (total / 1e3),
                                  *quantiles(lat, [0.5, 0.99]), rules, not reasons, tuple(reasons),
                                  recs[0].extra["stream"].get("served_set")))
    return out


@dataclass(frozen=True)
class QualityRow:
    workload: str
    target: str
    adapter: str | None
    single_call_ms: float | None
    decisions_per_s: float | None
    accuracy: dict | None  # {"set", "questions", "correct", "value", "low", "high"}
    agreement: dict | None


def quality_rows(records: list[CallRecord]) -> list[QualityRow]:
    """Per (workload, target): accuracy, the reference check and the single calls' speed."""
    steady: dict[tuple, list[CallRecord]] = defaultdict(list)
    accuracy: dict[tuple, list[CallRecord]] = defaultdict(list)
    agreement: dict[tuple, dict] = {}
    for r in records:
        key = (workload_label(r), target_label(r))
        if r.phase == "steady":
            steady[key].append(r)
        elif r.phase == "accuracy":
            accuracy[key].append(r)
        if r.agreement is not None:
            agreement.setdefault(key, msgspec.to_builtins(r.agreement))
    out = []
    for key in dict.fromkeys([*steady, *accuracy, *agreement]):
        recs = steady.get(key, [])
        wall = median(r.wall_ms for r in recs) if recs else None
        decisions = median(r.decisions for r in recs) if recs else None
        acc = None
        if accuracy.get(key):
            counts = [r.extra["accuracy"] for r in accuracy[key]]
            right, total = sum(c["correct"] for c in counts), sum(c["questions"] for c in counts)
            low, high = wilson_interval(right, total)
            acc = {"set": counts[0].get("set"), "questions": total, "correct": right,
                   "value": right / total if total else None, "low": low, "high": high}
        sample = (recs or accuracy.get(key) or [None])[0]
        adapter = sample.target_options.get("adapter") if sample is not None else None
        out.append(QualityRow(key[0], key[1], adapter, wall, decisions / wall * 1e3 if wall else None, acc,
                              agreement.get(key)))
    return [q for q in out if q.accuracy is not None or q.agreement is not None]
