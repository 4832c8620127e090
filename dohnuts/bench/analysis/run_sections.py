"""The built-in analysis of a run, as the sections of its report (dohnuts.bench.sections): the
headline that opens the report (dohnuts against its peer and against the measured bound, a CPU
run's scope: dohnuts.bench.analysis.headline); the efficiency analysis — per stage and whole
call, against the hwspec's datasheet and measured ceilings (dohnuts.bench.analysis.report) —;
scaling over process counts; the serving section (load points, the SLO search, the bound at load,
accuracy and the reference check: dohnuts.bench.analysis.serving); and the run's conditions (load,
the ceilings' stability: dohnuts.bench.analysis.machine). `dohnuts-bench run` and `analyze` call it
directly; analyzer plugins add their sections after these (`dohnuts_bench_analyze`)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from dohnuts.bench.analysis.headline import build_headline, headline_renderables
from dohnuts.bench.analysis.hwspec import HwSpec, compute_kinds_overlap, measured_hwspec, with_measured_ceilings
from dohnuts.bench.analysis.machine import machine_conditions, machine_renderables
from dohnuts.bench.analysis.render import analysis_tables
from dohnuts.bench.analysis.records import CallRecord
from dohnuts.bench.analysis.report import analyze_records
from dohnuts.bench.analysis.scaling import scaling_rows, scaling_table
from dohnuts.bench.analysis.serving import attach_bounds, load_curves, quality_rows, stream_scenarios
from dohnuts.bench.analysis.serving_render import serving_section
from dohnuts.bench.sections import Section


def run_sections(records: list[CallRecord], hwspec: HwSpec | None, measured: dict) -> list[Section]:
    """The built-in analysis of a run's records, as report sections: the headline (it leads), the
    efficiency (bounds against `hwspec`, or the ceilings `measured` at the run's start where no
    datasheet spec describes the device), scaling (several processes), serving and the machine's
    conditions. From its arguments alone, writing nothing: any run can be analysed again later (the
    plots are the built-in reporter's, bench_plugins/reporters)."""
    ceilings = (measured or {}).get("ceilings", {})
    device = records[0].device.name if records else "?"
    if hwspec is None:
        # No datasheet spec describes this device (the CPU, an unknown GPU): bound every stage by
        # what this machine measured at the start of the run, and say so.
        spec = measured_hwspec(device, ceilings, overlap_compute_kinds=compute_kinds_overlap(_device_info(records)))
        if spec is None:
            return [_headline(records, None, measured),
                    Section("efficiency", Text(f"efficiency: no hardware spec for device {device!r} and no measured "
                                               "ceilings in this run; pass --hwspec NAME or a path"))] + \
                _serving(records, None) + [_machine(records, measured)]
    else:
        spec = with_measured_ceilings(hwspec, ceilings)
    analysis = analyze_records(records, spec)
    origin = spec.source or "built in"
    if not spec.roles:  # synthesised: say how its compute kinds combine (compute_kinds_overlap)
        origin = ("ceilings measured at the start of this run; matrix and vector time "
                  + ("maximised (their units side by side)" if spec.overlap_compute_kinds else "added (their units shared)"))
    parts = [Text(f"{spec.name}: bounds and efficiency ({origin})", style="bold")]
    parts += analysis_tables(analysis)
    parts += [Text(f"warning: {w}", style="yellow") for w in analysis.warnings]
    return ([_headline(records, analysis, measured),
             Section("efficiency", Group(*parts), data=analysis.to_dict())]
            + _scaling(records) + _serving(records, analysis) + [_machine(records, measured)])


def _device_info(records: list[CallRecord]) -> dict:
    """The run's device as its records' provenance describes it (type, capability, hip, arch), or
    as far as the records' own device field says (older records)."""
    for r in records:
        info = (r.provenance or {}).get("device")
        if isinstance(info, dict) and info.get("type"):
            return info
    return {"type": records[0].device.type} if records else {}


def _headline(records, analysis, measured) -> Section:
    """The headline: per workload dohnuts against its peer and the measured bound (leads the report)."""
    headline = build_headline(records, analysis, measured)
    return Section("headline", Group(*headline_renderables(headline)), data=headline.to_dict(), leads=True)


def _serving(records, analysis) -> list:
    """The serving section, when the run has load points, a stream scenario, accuracy or a
    reference check; the efficiency analysis (None: no bounds) gives the bound at load."""
    curves = load_curves(records)
    attach_bounds(curves, analysis, records)
    section = serving_section(curves, stream_scenarios(records), quality_rows(records))
    return [section] if section is not None else []


def _machine(records, measured) -> Section:
    """The run's conditions: load, the ceilings' stability, a CPU run's scope."""
    conditions = machine_conditions(records, measured)
    return Section("machine", Group(*machine_renderables(conditions)), data=conditions.to_dict())


def _scaling(records) -> list:
    """The scaling section, when a workload was measured by several processes (launchers)."""
    rows = scaling_rows(records)
    if not rows:
        return []
    return [Section("scaling", scaling_table(rows), data={"rows": [r.to_dict() for r in rows]})]
