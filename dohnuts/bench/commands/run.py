"""`dohnuts-bench run`: validate every workload file, skip what cannot run here, measure the rest
into a new run directory (results.jsonl, run.json), then analyse and report.

Everything that can be checked before measuring is: the workload files against the registered
kinds and targets, each target's options against its `Options`, the launchers, the hwspec, the
`--out` folder. A refusal there leaves no run directory behind. The exit statuses are those of
dohnuts.bench.cli (0; 1: a target failed, out of memory; 2: refused; 130: interrupted).

Status, progress and warnings go to stderr through `logging` (dohnuts.bench.report.status); the report
alone goes to stdout. A CPU run measures with `--threads` torch threads (default 1, as every
command's: dohnuts.threads says why; the ceilings scatter on more threads the way the calls do,
docs/measurement.md, "A CPU run").
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import sys
from pathlib import Path

from dohnuts.bench.report.status import log
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.threads import check_threads  # shared with `dohnuts train` and `dohnuts predict`

TELEMETRY_INTERVAL_S = (0.001, 60.0)  # bounds of --telemetry-interval


def hwspec_for(name: str | None, device_name: str):
    """The spec named (a built-in name or a path), else the built-in matching the device."""
    from dohnuts.bench.analysis import find_hwspec

    if name:
        return find_hwspec(name)
    low = device_name.lower()
    for key, spec in (("h200", "h200"), ("7900 xtx", "rx7900xtx"), ("7900xtx", "rx7900xtx")):
        if key in low:
            return find_hwspec(spec)
    return None


def hwspec_ref(spec) -> str | None:
    """How run.json names a spec: a built-in's name (portable), else its file path."""
    from dohnuts.bench.analysis.hwspec import BUILTIN_DIR

    if spec is None or spec.source is None:
        return None
    path = Path(spec.source).resolve()
    return path.stem if path.parent == BUILTIN_DIR.resolve() else str(path)


def check_telemetry_interval(value: float) -> None:
    lo, hi = TELEMETRY_INTERVAL_S
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ConfigError(f"must be a number of seconds in [{lo:g}, {hi:g}], got {value!r}", source="command line",
                          field="--telemetry-interval")


class RunClock:
    """A run's wall-clock milestones in seconds from its process's start, kept in run.json
    (`measured.timing`): when the ceilings were measured, each workload's first and last record,
    the end. What a user meets on a fresh machine — seconds to a first result, minutes to a
    suite — is read there, not from a stopwatch around the command. A `RecordSink` mirror."""

    def __init__(self, timing: dict):
        import psutil

        self.t0 = psutil.Process().create_time()
        self.timing = timing
        timing.update(process_started=_iso(self.t0), workloads={})

    def seconds(self) -> float:
        import time

        return round(time.time() - self.t0, 2)

    def mark(self, name: str) -> None:
        self.timing[f"{name}_s"] = self.seconds()

    def write(self, record: dict) -> None:
        w = record.get("workload")
        name = w.get("name") if isinstance(w, dict) else w
        now = self.seconds()
        self.timing["workloads"].setdefault(str(name), {"first_result_s": now})["last_result_s"] = now


def _iso(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="seconds")


def _run_json(run, runnable, hwspec, samplers, device, telemetry=None) -> dict:
    from dohnuts.bench.measure.provenance import provenance

    return {"run_id": run.run_id, "workloads": [s.to_dict() for s in runnable], "hwspec": hwspec_ref(hwspec),
            "measured": run.measured, "provenance": provenance(device, telemetry),
            "telemetry": {s.name: s.unavailable or "available" for s in samplers},
            "failures": run.failures, "traces": run.traces}


def runnable_here(specs: list, targets: dict, launchers: dict) -> list:
    """The workloads (their process counts and targets) this machine can run; each one left out is
    said with its reason. A workload naming a launcher no plugin registers is refused."""
    from dohnuts.bench.measure.runner import resolve_device

    runnable = []
    for spec in specs:
        if max(spec.processes) > 1 and spec.launcher not in launchers:
            raise ConfigError(f"names launcher {spec.launcher!r}, which no plugin registers (known: "
                              f"{', '.join(sorted(launchers)) or 'none'})", source=spec.file, field="launcher")
        if resolve_device(spec) is None:
            log.warning("skipped %s: needs a CUDA GPU (requires_gpu / device: cuda)", spec.file)
            continue
        counts = []
        for n in spec.processes:  # process counts this machine cannot hold are skipped, with the reason
            reason = None if n == 1 else launchers[spec.launcher].unavailable(n, resolve_device(spec))
            if reason:
                log.warning("skipped %s at %d processes: %s", spec.file, n, reason)
            else:
                counts.append(n)
        if not counts:
            continue
        spec = dataclasses.replace(spec, processes=tuple(counts))
        kept = []
        for t in spec.targets:  # a target that cannot run here (e.g. its library is missing) is skipped
            reason = targets[t.name].unavailable()
            if reason:
                log.warning("skipped target %s of %s: %s", t.label, spec.file, reason)
            else:
                kept.append(t)
        if kept:
            runnable.append(dataclasses.replace(spec, targets=tuple(kept)))
    return runnable


@dataclasses.dataclass(frozen=True)
class Registries:
    """The plugin manager and what its plugins register, built once a run."""

    pm: object
    kinds: dict
    targets: dict
    launchers: dict


def check_before_torch(args) -> tuple[Registries, list[Path]]:
    """What can be checked before torch is imported, checked: the command line's numbers and every
    workload file's existence, YAML and fields (dohnuts.bench.measure.workload.check_workload_file). Torch's
    import takes seconds (18–30 s on a busy 2-core machine); a typo is reported before it, in one line.
    The plugin manager imports no torch (the targets import it where they run)."""
    from dohnuts.bench.cli import standard_files
    from dohnuts.bench.plugins import collect, plugin_manager
    from dohnuts.bench.measure.workload import check_workload_file

    check_telemetry_interval(args.telemetry_interval)
    check_threads(args.threads)
    pm = plugin_manager()
    registries = Registries(pm, collect(pm, "dohnuts_bench_register_workload_kinds"),
                            collect(pm, "dohnuts_bench_register_targets"),
                            collect(pm, "dohnuts_bench_register_launchers"))
    files = [Path(f) for f in args.workloads] or standard_files()
    for f in files:
        check_workload_file(f, registries.kinds, registries.targets)
    return registries, files


def cmd_run(args, console=None) -> int:
    """`dohnuts-bench run`; the report goes to `console` (default: stdout)."""
    registries, files = check_before_torch(args)
    import torch

    threads = torch.get_num_threads()
    try:
        return _run(args, registries, files, console)
    finally:
        torch.set_num_threads(threads)  # a CPU run sets its own (--threads); the process gets its own back


def _run(args, registries: Registries, files: list[Path], console=None) -> int:
    from dohnuts.schema import check_output_file, check_output_folder, write_json
    from dohnuts.bench.commands.analyze import analyze_and_report
    from dohnuts.bench.cli import console_for_output
    from dohnuts.bench.contracts import RunContext
    from dohnuts.bench.measure.machine_id import this_machine
    from dohnuts.bench.plugins import check_target_options, samplers
    from dohnuts.bench.measure.provenance import device_info
    from dohnuts.bench.store.rundir import new_run_dir
    from dohnuts.bench.measure.runner import measure_workload, resolve_device
    from dohnuts.bench.sink import RecordSink
    from dohnuts.bench.report.status import MeasureProgress
    from dohnuts.bench.store.run_store import RunStore, StoreMirror
    from dohnuts.bench.measure.telemetry import TelemetryThread
    from dohnuts.bench.measure.workload import check_unique_names, load_workload

    from dohnuts.bench.measure.telemetry import default_min_clock_fraction

    default_min_clock_fraction()  # a garbled DOHNUTS_BENCH_MIN_CLOCK_FRACTION is refused before anything runs
    console = console or console_for_output()  # the report's (stdout); status goes to the log (stderr)
    pm, kinds, targets, launchers = registries.pm, registries.kinds, registries.targets, registries.launchers
    specs = [load_workload(f, kinds, targets) for f in files]  # validate everything before measuring
    trained = None
    if getattr(args, "checkpoint", None):
        from dohnuts.bench.measure.trained_model import serving_specs, trained_model

        trained = trained_model(args.checkpoint)
        specs = serving_specs(specs, trained)
    check_unique_names(specs)  # two workloads of one name would be pooled into one row
    # Every output by the one rule (dohnuts.schema.output_paths), before anything is created: a bad
    # --out, --store or --output leaves nothing behind (not even an empty store).
    out_root = check_output_folder(args.out, field="--out", error=ConfigError, create=False, holds_new_folders=True)
    store_path = Path(args.store) if args.store else out_root.parent / "store.sqlite"
    inputs = [*files, trained.adapter if trained else None]
    check_output_file(store_path, inputs=inputs, field="--store", what="a run store", error=ConfigError,
                      make_folder="later")
    output = None
    if getattr(args, "output", None):
        from dohnuts.bench.store.run_store import store_files

        output = check_output_file(args.output, inputs=[*inputs, *store_files(store_path)], field="--output",
                                   what="a JSONL file to write", error=ConfigError, make_folder="later")
    if args.nvtx:  # without the nvtx package --nvtx is refused here, in one line, before anything runs
        from dohnuts.bench.measure.trace import nvtx_stage_ranges

        nvtx_stage_ranges()
    for spec in specs:
        check_target_options(spec, targets)
    runnable = runnable_here(specs, targets, launchers)
    if not runnable:
        log.info("nothing to run on this machine")
        return 0
    device = resolve_device(runnable[0])
    named_by = None if args.hwspec else next((s for s in runnable if s.hwspec), None)
    try:
        hwspec = hwspec_for(args.hwspec or (named_by.hwspec if named_by else None), device_info(device)["name"])
    except ConfigError as exc:
        if named_by is None:
            raise
        raise ConfigError(f"cannot be used: {exc}", source=named_by.file, field="hwspec") from None
    # a corrupt or foreign store is refused here, before anything is measured
    store = RunStore(store_path)
    label = args.label or (runnable[0].name if len(runnable) == 1 else "run")
    created_root = not os.path.lexists(out_root)
    if device.type == "cpu":
        _set_threads(args.threads)
    run_id, run_dir = new_run_dir(out_root, label)  # created only now: every input has been validated
    run = RunContext(run_id=run_id, run_dir=run_dir, device=device, hwspec=hwspec, console=console,
                     profile=args.profile, nvtx=args.nvtx)
    run.measured["machine"] = {"id": this_machine(device)}  # what a gate baseline is kept per
    clock = RunClock(run.measured.setdefault("timing", {}))

    def discard_run() -> None:
        """Nothing was recorded: leave no run behind."""
        store.delete_run(run_id)
        store.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        if created_root:
            try:
                out_root.rmdir()
            except OSError:
                pass

    every_sampler = samplers(pm)
    for s in every_sampler:
        if s.unavailable:
            log.info("telemetry: %s: %s", s.name, s.unavailable)
    telemetry = TelemetryThread([s for s in every_sampler if not s.unavailable], interval_s=args.telemetry_interval)
    results = run_dir / "results.jsonl"
    meta = _run_json(run, runnable, hwspec, every_sampler, device, telemetry)  # holds run.measured and run.failures as they grow
    interrupted, error = False, None
    mirror = StoreMirror(store, run_id, warn=lambda m: log.warning("%s", m))
    clock.mark("run_started")
    try:
        with MeasureProgress(enabled=not args.quiet) as progress:
            progress.phase("preparing the run (the ceilings of this machine)")
            pm.hook.dohnuts_bench_prepare_run(run=run)
            clock.mark("prepared")
            write_json(run_dir / "run.json", meta, indent=2, default=str)
            _store_run(store, run_id, meta)  # the store is a copy: a store that fails is a warning
            log.info("run %s → %s (and %s)", run_id, results, store.path)
            telemetry.start()
            try:
                with RecordSink.open(results, mirrors=(mirror, clock)) as out:
                    for spec in runnable:
                        for n in spec.processes:
                            if n == 1:
                                measure_workload(run, pm, spec, kinds, targets, telemetry, out, progress)
                            else:  # the launcher's processes measure on their own devices; the parent waits
                                write_json(run_dir / "run.json", meta, indent=2, default=str)
                                progress.phase(f"{spec.name} at {n} processes ({spec.launcher})")
                                launchers[spec.launcher].launch(run, spec, n, out, gpu=run.device.type == "cuda",
                                                                telemetry_interval=args.telemetry_interval)
            finally:
                telemetry.stop()
    except KeyboardInterrupt:
        interrupted = True
    except DohnutsError as exc:  # refused while measuring (e.g. a target's adapter): report what was measured
        error = exc
    measured_any = results.exists() and results.stat().st_size > 0
    if interrupted and not measured_any:
        # Ctrl-C before the first call was recorded (e.g. while the ceilings were measured).
        discard_run()
        log.warning("interrupted before the first call was recorded: nothing was measured, no run kept")
        return 130
    if interrupted:
        log.warning("interrupted: %s holds every completed call", results)
    if error is not None and not measured_any and not run.failures:
        discard_run()  # refused before any call was recorded: leave nothing behind
        raise error
    clock.mark("measured")  # the report's machine section says the milestones
    try:
        write_json(run_dir / "run.json", meta, indent=2, default=str)  # now with the failures and calibrations
        _store_run(store, run_id, meta)
        if measured_any:
            analyze_and_report(results, hwspec, run.measured, run_dir, console, pm)
            _store_summary(store, run_id, run_dir)
            _html(run_dir, store.path)
        for t in run.traces:
            log.info("trace: %s (open in Perfetto: ui.perfetto.dev)", run_dir / t["path"])
    except DohnutsError as exc:
        if error is None:
            raise
        # The report failed after the run itself did (a full disk fails both): the run's own error
        # is the one line; results.jsonl holds every record written whole before it.
        log.warning("no report (%s)", exc)
    except KeyboardInterrupt:
        # A second Ctrl-C (or the first, during the report): results.jsonl is complete and closed.
        print("dohnuts-bench: interrupted while writing the report; results.jsonl holds every completed call "
              f"(`dohnuts-bench analyze {results}` writes the report)", file=sys.stderr)
        return 130
    if output is not None and measured_any:
        _copy_records(results, output)
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


def _copy_records(results: Path, output: Path) -> None:
    """results.jsonl to --output, whole or not at all (a temporary file renamed into place: a link
    planted meanwhile is replaced, never followed)."""
    from dohnuts.schema import write_bytes_atomic

    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(output, results.read_bytes())
    except (OSError, DohnutsError) as exc:
        log.warning("--output %s was not written (%s); %s holds the records", output, exc, results)
        return
    log.info("records: %s", output)


def _set_threads(threads: int) -> None:
    """torch's intra-op threads for this CPU run (module docstring: why one by default)."""
    import torch

    torch.set_num_threads(threads)


def _store_run(store, run_id: str, meta: dict) -> None:
    import sqlite3

    try:
        store.add_run(run_id, meta)
    except (sqlite3.Error, OSError) as exc:
        log.warning("the run store %s did not take run.json (%s)", store.path, exc)


def _store_summary(store, run_id: str, run_dir: Path) -> None:
    import json
    import sqlite3

    summary = run_dir / "summary.json"
    try:
        if summary.is_file():
            store.add_summary(run_id, json.loads(summary.read_text(encoding="utf-8")))
    except (sqlite3.Error, OSError, ValueError) as exc:
        log.warning("the run store %s did not take summary.json (%s)", store.path, exc)
    finally:
        store.close()


def _html(run_dir: Path, store_path: Path) -> None:
    from dohnuts.bench.commands.report import write_html

    try:
        log.info("html: %s", write_html(run_dir, store=store_path))
    except (DohnutsError, OSError, ValueError) as exc:  # the text report and the JSONL are written already
        log.warning("no report.html (%s)", exc)
