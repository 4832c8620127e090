"""The regression gate: this build's pytest-benchmark timings against a saved baseline.

    python benchmarks/gate.py BASELINE.json CURRENT.json [--min-effect 0.1] [--confidence 0.99]

Both files are pytest-benchmark JSON written with `--benchmark-save-data` (every round's time).
For each benchmark in both, the ratio current/baseline of the medians gets a bootstrap
confidence interval and a rank test (dohnuts.bench.analysis.compare): the tolerance is the
interval the two samples' own spread allows, not a fixed percentage. A benchmark is a
regression when the whole interval lies above 1 + min_effect and the rank test agrees.
Exit status 1 when any benchmark regressed, 2 on unreadable input, 0 otherwise.
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


def gate(baseline: dict[str, list[float]], current: dict[str, list[float]], *, min_effect: float = 0.1,
         confidence: float = 0.99) -> tuple[bool, list[str]]:
    """(passed, one line per benchmark) — the verdicts of compare_samples, B = current over A = baseline."""
    from dohnuts.bench.analysis.compare import SLOWER, compare_samples

    ok, lines = True, []
    for name in sorted(set(baseline) | set(current)):
        if name not in baseline or name not in current:
            lines.append(f"{name}: only in {'the baseline' if name in baseline else 'this build'}")
            continue
        row = compare_samples(name, baseline[name], current[name], confidence=confidence, min_effect=min_effect)
        interval = "" if row.ci_low is None else f", {confidence:.0%} interval {row.ci_low:.3f}–{row.ci_high:.3f}"
        lines.append(f"{name}: median {row.median_a * 1e3:.2f} → {row.median_b * 1e3:.2f} ms, ratio {row.ratio:.3f}"
                     f"{interval}: {row.verdict}")
        ok &= row.verdict != SLOWER
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("baseline", type=Path)
    p.add_argument("current", type=Path)
    p.add_argument("--min-effect", type=float, default=0.1,
                   help="smallest slowdown called a regression, as a fraction (default 0.1)")
    p.add_argument("--confidence", type=float, default=0.99, help="interval confidence (default 0.99)")
    a = p.parse_args(argv)
    try:
        ok, lines = gate(timings(a.baseline), timings(a.current), min_effect=a.min_effect, confidence=a.confidence)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(lines))
    print("gate: " + ("passed" if ok else "REGRESSION"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
