"""Built-in analyzers: the machine at the start of a run (its load, its measured ceilings) and
the machine's load as telemetry while it runs; the headline that opens the report (dohnuts against
its peer and against the measured bound, a CPU run's scope: dohnuts.bench.analysis.headline); the
efficiency analysis — per stage and whole
call, against the hwspec's datasheet and measured ceilings —, the serving section (load points,
the SLO search, the bound at load, accuracy and the reference check:
dohnuts.bench.analysis.serving) and the run's conditions (load, the ceilings' stability:
dohnuts.bench.analysis.machine)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.sections import Section
from dohnuts.bench.report.status import log


@hookimpl
def dohnuts_bench_register_telemetry():
    from dohnuts_bench_plugins.analyzers.load import LoadSampler

    return [LoadSampler()]


@hookimpl
def dohnuts_bench_prepare_run(run):
    import torch

    from dohnuts_bench_plugins.analyzers.load import load_before
    from dohnuts_bench_plugins.analyzers.microbench import measure_ceilings, measure_cpu_ceilings

    before = load_before()
    run.measured.setdefault("machine", {}).update(cpus=before["cpus"], threads=torch.get_num_threads(), before=before)
    log.info("load when the run started: other processes kept %.2f of %d cores busy (load average %.2f)",
             before["others_cores"] or 0.0, before["cpus"], before["load1"])
    if run.device.type != "cuda":
        log.info("measuring the CPU's ceilings on %d thread(s): fp32/bf16 matmul, fp32 vector, memory copy "
                 "(a few seconds)", torch.get_num_threads())
        run.measured["ceilings"] = measure_cpu_ceilings()
        return
    log.info("measuring ceilings: bf16 matmul (a burst, then 2 s sustained), device copy, host link, "
             "fp32 vector (FMA chains)")
    run.measured["ceilings"] = measure_ceilings(run.device)


@hookimpl
def dohnuts_bench_analyze(records, hwspec, measured, run_dir):
    from dohnuts.bench.analysis import analysis_tables, analyze_records, roofline_png
    from dohnuts.bench.analysis.hwspec import measured_hwspec, with_measured_ceilings

    ceilings = (measured or {}).get("ceilings", {})
    device = records[0]["device"]["name"] if records else "?"
    if hwspec is None:
        # No datasheet spec describes this device (the CPU, an unknown GPU): bound every stage by
        # what this machine measured at the start of the run, and say so.
        spec = measured_hwspec(device, ceilings)
        if spec is None:
            return [_headline(records, None, measured),
                    Section("efficiency", Text(f"efficiency: no hardware spec for device {device!r} and no measured "
                                               "ceilings in this run; pass --hwspec NAME or a path"))] + \
                _serving(records, None) + [_machine(records, measured)]
    else:
        spec = with_measured_ceilings(hwspec, ceilings)
    analysis = analyze_records(records, spec)
    png = roofline_png(analysis, run_dir / "roofline.png")
    origin = spec.source or ("ceilings measured at the start of this run" if not spec.roles else "built in")
    parts = [Text(f"{spec.name}: bounds and efficiency ({origin})", style="bold")]
    parts += analysis_tables(analysis)
    parts += [Text(f"warning: {w}", style="yellow") for w in analysis.warnings]
    return ([_headline(records, analysis, measured),
             Section("efficiency", Group(*parts), data=analysis.to_dict(), files=[str(png)])]
            + _scaling(records, run_dir) + _serving(records, analysis) + [_machine(records, measured)])


def _headline(records, analysis, measured) -> Section:
    """The headline: per workload dohnuts against its peer and the measured bound (leads the report)."""
    from dohnuts.bench.analysis.headline import build_headline, headline_renderables

    headline = build_headline(records, analysis, measured)
    return Section("headline", Group(*headline_renderables(headline)), data=headline.to_dict(), leads=True)


def _serving(records, analysis) -> list:
    """The serving section, when the run has load points, a stream scenario, accuracy or a
    reference check; the efficiency analysis (None: no bounds) gives the bound at load."""
    from dohnuts.bench.analysis.serving import attach_bounds, load_curves, quality_rows, stream_scenarios
    from dohnuts.bench.analysis.serving_render import serving_section

    curves = load_curves(records)
    attach_bounds(curves, analysis, records)
    section = serving_section(curves, stream_scenarios(records), quality_rows(records))
    return [section] if section is not None else []


def _machine(records, measured) -> Section:
    """The run's conditions: load, the ceilings' stability, a CPU run's scope."""
    from dohnuts.bench.analysis.machine import machine_conditions, machine_renderables

    conditions = machine_conditions(records, measured)
    return Section("machine", Group(*machine_renderables(conditions)), data=conditions.to_dict())


def _scaling(records, run_dir) -> list:
    """The scaling section, when a workload was measured by several processes (launchers)."""
    from dohnuts.bench.analysis.scaling import scaling_png, scaling_rows, scaling_table

    rows = scaling_rows(records)
    if not rows:
        return []
    png = scaling_png(rows, run_dir / "scaling.png")
    return [Section("scaling", scaling_table(rows), data={"rows": [r.to_dict() for r in rows]},
                    files=[str(png)] if png else [])]
