"""`dohnuts-bench analyze` and `compare`: the commands that read finished runs (results.jsonl or its
archive results.jsonl.gz, and the run.json beside it), and the analysis and report `run` ends with.

`analyze` never writes beside its input (a committed run stays as committed): its report files go
to `--out DIR`, or by default to a new temporary folder, named on stderr. Every output path follows
the one rule of dohnuts.schema.output_paths (never a symbolic link, an input or a run folder). `compare` exits 1 when a
workload · target's whole call is slower in B (a CI can use it), 0 otherwise, 2 on bad input.

A run.json is read as `RunMeta` (dohnuts.schema: one line naming the file and the field when it
is not usable); the records as dohnuts.bench.analysis.records reads them.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Any

import msgspec

from dohnuts.bench.report.status import log
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema import (
    MIB, check_output_file, check_output_folder, convert, read_file, short, stat_path, write_json,
)

MAX_RUN_JSON_BYTES = 64 * MIB


def make_console():
    """The console reports are printed on (stdout, no highlighting of numbers)."""
    from dohnuts.bench.report.terminal import SafeConsole

    return SafeConsole(stderr=False)


def _stored_hwspec(ref: str):
    """A run.json's hwspec: its file path or built-in name, or (older runs) its display name."""
    from dohnuts.bench.analysis import find_hwspec
    from dohnuts.bench.analysis.hwspec import BUILTIN_DIR

    try:
        return find_hwspec(ref)
    except ConfigError:
        for path in sorted(BUILTIN_DIR.glob("*.yaml")):
            spec = find_hwspec(path)
            if spec.name == ref:
                return spec
        raise


def analyze_and_report(results: Path, hwspec, measured: dict, run_dir: Path, console, pm=None, *,
                       revalidate: bool = False) -> None:
    from dohnuts.bench.analysis import read_jsonl
    from dohnuts.bench.analysis.records import RecordError, check_reportable
    from dohnuts.bench.plugins import plugin_manager

    pm = pm or plugin_manager()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_jsonl(results)
    if not records:  # the one line names what was skipped
        skipped = f" ({caught[0].message})" if caught else ""
        raise RecordError(f"holds no schema-1 records of a dohnuts-bench run{skipped}", source=str(results))
    for w in caught:
        log.warning("%s", w.message)
    for rec in records:
        check_reportable(rec)
    if revalidate:  # the validity gates of today, applied to the telemetry each record kept
        from dohnuts.bench.measure.telemetry import call_validity, default_min_clock_fraction

        fraction = default_min_clock_fraction()
        for rec in records:
            if isinstance(rec.get("telemetry"), list):
                rec["validity"] = call_validity(rec["telemetry"], fraction)
    sections = [s for group in pm.hook.dohnuts_bench_analyze(records=records, hwspec=hwspec, measured=measured,
                                                              run_dir=run_dir) if group for s in group]
    pm.hook.dohnuts_bench_report(console=console, records=records, sections=sections, run_dir=run_dir)


class RunMeasured(msgspec.Struct):
    ceilings: dict[str, Any] = {}


class RunMeta(msgspec.Struct):
    """What `analyze` reads of a run.json (dohnuts.bench.cli._run_json writes it)."""

    hwspec: str | None = None  # a built-in name or a path (older runs: the spec's display name)
    measured: RunMeasured | None = None  # the ceilings measured at the start of the run


def _run_meta(run_json: Path) -> dict:
    """The run.json beside a results.jsonl ({} when there is none); a corrupt one is refused."""
    if not os.path.lexists(run_json):
        return {}
    raw = read_file(run_json, max_bytes=MAX_RUN_JSON_BYTES, what="a run's JSON")
    try:
        meta = msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise DohnutsError(f"is not a run's JSON ({short(exc, 120, str)}); repair it or move it away to analyse the "
                           "results beside it", source=str(run_json)) from None
    convert(meta, RunMeta, source=str(run_json), error=DohnutsError)
    return meta


def _temporary_output(results: Path) -> Path:
    """A new folder for the report files of `analyze` without --out: never the input's folder."""
    import re
    import tempfile

    name = re.sub(r"[^A-Za-z0-9._-]+", "-", results.parent.name or "run").strip("-")[:60] or "run"
    return Path(tempfile.mkdtemp(prefix=f"dohnuts-bench-analyze-{name}-"))


def results_path(arg: str) -> Path:
    """The results file an argument names: a results.jsonl (or .jsonl.gz), or a run directory
    holding one. A path that is missing, too long, a FIFO or a device is one line (the reader
    checks the file's type and size before it opens it)."""
    path = Path(arg)
    st = stat_path(path, error=DohnutsError)
    if stat.S_ISDIR(st.st_mode):  # a run directory (an archived run: results.jsonl.gz)
        plain, archived = path / "results.jsonl", path / "results.jsonl.gz"
        path = plain if os.path.lexists(plain) or not os.path.lexists(archived) else archived
        if not os.path.lexists(path):
            raise DohnutsError("does not exist (expected a run directory or its results.jsonl)", source=str(path))
    return path


def json_output(arg: str, inputs: list[Path]) -> Path:
    """`--json OUT` (compare, the interleaved gate) by the one output rule (dohnuts.schema.output_paths):
    not a symbolic link, none of the command's `inputs`, not in a run folder, new or a regular file
    (a directory, /dev/full, a FIFO, a name too long or a read-only place is one line, before any
    work); its folder created if need be."""
    return check_output_file(arg, inputs=inputs, field="--json", what="a JSON file to write", make_folder=True)


def run_inputs(results: Path) -> list[Path]:
    """What a command reading a run reads: its results file and the run.json beside it."""
    return [results, results.parent / "run.json"]


def cmd_analyze(args) -> int:
    from dohnuts.bench.analysis import find_hwspec
    from dohnuts.bench.analysis.records import RecordError

    path = results_path(args.results)
    meta = _run_meta(path.parent / "run.json")
    hwspec = find_hwspec(args.hwspec) if args.hwspec else (
        _stored_hwspec(meta["hwspec"]) if meta.get("hwspec") else None)
    hwspec_file = Path(hwspec.source) if hwspec is not None and hwspec.source else None
    # the one output rule: never a run folder (nor the input's), never through a planted link
    out_dir = (check_output_folder(args.out, inputs=[*run_inputs(path), hwspec_file], field="--out", error=ConfigError)
               if args.out else _temporary_output(path))
    try:
        analyze_and_report(path, hwspec, meta.get("measured") or {}, out_dir, make_console(),
                           revalidate=args.revalidate)
    except DohnutsError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        # Records that pass the structural checks but that an analysis still cannot read (a
        # foreign or hand-edited file): one line naming the file, not a traceback.
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise RecordError(f"cannot be analysed ({reason})", source=str(path)) from None
    if not args.out:
        log.info("report files: %s (a new temporary folder; --out DIR chooses one)", out_dir)
    return 0


def cmd_compare(args) -> int:
    """`compare RUN_A RUN_B`: the table of dohnuts.bench.analysis.compare (its docstring has the rule)."""
    from rich.text import Text

    from dohnuts.bench.analysis.compare import SLOWER, WALL, compare_runs
    from dohnuts.bench.analysis.compare_table import comparison_dict, comparison_table, load_lines
    from dohnuts.bench.analysis.records import read_jsonl

    console = make_console()
    paths = [results_path(arg) for arg in (args.run_a, args.run_b)]
    runs = []
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = read_jsonl(path)
        for w in caught:
            log.warning("%s", w.message)
        if not any(r.get("phase", "steady") == "steady" for r in records):
            raise DohnutsError("holds no steady-state records", source=str(path))
        runs.append(records)
    inputs = [p for path in paths for p in run_inputs(path)]
    json_out = json_output(args.json, inputs) if args.json else None  # refused before any work, in one line
    comparison = compare_runs(runs[0], runs[1], confidence=args.confidence, min_effect=args.min_effect,
                              label_a=str(paths[0]), label_b=str(paths[1]))
    if not comparison.rows:
        only = sorted({f"{w} / {t}" for w, t in (*comparison.only_in_a, *comparison.only_in_b)})
        raise DohnutsError(f"no (workload, target) measured in both runs ({', '.join(only)})",
                           source=f"{paths[0]} vs {paths[1]}")
    console.print(comparison_table(comparison))
    for note in comparison.warnings:  # (names are the user's: never read as markup)
        console.print(Text.assemble(("warning", "yellow"), f": {note}"))
    explained = load_lines(comparison)
    for line in explained:  # not a regression: the machine's load accounts for the change
        console.print(Text.assemble(("load", "yellow"), f": {line}"))
    if json_out is not None:
        write_json(json_out, comparison_dict(comparison), indent=2)
        log.info("wrote %s", json_out)
    if explained:
        names = [f"{r.workload} · {r.target}" for r in comparison.rows if r.stage == WALL and r.load]
        log.warning("changed, explained by the machine's load (not a regression; measure both runs on a quiet "
                    "machine to judge the code): %s", ", ".join(names))
    slower = [f"{r.workload} · {r.target}" for r in comparison.rows if r.stage == WALL and r.verdict == SLOWER]
    if slower:
        log.warning("slower in B (whole call): %s", ", ".join(slower))
        return 1
    return 0
