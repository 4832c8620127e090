"""The latency-bound throughput: the highest arrival rate whose latency percentile meets the SLO.

Search (run while measuring; each probe is one load point):
1. start at `first` (the harness: the rate at which an M/D/1 server with the measured single-call
   time would meet the SLO — dohnuts.bench.serving.queueing.md1_max_rate — within [low, high]);
2. while every probe passed, go up by `step`; while every probe failed, go down by `step`;
3. then bisect (geometrically) between the highest passing and the lowest failing rate until
   they are within `resolution` of each other, or `points` probes are spent, or the next probe
   would not end within the time budget (its arrivals are known before it starts).
A probe passes when its percentile's estimate is within the SLO (requests never served count as
infinite latencies: stats.summarize_point). Every probe uses the same seed, so its arrival
pattern is the others' stretched in time (arrivals.py): the percentile moves with the rate, not
with the draw.

Result (`search_result`, recomputed from the records by the analysis): the highest valid passing
rate below the lowest valid failing rate, that failing rate (the bracket: the answer's
resolution), and each one's interval verdict — "meets" when the percentile's whole 95 %
interval is within the SLO, "misses" when it is wholly above, else "inconclusive" (the SLO
lies inside the interval: more requests a point would resolve it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dohnuts.bench.serving.stats import PointSummary


@dataclass(frozen=True)
class SearchPlan:
    low_rps: float
    high_rps: float
    points: int  # probes at most
    resolution: float  # stop when failing / passing − 1 <= resolution
    step: float  # the expansion factor before a bracket exists


def slo_search(measure: Callable[[float], PointSummary], first: float, plan: SearchPlan,
               fits: Callable[[float], bool] = lambda rate: True) -> list[PointSummary]:
    """Probe rates (module docstring) with `measure(rate)`; returns the probes in order. A probe
    that `fits(rate)` refuses (it would run past the search's time budget) is not started, and the
    search ends there."""
    tried: list[PointSummary] = []
    passing = failing = None
    rate = min(plan.high_rps, max(plan.low_rps, first))
    while len(tried) < plan.points and fits(rate):
        point = measure(rate)
        tried.append(point)
        if point.meets_slo:
            passing = rate if passing is None else max(passing, rate)
        else:
            failing = rate if failing is None else min(failing, rate)
        nxt = next_rate(passing, failing, plan)
        if nxt is None or any(math.isclose(nxt, p.rate_rps, rel_tol=1e-9) for p in tried):
            break
        rate = nxt
    return tried


def next_rate(passing: float | None, failing: float | None, plan: SearchPlan) -> float | None:
    """The next probe, or None when the search is done (bracketed finely enough, or at a bound)."""
    if failing is None:  # everything passed: up
        return None if passing >= plan.high_rps else min(plan.high_rps, passing * plan.step)
    if passing is None:  # everything failed: down
        return None if failing <= plan.low_rps else max(plan.low_rps, failing / plan.step)
    if failing / passing - 1 <= plan.resolution:
        return None
    return math.sqrt(passing * failing)


@dataclass(frozen=True)
class SearchResult:
    max_rate_rps: float | None  # None: no valid tried rate met the SLO
    point: PointSummary | None  # the probe at that rate
    failing: PointSummary | None  # the lowest valid failing probe above it (None: none failed)
    below_low: bool  # even the lowest tried rate failed
    tried: int

    def words(self) -> str:
        """The result in one line, with the bracket and the intervals' verdicts."""
        if self.point is None:
            low = self.failing.rate_rps if self.failing else None
            return ("no tried rate meets the SLO" + (f" (the lowest, {low:.3g} req/s, misses it: p = "
                                                     f"{_ms(self.failing.latency_ms)})" if low else ""))
        p = self.point
        text = (f"{p.rate_rps:.3g} req/s (p{_pct(p.percentile)} {_ms(p.latency_ms)}, 95 % interval "
                f"{_ms(p.latency_low_ms)}–{_ms(p.latency_high_ms)}: {p.verdict})")
        if self.failing is None:
            return text + "; no tried rate failed: the answer is at least this"
        f = self.failing
        return text + (f"; {f.rate_rps:.3g} req/s fails (p{_pct(f.percentile)} {_ms(f.latency_ms)}, "
                       f"{_ms(f.latency_low_ms)}–{_ms(f.latency_high_ms)}: {f.verdict})")


def _ms(x: float | None) -> str:
    return "∞" if x is None else f"{x:.3g} ms"


def _pct(p: float) -> str:
    return f"{100 * p:g}"


def search_result(points: Sequence[PointSummary]) -> SearchResult:
    """The answer of a search from its probes (module docstring); invalid probes are left out."""
    valid = sorted((p for p in points if p.valid and p.meets_slo is not None), key=lambda p: p.rate_rps)
    failing = [p for p in valid if not p.meets_slo]
    lowest_fail = failing[0].rate_rps if failing else math.inf
    passing = [p for p in valid if p.meets_slo and p.rate_rps < lowest_fail]
    best = passing[-1] if passing else None
    above = [p for p in failing if best is None or p.rate_rps > best.rate_rps]
    return SearchResult(best.rate_rps if best else None, best, above[0] if above else None,
                        best is None and bool(failing), len(points))
