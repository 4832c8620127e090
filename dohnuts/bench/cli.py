"""`dohnuts-bench`: measure complete calls of the scoring model and say how far each stage is
from what the hardware allows.

    dohnuts-bench run [WORKLOAD.yaml ...]    measure (no file: the embedded standard suite, workloads/*.yaml)
    dohnuts-bench analyze RESULTS.jsonl      re-analyse raw records (from JSONL alone)
    dohnuts-bench compare RUN_A RUN_B        B against A per workload, target and stage: ratio of
                                             medians, bootstrap interval, rank test, verdict
                                             (run directories or results.jsonl; --json OUT)
    dohnuts-bench list                       plugins, workload kinds, targets, telemetry

Bad input (a malformed or invalid workload file, an unknown kind/target/preset or target option, a
size out of its bounds or a sequence over the model's context, a bad hwspec, an `--out` that is a
file) ends with one line on stderr naming the file and field, exit status 2, before anything is
measured, and leaves no run directory behind. An error met while measuring (e.g. a target's
adapter file that cannot be loaded) stops the run: what was measured is reported, then the one
line, exit 2. A target that
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
import warnings
from importlib import resources
from pathlib import Path

from dohnuts.errors import ConfigError, DohnutsError

DEFAULT_RESULTS = Path("results/runs")
TELEMETRY_INTERVAL_S = (0.001, 60.0)  # bounds of --telemetry-interval


def _console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


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


def _stored_hwspec(ref: str):
    """A run.json's hwspec: its file path or built-in name, or (older runs) its display name."""
    from dohnuts.bench.analysis import find_hwspec
    from dohnuts.bench.analysis.hwspec import BUILTIN_DIR
    from dohnuts.errors import ConfigError

    try:
        return find_hwspec(ref)
    except ConfigError:
        for path in sorted(BUILTIN_DIR.glob("*.yaml")):
            spec = find_hwspec(path)
            if spec.name == ref:
                return spec
        raise


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

    from dohnuts.bench.analysis.records import write_json
    from dohnuts.bench.contracts import RunContext
    from dohnuts.bench.plugins import check_target_options, collect, plugin_manager, samplers
    from dohnuts.bench.provenance import device_info
    from dohnuts.bench.rundir import new_run_dir
    from dohnuts.bench.runner import measure_workload, resolve_device
    from dohnuts.bench.sink import RecordSink
    from dohnuts.bench.telemetry import TelemetryThread
    from dohnuts.bench.workload import load_workload

    _check_telemetry_interval(args.telemetry_interval)
    console = _console()
    pm = plugin_manager()
    kinds = collect(pm, "dohnuts_bench_register_workload_kinds")
    targets = collect(pm, "dohnuts_bench_register_targets")
    launchers = collect(pm, "dohnuts_bench_register_launchers")
    files = [Path(f) for f in args.workloads] or standard_files()
    specs = [load_workload(f, kinds, targets) for f in files]  # validate everything before measuring
    for spec in specs:
        check_target_options(spec, targets)
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
            reason = targets[t.name].unavailable()
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

    every_sampler = samplers(pm)
    for s in every_sampler:
        if s.unavailable:
            console.print(f"[dim]telemetry: {s.name}: {s.unavailable}[/]")
    telemetry = TelemetryThread([s for s in every_sampler if not s.unavailable], interval_s=args.telemetry_interval)
    results = run_dir / "results.jsonl"
    meta = _run_json(run, runnable, hwspec, every_sampler, device)  # holds run.measured and run.failures as they grow
    interrupted, error = False, None
    try:
        pm.hook.dohnuts_bench_prepare_run(run=run)
        write_json(run_dir / "run.json", meta, indent=2, default=str)
        console.print(f"run [bold]{run_id}[/] → {results}")
        telemetry.start()
        try:
            with RecordSink.open(results) as out, Progress(
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
    except DohnutsError as exc:  # refused while measuring (e.g. a target's adapter): report what was measured
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


def analyze_and_report(results: Path, hwspec, measured: dict, run_dir: Path, console, pm=None, *,
                       revalidate: bool = False) -> None:
    from dohnuts.bench.analysis import read_jsonl
    from dohnuts.bench.analysis.records import RecordError, check_reportable
    from dohnuts.bench.plugins import plugin_manager

    pm = pm or plugin_manager()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_jsonl(results)
    for w in caught:
        console.print(f"[yellow]warning[/]: {w.message}")
    if not records:
        skipped = f" ({caught[0].message})" if caught else ""
        raise RecordError(f"holds no schema-1 records of a dohnuts-bench run{skipped}", source=str(results))
    for rec in records:
        check_reportable(rec)
    if revalidate:  # the validity gates of today, applied to the telemetry each record kept
        from dohnuts.bench.telemetry import call_validity, default_min_clock_fraction

        fraction = default_min_clock_fraction()
        for rec in records:
            if isinstance(rec.get("telemetry"), list):
                rec["validity"] = call_validity(rec["telemetry"], fraction)
    sections = [s for group in pm.hook.dohnuts_bench_analyze(records=records, hwspec=hwspec, measured=measured,
                                                              run_dir=run_dir) if group for s in group]
    pm.hook.dohnuts_bench_report(console=console, records=records, sections=sections, run_dir=run_dir)


def _run_meta(run_json: Path) -> dict:
    """The run.json beside a results.jsonl ({} when there is none); a corrupt one is refused."""
    import json

    if not run_json.exists():
        return {}
    try:
        meta = json.loads(run_json.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise DohnutsError(f"cannot be read ({exc.strerror or exc})", source=str(run_json)) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = " ".join(str(exc).split())[:120]
        raise DohnutsError(f"is not a run's JSON ({reason}); repair it or move it away to analyse the results "
                           "beside it", source=str(run_json)) from None
    if not isinstance(meta, dict):
        raise DohnutsError("must be a JSON object (a run's run.json)", source=str(run_json))
    if meta.get("hwspec") is not None and not isinstance(meta["hwspec"], str):
        raise DohnutsError("must be a hwspec name or path", source=str(run_json), field="hwspec")
    measured = meta.get("measured")
    if measured is not None and (not isinstance(measured, dict) or not isinstance(measured.get("ceilings", {}), dict)):
        raise DohnutsError("must be an object whose ceilings are an object", source=str(run_json), field="measured")
    return meta


def _output_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError("is not a directory (a folder for the report files)", source=str(path),
                          field="--out") from None
    except (OSError, ValueError) as exc:  # e.g. a file on the way, no permission
        raise ConfigError(f"cannot be created ({getattr(exc, 'strerror', None) or exc})", source=str(path),
                          field="--out") from None
    return path


def cmd_analyze(args) -> int:
    from dohnuts.bench.analysis import find_hwspec
    from dohnuts.bench.analysis.records import RecordError

    path = Path(args.results)
    try:
        if path.is_dir():  # a run directory, as `compare` takes (an archived run: results.jsonl.gz)
            path = path / "results.jsonl" if (path / "results.jsonl").exists() or not (
                path / "results.jsonl.gz").exists() else path / "results.jsonl.gz"
        exists = path.exists()
    except (OSError, ValueError) as exc:  # e.g. a name too long for a path
        raise DohnutsError(f"cannot be read ({getattr(exc, 'strerror', None) or exc})", source=str(path)) from None
    if not exists:
        raise DohnutsError("does not exist", source=str(path))
    meta = _run_meta(path.parent / "run.json")
    hwspec = find_hwspec(args.hwspec) if args.hwspec else (
        _stored_hwspec(meta["hwspec"]) if meta.get("hwspec") else None)
    out_dir = _output_dir(Path(args.out) if args.out else path.parent)
    try:
        analyze_and_report(path, hwspec, meta.get("measured") or {}, out_dir, _console(), revalidate=args.revalidate)
    except DohnutsError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        # Records that pass the structural checks but that an analysis still cannot read (a
        # foreign or hand-edited file): one line naming the file, not a traceback.
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise RecordError(f"cannot be analysed ({reason})", source=str(path)) from None
    return 0


def cmd_compare(args) -> int:
    """`compare RUN_A RUN_B`: the table of dohnuts.bench.analysis.compare (its docstring has the rule)."""
    import json

    from dohnuts.bench.analysis.compare import compare_runs, comparison_dict, comparison_table
    from dohnuts.bench.analysis.records import read_jsonl

    console = _console()
    paths = []
    for arg in (args.run_a, args.run_b):
        path = Path(arg)
        if path.is_dir():
            path = path / "results.jsonl" if (path / "results.jsonl").exists() or not (
                path / "results.jsonl.gz").exists() else path / "results.jsonl.gz"
        if not path.is_file():
            raise DohnutsError("does not exist (expected a run directory or its results.jsonl)", source=str(path))
        paths.append(path)
    runs = []
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = read_jsonl(path)
        for w in caught:
            console.print(f"[yellow]warning[/]: {w.message}")
        if not any(r.get("phase", "steady") == "steady" for r in records):
            raise DohnutsError("holds no steady-state records", source=str(path))
        runs.append(records)
    comparison = compare_runs(runs[0], runs[1], confidence=args.confidence, min_effect=args.min_effect,
                              label_a=str(paths[0]), label_b=str(paths[1]))
    if not comparison.rows:
        only = sorted({f"{w} / {t}" for w, t in (*comparison.only_in_a, *comparison.only_in_b)})
        raise DohnutsError(f"no (workload, target) measured in both runs ({', '.join(only)})",
                           source=f"{paths[0]} vs {paths[1]}")
    console.print(comparison_table(comparison))
    for note in comparison.warnings:
        console.print(f"[yellow]warning[/]: {note}")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(comparison_dict(comparison), indent=2))
        console.print(f"[dim]wrote {out}[/]")
    return 0


def cmd_list(args) -> int:
    from rich.table import Table

    from dohnuts.bench.plugins import collect, plugin_manager, samplers

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
    console.print("telemetry: " + ", ".join(f"{s.name} ({s.unavailable or 'available'})" for s in samplers(pm)))
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
