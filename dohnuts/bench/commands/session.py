"""A `dohnuts-bench run` from its checked command line to its exit status: `RunSession`, its
phases its methods (the module docstring of dohnuts.bench.commands.run lists them). It measures
with torch: dohnuts.bench.commands.run imports it once its checks before torch have passed."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import torch

from dohnuts.bench.analysis.hwspec import hwspec_for_device, hwspec_ref
from dohnuts.bench.analysis.records import CallRecord
from dohnuts.bench.analysis.summary import summarize, summary_json
from dohnuts.bench.contracts import RunContext
from dohnuts.bench.measure import machine_id, runner
from dohnuts.bench.measure.provenance import device_info, provenance
from dohnuts.bench.measure.run_clock import RunClock
from dohnuts.bench.measure.runner import resolve_device, runnable_here
from dohnuts.bench.measure.telemetry import TelemetryThread, default_min_clock_fraction
from dohnuts.bench.measure.trace import nvtx_stage_ranges
from dohnuts.bench.measure.trained_model import serving_specs, trained_model
from dohnuts.bench.measure.workload import check_unique_names, load_workload
from dohnuts.bench.plugins import check_target_options, samplers
from dohnuts.bench.report.html_page import write_page
from dohnuts.bench.report.run_report import analysis_sections, checked_records, report_analysis, write_summary
from dohnuts.bench.report.status import MeasureProgress, log
from dohnuts.bench.sink import RecordSink
from dohnuts.bench.store.history import trends_for
from dohnuts.bench.store.run_store import RunStore, StoreMirror, store_files
from dohnuts.bench.store.rundir import new_run_dir
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema import check_output_file, check_output_folder, dumps, write_bytes_atomic, write_text_atomic


class RunSession:
    """One `dohnuts-bench run` (dohnuts.bench.commands.run's docstring lists its phases). `run()`
    calls them in order and turns what happened into the exit status; each phase keeps what the
    next one reads."""

    def __init__(self, args, registries, files: list[Path], console):
        self.args, self.files, self.console = args, files, console
        self.pm, self.kinds, self.targets, self.launchers = (registries.pm, registries.kinds, registries.targets,
                                                             registries.launchers)
        self.interrupted, self.error = False, None  # how measuring ended: Ctrl-C, or a refusal while measuring
        self.records: list[CallRecord] = []  # the analyse phase's: the records, the sections, summary.json's rows
        self.sections: list = []
        self.rows: list[dict] = []
        self.summary: dict | None = None  # summary.json's content, once analysed (as the file holds it, once stored)

    # -- the phases, in order -------------------------------------------------------------------

    def prepare(self) -> bool:
        """Check every input, then make the run directory. False: nothing of the
        workloads can run on this machine (said on stderr; no run directory)."""
        args = self.args
        default_min_clock_fraction()  # a garbled DOHNUTS_BENCH_MIN_CLOCK_FRACTION is refused before anything runs
        specs = [load_workload(f, self.kinds, self.targets) for f in self.files]  # validate everything first
        trained = None
        if getattr(args, "checkpoint", None):
            trained = trained_model(args.checkpoint)
            specs = serving_specs(specs, trained)
        check_unique_names(specs)  # two workloads of one name would be pooled into one row
        # Every output by the one rule (dohnuts.schema.output_paths), before anything is created: a bad
        # --out, --store or --output leaves nothing behind (not even an empty store).
        out_root = check_output_folder(args.out, field="--out", error=ConfigError, create=False,
                                       holds_new_folders=True)
        store_path = Path(args.store) if args.store else out_root.parent / "store.sqlite"
        inputs = [*self.files, trained.adapter if trained else None]
        check_output_file(store_path, inputs=inputs, field="--store", what="a run store", error=ConfigError,
                          make_folder="later")
        self.output = None
        if getattr(args, "output", None):
            self.output = check_output_file(args.output, inputs=[*inputs, *store_files(store_path)], field="--output",
                                            what="a JSONL file to write", error=ConfigError, make_folder="later")
        if getattr(args, "nvtx", False):  # without the nvtx package --nvtx is refused here, in one line
            nvtx_stage_ranges()
        for spec in specs:
            check_target_options(spec, self.targets)
        self.runnable = runnable_here(specs, self.targets, self.launchers)
        if not self.runnable:
            log.info("nothing to run on this machine")
            return False
        device = resolve_device(self.runnable[0])
        named_by = None if args.hwspec else next((s for s in self.runnable if s.hwspec), None)
        try:
            self.hwspec = hwspec_for_device(args.hwspec or (named_by.hwspec if named_by else None),
                                            device_info(device)["name"])
        except ConfigError as exc:
            if named_by is None:
                raise
            raise ConfigError(f"cannot be used: {exc}", source=named_by.file, field="hwspec") from None
        self.store_db = RunStore(store_path)  # a corrupt or foreign store is refused here, before anything is measured
        label = args.label or (self.runnable[0].name if len(self.runnable) == 1 else "run")
        self.out_root, self.created_root = out_root, not os.path.lexists(out_root)
        if device.type == "cpu":
            torch.set_num_threads(args.threads)  # dohnuts.bench.commands.run's docstring: why one by default
        run_id, run_dir = new_run_dir(out_root, label)  # created only now: every input has been validated
        self.run_dir, self.results = run_dir, run_dir / "results.jsonl"
        self.context = RunContext(run_id=run_id, run_dir=run_dir, device=device, hwspec=self.hwspec,
                                  console=self.console, profile=args.profile,
                                  nvtx=getattr(args, "nvtx", False))
        # the id is what a gate baseline is kept per; the CPU model, what host stages and a host-bound peer follow
        self.context.measured["machine"] = {"id": machine_id.this_machine(device), "cpu_model": machine_id.cpu_model()}
        self.clock = RunClock(self.context.measured.setdefault("timing", {}))
        self.samplers = samplers(self.pm)
        for s in self.samplers:
            if s.unavailable:
                log.info("telemetry: %s: %s", s.name, s.unavailable)
        self.telemetry = TelemetryThread([s for s in self.samplers if not s.unavailable],
                                         interval_s=args.telemetry_interval)
        self.provenance = provenance(device, self.telemetry)  # where the numbers come from, taken once
        return True

    def measure(self) -> None:
        """The machine, then every workload (dohnuts.bench.commands.run). A Ctrl-C, or a refusal met while
        measuring (e.g. a target's adapter that cannot be loaded), ends it: `interrupted` or
        `error` says which, and what was recorded stays in results.jsonl."""
        run, pm = self.context, self.pm
        mirror = StoreMirror(self.store_db, run.run_id, warn=lambda m: log.warning("%s", m))
        self.clock.mark("run_started")
        try:
            with MeasureProgress(enabled=not self.args.quiet) as progress:
                progress.phase("preparing the run (the ceilings of this machine)")
                pm.hook.dohnuts_bench_prepare_run(run=run)
                self.clock.mark("prepared")
                self._store_run()  # the store takes the run before its records (it is a copy: a failure warns)
                log.info("run %s → %s (and %s)", run.run_id, self.results, self.store_db.path)
                self.telemetry.start()
                try:
                    with RecordSink.open(self.results, mirrors=(mirror, self.clock)) as out:
                        for spec in self.runnable:
                            for n in spec.processes:
                                if n == 1:
                                    runner.measure_workload(run, pm, spec, self.kinds, self.targets, self.telemetry,
                                                            out, progress)
                                else:  # the launcher's processes measure on their own devices; the parent waits
                                    progress.phase(f"{spec.name} at {n} processes ({spec.launcher})")
                                    self.launchers[spec.launcher].launch(
                                        run, spec, n, out, gpu=run.device.type == "cuda",
                                        telemetry_interval=self.args.telemetry_interval)
                finally:
                    self.telemetry.stop()
        except KeyboardInterrupt:
            self.interrupted = True
        except DohnutsError as exc:  # refused while measuring: what was measured is reported
            self.error = exc

    def analyse(self) -> None:
        """The records read back, the built-in analysis, summary.json's rows, the plugins' sections."""
        self.records = checked_records(self.results)
        self.sections = analysis_sections(self.pm, self.records, self.hwspec, self.context.measured, self.run_dir)
        self.rows = summarize(self.records)
        self.summary = summary_json(self.rows, self.sections)

    def store(self) -> None:
        """run.json (always: with the failures, the traces, the milestones) and, once analysed,
        summary.json, each written once; the store's copy of both; `--output`."""
        self.write_run_json()
        self._store_run(self.meta)
        if self.summary is not None:
            self.summary = write_summary(self.run_dir, self.summary)
            try:
                self.store_db.add_summary(self.context.run_id, self.summary)
            except (sqlite3.Error, OSError, ValueError) as exc:
                log.warning("the run store %s did not take summary.json (%s)", self.store_db.path, exc)
        self.store_db.close()
        if self.output is not None and self.measured_any():
            copy_records(self.results, self.output)

    def report(self) -> None:
        """The text report (stdout, report.txt), the reporter plugins', report.html."""
        run_dir = self.run_dir
        report_analysis(self.pm, self.console, self.records, self.rows, self.sections, run_dir)
        try:
            page = write_page(run_dir / "report.html", self.summary, meta=self.meta, title=self.context.run_id,
                              trends=trends_for(self.store_db.path, self.summary, self.context.run_id),
                              source=run_dir / "summary.json")
            log.info("html: %s", page)
        except (DohnutsError, OSError, ValueError) as exc:  # the text report and the JSONL are written already
            log.warning("no report.html (%s)", exc)
        for t in self.context.traces:
            log.info("trace: %s (open in Perfetto: ui.perfetto.dev)", run_dir / t["path"])

    # -- the run, end to end ----------------------------------------------------------------------

    def run(self) -> int:
        """The phases in order, and what an interruption or a refusal leaves (dohnuts.bench.cli's
        docstring): the exit status."""
        if not self.prepare():
            return 0
        try:
            self.measure()
        except BaseException:
            if self.measured_any():
                self.write_run_json()  # an error no phase expects: what was recorded stays analysable
            raise
        measured_any = self.measured_any()
        if self.interrupted and not measured_any:
            # Ctrl-C before the first call was recorded (e.g. while the ceilings were measured).
            self.discard()
            log.warning("interrupted before the first call was recorded: nothing was measured, no run kept")
            return 130
        if self.interrupted:
            log.warning("interrupted: %s holds every completed call", self.results)
        if self.error is not None and not measured_any and not self.context.failures:
            self.discard()  # refused before any call was recorded: leave nothing behind
            raise self.error
        self.clock.mark("measured")  # the report's machine section says the milestones
        try:
            try:
                if measured_any:
                    self.analyse()
            finally:
                self.store()  # run.json whatever the analysis did
            if measured_any:
                self.report()
        except DohnutsError as exc:
            if self.error is None:
                raise
            # The report failed after the run itself did (a full disk fails both): the run's own error
            # is the one line; results.jsonl holds every record written whole before it.
            log.warning("no report (%s)", exc)
        except KeyboardInterrupt:
            # A second Ctrl-C (or the first, during the report): results.jsonl is complete and closed.
            print("dohnuts-bench: interrupted while writing the report; results.jsonl holds every completed call "
                  f"(`dohnuts-bench analyze {self.results}` writes the report)", file=sys.stderr)
            return 130
        if self.error is not None:
            raise self.error
        if self.interrupted:
            return 130
        failures = self.context.failures
        if failures:
            first = failures[0]
            print(f"dohnuts-bench: error: {len(failures)} target(s) failed, the rest was measured and reported "
                  f"(run.json `failures`); first: {first['file']}: target {first['target']}: {first['error']}",
                  file=sys.stderr)
            return 1
        return 0

    # -- helpers ------------------------------------------------------------------------------------

    def write_run_json(self) -> None:
        text = dumps(self.run_json(), indent=2, default=str)
        write_text_atomic(self.run_dir / "run.json", text)
        self.meta = json.loads(text)  # run.json as the file holds it (the page reads it)

    def measured_any(self) -> bool:
        return self.results.exists() and self.results.stat().st_size > 0

    def run_json(self) -> dict:
        """run.json's content: the workloads, the hwspec, what was measured of the machine, the
        provenance, the telemetry samplers, the failures and the traces."""
        run = self.context
        return {"run_id": run.run_id, "workloads": [s.to_dict() for s in self.runnable],
                "hwspec": hwspec_ref(self.hwspec), "measured": run.measured,
                "provenance": self.provenance,
                "telemetry": {s.name: s.unavailable or "available" for s in self.samplers},
                "failures": run.failures, "traces": run.traces}

    def _store_run(self, meta: dict | None = None) -> None:
        """The run's row in the store (a copy: a store that fails is a warning)."""
        try:
            self.store_db.add_run(self.context.run_id, meta if meta is not None else self.run_json())
        except (sqlite3.Error, OSError) as exc:
            log.warning("the run store %s did not take run.json (%s)", self.store_db.path, exc)

    def discard(self) -> None:
        """Nothing was recorded: leave no run behind."""
        self.store_db.delete_run(self.context.run_id)
        self.store_db.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.created_root:
            try:
                self.out_root.rmdir()
            except OSError:
                pass


def copy_records(results: Path, output: Path) -> None:
    """results.jsonl to --output, whole or not at all (a temporary file renamed into place: a link
    planted meanwhile is replaced, never followed)."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(output, results.read_bytes())
    except (OSError, DohnutsError) as exc:
        log.warning("--output %s was not written (%s); %s holds the records", output, exc, results)
        return
    log.info("records: %s", output)
