"""The statistics vocabulary every report, summary and export uses: one quantile rule, the mean and the
standard deviation beside the median.

Quantile: `numpy.quantile(values, p, method="linear")` — numpy's default, Hyndman & Fan's definition
7 (R's and Excel's PERCENTILE.INC as well; what `vllm bench serve` reports, through np.percentile):
for n sorted values x[0..n-1] the p-quantile is x[h] interpolated linearly, h = (n − 1)·p. The
median is the 0.5-quantile (for an even count the mean of the two middle values). One method
everywhere: the per-call p10/p90 and spread, a stream's and a load point's p50/p90/p99, the
first-byte time, an export's percentiles.

Unserved requests: a load point counts a request it refused or abandoned as an infinite latency (it
missed every objective: dohnuts.bench.measure.serving.stats). numpy's interpolation turns an infinity into
NaN (∞ − ∞, ∞ · 0), so `quantiles` takes them apart: where the rank h reaches past the last finite
value the quantile is ∞ (unbounded), elsewhere numpy interpolates between finite values only — the
same number numpy gives when every value is finite.

Mean and standard deviation: `numpy.mean` and `numpy.std(ddof=1)`, the sample standard deviation
(Bessel's correction, as pytest-benchmark's `stddev`; vLLM's `std_*_ms` is ddof 0, smaller by
√((n − 1)/n)); None below two values. Over finite values: a latency never measured has no place in
an average.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Sequence

import numpy as np

QUANTILE_METHOD = "linear"  # numpy.quantile's method name (Hyndman & Fan 7)
STD_DDOF = 1  # the sample standard deviation


def quantiles(values: Iterable[float], ps: Sequence[float]) -> list[float]:
    """The `ps`-quantiles (each in [0, 1]) of `values` by `QUANTILE_METHOD`; +inf values are
    unserved requests (module docstring). ValueError on no values, a NaN or a −inf."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        raise ValueError("a quantile of no values")
    if np.isnan(x).any() or np.isneginf(x).any():
        raise ValueError("a quantile takes numbers and +inf (an unserved request), not NaN or -inf")
    p = np.asarray(ps, dtype=float)
    unserved = np.isposinf(x)
    if not unserved.any():
        return [float(v) for v in np.quantile(x, p, method=QUANTILE_METHOD)]
    served = int(x.size - unserved.sum())
    if served == 0:
        return [math.inf] * len(p)
    # where the linear rank stays among the finite values, the infinities (stood in for by the
    # largest finite value) take no part in the interpolation
    stand_in = np.where(unserved, x[~unserved].max(), x)
    finite = np.quantile(stand_in, p, method=QUANTILE_METHOD)
    reaches = (x.size - 1) * p > served - 1 + 1e-9  # a rank at the last finite value is that value
    return [math.inf if r else float(v) for r, v in zip(reaches, finite)]


def quantile(values: Iterable[float], p: float) -> float:
    """The p-quantile (p in [0, 1]) by `QUANTILE_METHOD` (`quantiles`)."""
    return quantiles(values, [p])[0]


def mean_and_std(values: Iterable[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation) of the finite values; None where there are too few
    (no value: both; one value: the deviation)."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0:
        return None, None
    return float(np.mean(x)), float(np.std(x, ddof=STD_DDOF)) if x.size > STD_DDOF else None


def percentile_name(p: float) -> str:
    """`p99`, `p99.9`, `p50` for p = 0.99, 0.999, 0.5 (the names the reports and summaries use)."""
    return f"p{100 * p:g}"


def bootstrap_rng(seed_seq: list[int]) -> dict:
    """scipy.stats.bootstrap's keyword for a seeded generator: `rng` (scipy >= 1.15) or `random_state`."""
    from scipy import stats  # scipy.stats: a second's import, only where an interval is drawn

    rng = np.random.default_rng(seed_seq)
    if "rng" in inspect.signature(stats.bootstrap).parameters:   # scipy >= 1.15
        return {"rng": rng}
    return {"random_state": rng}

