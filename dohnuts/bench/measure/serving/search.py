"""The latency-bound throughput: the highest arrival rate whose latency percentile meets the SLO —
or, over closed-loop points, the most concurrent clients whose latency percentile meets it.

Search (run while measuring; each probe is one load point):
1. start at `first` (the harness: the rate at which an M/D/1 server with the measured single-call
   time would meet the SLO — dohnuts.bench.measure.serving.queueing.md1_max_rate — within [low, high]);
2. while every probe passed, go up by `step`; while every probe failed, go down by `step`;
3. then bisect (geometrically) between the highest passing and the lowest failing rate until
   they are within `resolution` of each other, or `points` probes are spent, or the next probe
   would not end within the time budget (its arrivals are known before it starts).
A probe passes when its percentile's estimate is within the SLO (requests never served count as
infinite latencies: stats.summarize_point). Every probe uses the same seed, so its arrival
pattern is the others' stretched in time (arrivals.py): the percentile moves with the rate, not
with the draw.

Over concurrency (`SearchPlan.clients`) the same steps move through whole numbers of clients: up
or down by `step` but at least one client, then bisection until the passing and failing counts
are neighbours (the answer exact) or within `resolution`. A closed loop's latency grows with its
clients as an open queue's with its rate, and every probe's think times come from one seed.

Result (`search_result`, recomputed from the records by the analysis): the highest valid passing
load (rate or clients) below the lowest valid failing one, that failing load (the bracket: the
answer's resolution), and each one's interval verdict — "meets" when the percentile's whole 95 %
interval is within the SLO, "misses" when it is wholly above, else "inconclusive" (the SLO
lies inside the interval: more requests a point would resolve it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dohnuts.bench.measure.serving.stats import PointSummary


@dataclass(frozen=True)
class SearchPlan:
    low: float  # the lowest load probed: a rate (requests/s), or clients
    high: float
    points: int  # probes at most
    resolution: float  # stop when failing / passing − 1 <= resolution
    step: float  # the expansion factor before a bracket exists
    clients: bool = False  # the loads are whole numbers of closed-loop clients


def slo_search(measure: Callable[[float], PointSummary], first: float, plan: SearchPlan,
               fits: Callable[[float], bool] = lambda load: True) -> list[PointSummary]:
    """Probe loads (module docstring) with `measure(load)`; returns the probes in order. A probe
    that `fits(load)` refuses (it would run past the search's time budget) is not started, and the
    search ends there."""
    tried: list[PointSummary] = []
    passing = failing = None
    load = min(plan.high, max(plan.low, first))
    if plan.clients:
        load = float(round(load))
    while len(tried) < plan.points and fits(load):
        point = measure(load)
        tried.append(point)
        if point.meets_slo:
            passing = load if passing is None else max(passing, load)
        else:
            failing = load if failing is None else min(failing, load)
        nxt = next_rate(passing, failing, plan)
        if nxt is None or any(math.isclose(nxt, p.load, rel_tol=1e-9) for p in tried):
            break
        load = nxt
    return tried


def next_rate(passing: float | None, failing: float | None, plan: SearchPlan) -> float | None:
    """The next probe, or None when the search is done (bracketed finely enough, or at a bound)."""
    if plan.clients:
        return _next_clients(passing, failing, plan)
    if failing is None:  # everything passed: up
        return None if passing >= plan.high else min(plan.high, passing * plan.step)
    if passing is None:  # everything failed: down
        return None if failing <= plan.low else max(plan.low, failing / plan.step)
    if failing / passing - 1 <= plan.resolution:
        return None
    return math.sqrt(passing * failing)


def _next_clients(passing: float | None, failing: float | None, plan: SearchPlan) -> float | None:
    """`next_rate` over whole numbers of clients: each step at least one client."""
    if failing is None:
        return None if passing >= plan.high else float(min(plan.high, max(passing + 1, round(passing * plan.step))))
    if passing is None:
        return None if failing <= plan.low else float(max(plan.low, min(failing - 1, round(failing / plan.step))))
    if failing - passing <= 1 or failing / passing - 1 <= plan.resolution:
        return None
    return float(min(failing - 1, max(passing + 1, round(math.sqrt(passing * failing)))))


@dataclass(frozen=True)
class SearchResult:
    max_load: float | None  # None: no valid tried load met the SLO
    point: PointSummary | None  # the probe at that load
    failing: PointSummary | None  # the lowest valid failing probe above it (None: none failed)
    below_low: bool  # even the lowest tried load failed
    tried: int
    clients: bool = False  # the loads are closed-loop clients

    @property
    def max_rate_rps(self) -> float | None:
        """The highest rate that met the SLO (None over clients, or where none met it)."""
        return None if self.clients else self.max_load

    @property
    def max_concurrency(self) -> int | None:
        """The most clients that met the SLO (None over rates, or where none met it)."""
        return int(self.max_load) if self.clients and self.max_load is not None else None

    def words(self) -> str:
        """The result in one line, with the bracket and the intervals' verdicts."""
        what = "clients" if self.clients else "rate"
        if self.point is None:
            low = self.failing.load if self.failing else None
            return (f"no tried {what} meets the SLO" + (f" (the lowest, {self._load(low)}, misses it: p = "
                                                         f"{_ms(self.failing.latency_ms)})" if low else ""))
        p = self.point
        text = (f"{self._load(p.load)} (p{_pct(p.percentile)} {_ms(p.latency_ms)}, 95 % interval "
                f"{_ms(p.latency_low_ms)}–{_ms(p.latency_high_ms)}: {p.verdict})")
        if self.failing is None:
            return text + f"; no tried {what} failed: the answer is at least this"
        f = self.failing
        return text + (f"; {self._load(f.load)} fails (p{_pct(f.percentile)} {_ms(f.latency_ms)}, "
                       f"{_ms(f.latency_low_ms)}–{_ms(f.latency_high_ms)}: {f.verdict})")

    def _load(self, x: float) -> str:
        return f"{x:.0f} client{'s' if x != 1 else ''}" if self.clients else f"{x:.3g} req/s"


def _ms(x: float | None) -> str:
    return "∞" if x is None else f"{x:.3g} ms"


def _pct(p: float) -> str:
    return f"{100 * p:g}"


def search_result(points: Sequence[PointSummary]) -> SearchResult:
    """The answer of a search from its probes (module docstring); invalid probes are left out.
    Probes of closed-loop points are judged over their clients, the others over their rates."""
    clients = bool(points) and all(p.concurrency is not None for p in points)
    valid = sorted((p for p in points if p.valid and p.meets_slo is not None), key=lambda p: p.load)
    failing = [p for p in valid if not p.meets_slo]
    lowest_fail = failing[0].load if failing else math.inf
    passing = [p for p in valid if p.meets_slo and p.load < lowest_fail]
    best = passing[-1] if passing else None
    above = [p for p in failing if best is None or p.load > best.load]
    return SearchResult(best.load if best else None, best, above[0] if above else None,
                        best is None and bool(failing), len(points), clients)
