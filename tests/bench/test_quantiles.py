"""One statistics vocabulary (dohnuts.bench.analysis.quantiles): the quantile is numpy.quantile's
`linear` method everywhere (unserved requests as +inf taken apart), every median of the code is its
0.5-quantile, the mean and the sample standard deviation are numpy's; the library calls that
replaced hand-written code give what the hand-written code gave (the reports' interpolated
quantile, the Wilson interval, the paired bootstrap of the harness overhead: before and after on
the same seeded data); the summary carries the mean and the deviation beside the median; a load
point's metrics carry vLLM's names."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from dohnuts.bench.analysis.quantiles import QUANTILE_METHOD, mean_and_std, quantile, quantiles
from dohnuts.bench.analysis.measurement_quality import _paired_overhead
from dohnuts.bench.analysis.records import read_records
from dohnuts.bench.analysis.summary import summarize
from dohnuts.bench.measure.serving.stats import Rules, metrics_of, summarize_point, wilson_interval
from dohnuts.bench.report.text_report import summary_table
from dohnuts.schema import median

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu-standard-suite" / "results.jsonl.gz"
PS = [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_the_quantile_is_numpys_linear_method(n):
    x = np.random.default_rng(n).lognormal(0, 1, n)
    assert QUANTILE_METHOD == "linear"
    assert quantiles(x, PS) == [float(v) for v in np.quantile(x, PS, method="linear")]
    # Hyndman & Fan 7 by hand: h = (n - 1) p, interpolated between its neighbours
    xs = sorted(x)
    for p in PS:
        h = (n - 1) * p
        lo = math.floor(h)
        hand = xs[lo] + (xs[min(lo + 1, n - 1)] - xs[lo]) * (h - lo)
        assert quantile(x, p) == pytest.approx(hand, rel=1e-12)


def test_unserved_requests_are_infinite_and_take_no_part_in_the_interpolation():
    assert quantiles([1.0, 2.0, math.inf], [0.0, 0.5, 0.51, 1.0]) == [1.0, 2.0, math.inf, math.inf]
    served = list(np.random.default_rng(3).uniform(5, 50, 95))
    values = served + [math.inf] * 5  # 5 of 100 refused: the rank h = 99 p reaches them past p = 94/99
    got = quantiles(values, PS)
    stand_in = np.quantile(served + [1e300] * 5, PS, method="linear")  # any finite stand-in, where h < 94
    for p, g, s in zip(PS, got, stand_in):
        assert (g == math.inf) if 99 * p > 94 else (g == s), p
    assert quantiles([math.inf] * 3, [0.0, 0.5]) == [math.inf, math.inf]
    for bad in ([math.nan], [-math.inf, 1.0], []):
        with pytest.raises(ValueError):
            quantiles(bad, [0.5])


@pytest.mark.parametrize("n", [1, 2, 7, 8])
def test_every_median_of_the_code_is_the_half_quantile(n):
    x = list(np.random.default_rng(n).normal(10, 2, n))
    q = quantile(x, 0.5)
    assert median(x) == pytest.approx(q, rel=1e-15) and statistics.median(x) == pytest.approx(q, rel=1e-15)
    assert float(np.median(x)) == pytest.approx(q, rel=1e-15)


def test_mean_and_the_sample_standard_deviation():
    x = [3.0, 4.5, 9.25, 1.0, 7.0]
    mean, std = mean_and_std(x)
    assert mean == pytest.approx(statistics.mean(x)) and std == pytest.approx(statistics.stdev(x))  # ddof 1
    assert mean_and_std(x + [math.inf]) == (mean, std)  # an unserved request has no latency to average
    assert mean_and_std([2.0]) == (2.0, None) and mean_and_std([]) == (None, None)


def _old_reporters_quantile(xs: list[float], q: float) -> float:
    """the built-in reporter's `_quantile` as it was (the reports' p10/p90 and stream percentiles)."""
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def test_the_standard_suite_s_reports_keep_their_numbers_and_add_mean_and_std():
    """Before (the hand-written interpolation) and after (numpy.quantile, linear) on the committed
    CPU suite: every p10/p90 and spread the report prints is the same; mean and std are added."""
    records = read_records(FIXTURE)
    rows = summarize(records)
    from dohnuts.bench.analysis.records import group_key, per_call_records, valid_records

    kept, _ = valid_records(per_call_records(records))
    for row in rows:
        walls = [r.wall_ms for r in kept if group_key(r) == (row["workload"], row["target"])]
        for key, q in (("wall_p10_ms", 0.1), ("wall_p90_ms", 0.9)):
            assert row[key] == pytest.approx(_old_reporters_quantile(walls, q), rel=1e-12)
            assert f"{row[key]:.2f}" == f"{_old_reporters_quantile(walls, q):.2f}"
        assert row["wall_mean_ms"] == pytest.approx(statistics.mean(walls), rel=1e-12)
        assert row["wall_std_ms"] == (pytest.approx(statistics.stdev(walls), rel=1e-12) if len(walls) > 1 else None)
        for name, stage in row["stages"].items():
            xs = [r.stages[name].host_ms for r in kept if group_key(r) == (row["workload"], row["target"])
                  and name in r.stages]
            assert stage["p90_ms"] == pytest.approx(_old_reporters_quantile(xs, 0.9), rel=1e-12)
            assert stage["mean_ms"] == pytest.approx(statistics.mean(xs), rel=1e-12)
        if "stream" in row:
            assert row["stream"]["latency_mean_ms"] is not None
    table = summary_table(rows)
    assert [c.header for c in table.columns][-2:] == ["mean ms", "std ms"]  # added at the end, nothing moved


def test_the_server_percentile_changed_from_nearest_rank_to_linear():
    """What the one method changes: a load point's p99 was the nearest-rank x₍⌈0.99 n⌉₎, a latency
    that was observed; it is now numpy's linear interpolation, vLLM's: 100 latencies of 1..100 ms
    have p99 99.01 ms (was 99 ms)."""
    lat = [i / 1e3 for i in range(1, 101)]
    s = summarize_point(10.0, lat, [0.0] * 100, lat, offered=100, dropped=0, abandoned=0, duration_s=10.0,
                        percentile=0.99, slo_ms=None, rules=Rules(1, 0.0))
    assert s.latency_ms == pytest.approx(99.01) and s.p99_ms == pytest.approx(99.01) and s.p50_ms == pytest.approx(50.5)
    assert math.ceil(0.99 * 100) == 99  # the nearest rank it was


def _old_wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    from scipy.stats import norm

    z = float(norm.ppf(1 - (1 - confidence) / 2))
    phat = successes / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest.mark.parametrize("k, n", [(82, 100), (0, 10), (10, 10), (1, 3), (517, 1000)])
def test_the_wilson_interval_is_scipys_and_what_the_hand_formula_gave(k, n):
    from scipy.stats import binomtest

    low, high = wilson_interval(k, n)
    ci = binomtest(k, n).proportion_ci(method="wilson")
    assert (low, high) == (float(ci.low), float(ci.high))
    assert (low, high) == pytest.approx(_old_wilson(k, n), abs=1e-12)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _old_paired_overhead(pairs, confidence=0.95, resamples=2000):
    """dohnuts.bench.analysis.measurement_quality._paired_overhead's hand bootstrap as it was."""
    timed = np.array([t for t, _ in pairs])
    untimed = np.array([u for _, u in pairs])
    base = float(np.median(untimed))
    diff = timed - untimed
    idx = np.random.default_rng(0).integers(0, len(diff), size=(resamples, len(diff)))
    boot = np.median(diff[idx], axis=1) / base
    low, high = (float(v) for v in np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2]))
    med = float(np.median(diff))
    return {"pairs": len(pairs), "median_ms": med, "fraction": med / base, "low": low, "high": high}


@pytest.mark.parametrize("seed, n", [(1, 8), (2, 12), (3, 40)])
def test_the_overhead_bootstrap_is_scipys_and_gives_what_the_hand_one_gave(seed, n):
    rng = np.random.default_rng(seed)
    untimed = rng.normal(10.0, 0.4, n)
    pairs = list(zip(untimed + rng.normal(0.15, 0.2, n), untimed))
    before, after = _old_paired_overhead(pairs), _paired_overhead(pairs)
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] == pytest.approx(before[key], rel=1e-12, abs=1e-15), key
    assert after["low"] < after["fraction"] < after["high"]


def test_a_point_names_its_metrics_as_vllm_does():
    # four served in 10, 20, 30, 40 ms (first bytes 1 ms before), one refused: 5 offered
    lat = [0.010, 0.020, 0.030, 0.040]
    s = summarize_point(5.0, lat, [0.0, 0.005, 0.010, 0.015], [0.01] * 4, offered=5, dropped=1, abandoned=0,
                        duration_s=1.0, percentile=0.9, slo_ms=None, rules=Rules(1, 0.0),
                        first_byte_s=[x - 0.001 for x in lat], metric_percentiles=[0.25, 0.5, 0.9])
    d = s.to_dict()
    assert d["mean_e2el_ms"] == pytest.approx(25.0) and d["std_e2el_ms"] == pytest.approx(statistics.stdev(
        [10, 20, 30, 40]))
    assert d["median_e2el_ms"] == pytest.approx(30.0) == d["p50_e2el_ms"] == d["p50_ms"]  # [10 20 30 40 ∞]
    assert d["p25_e2el_ms"] == pytest.approx(20.0) and d["p90_e2el_ms"] is None  # the refused one reaches p90
    assert d["mean_ttft_ms"] == pytest.approx(24.0) and d["p25_ttft_ms"] == pytest.approx(19.0)
    assert d["mean_queue_ms"] == pytest.approx(7.5) and "p99_e2el_ms" not in d
    assert metrics_of("e2el_ms", [], 0) == {}
