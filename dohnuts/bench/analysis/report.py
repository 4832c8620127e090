"""From raw JSONL records to an Analysis: per workload and target, per stage and per call.

Records are grouped by (workload name, target). Per record: the stage costs of its WorkCounts
(cost.py) and their bounds under the hwspec's datasheet ceilings and, when the spec has them
for the run's precision, its measured ceilings (bounds.py). Per group and stage: the median
measured time (device time when recorded, else host time), the median bound, efficiency =
median bound / median measured (never above 100 %: a measurement faster than its bound leaves the
efficiency empty and says why in `suspect`: bounds.shown_efficiency), the limiter, the 80%-target
verdict. Per call: stage medians
combined over the pipeline graph (sum, max, critical path, single-call latency) for bounds
and for measurements, the median wall time, whole-call efficiency = critical-path bound /
measured wall, decisions per second measured and at the bound, and the useful / padded /
repeated tokens and FLOPs. Stages without a cost model (CPU preparation, serialization) are
reported with their measurements and bound 0: no analytic bound exists for them. On a CPU the
host-to-device and device-to-host stages are not transfers (host and device memory are one): they
get no bound either (`NOT_A_TRANSFER`), never one a copy in the same memory beats.

When a target times one `forward` interval and none of prefix / suffix / head (the training
step, a peer implementation), those cost stages are folded into `forward` so the comparison is
like for like.

A group must not mix precisions or model architectures (that would average different
experiments); it may pool several runs of the same workload.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dohnuts.bench.analysis.bounds import CallBounds, combine, shown_efficiency, stage_bound, target_verdict
from dohnuts.bench.analysis.cost import StageCost, allreduce_cost, call_totals, fold_stages, stage_costs, token_counts
from dohnuts.bench.analysis.critical_path import STAGE_RESOURCES, CallGraph, default_call_graph
from dohnuts.bench.analysis.hwspec import HwSpec
from dohnuts.bench.analysis.records import (
    DTYPE_BYTES, CallRecord, RecordError, group_key, lora_of, model_of, per_call_records, stage_ms, valid_records,
    where, work_of,
)
from dohnuts.bench.analysis.roofline import roofs
from dohnuts.schema import median

# A target that times one `forward` and none of prefix / suffix / head (the training step, a
# peer implementation) is compared with the bound of all of them together.
FOLDED_INTO_FORWARD = ("prefix", "suffix", "head", "forward")
# A call that runs its shared prefix and forked suffixes as one pass (`shared`, dohnuts'
# merged pass) is compared with the bound of the prefix and suffix work together.
FOLDED_INTO_SHARED = ("prefix", "suffix")
# Stages that move data over the host link; on a CPU, where host and device memory are one, they
# move nothing and have no bound.
TRANSFER_RESOURCES = ("h2d", "d2h")
NO_MODEL = "no model"  # a stage no cost model bounds (CPU preparation, serialization)
NOT_A_TRANSFER = "not a transfer"  # h2d / d2h of a CPU run


@dataclass(frozen=True)
class StageRow:
    stage: str
    resource: str
    measured_ms: float | None  # median over the group's calls; None when the stage was not timed
    bound_ms: dict[str, float]  # basis → median T_lower
    efficiency: dict[str, float | None]  # basis → bound / measured
    limiter: dict[str, str]  # basis → "compute (bf16_matrix)", "bandwidth (gddr6)", "—"
    verdict: dict[str, str | None]  # basis → meets / misses / bound-suspect (bounds.target_verdict)
    useful_flops: dict[str, float]  # kind → FLOP (median call)
    padded_flops: float
    repeated_flops: float
    useful_bytes: float  # device memory
    link_bytes: float  # host link
    modelled: bool  # False: no bound for this stage (bound 0, measured only); `unbounded` says why
    notes: tuple[str, ...] = ()
    # basis → why no efficiency is shown: the measurement beat the bound (bounds.shown_efficiency)
    suspect: dict[str, str] = dataclasses.field(default_factory=dict)
    unbounded: str = ""  # NO_MODEL or NOT_A_TRANSFER when not modelled

    @property
    def intensity(self) -> float | None:
        """Useful FLOPs per necessary device byte (the roofline's x axis)."""
        total = sum(self.useful_flops.values())
        return total / self.useful_bytes if total and self.useful_bytes else None


@dataclass(frozen=True)
class CallRow:
    wall_ms: float  # median measured wall time of a call
    bound: dict[str, CallBounds]  # basis → stage bounds combined
    measured: CallBounds  # measured stage medians combined over the same graph
    efficiency: dict[str, float | None]  # basis → critical-path bound / wall (None above 100 %: `suspect`)
    verdict: dict[str, str | None]  # basis → bounds.target_verdict of the whole call
    decisions: float  # median decisions per call
    decisions_per_s: float | None  # measured
    ceiling_decisions_per_s: dict[str, float | None]  # decisions / critical-path bound
    tokens: dict[str, float]  # useful, padded, repeated, recomputed (median call)
    flops: dict[str, float]  # useful, padded, repeated (median call, all stages)
    suspect: dict[str, str] = dataclasses.field(default_factory=dict)  # basis → why no efficiency is shown


@dataclass(frozen=True)
class GroupAnalysis:
    workload: str
    target: str
    precision: str
    device: str
    model: str
    calls: int
    runs: tuple[str, ...]
    # ("datasheet",), ("datasheet", "measured"[, "sustained"]) or ("measured",) (no datasheet spec)
    bases: tuple[str, ...]
    stages: tuple[StageRow, ...]
    call: CallRow
    graph: CallGraph
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Analysis:
    hwspec: HwSpec
    groups: tuple[GroupAnalysis, ...]
    warnings: tuple[str, ...] = ()

    def precisions(self) -> list[str]:
        """The precisions of its groups, in order (none: the spec's first, whose roofs the plot draws)."""
        return list(dict.fromkeys(g.precision for g in self.groups)) or self.hwspec.precisions()[:1]

    def to_dict(self) -> dict:
        """A JSON-serialisable summary (for the run's summary file; raw records stay the source)."""
        spec = self.hwspec
        return {
            "hwspec": {"name": spec.name, "source": spec.source, "target_fraction": spec.target_fraction,
                       "overlap_compute_kinds": spec.overlap_compute_kinds,
                       "ceilings": {c.name: {"kind": c.kind, "value": c.value, "unit": c.unit,
                                             "provenance": c.provenance, "factors": dict(c.factors),
                                             "source": c.source, "date": c.date} for c in spec.ceilings.values()}},
            "groups": [_group_dict(g) for g in self.groups],
            # per precision the roofs the roofline draws (dohnuts.bench.analysis.roofline), PNG and page alike
            "rooflines": {p: roofs(spec, p) for p in self.precisions()},
            "warnings": list(self.warnings),
        }


def _group_dict(g: GroupAnalysis) -> dict:
    c = g.call
    return {
        "workload": g.workload, "target": g.target, "precision": g.precision, "device": g.device,
        "model": g.model, "calls": g.calls, "runs": list(g.runs), "bases": list(g.bases),
        "stages": [dataclasses.asdict(r) | {"intensity": r.intensity} for r in g.stages],
        "call": {"wall_ms": c.wall_ms, "bound": {b: dataclasses.asdict(x) for b, x in c.bound.items()},
                 "measured": dataclasses.asdict(c.measured), "efficiency": c.efficiency,
                 "suspect": c.suspect, "verdict": c.verdict, "decisions": c.decisions, "decisions_per_s": c.decisions_per_s,
                 "ceiling_decisions_per_s": c.ceiling_decisions_per_s, "tokens": c.tokens, "flops": c.flops},
        "graph": {"stages": [list(s) for s in g.graph.stages],
                  "dependencies": [dataclasses.asdict(d) for d in g.graph.dependencies]},
        "warnings": list(g.warnings),
    }


def analyze_records(records: list[CallRecord], hwspec: HwSpec, *, buffers: int = 2) -> Analysis:
    """Analyse records (`read_records`' output) against `hwspec`."""
    groups: dict[tuple[str, str], list[CallRecord]] = {}
    records = per_call_records(records)  # load points and the accuracy mode: dohnuts.bench.analysis.serving
    records, dropped = valid_records(records)  # calls on a throttled or down-clocked GPU
    for rec in records:
        groups.setdefault(group_key(rec), []).append(rec)
    out = [_group(key, recs, hwspec, buffers) for key, recs in groups.items()]
    warnings = tuple(w for g in out for w in g.warnings)
    if dropped:
        warnings += (f"{dropped} call(s) left out: the GPU was throttling or below its clock threshold "
                     "(see each record's `validity`)",)
    return Analysis(hwspec, tuple(out), warnings)


def _group(key: tuple[str, str], recs: list[CallRecord], spec: HwSpec, buffers: int) -> GroupAnalysis:
    workload, target = key
    first = recs[0]
    precision, model = first.precision, model_of(first)
    for rec in recs[1:]:
        if rec.precision != precision:
            raise RecordError(f"mixes precisions {precision!r} and {rec.precision!r} in workload {workload!r} "
                              f"({target})", source=where(rec), field="precision")
        if model_of(rec).config_hash() != model.config_hash():
            raise RecordError(f"mixes model architectures in workload {workload!r} ({target})", source=where(rec),
                              field="model")
    warnings = []
    device = first.device.name
    if first.device.type == "cpu" and spec.roles:  # (a spec measured on this CPU does apply)
        warnings.append(f"{workload} ({target}): a CPU run analysed against {spec.name}: the bounds do not apply")
    elif spec.device_names and not spec.matches(device):
        warnings.append(f"{workload} ({target}): device {device!r} is not one {spec.name} describes")
    bases = spec.bases(precision)
    if not bases:
        raise RecordError(f"is {precision!r}, for which hwspec {spec.name} has no roles", source=where(first),
                          field="precision")
    lora = lora_of(first)

    # On a CPU host and device memory are one: h2d / d2h copy nothing, and no link bounds them.
    one_memory = first.device.type == "cpu"
    timed = {n for r in recs for n in r.stages}
    fold = "forward" in timed and not timed & set(FOLDED_INTO_FORWARD[:-1])
    costs: list[dict[str, StageCost]] = []
    for rec in recs:
        try:
            c = stage_costs(model, work_of(rec), DTYPE_BYTES[precision], lora)
        except ValueError as exc:
            raise RecordError(str(exc), source=where(rec), field="work") from None
        c = fold_stages(c, "forward", FOLDED_INTO_FORWARD) if fold else c
        c = fold_stages(c, "shared", FOLDED_INTO_SHARED) if "shared" in timed else c
        if one_memory:
            c = {n: x for n, x in c.items() if x.resource not in TRANSFER_RESOURCES}
        grad_bytes = rec.extra.get("allreduce_bytes")  # a collective train step's gradients (extra: the target's)
        if rec.world_size > 1 and isinstance(grad_bytes, (int, float)) and not isinstance(grad_bytes, bool):
            c = c | {"allreduce": allreduce_cost(grad_bytes, rec.world_size)}
        costs.append(c)
    if any("allreduce" in c for c in costs):
        missing = [b for b in bases if not spec.has_role("interconnect", precision, b)]
        if missing:
            warnings.append(f"{workload} ({target}): hwspec {spec.name} has no interconnect ceiling "
                            f"({', '.join(missing)} basis): the all-reduce stage is not bounded there")
    names = list(dict.fromkeys([n for c in costs for n in c] + [n for r in recs for n in r.stages]))
    known = {s for s, _ in STAGE_RESOURCES}
    unknown = [n for n in names if n not in known]
    if unknown:
        warnings.append(f"{workload} ({target}): stage(s) {', '.join(unknown)} have no cost model; "
                        "placed on the host before h2d")
    graph = default_call_graph(names, buffers=buffers)
    resource = dict(graph.stages)

    rows, measured_med, bound_med = [], {}, {b: {} for b in bases}
    for name in graph.names:
        times = [stage_ms(r.stages[name]) for r in recs if name in r.stages]
        measured = median(times) if times else None
        have = [c[name] for c in costs if name in c]
        bound = {b: median(stage_bound(c, spec, precision, b).ms for c in have) if have else 0.0 for b in bases}
        # The representative call (median datasheet bound) names the limiter and the FLOP split.
        mid = sorted(have, key=lambda c: stage_bound(c, spec, precision, bases[0]).ms)[len(have) // 2] if have else None
        limiter = {b: stage_bound(mid, spec, precision, b).describe() if mid else "—" for b in bases}
        shown = {b: shown_efficiency(bound[b], measured, limiter[b]) if have else (None, None) for b in bases}
        rows.append(StageRow(
            stage=name, resource=resource[name], measured_ms=measured, bound_ms=bound,
            efficiency={b: shown[b][0] for b in bases},
            limiter=limiter,
            verdict={b: target_verdict(measured, bound[b], spec.target_fraction) if have else None for b in bases},
            useful_flops=mid.useful.kinds() if mid else {},
            padded_flops=median(c.padded.total_flops for c in have) if have else 0.0,
            repeated_flops=median(c.repeated.total_flops for c in have) if have else 0.0,
            useful_bytes=median(c.useful.device_bytes for c in have) if have else 0.0,
            link_bytes=median(c.useful.link_bytes for c in have) if have else 0.0,
            modelled=bool(have), notes=mid.notes if mid else (),
            suspect={b: why for b, (_, why) in shown.items() if why},
            unbounded="" if have else (NOT_A_TRANSFER if one_memory and resource[name] in TRANSFER_RESOURCES
                                       else NO_MODEL)))
        for b, why in rows[-1].suspect.items():  # a lower bound above a measurement is a wrong bound
            warnings.append(f"{workload} ({target}): stage {name} is bound-suspect against its {b} bound: {why}")
        if measured is not None:
            measured_med[name] = measured
        for b in bases:
            bound_med[b][name] = bound[b]
    call = _call_row(recs, costs, graph, bases, measured_med, bound_med, spec)
    for b, why in call.suspect.items():
        warnings.append(f"{workload} ({target}): the whole call is bound-suspect against its {b} bound: {why}")
    return GroupAnalysis(workload, target, precision, device, model.name, len(recs),
                         tuple(sorted({r.run_id for r in recs})), bases, tuple(rows), call, graph,
                         tuple(warnings))


def _call_row(recs, costs, graph, bases, measured_med, bound_med, spec) -> CallRow:
    wall = median(r.wall_ms for r in recs)
    decisions = median(float(r.decisions or 0) for r in recs)
    bound = {b: combine(bound_med[b], graph) for b in bases}
    shown = {b: shown_efficiency(bound[b].critical_ms, wall, "critical path") for b in bases}
    eff = {b: shown[b][0] for b in bases}
    works = [work_of(r) for r in recs]
    tokens = [token_counts(w) for w in works]
    totals = [call_totals(c) for c in costs]
    return CallRow(
        wall_ms=wall, bound=bound, measured=combine(measured_med, graph), efficiency=eff,
        verdict={b: target_verdict(wall, bound[b].critical_ms, spec.target_fraction) for b in bases},
        decisions=decisions, decisions_per_s=decisions / wall * 1e3 if wall > 0 else None,
        ceiling_decisions_per_s={b: decisions / bound[b].critical_ms * 1e3 if bound[b].critical_ms > 0 else None
                                 for b in bases},
        tokens={"useful": median(t["useful"] for t in tokens), "padded": median(t["padded"] for t in tokens),
                "repeated": median(t["repeated"] for t in tokens),
                "recomputed": median(w.recomputed_tokens for w in works)},
        flops={k: median(t[k].total_flops for t in totals) for k in ("useful", "padded", "repeated")},
        suspect={b: why for b, (_, why) in shown.items() if why})
