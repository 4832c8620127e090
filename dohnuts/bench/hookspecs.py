"""The hooks of dohnuts-bench (pluggy, project name `dohnuts_bench`), grouped by lifecycle.

A plugin is any module or object with functions named like these hooks and decorated with
`dohnuts.bench.hookspecs.hookimpl`. Built-in plugins (bench_plugins/) and third-party packages
register the same way: an entry point in the `dohnuts_bench` group (see docs/plugins.md). What
the register hooks return, and what the other hooks are handed, is typed in
dohnuts.bench.contracts: every object a register hook returns is checked against its contract
when the plugin manager collects it (dohnuts.bench.plugins.collect).

Lifecycle of `dohnuts-bench run` (its phases: dohnuts.bench.commands.session.RunSession):

    1. register   dohnuts_bench_register_workload_kinds / _targets / _telemetry / _launchers
    2. prepare    dohnuts_bench_prepare_run                                      (once per run)
    3. iterate    dohnuts_bench_before_call, dohnuts_bench_after_call            (every measured call)
    4. sample     telemetry samplers run in a background thread during the run
    5. analyze    dohnuts_bench_analyze                                          (from JSONL alone)
    6. report     dohnuts_bench_report

The harness's own analysis and text report are called directly (dohnuts.bench.analysis.run_sections,
dohnuts.bench.report.text_report); `dohnuts_bench_analyze` and `dohnuts_bench_report` extend them:
an analyzer's sections follow the built-in ones, a reporter runs after the text report.
"""

from __future__ import annotations

import pluggy

PROJECT = "dohnuts_bench"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- 1. register -------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_register_workload_kinds():
    """Return a dict {kind name: WorkloadKind} of workload kinds this plugin provides.

    A `dohnuts.bench.contracts.WorkloadKind` has `calls(ctx)`, which turns a validated spec into the
    calls every target is measured on; its optional members — among them `Shape`, its `shape:`
    fields as a frozen msgspec Struct, converted and checked by the harness — are the fields of
    `dohnuts.bench.contracts.WorkloadKindCapabilities`. Kind names must be unique across plugins.
    """


@hookspec
def dohnuts_bench_register_targets():
    """Return a dict {target name: TargetFactory} of targets (implementations under test).

    A `dohnuts.bench.contracts.TargetFactory` (usually the target's class) is called as
    `factory(spec, device, dtype, options)` — `options` an instance of its `Options` dataclass,
    validated from the workload's `options:` — and returns a `dohnuts.bench.contracts.Target`:
    `run_call(call, timer)` → `dohnuts.bench.calls.CallResult`, and `close()`. Optional members:
    `dohnuts.bench.contracts.TargetFactoryCapabilities` (of the factory) and
    `dohnuts.bench.contracts.TargetCapabilities` (of the target). Every target of a workload is
    measured in the same run, on the same calls.
    """


@hookspec
def dohnuts_bench_register_telemetry():
    """Return a list of telemetry samplers (`dohnuts.bench.contracts.TelemetrySampler`; the base
    class `dohnuts.bench.measure.telemetry.Sampler` holds the defaults).

    A sampler whose library or device is absent says why once (its `unavailable` reason) and
    steps aside; it never fails the run.
    """


@hookspec
def dohnuts_bench_register_launchers():
    """Return a dict {launcher name: Launcher} of ways to start several processes for a workload
    whose `processes` lists a count above 1 (the built-in: `torchrun`). A
    `dohnuts.bench.contracts.Launcher` has `unavailable(processes, device) -> str | None` (why it
    cannot start that many here) and `launch(run, spec, processes, out, *, gpu, telemetry_interval)
    -> int`: the records it writes to `out` (a `dohnuts.bench.sink.RecordSink`), each stamped with
    its `rank` and `world_size`, and how many. Launchers are separate from targets, as in
    optimum-benchmark: any target runs under any launcher.
    """


# -- 2. prepare --------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_prepare_run(run):
    """Called once before the first workload with the `dohnuts.bench.contracts.RunContext`
    (device, hwspec, run dir).

    Plugins may measure the machine here (e.g. the measured-ceiling microbenchmarks) and store
    results in `run.measured` (a dict written to run.json). `dohnuts-bench calibrate` calls it too,
    with a context of its own (run_id `calibrate`, no hwspec), and writes `run.measured["ceilings"]`
    into the `measured:` section of a hwspec copy (dohnuts.bench.commands.calibrate)."""


# -- 3. iterate --------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_before_call(run, spec, target_name, iteration):
    """Called before each measured call (not before warm-up calls), with the
    `dohnuts.bench.contracts.RunContext`, the `dohnuts.bench.measure.workload.WorkloadSpec`, the target's
    label and the call's index."""


@hookspec
def dohnuts_bench_after_call(run, spec, target_name, record):
    """Called after each measured call with its record (a `dohnuts.bench.sink.CallRecord`, the typed
    record of dohnuts.bench.analysis.records) before it is written; a plugin may add its fields
    under its own key of `record.extra`, the record's one open place (`record.extra["myplugin"] = {...}`),
    which is written and read back with the record."""


# -- 5. analyze --------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_analyze(records, hwspec, measured, run_dir):
    """Turn a run's records (a list of `dohnuts.bench.sink.CallRecord`, read back from its JSONL and
    upgraded to the current schema: attribute access, `record.wall_ms`, a stage's
    `record.stages["prefix"].host_ms`, a plugin's own fields in `record.extra`;
    `msgspec.to_builtins(record)` gives the plain JSON values) into analysis sections, added after
    the built-in analysis's.

    Return a list of `dohnuts.bench.sections.Section` (title + rich renderable + plain dict), or
    None. Must depend only on its arguments: any run can be re-analysed later. A plugin that
    implements it is a `dohnuts.bench.contracts.Analyzer`."""


# -- 6. report ---------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_report(console, records, sections, run_dir):
    """Render results: print to the rich `console`, write files into `run_dir` (called after the
    built-in text report). `records` are the run's `CallRecord`s, as `dohnuts_bench_analyze` gets
    them. A plugin that implements it is a `dohnuts.bench.contracts.Reporter`."""
