"""`dohnuts-bench`: measure complete calls of the scoring model and say how far each stage is
from what the hardware allows.

    dohnuts-bench run [WORKLOAD.yaml ...]    measure (no file: the embedded standard suite, workloads/*.yaml)
    dohnuts-bench analyze RESULTS.jsonl      re-analyse raw records (from JSONL alone)
    dohnuts-bench compare RUN_A RUN_B        B against A per workload, target and stage: ratio of
                                             medians, bootstrap interval, rank test, verdict
                                             (run directories or results.jsonl; --json OUT)
    dohnuts-bench list                       plugins, workload kinds, targets, telemetry

Bad input (a malformed or invalid workload file, an unknown kind/target/preset, a size out of
its bounds or a sequence over the model's context, a bad hwspec, an `--out` that is a file)
ends with one line on stderr naming the file and field, exit status 2, before anything is
measured, and leaves no run directory behind. An error met while measuring (e.g. a target's
option) stops the run: what was measured is reported, then the one line, exit 2. A target that
runs out of device memory fails alone (run.json `failures`), the run goes on, the report is
written, and the exit status is 1. Ctrl-C leaves a valid results.jsonl holding every completed
record (exit 130), a second Ctrl-C during the report too. `analyze` refuses a file holding no
schema-1 record, a corrupt line or run.json, or a non-finite number, the same way (exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import sys
from importlib import resources
from pathlib import Path

from dohnuts.bench.offline import cmd_analyze, cmd_compare
from dohnuts.bench.offline import make_console as _console
from dohnuts.errors import ConfigError, DohnutsError

DEFAULT_RESULTS = Path("results/runs")
TELEMETRY_INTERVAL_S = (0.001, 60.0)  # bounds of --telemetry-interval


def standard_files() -> list[Path]:
    """The standard suite (workloads/*.yaml, embedded as package data): text, shared prefix, image,
    cold/warm image cache and train step, each sized for a CPU and (its `on_gpu` fields) a GPU."""
    root = resources.files("dohnuts.bench") / "standard"
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml"))


def _hwspec_for(name: str | None, device_name: str):
    """The spec named (a built-in name or a path), else the built-in matching the device."""
    from dohnuts.bench.analysis import find_hwspec

    if name:
        return find_hwspec(name)
    low = device_name.lower()
    for key, spec in (("h200", "h200"), ("7900 xtx", "rx7900xtx"), ("7900xtx", "rx7900xtx")):
        if key in low:
            return find_hwspec(spec)
    return None


def _hwspec_ref(spec) -> str | None:
    """How run.json names a spec: a built-in's name (portable), else its file path."""
    from dohnuts.bench.analysis.hwspec import BUILTIN_DIR

    if spec is None or spec.source is None:
        return None
    path = Path(spec.source).resolve()
    return path.stem if path.parent == BUILTIN_DIR.resolve() else str(path)


def _check_telemetry_interval(value: float) -> None:
    lo, hi = TELEMETRY_INTERVAL_S
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ConfigError(f"must be a number of seconds in [{lo:g}, {hi:g}], got {value!r}", source="command line",
                          field="--telemetry-interval")


def _run_json(run, runnable, hwspec, samplers, device) -> dict:
    from dohnuts.bench.provenance import provenance

    return {"run_id": run.run_id, "workloads": [s.to_dict() for s in runnable], "hwspec": _hwspec_ref(hwspec),
            "measured": run.measured, "provenance": provenance(device),
            "telemetry": {s.name: s.unavailable or "available" for s in samplers},
            "failures": run.failures}


def cmd_run(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.bench.provenance import device_info
    from dohnuts.bench.rundir import new_run_dir
    from dohnuts.bench.runner import RunContext, measure_workload, resolve_device
    from dohnuts.bench.telemetry import TelemetryThread
    from dohnuts.bench.workload import load_workload
    from dohnuts.schema import write_json

    _check_telemetry_interval(args.telemetry_interval)
    console = _console()
    pm = plugin_manager()
    kinds = collect(pm, "dohnuts_bench_register_workload_kinds")
    targets = collect(pm, "dohnuts_bench_register_targets")
    launchers = collect(pm, "dohnuts_bench_register_launchers")
    files = [Path(f) for f in args.workloads] or standard_files()
    specs = [load_workload(f, kinds, targets) for f in files]  # validate everything before measuring
    runnable = []
    for spec in specs:
        if max(spec.processes) > 1 and spec.launcher not in launchers:
            raise ConfigError(f"names launcher {spec.launcher!r}, which no plugin registers (known: "
                              f"{', '.join(sorted(launchers)) or 'none'})", source=spec.file, field="launcher")
        if resolve_device(spec) is None:
            console.print(f"[yellow]skipped[/] {spec.file}: needs a CUDA GPU (requires_gpu / device: cuda)")
            continue
        counts = []
        for n in spec.processes:  # process counts this machine cannot hold are skipped, with the reason
            reason = None if n == 1 else launchers[spec.launcher].unavailable(n, resolve_device(spec))
            if reason:
                console.print(f"[yellow]skipped[/] {spec.file} at {n} processes: {reason}")
            else:
                counts.append(n)
        if not counts:
            continue
        spec = dataclasses.replace(spec, processes=tuple(counts))
        kept = []
        for t in spec.targets:  # a target that cannot run here (e.g. its library is missing) is skipped
            reason = getattr(targets[t.name], "unavailable", lambda: None)()
            if reason:
                console.print(f"[yellow]skipped[/] target {t.label} of {spec.file}: {reason}")
            else:
                kept.append(t)
        if kept:
            runnable.append(dataclasses.replace(spec, targets=tuple(kept)))
    if not runnable:
        console.print("nothing to run on this machine")
        return 0
    device = resolve_device(runnable[0])
    named_by = None if args.hwspec else next((s for s in runnable if s.hwspec), None)
    try:
        hwspec = _hwspec_for(args.hwspec or (named_by.hwspec if named_by else None), device_info(device)["name"])
    except ConfigError as exc:
        if named_by is None:
            raise
        raise ConfigError(f"cannot be used: {exc}", source=named_by.file, field="hwspec") from None
    label = args.label or (runnable[0].name if len(runnable) == 1 else "run")
    out_root = Path(args.out)
    created_root = not os.path.lexists(out_root)
    run_id, run_dir = new_run_dir(out_root, label)  # created only now: every input has been validated
    run = RunContext(run_id=run_id, run_dir=run_dir, device=device, hwspec=hwspec, console=console)

    samplers = [s for group in pm.hook.dohnuts_bench_register_telemetry() for s in group]
    for s in samplers:
        if s.unavailable:
            console.print(f"[dim]telemetry: {s.name}: {s.unavailable}[/]")
    telemetry = TelemetryThread([s for s in samplers if not s.unavailable], interval_s=args.telemetry_interval)
    results = run_dir / "results.jsonl"
    meta = _run_json(run, runnable, hwspec, samplers, device)  # holds run.measured and run.failures as they grow
    interrupted, error = False, None
    try:
        pm.hook.dohnuts_bench_prepare_run(run=run)
        write_json(run_dir / "run.json", meta, indent=2, default=str)
        console.print(f"run [bold]{run_id}[/] → {results}")
        telemetry.start()
        try:
            with open(results, "a", encoding="utf-8") as out, Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=console, disable=args.quiet,
            ) as progress:
                for spec in runnable:
                    for n in spec.processes:
                        if n == 1:
                            measure_workload(run, pm, spec, kinds, targets, telemetry, out, progress)
                        else:  # the launcher's processes measure on their own devices; the parent waits
                            write_json(run_dir / "run.json", meta, indent=2, default=str)
                            launchers[spec.launcher].launch(run, spec, n, out, gpu=run.device.type == "cuda",
                                                            telemetry_interval=args.telemetry_interval)
        finally:
            telemetry.stop()
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted[/]: results.jsonl holds every completed call")
    except DohnutsError as exc:  # refused while measuring (e.g. a target's option): report what was measured
        error = exc
    measured_any = results.exists() and results.stat().st_size > 0
    if error is not None and not measured_any and not run.failures:
        # Refused before any call was recorded: leave nothing behind.
        shutil.rmtree(run_dir, ignore_errors=True)
        if created_root:
            try:
                out_root.rmdir()
            except OSError:
                pass
        raise error
    try:
        write_json(run_dir / "run.json", meta, indent=2, default=str)  # now with the failures and calibrations
        if measured_any:
            from dohnuts.bench.offline import analyze_and_report

            analyze_and_report(results, hwspec, run.measured, run_dir, console, pm)
    except KeyboardInterrupt:
        # A second Ctrl-C (or the first, during the report): results.jsonl is complete and closed.
        print("dohnuts-bench: interrupted while writing the report; results.jsonl holds every completed call "
              f"(`dohnuts-bench analyze {results}` writes the report)", file=sys.stderr)
        return 130
    if error is not None:
        raise error
    if interrupted:
        return 130
    if run.failures:
        first = run.failures[0]
        print(f"dohnuts-bench: error: {len(run.failures)} target(s) failed, the rest was measured and reported "
              f"(run.json `failures`); first: {first['file']}: target {first['target']}: {first['error']}",
              file=sys.stderr)
        return 1
    return 0


def cmd_list(args) -> int:
    from rich.table import Table

    from dohnuts.bench.plugins import collect, plugin_manager

    pm = plugin_manager()
    console = _console()
    t = Table(title="dohnuts-bench plugins")
    t.add_column("plugin")
    t.add_column("hooks")
    for name, plugin in pm.list_name_plugin():
        t.add_row(str(name), ", ".join(h.name.removeprefix("dohnuts_bench_") for h in pm.get_hookcallers(plugin)))
    console.print(t)
    for hook, title in (("dohnuts_bench_register_workload_kinds", "workload kinds"),
                        ("dohnuts_bench_register_targets", "targets")):
        console.print(f"{title}: {', '.join(sorted(collect(pm, hook)))}")
    from dohnuts.bench.workload import shape_fields

    for name, kind in sorted(collect(pm, "dohnuts_bench_register_workload_kinds").items()):
        console.print(f"  {name} shape: " + "; ".join(shape_fields(kind)))
    samplers = [s for g in pm.hook.dohnuts_bench_register_telemetry() for s in g]
    console.print("telemetry: " + ", ".join(f"{s.name} ({s.unavailable or 'available'})" for s in samplers))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dohnuts-bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure workloads (default: the embedded standard suite, workloads/*.yaml)")
    r.add_argument("workloads", nargs="*", help="workload YAML files")
    r.add_argument("--out", default=str(DEFAULT_RESULTS), help="folder for run directories (default: results/runs)")
    r.add_argument("--label", help="run directory label (default: the workload name)")
    r.add_argument("--hwspec", help="hardware spec name (hwspecs/NAME.yaml) or path (default: by device name)")
    r.add_argument("--telemetry-interval", type=float, default=0.1,
                   help="seconds between telemetry samples (0.001 to 60; default: 0.1)")
    r.add_argument("--quiet", action="store_true", help="no progress display")
    r.set_defaults(func=cmd_run)
    a = sub.add_parser("analyze", help="re-analyse a results.jsonl")
    a.add_argument("results", help="a results.jsonl (or the run directory holding it)")
    a.add_argument("--hwspec", help="hardware spec name or path (default: the run's)")
    a.add_argument("--out", help="folder for the report files (default: beside the JSONL)")
    a.add_argument("--revalidate", action="store_true",
                   help="re-apply today's validity gates to the telemetry each record kept (runs recorded "
                        "under an older rule, e.g. one that excluded power-capped calls)")
    a.set_defaults(func=cmd_analyze)
    c = sub.add_parser("compare", help="compare run B against run A (ratio of medians, interval, verdict)")
    c.add_argument("run_a", metavar="RUN_A", help="run directory or results.jsonl (the baseline)")
    c.add_argument("run_b", metavar="RUN_B", help="run directory or results.jsonl (compared against RUN_A)")
    c.add_argument("--confidence", type=float, default=0.95, help="confidence of the intervals (default: 0.95)")
    c.add_argument("--min-effect", type=float, default=0.02,
                   help="smallest relative change given a verdict (default: 0.02)")
    c.add_argument("--json", metavar="OUT", help="also write the comparison as JSON to OUT")
    c.set_defaults(func=cmd_compare)
    ls = sub.add_parser("list", help="list plugins, workload kinds, targets and telemetry")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DohnutsError as exc:
        print(f"dohnuts-bench: error: {' '.join(str(exc).split())}", file=sys.stderr)  # always one line
        return 2
    except KeyboardInterrupt:
        print("dohnuts-bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
