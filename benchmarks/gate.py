"""The regression gate: this build's pytest-benchmark timings against saved baseline runs.

    python benchmarks/gate.py results/baselines/cpu-tiny-*.json --current CURRENT.json \
        [--min-effect 0.1] [--confidence 0.99]

Every file is pytest-benchmark JSON written with `--benchmark-save-data` (every round's time).
For each benchmark, the baseline runs' rounds are pooled and the ratio current/baseline of the
medians gets a bootstrap confidence interval and a rank test (dohnuts.bench.analysis.compare).
The tolerance comes from measured spread twice over: the interval is as wide as the samples'
own spread makes it, and the smallest slowdown called a regression is the larger of
--min-effect and the drift between the baseline's own runs (max / min of their medians − 1) —
on the shared 2-core CI machine a benchmark's median moves by up to ≈ 25 % between processes of
unchanged code, which no within-run statistic can see. A benchmark is a regression when the
whole interval lies above 1 + tolerance and the rank test agrees. Exit status 1 when any
benchmark regressed, 2 on unreadable input, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def timings(path: Path) -> dict[str, list[float]]:
    """Benchmark name → every round's seconds, from a pytest-benchmark JSON file."""
    try:
        data = json.loads(path.read_text())
        out = {}
        for b in data["benchmarks"]:
            rounds = b["stats"].get("data")
            if not rounds:
                raise KeyError(f"{b['name']}: stats.data (save with --benchmark-save-data)")
            out[b["name"]] = [float(x) for x in rounds]
        return out
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"gate: error: {path}: cannot read pytest-benchmark timings ({exc})") from None


def gate(baselines: list[dict[str, list[float]]], current: dict[str, list[float]], *, min_effect: float = 0.1,
         confidence: float = 0.99) -> tuple[bool, list[str]]:
    """(passed, one line per benchmark) — the verdicts of compare_samples, B = current over A = the
    pooled baseline runs, with the tolerance of the module docstring."""
    import statistics

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
        lines.append(f"{name}: median {row.median_a * 1e3:.2f} → {row.median_b * 1e3:.2f} ms, ratio {row.ratio:.3f}"
                     f"{interval}, tolerance {tolerance:.0%}: {row.verdict}")
        ok &= row.verdict != SLOWER
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("baseline", type=Path, nargs="+", help="baseline runs (pytest-benchmark JSON)")
    p.add_argument("--current", type=Path, required=True, help="this build's run (pytest-benchmark JSON)")
    p.add_argument("--min-effect", type=float, default=0.1,
                   help="smallest slowdown called a regression, as a fraction (default 0.1)")
    p.add_argument("--confidence", type=float, default=0.99, help="interval confidence (default 0.99)")
    a = p.parse_args(argv)
    try:
        ok, lines = gate([timings(b) for b in a.baseline], timings(a.current), min_effect=a.min_effect,
                         confidence=a.confidence)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(lines))
    print("gate: " + ("passed" if ok else "REGRESSION"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
