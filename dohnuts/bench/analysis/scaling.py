"""Scaling over process counts: throughput per count, speedup and efficiency against one process,
the all-reduce and the load imbalance that explain what is missing.

Records of one workload and target measured at several `world_size`s (a workload's `processes:
[1, 2, ...]`, dohnuts.bench.launchers) are set side by side, from steady-state calls that passed
the validity gates:

- *collective* calls (`shard: collective`, the train step: the ranks share each update): call i
  of every rank is the same update, which ends when the slowest rank ends, so its time is the
  maximum over ranks; throughput = 1 / median of those (updates/s). Load imbalance is the median
  over updates of max − min over ranks of (wall − all-reduce): the time the fastest rank waits in
  the all-reduce for the slowest.
- *data-parallel* calls (`shard: data`, prediction: every rank its own requests): the ranks run
  side by side, so throughput = Σ over ranks of 1 / median wall (requests/s). Load imbalance is
  max − min over ranks of the median wall.
- the pipelined stream (records `phase: stream`), when measured: Σ over ranks of requests / the
  slowest rank's stream time.

Speedup = throughput / throughput at one process; efficiency = speedup / processes (1.0 is
perfect scaling). A count without a one-process measurement in the same records gets neither.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from dohnuts.bench.analysis.records import CallRecord, StreamTimes, extra_part, stage_ms, target_label, valid_records
from dohnuts.bench.analysis.render import Col, FitTable
from dohnuts.bench.analysis.roofline import plot_text, save_png
from dohnuts.schema import median


@dataclass(frozen=True)
class ScalingRow:
    workload: str
    target: str
    processes: int
    unit: str  # "update" | "request"
    per_s: float  # units per second, all processes together
    decisions_per_s: float
    speedup: float | None  # per_s / per_s at 1 process
    efficiency: float | None  # speedup / processes
    allreduce_ms: float | None  # median all-reduce stage (collective calls)
    imbalance_ms: float | None
    stream_per_s: float | None
    calls: int  # steady records used (all ranks)

    def to_dict(self) -> dict:
        return asdict(self)


def scaling_rows(records: list[CallRecord]) -> list[ScalingRow]:
    """One row per (workload, target, processes); empty when every record is one process and no
    workload was measured at several counts."""
    records, _ = valid_records(records)
    steady: dict[tuple[str, str], dict[int, list[CallRecord]]] = defaultdict(lambda: defaultdict(list))
    stream: dict[tuple[str, str], dict[int, list[CallRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        key = (r.workload.name, target_label(r))
        if r.phase == "steady":
            steady[key][r.world_size].append(r)
        elif r.phase == "stream":
            stream[key][r.world_size].append(r)
    if not any(n > 1 for counts in steady.values() for n in counts):
        return []
    rows = []
    for key, counts in steady.items():
        base = None
        for n in sorted(counts):
            row = _row(key, n, counts[n], stream.get(key, {}).get(n, []))
            if n == 1:
                base = row.per_s
            if base:
                speedup = row.per_s / base
                row = ScalingRow(**(row.to_dict() | {"speedup": speedup, "efficiency": speedup / n}))
            rows.append(row)
    return rows


def _by_rank(recs: list[CallRecord]) -> dict[int, list[CallRecord]]:
    out: dict[int, list[CallRecord]] = defaultdict(list)
    for r in recs:
        out[r.rank].append(r)
    return out


def _allreduce(r: CallRecord) -> float:
    st = r.stages.get("allreduce")
    return stage_ms(st) if st else 0.0


def _row(key: tuple[str, str], n: int, recs: list[CallRecord], streamed: list[CallRecord]) -> ScalingRow:
    ranks = _by_rank(recs)
    collective = any(r.shard == "collective" for r in recs)
    if collective:
        by_iter: dict[int, list[CallRecord]] = defaultdict(list)
        for r in recs:
            by_iter[r.iteration].append(r)
        complete = [v for v in by_iter.values() if len(v) == len(ranks)] or list(by_iter.values())
        per_call = median(max(r.wall_ms for r in v) for v in complete)
        per_s = 1e3 / per_call if per_call > 0 else 0.0
        decisions = median(sum(float(r.decisions or 0) for r in v) for v in complete)
        decisions_per_s = decisions * per_s
        allreduce = median(_allreduce(r) for r in recs) if any("allreduce" in r.stages for r in recs) else None
        imbalance = median(max(r.wall_ms - _allreduce(r) for r in v)
                            - min(r.wall_ms - _allreduce(r) for r in v) for v in complete) if n > 1 else None
        unit = "update"
    else:
        medians = {k: median(r.wall_ms for r in v) for k, v in ranks.items()}
        per_s = sum(1e3 / m for m in medians.values() if m > 0)
        decisions_per_s = sum(median(float(r.decisions or 0) for r in ranks[k]) * 1e3 / m
                              for k, m in medians.items() if m > 0)
        allreduce = None
        imbalance = (max(medians.values()) - min(medians.values())) if n > 1 else None
        unit = "request"
    stream_per_s = None
    if streamed:
        totals: dict[int, float] = {}
        counts: dict[int, int] = defaultdict(int)
        for r in streamed:
            s = extra_part(r, "stream", StreamTimes)
            if s is not None:
                totals[r.rank] = max(totals.get(r.rank, 0.0), s.total_ms)
            counts[r.rank] += 1
        slowest = max(totals.values(), default=0.0)
        if slowest > 0:
            stream_per_s = sum(counts.values()) / slowest * 1e3
    return ScalingRow(key[0], key[1], n, unit, per_s, decisions_per_s, None, None, allreduce, imbalance,
                      stream_per_s, len(recs))


def scaling_table(rows: list[ScalingRow]):
    """The rows as a table that fits any width (dohnuts.bench.analysis.render.FitTable)."""
    t = FitTable("Scaling: throughput by process count (one device each; efficiency = speedup / processes)",
                 [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("procs"),
                  Col("per s"), Col("unit", "left"), Col("speedup"), Col("efficiency"), Col("all-reduce\nms"),
                  Col("imbalance\nms"), Col("stream\nper s")],
                 sections=1, keys=2, groups=[(3, 4), (5, 6), (7,), (8,), (9,)], title_justify="center")

    def num(v, fmt, suffix=""):
        return "—" if v is None else format(v, fmt) + suffix

    for r in rows:
        t.add_row(r.workload, r.target, str(r.processes), f"{r.per_s:.4g}", r.unit + "s", num(r.speedup, ".2f", "×"),
                  num(r.efficiency, ".0%"), num(r.allreduce_ms, ".3g"), num(r.imbalance_ms, ".3g"),
                  num(r.stream_per_s, ".4g"))
    return t


def scaling_png(rows: list[ScalingRow], path: str | Path) -> Path | None:
    """Speedup against process count, one line per workload and target, beside perfect scaling."""
    lines: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r.speedup is not None:
            lines[(r.workload, r.target)].append((r.processes, r.speedup))
    if not lines:
        return None
    # matplotlib: only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure


    fig = Figure(figsize=(7, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    most = max(n for pts in lines.values() for n, _ in pts)
    ax.plot([1, most], [1, most], "--", color="grey", linewidth=1, label="perfect scaling")
    for i, ((workload, target), pts) in enumerate(sorted(lines.items())):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^Dv"[i % 5], color=f"C{i % 10}",
                label=plot_text(f"{workload} · {target}"))
    ax.set_xlabel("processes (one GPU each)")
    ax.set_ylabel("throughput / throughput at 1 process")
    ax.set_xticks(sorted({n for pts in lines.values() for n, _ in pts}))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)

    return save_png(fig, Path(path))
