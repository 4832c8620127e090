"""Latency percentiles with their intervals, and what one load point measured.

Percentile: the p-quantile of the n offered requests' latencies by the project's one method
(dohnuts.bench.analysis.quantiles: numpy.quantile, method "linear", as `vllm bench serve` computes
its percentiles), with a request that was never served (refused by a full queue, abandoned at the
deadline) counted as an infinite latency: it missed every objective, and a percentile that reaches
one is unbounded.

The metrics under vLLM's names (`metrics_of`): for the end-to-end latency (`e2el_ms`: arrival →
response serialized), the time to the first byte (`ttft_ms`: arrival → the scores on the host,
before serialization: a scoring model's first and only "token") and the wait in the queue
(`queue_ms`: arrival → service start), each `mean_`, `median_`, `std_` and `pNN_` for the chosen
percentiles (`serving.metric_percentiles`, default 50, 90, 99) — `mean_e2el_ms`, `p99_ttft_ms`, as
vLLM prints them. The median and the percentiles count unserved requests as infinite (None in
JSON: unbounded), as above; the mean and the (sample) standard deviation are over the served ones.

Interval: the distribution-free 95 % interval of a quantile from order statistics: the number of
samples at or below the true p-quantile is Binomial(n, p), so [x₍l₎, x₍u₎] with l, u from its
2.5 % and 97.5 % points covers it with at least 95 %. When u would exceed n the interval has no
upper end (`None`): too few requests to bound that percentile. The fewest requests for which the
upper end exists is `min_requests_for(p)` (368 at p99, 36 at p90, 6 at p50) — the default
minimum of a server point: far below LoadGen's Server minimum (270,336 queries in mlperf.conf,
which pins the p99 much more tightly), but the fewest that bound the percentile at all.
The interval treats latencies as independent; queueing
correlates neighbours, so near saturation it is narrower than the truth: read it as a lower bound
on the uncertainty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dohnuts.bench.analysis.quantiles import mean_and_std, percentile_name, quantiles

CONFIDENCE = 0.95
METRIC_PERCENTILES = (0.5, 0.9, 0.99)  # the pNN_* metrics of a point, by default (vLLM prints p99)


def quantile_interval(sorted_values: Sequence[float], p: float, confidence: float = CONFIDENCE
                      ) -> tuple[float | None, float | None]:
    """The distribution-free interval of the p-quantile (module docstring); None for an end the
    sample cannot bound."""
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy.stats import binom

    n = len(sorted_values)
    if n == 0:
        return None, None
    alpha = 1 - confidence
    lo = int(binom.ppf(alpha / 2, n, p))  # 1-based rank of the lower end: P(B <= lo - 1) <= α/2
    hi = int(binom.ppf(1 - alpha / 2, n, p)) + 1  # P(B >= hi) <= α/2
    low = sorted_values[lo - 1] if lo >= 1 else None
    high = sorted_values[hi - 1] if hi <= n else None
    return low, high


def min_requests_for(p: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples for which the p-quantile's interval has an upper end: 1 − pⁿ ≥ 1 − α/2."""
    n = math.ceil(math.log((1 - confidence) / 2) / math.log(p))
    while 1 - p ** n < 1 - (1 - confidence) / 2:  # guard the rounding of the logarithms
        n += 1
    return max(1, n)


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a proportion (accuracy, choice agreement):
    `scipy.stats.binomtest(successes, n).proportion_ci(method="wilson")`; (0, 1) for no trial."""
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy.stats import binomtest

    if n == 0:
        return 0.0, 1.0
    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def metrics_of(name: str, served_ms: Sequence[float], unserved: int,
               percentiles: Sequence[float] = METRIC_PERCENTILES) -> dict[str, float | None]:
    """vLLM's metrics of one latency (module docstring): `mean_NAME`, `median_NAME`, `std_NAME` and
    `pNN_NAME` a percentile, from the served requests' values (ms) and the count never served."""
    if not served_ms and not unserved:
        return {}
    values = list(served_ms) + [math.inf] * unserved
    mean, std = mean_and_std(served_ms)
    median, *ps = quantiles(values, [0.5, *percentiles])
    out = {f"mean_{name}": mean, f"median_{name}": _bounded(median), f"std_{name}": std}
    out |= {f"{percentile_name(p)}_{name}": _bounded(v) for p, v in zip(percentiles, ps)}
    return out


def _bounded(x: float) -> float | None:
    """A percentile, or None where it is unbounded (it reached an unserved request)."""
    return None if math.isinf(x) else x


@dataclass(frozen=True)
class Rules:
    """A point's minimums (LoadGen's validity rules, scaled per workload)."""

    min_requests: int
    min_duration_s: float


@dataclass(frozen=True)
class PointSummary:
    """What one load point measured (latencies in ms; None where unbounded or unmeasured)."""

    rate_rps: float  # offered (scheduled) rate
    offered: int  # arrivals issued
    served: int
    dropped: int  # refused: the queue was full
    abandoned: int  # still waiting at the deadline
    duration_s: float  # from the point's start to its last completion
    throughput_rps: float  # served / duration
    goodput_rps: float | None  # served within the SLO / duration (None without an SLO)
    percentile: float  # p in (0, 1)
    latency_ms: float | None  # the p-quantile of the latency (None: unbounded, misses above 1 − p)
    latency_low_ms: float | None  # its interval
    latency_high_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    queue_p50_ms: float | None
    service_p50_ms: float | None
    slo_ms: float | None
    meets_slo: bool | None  # the percentile's estimate within the SLO (None: no SLO)
    verdict: str  # "meets" / "misses" (the interval on one side of the SLO), "inconclusive", "—"
    valid: bool
    reasons: tuple[str, ...] = ()
    stopped: bool = False  # cut at the deadline (max_duration_s)
    extra: dict = field(default_factory=dict)
    # a closed loop's clients (None: an open schedule); its `rate_rps` is then the rate its clients
    # sent at (offered / duration), a result rather than a setting
    concurrency: int | None = None
    # vLLM's names (`metrics_of`): mean_/median_/std_/pNN_ of e2el_ms, ttft_ms (where first bytes were
    # timed) and queue_ms; written into the point's dict beside the fields above
    metrics: dict = field(default_factory=dict)

    @property
    def load(self) -> float:
        """What the point set: its clients (a closed loop), else its offered rate."""
        return float(self.concurrency) if self.concurrency is not None else self.rate_rps

    def to_dict(self) -> dict:
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if k != "metrics"}
        return out | self.metrics


def _ms(x: float) -> float | None:
    return None if math.isinf(x) else x * 1e3


def summarize_point(rate_rps: float, latencies_s: Sequence[float], queue_s: Sequence[float],
                    service_s: Sequence[float], *, offered: int, dropped: int, abandoned: int, duration_s: float,
                    percentile: float, slo_ms: float | None, rules: Rules, stopped: bool = False,
                    concurrency: int | None = None, first_byte_s: Sequence[float] | None = None,
                    metric_percentiles: Sequence[float] = METRIC_PERCENTILES) -> PointSummary:
    """A load point from its served requests' latencies (arrival → completion), queueing
    (arrival → start) and service (start → completion) times, in seconds, its counts, and where
    they were timed its first bytes (arrival → scores on the host). Unserved requests (dropped,
    abandoned) enter the percentiles as infinite latencies."""
    served = len(latencies_s)
    missing = offered - served
    lat = sorted(list(latencies_s) + [math.inf] * missing)
    p = percentile
    value, p50, p90, p99 = quantiles(lat, [p, 0.5, 0.9, 0.99]) if lat else (math.inf,) * 4
    low, high = quantile_interval(lat, p) if lat else (None, None)
    meets = verdict = None
    good = None
    if slo_ms is not None:
        slo = slo_ms / 1e3
        meets = value <= slo
        good = sum(1 for x in latencies_s if x <= slo) / duration_s if duration_s > 0 else 0.0
        if high is not None and high <= slo:
            verdict = "meets"
        elif low is not None and low > slo:
            verdict = "misses"
        else:
            verdict = "inconclusive"
    reasons = []
    if offered < rules.min_requests:
        reasons.append(f"{offered} requests < the minimum {rules.min_requests}")
    if duration_s < rules.min_duration_s:
        reasons.append(f"{duration_s:.3g} s < the minimum {rules.min_duration_s:g} s")
    if stopped:
        reasons.append("stopped at its deadline (max_duration_s): waiting requests abandoned, later arrivals "
                       "never issued")
    metrics = metrics_of("e2el_ms", [x * 1e3 for x in latencies_s], missing, metric_percentiles)
    if first_byte_s is not None:
        metrics |= metrics_of("ttft_ms", [x * 1e3 for x in first_byte_s], missing, metric_percentiles)
    metrics |= metrics_of("queue_ms", [x * 1e3 for x in queue_s], missing, metric_percentiles)
    return PointSummary(
        rate_rps=rate_rps, offered=offered, served=served, dropped=dropped, abandoned=abandoned,
        duration_s=duration_s, throughput_rps=served / duration_s if duration_s > 0 else 0.0, goodput_rps=good,
        percentile=p, latency_ms=_ms(value), latency_low_ms=None if low is None else _ms(low),
        latency_high_ms=None if high is None else _ms(high),
        p50_ms=_ms(p50), p90_ms=_ms(p90), p99_ms=_ms(p99),
        queue_p50_ms=_ms(quantiles(queue_s, [0.5])[0]) if queue_s else None,
        service_p50_ms=_ms(quantiles(service_s, [0.5])[0]) if service_s else None,
        slo_ms=slo_ms, meets_slo=meets, verdict=verdict or "—", valid=not reasons, reasons=tuple(reasons),
        stopped=stopped, concurrency=concurrency, metrics=metrics)
