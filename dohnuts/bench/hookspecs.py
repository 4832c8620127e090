"""The hooks of dohnuts-bench (pluggy, project name `dohnuts_bench`), grouped by lifecycle.

A plugin is any module or object with functions named like these hooks and decorated with
`dohnuts.bench.hookimpl`. Built-in plugins (bench_plugins/) and third-party packages register
the same way: an entry point in the `dohnuts_bench` group (see docs/plugins.md).

Lifecycle of `dohnuts-bench run`:

    1. register   dohnuts_bench_register_workload_kinds / _targets / _telemetry / _launchers
    2. prepare    dohnuts_bench_prepare_run                                      (once per run)
    3. iterate    dohnuts_bench_before_call, dohnuts_bench_after_call            (every measured call)
    4. sample     telemetry samplers run in a background thread during the run
    5. analyze    dohnuts_bench_analyze                                          (from JSONL alone)
    6. report     dohnuts_bench_report
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

    A `WorkloadKind` (dohnuts.bench.workload) declares the kind's YAML `shape` fields as a msgspec
    Struct (`Shape`) and turns a validated spec into the calls the runner measures. Kind names must be unique across plugins.
    """


@hookspec
def dohnuts_bench_register_targets():
    """Return a dict {target name: factory} of targets (implementations under test).

    A factory takes (spec, device, dtype) and returns an object with `run_call(call, timer)`
    → `CallResult` and `close()` (dohnuts.bench.target.Target). Every target of a workload is
    measured in the same run, on the same calls.
    """


@hookspec
def dohnuts_bench_register_telemetry():
    """Return a list of telemetry samplers (dohnuts.bench.telemetry.Sampler).

    A sampler whose library or device is absent says why once (its `unavailable` reason) and
    steps aside; it never fails the run.
    """


@hookspec
def dohnuts_bench_register_launchers():
    """Return a dict {launcher name: Launcher} of ways to start several processes for a workload
    whose `processes` lists a count above 1 (the built-in: `torchrun`). A launcher has
    `unavailable(processes, device) -> str | None` (why it cannot start that many here) and
    `launch(run, spec, processes, out, *, gpu, telemetry_interval) -> int` (records written into
    `out`, each stamped with its `rank` and `world_size`). Launchers are separate from targets, as
    in optimum-benchmark: any target runs under any launcher.
    """


# -- 2. prepare --------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_prepare_run(run):
    """Called once before the first workload with the `RunContext` (device, hwspec, run dir).

    Plugins may measure the machine here (e.g. the measured-ceiling microbenchmarks) and store
    results in `run.measured` (a dict written to run.json)."""


# -- 3. iterate --------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_before_call(run, spec, target_name, iteration):
    """Called before each measured call (not before warm-up calls)."""


@hookspec
def dohnuts_bench_after_call(run, spec, target_name, record):
    """Called after each measured call with its record (a dict) before it is written; a plugin
    may add fields under its own key."""


# -- 5. analyze --------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_analyze(records, hwspec, measured, run_dir):
    """Turn raw records (list of dicts read back from JSONL) into analysis sections.

    Return a list of `dohnuts.bench.report.Section` (title + rich renderable + plain dict), or
    None. Must depend only on its arguments: any run can be re-analysed later."""


# -- 6. report ---------------------------------------------------------------------------------


@hookspec
def dohnuts_bench_report(console, records, sections, run_dir):
    """Render results: print to the rich `console`, write files into `run_dir`."""
