"""`dohnuts-bench gate`: this build's timings against saved baselines, with exit codes a CI can use.

    dohnuts-bench gate CURRENT --baseline BASE [BASE ...] [--min-effect 0.1] [--confidence 0.99]

CURRENT and every BASE are either pytest-benchmark JSON files written with
`--benchmark-save-data` (every round's time: benchmarks/test_regressions.py) or dohnuts-bench runs
(a run directory or its results.jsonl[.gz]: every workload and target's steady-state wall times).
For each benchmark (or workload · target) the baseline runs' samples are pooled and the ratio
current / baseline of the medians gets a bootstrap confidence interval and a rank test
(dohnuts.bench.analysis.compare). The tolerance comes from measured spread twice over: the interval
is as wide as the samples' own spread makes it, and the smallest slowdown called a regression is
the larger of --min-effect and the drift between the baseline's own runs (max / min of their
medians − 1) — on the shared 2-core CI machine a benchmark's median moves by up to ≈ 25 % between
processes of unchanged code, which no within-run statistic can see. A benchmark is a regression
when the whole interval lies above 1 + tolerance and the rank test agrees.

Exit status: 0 passed, 1 a regression, 2 bad input (one line naming the file).
"""

from __future__ import annotations

import json
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
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
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


def gate(baselines: list[dict[str, list[float]]], current: dict[str, list[float]], *, min_effect: float = 0.1,
         confidence: float = 0.99) -> tuple[bool, list[str]]:
    """(passed, one line per benchmark) — the verdicts of compare_samples, B = current over A = the
    pooled baseline runs, with the tolerance of the module docstring."""
    from dohnuts.bench.analysis.compare import SLOWER, compare_samples

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
        interval = "" if row.ci_low is None else f", {confidence:.0%} interval {row.ci_low:.3f}–{row.ci_high:.3f}"
        lines.append(f"{name}: median {row.median_a:.4g} → {row.median_b:.4g}, ratio {row.ratio:.3f}"
                     f"{interval}, tolerance {tolerance:.0%}: {row.verdict}")
        ok &= row.verdict != SLOWER
    return ok, lines


def cmd_gate(args) -> int:
    current = timings(args.current)
    baselines = [timings(b) for b in args.baseline]
    ok, lines = gate(baselines, current, min_effect=args.min_effect, confidence=args.confidence)
    print("\n".join(lines))
    print("gate: " + ("passed" if ok else "REGRESSION"), file=sys.stderr)
    return PASSED if ok else REGRESSION


def add_parser(sub) -> None:
    g = sub.add_parser("gate", help="this build against saved baselines: exit 0 passed, 1 regression, 2 bad input")
    g.add_argument("current", metavar="CURRENT", help="pytest-benchmark JSON, or a dohnuts-bench run directory")
    g.add_argument("--baseline", nargs="+", required=True, metavar="BASE",
                   help="baseline runs of the same kind (e.g. results/baselines/cpu-tiny-*.json)")
    g.add_argument("--min-effect", type=float, default=0.1,
                   help="smallest slowdown called a regression, as a fraction (default: 0.1)")
    g.add_argument("--confidence", type=float, default=0.99, help="interval confidence (default: 0.99)")
    g.set_defaults(func=cmd_gate)
