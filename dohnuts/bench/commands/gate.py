"""`dohnuts-bench gate`: is this build slower? Two ways, with exit codes a CI can use.

**Interleaved (the gate to use on one machine):** the base revision and this work tree timed in
turns, in one command:

    dohnuts-bench gate --against main [WORKLOAD.yaml ...] [--rounds 10] [--calls 50]

The base is `git archive`d into a temporary folder (the repository is not touched); the candidate
is the git work tree holding the current directory, uncommitted changes included. Each round
starts one process a side and makes them take turns call by call (dohnuts.bench.measure.interleave); a
workload · target is a regression when the interval of its ratio candidate / base over the rounds
lies above 1 + --min-effect (default 5 %; dohnuts.bench.analysis.rounds). It prints each
workload · target's ratio, interval and the smallest slowdown this run could detect (caught 9
times in 10 given the spread its rounds showed), and the load other processes put on the machine
each round. On the shared 2-core CI machine it caught a 15 % slowdown of the dohnuts target in
10 of 10 trials and passed unchanged code in 10 of 10, quiet and loaded, seeing 6–9 % slowdowns
(benchmarks/maintainers/gate_detection.py; the numbers are in docs/measurement.md, "The regression gate").

**Against saved baselines (the coarse gate, across days):**

    dohnuts-bench baseline                       # once per machine (dohnuts.bench.commands.baseline)
    dohnuts-bench run --out /tmp/ci              # this build, then:
    dohnuts-bench gate /tmp/ci/<run> [--baseline BASE ...] [--min-effect 0.1] [--confidence 0.99]

CURRENT is a dohnuts-bench run (a run directory or its results.jsonl[.gz]: every workload and
target's steady-state wall times) or a pytest-benchmark JSON file written with
`--benchmark-save-data` (every round's time), or a run exported as one (`dohnuts-bench export`). Without --baseline
a run is gated against this machine's baseline, `results/baselines/<machine id>/` (the id its
run.json records: dohnuts.bench.measure.machine_id); a BASE is a baseline folder (its baseline.json names
its runs), a run, or a pytest-benchmark file. A baseline folder of another machine is refused
(exit 2): timings of one machine class say nothing about another's.
For each benchmark (or workload · target) the baseline runs' samples are pooled and the ratio
current / baseline of the medians gets a bootstrap confidence interval and a rank test
(dohnuts.bench.analysis.compare). The tolerance comes from measured spread twice over: the interval
is as wide as the samples' own spread makes it, and the smallest slowdown called a regression is
the larger of --min-effect and the drift between the baseline's own runs (max / min of their
medians − 1). Runs taken at other times meet other loads: on the shared 2-core CI machine that
drift is 20–254 %, so this gate fails only a slowdown near 2× there; it is for comparing across
days where the interleaved gate cannot run the old build. A benchmark is a regression when the
whole interval lies above 1 + tolerance and the rank test agrees — unless the loads the baseline
runs and this run measured under explain it (dohnuts.bench.analysis.load_verdict: this run's
process got less of a core while other processes saturated the machine): then the line says
"slower, explained by load" and why, and the gate passes.

Exit status: 0 passed, 1 a regression, 2 bad input (one line naming the file).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from dohnuts.bench import plugins
from dohnuts.bench.analysis.compare import SLOWER, WALL, compare_samples, steady_loads, steady_samples
from dohnuts.bench.analysis.load_verdict import weigh
from dohnuts.bench.analysis.records import read_records
from dohnuts.bench.analysis.rounds import judge_rounds, round_effect
from dohnuts.bench.commands.options import add_json_output, check_json_output
from dohnuts.bench.measure import interleave
from dohnuts.bench.measure.workload import check_unique_names, load_workload, standard_files
from dohnuts.bench.plugins import check_target_options, collect
from dohnuts.bench.report.status import log
from dohnuts.bench.store.baselines import DEFAULT_ROOT, MANIFEST, baseline_machine, baseline_runs
from dohnuts.bench.store.summary_file import MAX_JSON_BYTES
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema import MIB, read_json, write_json
from dohnuts.threads import DEFAULT_CPU_THREADS

PASSED, REGRESSION, BAD_INPUT = 0, 1, 2


def timings(path: str | Path) -> dict[str, list[float]]:
    """Benchmark name → its samples (seconds for pytest-benchmark JSON, ms for a dohnuts-bench run)."""
    path = Path(path)
    if path.is_dir() or path.name.startswith("results.jsonl"):
        return _run_timings(path)

    data = read_json(path, max_bytes=256 * MIB, error=DohnutsError, what="a pytest-benchmark JSON file")
    try:
        out = {}
        for b in data["benchmarks"]:
            rounds = b["stats"].get("data")
            if not rounds:
                raise KeyError(f"{b['name']}: stats.data (save with --benchmark-save-data)")
            out[b["name"]] = [float(x) for x in rounds]
        return out
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DohnutsError(f"cannot read pytest-benchmark timings ({exc})", source=str(path)) from None


def _run_timings(path: Path) -> dict[str, list[float]]:
    if path.is_dir():
        path = next((path / n for n in ("results.jsonl", "results.jsonl.gz") if (path / n).is_file()), path)
    if not path.is_file():
        raise DohnutsError("holds no results.jsonl (a dohnuts-bench run directory)", source=str(path))
    samples = steady_samples(read_records(path))
    return {f"{wl} · {tg}": s[WALL] for (wl, tg), s in samples.items() if s.get(WALL)}


def run_load(path: str | Path) -> float | None:
    """Cores other processes kept busy while a dohnuts-bench run measured (the median of its
    records' `load` telemetry), or None (a pytest-benchmark file, a run without that telemetry)."""
    path = Path(path)
    if path.is_dir():
        path = next((path / n for n in ("results.jsonl", "results.jsonl.gz") if (path / n).is_file()), path)
    if not path.name.startswith("results.jsonl") or not path.is_file():
        return None
    others = [r["load"].get("others_cores") for rec in read_records(path) for r in rec.telemetry
              if isinstance(r.get("load"), dict)]
    others = [x for x in others if isinstance(x, (int, float))]
    return statistics.median(others) if others else None


def run_loads(paths: list[str | Path]) -> dict:
    """Per benchmark (`workload · target`), the load (load_verdict.Load) the steady calls of these
    dohnuts-bench runs measured under, pooled; empty for pytest-benchmark files."""
    records = []
    for path in map(Path, paths):
        if path.is_dir():
            path = next((path / n for n in ("results.jsonl", "results.jsonl.gz") if (path / n).is_file()), path)
        if path.name.startswith("results.jsonl") and path.is_file():
            records += read_records(path)
    return {f"{wl} · {tg}": load for (wl, tg), load in steady_loads(records).items()}


def load_note(bases: list[Path], current: str | Path) -> str | None:
    """One line comparing the load the baseline runs and this run measured under, when known."""
    loads = [run_load(b) for b in bases]
    now = run_load(current)
    if now is None or any(x is None for x in loads):
        return None
    line = (f"load (cores kept busy by other processes, median): baseline runs "
            f"{', '.join(f'{x:.2f}' for x in loads)}; this run {now:.2f}")
    if now < min(loads) - 0.5 or now > max(loads) + 0.5:
        line += (" — outside the baseline's range: this comparison says as much about the other processes as "
                 "about this build")
    return line


def gate(baselines: list[dict[str, list[float]]], current: dict[str, list[float]], *, min_effect: float = 0.1,
         confidence: float = 0.99, base_loads: dict | None = None, current_loads: dict | None = None
         ) -> tuple[bool, list[str]]:
    """(passed, one line per benchmark) — the verdicts of compare_samples, B = current over A = the
    pooled baseline runs, with the tolerance of the module docstring, weighed by the loads each
    measured under (`run_loads`; none known: the plain verdict)."""
    ok, lines = True, []
    names = sorted({n for b in baselines for n in b} | set(current))
    for name in names:
        runs = [b[name] for b in baselines if name in b]
        if not runs or name not in current:
            lines.append(f"{name}: only in {'the baseline' if runs else 'this build'}")
            continue
        medians = [statistics.median(r) for r in runs]
        tolerance = max(min_effect, max(medians) / min(medians) - 1.0)
        row = compare_samples(name, [x for r in runs for x in r], current[name], confidence=confidence,
                              min_effect=tolerance)
        verdict, reason = weigh(row.verdict, row.ratio, (base_loads or {}).get(name), (current_loads or {}).get(name),
                                label_a="the baseline", label_b="this run")
        interval = "" if row.ci_low is None else f", {confidence:.0%} interval {row.ci_low:.3f}–{row.ci_high:.3f}"
        lines.append(f"{name}: median {row.median_a:.4g} → {row.median_b:.4g}, ratio {row.ratio:.3f}"
                     f"{interval}, tolerance {tolerance:.0%}: {verdict}" + (f" ({reason})" if reason else ""))
        ok &= verdict != SLOWER
    return ok, lines


def run_machine(path: str | Path) -> str | None:
    """The machine id a dohnuts-bench run recorded (run.json `measured.machine.id`), or None (no
    run.json, or one that cannot be read: a FIFO or a device is refused by its stat, never read)."""
    path = Path(path)
    run_dir = path if path.is_dir() else path.parent
    try:
        meta = read_json(run_dir / "run.json", max_bytes=MAX_JSON_BYTES, error=DohnutsError, what="a run's JSON")
        machine = ((meta.get("measured") or {}).get("machine") or {}).get("id")
    except (DohnutsError, AttributeError):
        return None
    return machine if isinstance(machine, str) else None


def baseline_paths(args_baseline: list[str] | None, current: str, root: Path) -> list[Path]:
    """The baseline runs: each BASE expanded (a baseline folder → its runs), or this machine's."""
    machine = run_machine(current)
    if not args_baseline:
        if machine is None:
            raise DohnutsError("names no machine (not a dohnuts-bench run, or one from before run.json recorded its "
                               "machine): pass --baseline", source=str(current))
        folder = root / machine
        if not (folder / MANIFEST).is_file():
            raise DohnutsError(f"holds no baseline of this machine ({machine}); make one with `dohnuts-bench "
                               "baseline`", source=str(folder))
        args_baseline = [str(folder)]
    out = []
    for base in args_baseline:
        path = Path(base)
        if path.is_dir() and (path / MANIFEST).is_file():
            theirs = baseline_machine(path)
            if machine and theirs and theirs != machine:
                raise DohnutsError(f"is the baseline of machine {theirs}; {current} ran on {machine}",
                                   source=str(path))
            out += baseline_runs(path)
        else:
            out.append(path)
    return out


def run(args) -> int:
    if args.against is not None:
        return run_rounds(args)
    if args.rounds is not None or args.calls is not None or args.json is not None:
        raise DohnutsError("--rounds, --calls and --json belong to the interleaved gate (--against REV)",
                           source="command line")
    if len(args.inputs) != 1:
        raise DohnutsError(f"gate takes one CURRENT run (or --against REV and workload files), got "
                           f"{len(args.inputs)}", source="command line")

    (path,) = args.inputs
    current = timings(path)
    bases = baseline_paths(args.baseline, path, Path(args.baselines_root or DEFAULT_ROOT))
    baselines = [timings(b) for b in bases]
    if len(baselines) < 2:

        log.warning("one baseline run (%s): no drift between runs measured, the tolerance is --min-effect alone",
                    bases[0])
    ok, lines = gate(baselines, current, min_effect=_or(args.min_effect, BASELINE_MIN_EFFECT),
                     confidence=_or(args.confidence, BASELINE_CONFIDENCE),
                     base_loads=run_loads(bases), current_loads=run_loads([path]))
    note = load_note(bases, path)
    print("\n".join(lines + ([note] if note else [])))
    print("gate: " + ("passed" if ok else "REGRESSION"), file=sys.stderr)
    return PASSED if ok else REGRESSION


# ----------------------------------------------------------------------------------------------
# the interleaved gate

BASELINE_MIN_EFFECT, BASELINE_CONFIDENCE = 0.1, 0.99   # against saved baselines
ROUNDS_MIN_EFFECT, ROUNDS_CONFIDENCE = 0.05, 0.95      # interleaved (dohnuts.bench.analysis.rounds)
DEFAULT_ROUNDS, DEFAULT_CALLS = 10, 50
MAX_ROUNDS, MAX_CALLS = 1000, 100_000


def _or(value, default):
    return default if value is None else value


def _printable(text: str) -> str:
    """A user's name (a workload, a label) as a terminal shows it: control characters escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def rounds_gate(result, *, min_effect: float = ROUNDS_MIN_EFFECT, confidence: float = ROUNDS_CONFIDENCE):
    """(passed, one line per workload · target, the verdicts) of an interleaved run
    (dohnuts.bench.measure.interleave.RoundsResult), by the rule of dohnuts.bench.analysis.rounds."""
    ok, lines, rows = True, [], []
    for name in result.groups:
        row = judge_rounds(name, [round_effect(p) for p in result.pairs[name]], confidence=confidence,
                           min_effect=min_effect)
        # The verdict is decided here, one workload · target at a time: a rule that weighs the load
        # each round saw (result.load) belongs right here, before the row counts.
        rows.append(row)
        lines.append(f"{_printable(name)}: ratio {row.ratio:.3f}, {confidence:.0%} interval {row.ci_low:.3f}–"
                     f"{row.ci_high:.3f} over {row.rounds} rounds (spread {row.spread:.1%}); smallest detectable "
                     f"slowdown {row.smallest_detectable:.1%}: {row.verdict}")
        ok &= row.verdict != SLOWER
    for side, names in result.only_in.items():
        lines += [f"{_printable(n)}: only in the {side} (not gated)" for n in names]
    return ok, lines, rows


def _workload_files(inputs: list[str]) -> list[Path]:
    """The workload files named (default: the standard suite), each checked by this build's reader
    before anything is exported or started: a bad file is one line, exit 2."""
    files = [Path(f).resolve() for f in inputs] or standard_files()
    pm = plugins.plugin_manager()
    kinds = collect(pm, "dohnuts_bench_register_workload_kinds")
    targets = collect(pm, "dohnuts_bench_register_targets")
    specs = [load_workload(f, kinds, targets) for f in files]
    for spec in specs:
        check_target_options(spec, targets)
    check_unique_names(specs)
    return files


def _check_rounds_args(args) -> None:
    if args.baseline or args.baselines_root:
        raise ConfigError("the interleaved gate (--against) measures its own base: no --baseline",
                          source="command line", field="--baseline")
    for flag, value, lo, hi in (("--rounds", args.rounds, 3, MAX_ROUNDS), ("--calls", args.calls, 1, MAX_CALLS)):
        if value is not None and not lo <= value <= hi:
            raise ConfigError(f"must be in [{lo}, {hi}], got {value}", source="command line", field=flag)
    if args.min_effect is not None and not 0.0 <= args.min_effect < 10.0:
        raise ConfigError(f"must be in [0, 10), got {args.min_effect!r}", source="command line", field="--min-effect")
    if args.confidence is not None and not 0.0 < args.confidence < 1.0:
        raise ConfigError(f"must be between 0 and 1, got {args.confidence!r}", source="command line",
                          field="--confidence")


def run_rounds(args) -> int:
    """`gate --against REV [WORKLOAD ...]`: the interleaved gate (module docstring)."""
    _check_rounds_args(args)
    rounds, calls = _or(args.rounds, DEFAULT_ROUNDS), _or(args.calls, DEFAULT_CALLS)
    min_effect, confidence = _or(args.min_effect, ROUNDS_MIN_EFFECT), _or(args.confidence, ROUNDS_CONFIDENCE)
    json_out = (check_json_output(args.json, [Path(f) for f in args.inputs]) if args.json  # refused before any work
                else None)
    files = _workload_files(args.inputs)
    candidate = interleave.work_tree(Path.cwd())
    scratch = interleave.make_scratch()
    try:
        base_tree = scratch / "base"
        commit = interleave.export_revision(candidate, args.against, base_tree)
        sides = (interleave.Side("base", base_tree, commit[:12]), interleave.Side("candidate", candidate, "work tree"))
        log.info("gate: %s (%s) against the work tree %s: %d rounds of %d call pairs a workload · target",
                 _printable(args.against), commit[:12], candidate, rounds, calls)
        result = interleave.run_rounds(rounds, calls, lambda side, r: interleave.WorkerProcess.start(
            sides[side], files, scratch, r, threads=DEFAULT_CPU_THREADS, trees=(base_tree, candidate),
            cpu=interleave.round_cpu(r)))
    finally:
        interleave.remove_scratch(scratch)
    if not result.groups:
        raise DohnutsError("no workload · target ran on both sides: nothing to gate", source="command line")
    ok, lines, rows = rounds_gate(result, min_effect=min_effect, confidence=confidence)
    widest = max(rows, key=lambda r: r.smallest_detectable)
    loads = [x for x in result.load if x is not None]
    lines.append(f"smallest slowdown this run detects 9 times in 10: {widest.smallest_detectable:.1%} "
                 f"({_printable(widest.name)}; min-effect {min_effect:.0%}, {confidence:.0%} confidence)")
    if loads:
        lines.append(f"load (cores kept busy by other processes) per round: {', '.join(f'{x:.2f}' for x in loads)}")
    print("\n".join(lines))
    if json_out is not None:

        write_json(json_out, {
            "schema": 1, "against": args.against, "base_commit": commit, "candidate": str(candidate),
            "rounds": rounds, "calls": calls, "min_effect": min_effect, "confidence": confidence, "passed": ok,
            "smallest_detectable": widest.smallest_detectable, "load": result.load, "first": result.first,
            "only_in": result.only_in,
            "groups": [{"name": r.name, "verdict": r.verdict, "ratio": r.ratio, "ci_low": r.ci_low, "ci_high": r.ci_high,
                        "spread": r.spread, "smallest_detectable": r.smallest_detectable,
                        "round_ratios": list(r.round_ratios)} for r in rows]}, indent=2)
    print("gate: " + ("passed" if ok else "REGRESSION"), file=sys.stderr)
    return PASSED if ok else REGRESSION


def setup_arguments(subparsers) -> None:
    g = subparsers.add_parser("gate", help="is this build slower? --against REV: base and this tree timed in turns; "
                                           "else CURRENT against saved baselines. Exit 0 passed, 1 regression, 2 bad "
                                           "input")
    g.add_argument("inputs", nargs="*", metavar="CURRENT | WORKLOAD",
                   help="without --against: one dohnuts-bench run directory or pytest-benchmark JSON (CURRENT); "
                        "with --against: workload YAML files (default: the embedded standard suite)")
    g.add_argument("--against", metavar="REV",
                   help="gate this git work tree against revision REV (a branch, tag or commit), both timed in "
                        "interleaved rounds on this machine (default: against saved baselines)")
    g.add_argument("--rounds", type=int, help=f"--against: rounds, a fresh process a side each (3 to {MAX_ROUNDS}; "
                                               f"default: {DEFAULT_ROUNDS})")
    g.add_argument("--calls", type=int, help=f"--against: call pairs a workload · target a round (1 to {MAX_CALLS}; "
                                              f"default: {DEFAULT_CALLS})")
    add_json_output(g, help="--against: also write the verdicts, rounds and loads as JSON to OUT (default: none "
                            "written)")
    g.add_argument("--baseline", nargs="+", metavar="BASE",
                   help="baseline folders (dohnuts-bench baseline), runs or pytest-benchmark files of the same kind "
                        "(default: this machine's, results/baselines/<machine id>/)")
    g.add_argument("--baselines-root", metavar="DIR",
                   help="where the per-machine baselines are (default: results/baselines)")
    g.add_argument("--min-effect", type=float,
                   help=f"smallest slowdown called a regression, as a fraction (default: {ROUNDS_MIN_EFFECT} with "
                        f"--against, {BASELINE_MIN_EFFECT} against saved baselines)")
    g.add_argument("--confidence", type=float,
                   help=f"interval confidence (default: {ROUNDS_CONFIDENCE} with --against, {BASELINE_CONFIDENCE} "
                        "against saved baselines)")
    g.set_defaults(func=run)
