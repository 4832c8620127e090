"""The conditions a run measured in, for its report: how busy the machine was and how steady the
ceilings measured at the start of the run were. (What a CPU run can and cannot show opens the
report: dohnuts.bench.analysis.headline.)

Load: the `load` telemetry of every record (dohnuts_bench_plugins.analyzers.load: the cores other
processes kept busy during the call, the load average) and the machine as the run found it
(`measured["machine"]`). Where other processes used more than `BUSY_OTHERS` cores while a
workload was measured, its times are slowed and spread by them: the report warns.

Ceilings: each measured ceiling keeps the rate of every repeat (`repeat_values`) and its spread
(dohnuts_bench_plugins.analyzers.microbench.stability); one that moved by more than its `STABLE_SPREAD`
between repeats is flagged, and so are the efficiencies it bounds.

Everything is read from the records and run.json's `measured`, so `dohnuts-bench analyze` says it
again for any run (runs recorded before the load sampler simply have no load).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from rich.text import Text

from dohnuts.bench.analysis.records import CallRecord, Device, group_key
from dohnuts.bench.analysis.render import Col, FitTable
from dohnuts.schema import printable

BUSY_OTHERS = 0.25  # cores other processes used while measuring, above which the report warns


@dataclass(frozen=True)
class GroupLoad:
    """Other processes' load while one workload · target was measured."""

    workload: str
    target: str
    samples: int
    others_cores_median: float
    others_cores_max: float
    load1_max: float | None
    own_cores_median: float | None = None  # this process's share (1.0: a whole core)


@dataclass(frozen=True)
class CeilingStability:
    name: str
    value: float
    unit: str
    repeats: int
    spread: float | None  # (fastest − slowest) / fastest over its repeats; None: not recorded
    stable: bool | None


@dataclass(frozen=True)
class MachineConditions:
    device_type: str
    device: str
    cpus: int | None
    threads: int | None
    before: dict | None  # {"others_cores", "load1", "cpus", "seconds"} when the run started
    groups: tuple[GroupLoad, ...]
    ceilings: tuple[CeilingStability, ...]
    warnings: tuple[str, ...]
    # run.json `measured.timing` (dohnuts.bench.measure.run_clock.RunClock): seconds from the process's
    # start; None for runs made before it was kept
    timing: dict | None = None
    cpu_model: str | None = None  # run.json `measured.machine.cpu_model`; None for runs made before it was kept

    @property
    def unstable(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.ceilings if c.stable is False)

    def to_dict(self) -> dict:
        return asdict(self) | {"unstable_ceilings": list(self.unstable)}


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def group_loads(records: list[CallRecord]) -> list[GroupLoad]:
    """Per workload · target, the `load` telemetry of its calls (records without it: none)."""
    per: dict[tuple[str, str], list[tuple[float, float | None, float | None]]] = {}
    for rec in records:
        for row in rec.telemetry:
            reading = row.get("load") if isinstance(row, dict) else None
            others = _number(reading.get("others_cores")) if isinstance(reading, dict) else None
            if others is not None:
                per.setdefault(group_key(rec), []).append(
                    (others, _number(reading.get("load1")), _number(reading.get("own_cores"))))
    out = []
    for (workload, target), rows in per.items():
        others = [o for o, _, _ in rows]
        loads = [la for _, la, _ in rows if la is not None]
        own = [x for _, _, x in rows if x is not None]
        out.append(GroupLoad(workload, target, len(rows), statistics.median(others), max(others),
                             max(loads) if loads else None, statistics.median(own) if own else None))
    return out


def ceiling_stability(ceilings: dict) -> list[CeilingStability]:
    out = []
    for name, entry in sorted((ceilings or {}).items()):
        if not isinstance(entry, dict) or _number(entry.get("value")) is None:
            continue
        stable = entry.get("stable")
        out.append(CeilingStability(name, float(entry["value"]), str(entry.get("unit", "")),
                                    len(entry.get("repeat_values") or ()), _number(entry.get("spread")),
                                    stable if isinstance(stable, bool) else None))
    return out


def machine_conditions(records: list[CallRecord], measured: dict | None) -> MachineConditions:
    measured = measured or {}
    device = records[0].device if records else Device(name="?", type="?")
    machine = measured.get("machine") if isinstance(measured.get("machine"), dict) else {}
    before = machine.get("before") if isinstance(machine.get("before"), dict) else None
    groups = tuple(group_loads(records))
    ceilings = tuple(ceiling_stability(measured.get("ceilings") or {}))
    cpus = machine.get("cpus") if isinstance(machine.get("cpus"), int) else None
    threads = machine.get("threads")
    warnings = []
    busy = [g for g in groups if g.others_cores_median > BUSY_OTHERS]
    if busy:
        warnings.append("other processes kept cores busy while these were measured (median cores): "
                        + ", ".join(f"{g.workload} · {g.target} {g.others_cores_median:.2f}" for g in busy)
                        + "; their times are slowed and spread by them — measure on a quiet machine to compare")
    unstable = [c for c in ceilings if c.stable is False]
    if unstable:
        warnings.append("ceiling(s) " + ", ".join(f"{c.name} (moved {c.spread:.0%} between its {c.repeats} repeats)"
                                                  for c in unstable)
                        + " not stable: the bounds and efficiencies they set are uncertain by as much")
    return MachineConditions(str(device.type), device.name, cpus,
                             threads if isinstance(threads, int) else None, before, groups, ceilings, tuple(warnings),
                             timing_of(measured.get("timing")),
                             machine["cpu_model"] if isinstance(machine.get("cpu_model"), str) else None)


def timing_of(t) -> dict | None:
    """The run's milestones, only the well-formed ones: {"prepared_s", "measured_s", "workloads":
    {name: {"first_result_s", "last_result_s", "spent_s": {phase: s}, "targets_s": {label: {phase:
    s}}}}} (the phases: dohnuts.bench.measure.run_clock.spent)."""
    if not isinstance(t, dict):
        return None

    def seconds(x) -> float | None:
        v = _number(x)
        return v if v is not None and math.isfinite(v) and v >= 0 else None

    def phases(x) -> dict:
        return {str(k): v for k, p in x.items() if (v := seconds(p)) is not None} if isinstance(x, dict) else {}

    def workload(w: dict) -> dict:
        out = {k: v for k in ("first_result_s", "last_result_s") if (v := seconds(w.get(k))) is not None}
        if own := phases(w.get("spent_s")):
            out["spent_s"] = own
        targets = w.get("targets_s") if isinstance(w.get("targets_s"), dict) else {}
        if by_target := {str(n): p for n, x in targets.items() if (p := phases(x))}:
            out["targets_s"] = by_target
        return out

    out: dict = {k: v for k in ("prepared_s", "measured_s") if (v := seconds(t.get(k))) is not None}
    workloads = t.get("workloads") if isinstance(t.get("workloads"), dict) else {}
    out["workloads"] = {str(n): workload(w) for n, w in workloads.items() if isinstance(w, dict)}
    return out if len(out) > 1 or out["workloads"] else None


def time_spent(t: dict | None) -> tuple[dict[str, float], list[tuple[str, str, str, float]]]:
    """From `timing_of`: seconds by phase over the whole run (largest first), and every
    (workload, target or "", phase, seconds), largest first."""
    items = []
    for name, w in (t or {}).get("workloads", {}).items():
        items += [(name, "", p, v) for p, v in w.get("spent_s", {}).items()]
        items += [(name, label, p, v) for label, x in w.get("targets_s", {}).items() for p, v in x.items()]
    totals: dict[str, float] = {}
    for *_, p, v in items:
        totals[p] = totals.get(p, 0.0) + v
    return (dict(sorted(totals.items(), key=lambda kv: -kv[1])), sorted(items, key=lambda i: -i[3]))


def timing_line(t: dict | None) -> str | None:
    """One sentence: what a user waits for from the process's start (a fresh machine compiles, and
    may tune, at each first call), and where the measuring time went."""
    if not t:
        return None
    parts = []
    for name, w in t["workloads"].items():
        if "first_result_s" in w:
            parts.append(f"{name} {w['first_result_s']:.1f} s")
    said = [f"ceilings measured by {t['prepared_s']:.1f} s"] if "prepared_s" in t else []
    said += [f"first result of each workload at: {', '.join(parts)}"] if parts else []
    said += [f"all measured by {t['measured_s']:.1f} s"] if "measured_s" in t else []
    totals, items = time_spent(t)
    if totals:
        said.append("spent on: " + ", ".join(f"{p} {v:.1f} s" for p, v in totals.items()))
        said.append("the longest: " + ", ".join(f"{' · '.join(x for x in (w, label) if x)} {p} {v:.1f} s"
                                                for w, label, p, v in items[:3]))
    return "Time from the process's start: " + "; ".join(said) + "." if said else None


NO_LOAD = "Load: not recorded by this run (recorded since the `load` telemetry)."


def opening_lines(c: dict) -> list[str]:
    """The section's sentences before its tables, from `MachineConditions.to_dict()` (summary.json's
    `machine` section, which the HTML report reads): a CPU run's scope, the load the run started
    under, or that no load was recorded."""
    lines = []
    if c.get("device_type") == "cpu":
        cores = f" of {c['cpus']} cores" if c.get("cpus") else ""
        lines.append(f"{c.get('device', '?')}: a CPU run with {c.get('threads') or '?'} torch thread(s){cores} "
                     "(dohnuts-bench run --threads); what a CPU run can and cannot show opens the report (the "
                     "headline).")
    elif c.get("cpu_model"):  # a GPU run: its host stages and any host-bound target follow this CPU
        cores = f", {c['cpus']} logical cores" if c.get("cpus") else ""
        lines.append(f"The host: {printable(str(c['cpu_model']))}{cores}. Host stages (prepare, serialize) and "
                     "a host-bound target's calls follow this CPU: compare them only with runs on the same one.")
    before = c.get("before") if isinstance(c.get("before"), dict) else None
    if before:
        others, load1 = _number(before.get("others_cores")), _number(before.get("load1"))
        lines.append("When the run started, other processes kept "
                     + ("? cores" if others is None else f"{others:.2f} cores") + " busy"
                     + ("" if load1 is None else f" (load average {load1:.2f})") + ".")
    if not c.get("groups") and before is None:
        lines.append(NO_LOAD)
    return lines


STABLE_WORDS = {None: "—", True: "yes", False: "NO: moved"}  # a ceiling's `stable`, as both reports say it


def machine_renderables(c: MachineConditions) -> list:
    """The report's section: the load, the ceilings' stability, the warnings."""
    parts: list = [Text("This run's machine", style="bold")]
    parts += [Text(line) for line in opening_lines(c.to_dict())]
    if c.groups:
        t = FitTable("Load while measuring: cores kept busy by other processes (telemetry `load`)",
                     [Col("workload", "left", wrap=True), Col("target", "left", wrap=True), Col("samples"),
                      Col("others median"), Col("others max"), Col("this process"), Col("load avg max")], sections=1)
        for g in c.groups:
            t.add_row(g.workload, g.target, str(g.samples), f"{g.others_cores_median:.2f}", f"{g.others_cores_max:.2f}",
                      "—" if g.own_cores_median is None else f"{g.own_cores_median:.2f}",
                      "—" if g.load1_max is None else f"{g.load1_max:.2f}")
        parts.append(t)
    if c.ceilings:
        t = FitTable("Measured ceilings and their stability (spread = (fastest − slowest) / fastest over the repeats)",
                     [Col("ceiling", "left", wrap=True), Col("value"), Col("unit", "left"), Col("repeats"),
                      Col("spread"), Col("stable", "center")])
        for s in c.ceilings:
            flag = Text(STABLE_WORDS[s.stable], style={True: "green", False: "red"}.get(s.stable, ""))
            t.add_row(s.name, f"{s.value:.3g}", s.unit, str(s.repeats or "—"),
                      "—" if s.spread is None else f"{s.spread:.1%}", flag)
        parts.append(t)
    if line := timing_line(c.timing):
        parts.append(Text(line))
    parts += [Text(f"warning: {w}", style="yellow") for w in c.warnings]
    return parts
