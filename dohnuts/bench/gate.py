"""`dohnuts-bench gate`: this build's timings against saved baselines, with exit codes a CI can use.

    dohnuts-bench baseline                       # once per machine (dohnuts.bench.baseline)
    dohnuts-bench run --out /tmp/ci              # this build, then:
    dohnuts-bench gate /tmp/ci/<run> [--baseline BASE ...] [--min-effect 0.1] [--confidence 0.99]

CURRENT is a dohnuts-bench run (a run directory or its results.jsonl[.gz]: every workload and
target's steady-state wall times) or a pytest-benchmark JSON file written with
`--benchmark-save-data` (every round's time: benchmarks/test_regressions.py). Without --baseline
a run is gated against this machine's baseline, `results/baselines/<machine id>/` (the id its
run.json records: dohnuts.bench.machine_id); a BASE is a baseline folder (its baseline.json names
its runs), a run, or a pytest-benchmark file. A baseline folder of another machine is refused
(exit 2): timings of one machine class say nothing about another's.
For each benchmark (or workload · target) the baseline runs' samples are pooled and the ratio
current / baseline of the medians gets a bootstrap confidence interval and a rank test
(dohnuts.bench.analysis.compare). The tolerance comes from measured spread twice over: the interval
is as wide as the samples' own spread makes it, and the smallest slowdown called a regression is
the larger of --min-effect and the drift between the baseline's own runs (max / min of their
medians − 1) — on the shared 2-core CI machine a benchmark's median moves by up to ≈ 25 % between
processes of unchanged code, which no within-run statistic can see. A benchmark is a regression
when the whole interval lies above 1 + tolerance and the rank test agrees — unless the loads the
baseline runs and this run measured under explain it (dohnuts.bench.analysis.load_verdict: this
run's process got less of a core while other processes saturated the machine): then the line says
"slower, explained by load" and why, and the gate passes.

Exit status: 0 passed, 1 a regression, 2 bad input (one line naming the file).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from dohnuts.errors import DohnutsError

PASSED, REGRESSION, BAD_INPUT = 0, 1, 2


def timings(path: str | Path) -> dict[str, list[float]]:
    """Benchmark name → its samples (seconds for pytest-benchmark JSON, ms for a dohnuts-bench run)."""
    path = Path(path)
    if path.is_dir() or path.name.startswith("results.jsonl"):
        return _run_timings(path)
    from dohnuts.schema import MIB, read_json

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
    from dohnuts.bench.analysis.compare import WALL, steady_samples
    from dohnuts.bench.analysis.records import read_jsonl

    if path.is_dir():
        path = next((path / n for n in ("results.jsonl", "results.jsonl.gz") if (path / n).is_file()), path)
    if not path.is_file():
        raise DohnutsError("holds no results.jsonl (a dohnuts-bench run directory)", source=str(path))
    samples = steady_samples(read_jsonl(path))
    return {f"{wl} · {tg}": s[WALL] for (wl, tg), s in samples.items() if s.get(WALL)}


def run_load(path: str | Path) -> float | None:
    """Cores other processes kept busy while a dohnuts-bench run measured (the median of its
    records' `load` telemetry), or None (a pytest-benchmark file, a run without that telemetry)."""
    from dohnuts.bench.analysis.records import read_jsonl

    path = Path(path)
    if path.is_dir():
        path = next((path / n for n in ("results.jsonl", "results.jsonl.gz") if (path / n).is_file()), path)
    if not path.name.startswith("results.jsonl") or not path.is_file():
        return None
    others = [r.get("load", {}).get("others_cores") for rec in read_jsonl(path) for r in rec.get("telemetry") or ()
              if isinstance(r, dict) and isinstance(r.get("load"), dict)]
    others = [x for x in others if isinstance(x, (int, float))]
    return statistics.median(others) if others else None


def run_loads(paths: list[str | Path]) -> dict:
    """Per benchmark (`workload · target`), the load (load_verdict.Load) the steady calls of these
    dohnuts-bench runs measured under, pooled; empty for pytest-benchmark files."""
    from dohnuts.bench.analysis.compare import steady_loads
    from dohnuts.bench.analysis.records import read_jsonl

    records = []
    for path in map(Path, paths):
        if path.is_dir():
            path = next((path / n for n in ("results.jsonl", "results.jsonl.gz") if (path / n).is_file()), path)
        if path.name.startswith("results.jsonl") and path.is_file():
            records += read_jsonl(path)
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
    from dohnuts.bench.analysis.compare import SLOWER, compare_samples
    from dohnuts.bench.analysis.load_verdict import weigh

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
    from dohnuts.bench.offline import MAX_RUN_JSON_BYTES
    from dohnuts.schema import read_json

    path = Path(path)
    run_dir = path if path.is_dir() else path.parent
    try:
        meta = read_json(run_dir / "run.json", max_bytes=MAX_RUN_JSON_BYTES, error=DohnutsError, what="a run's JSON")
        machine = ((meta.get("measured") or {}).get("machine") or {}).get("id")
    except (DohnutsError, AttributeError):
        return None
    return machine if isinstance(machine, str) else None


def baseline_paths(args_baseline: list[str] | None, current: str, root: Path) -> list[Path]:
    """The baseline runs: each BASE expanded (a baseline folder → its runs), or this machine's."""
    from dohnuts.bench.baseline import MANIFEST, baseline_machine, baseline_runs

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


def cmd_gate(args) -> int:
    from dohnuts.bench.baseline import DEFAULT_ROOT

    current = timings(args.current)
    bases = baseline_paths(args.baseline, args.current, Path(args.baselines_root or DEFAULT_ROOT))
    baselines = [timings(b) for b in bases]
    if len(baselines) < 2:
        from dohnuts.bench.status import log

        log.warning("one baseline run (%s): no drift between runs measured, the tolerance is --min-effect alone",
                    bases[0])
    ok, lines = gate(baselines, current, min_effect=args.min_effect, confidence=args.confidence,
                     base_loads=run_loads(bases), current_loads=run_loads([args.current]))
    note = load_note(bases, args.current)
    print("\n".join(lines + ([note] if note else [])))
    print("gate: " + ("passed" if ok else "REGRESSION"), file=sys.stderr)
    return PASSED if ok else REGRESSION


def add_parser(sub) -> None:
    g = sub.add_parser("gate", help="this build against saved baselines: exit 0 passed, 1 regression, 2 bad input")
    g.add_argument("current", metavar="CURRENT", help="a dohnuts-bench run directory, or pytest-benchmark JSON")
    g.add_argument("--baseline", nargs="+", metavar="BASE",
                   help="baseline folders (dohnuts-bench baseline), runs or pytest-benchmark files of the same kind "
                        "(default: this machine's, results/baselines/<machine id>/)")
    g.add_argument("--baselines-root", metavar="DIR",
                   help="where the per-machine baselines are (default: results/baselines)")
    g.add_argument("--min-effect", type=float, default=0.1,
                   help="smallest slowdown called a regression, as a fraction (default: 0.1)")
    g.add_argument("--confidence", type=float, default=0.99, help="interval confidence (default: 0.99)")
    g.set_defaults(func=cmd_gate)
