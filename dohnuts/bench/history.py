"""History across commits: per workload, target and stage, the series of runs in the store, and
the changes between consecutive runs judged by the statistics `dohnuts-bench compare` uses.

A run's point is the median of its steady-state calls (the stage's, or the whole call's for
`wall`). Each run is compared with the run before it (same workload and target) by the ratio of
medians with a bootstrap interval and a rank test (dohnuts.bench.analysis.compare). What counts
as a change is decided by measured noise, not a fixed percentage: the smallest change given a
verdict is the larger of `min_effect` and the two runs' own A/A noise (each run measures its calls
as two interleaved halves; the distance of that half-over-half interval from 1 is what the run
cannot tell from noise). A flagged step is "slower" or "faster"; everything else is "no
detectable change" (or "too few calls").
"""

from __future__ import annotations

from dataclasses import dataclass

from dohnuts.bench.analysis.compare import (
    DEFAULT_MIN_EFFECT, FASTER, SLOWER, WALL, aa_noise, compare_samples, steady_samples,
)
from dohnuts.errors import DohnutsError


@dataclass(frozen=True)
class Point:
    run_id: str
    started: str | None
    revision: str | None
    dirty: bool | None
    calls: int
    median_ms: float
    verdict: str | None = None  # against the previous point (None for the first)
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    min_effect: float | None = None  # the threshold the verdict used (noise decides it)

    @property
    def flagged(self) -> bool:
        return self.verdict in (SLOWER, FASTER)


@dataclass(frozen=True)
class Series:
    workload: str
    target: str
    stage: str
    points: tuple[Point, ...]

    @property
    def changes(self) -> list[Point]:
        return [p for p in self.points if p.flagged]


def _noise(records: list[dict], group: tuple[str, str], stage: str) -> float | None:
    """A run's own A/A noise for `stage` (None when it cannot be told: old records, few calls)."""
    try:
        return aa_noise(records, group, resamples=999).halfwidth(stage)
    except (DohnutsError, KeyError, ValueError):
        return None


def history(store, *, workload: str | None = None, target: str | None = None, stage: str = WALL,
            confidence: float = 0.95, min_effect: float = DEFAULT_MIN_EFFECT) -> list[Series]:
    """The series of every (workload, target) in `store` (filtered), oldest run first."""
    runs = {r["run_id"]: r for r in store.runs()}
    out = []
    for wl, tg in store.groups():
        if (workload is not None and wl != workload) or (target is not None and tg != target):
            continue
        by_run: dict[str, list[dict]] = {}
        for rec in store.records(workload=wl, target=tg, phase="steady"):
            by_run.setdefault(str(rec.get("run_id")), []).append(rec)
        points: list[Point] = []
        previous: tuple[list[float], float | None] | None = None
        for run_id, recs in by_run.items():
            samples = steady_samples(recs).get((wl, tg), {}).get(stage)
            if not samples:
                continue
            run = runs.get(run_id, {})
            noise = _noise(recs, (wl, tg), stage)
            base = dict(run_id=run_id, started=run.get("started"), revision=run.get("revision"),
                        dirty=None if run.get("dirty") is None else bool(run.get("dirty")), calls=len(samples),
                        median_ms=sorted(samples)[len(samples) // 2])
            if previous is None:
                points.append(Point(**base))
            else:
                threshold = max([min_effect] + [n for n in (previous[1], noise) if n is not None])
                c = compare_samples(f"{wl} · {tg} · {stage}", previous[0], samples, confidence=confidence,
                                    min_effect=threshold, resamples=1999)
                points.append(Point(**base, verdict=c.verdict, ratio=c.ratio, ci_low=c.ci_low, ci_high=c.ci_high,
                                    min_effect=threshold))
            previous = (samples, noise)
        if points:
            out.append(Series(wl, tg, stage, tuple(points)))
    return out


def history_tables(series: list[Series]) -> list:
    """One table a series (fitting any console width): a row a run, its change against the run
    before flagged, with the threshold noise set for it."""
    from rich.text import Text

    from dohnuts.bench.analysis.render import Col, FitTable

    out = []
    for s in series:
        cols = [Col("run", "left"), Col("revision", "left"), Col("calls"), Col("median ms"), Col("ratio"),
                Col("interval"), Col("verdict", "left", wrap=True)]
        t = FitTable(f"{s.workload} · {s.target} · {s.stage}", cols)
        for p in s.points:
            verdict = Text(p.verdict or "")
            if p.flagged:
                verdict = Text(f"{p.verdict} (≥ {p.min_effect:.1%})", style="bold " + ("red" if p.verdict == SLOWER
                                                                                          else "green"))
            t.add_row(p.run_id, (p.revision or "?")[:10] + ("+dirty" if p.dirty else ""), str(p.calls),
                      f"{p.median_ms:.3f}", "" if p.ratio is None else f"{p.ratio:.3f}×",
                      f"{p.ci_low:.3f}–{p.ci_high:.3f}" if p.ci_low is not None else "", verdict)
        out.append(t)
    return out
