"""The arrival generator: a Poisson process at the rate asked for (mean gap, exponential gaps,
counts in windows), reproducible by its seed, stretched across rates (common random numbers),
meeting a point's minimums; trace files replayed as written, stretched to a rate, refused line
by line when malformed."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dohnuts.bench.measure.serving.arrivals import all_at_once, poisson_arrivals, read_trace, trace_arrivals, trace_rate
from dohnuts.errors import ConfigError


def test_poisson_gaps_have_the_rate_asked_for():
    from scipy import stats  # here, not at collection: only this test's process needs scipy
    rate, n = 250.0, 40_000
    a = poisson_arrivals(rate, seed=7, min_requests=n)
    gaps = np.diff((0.0,) + a.times_s)
    assert len(a) == n and a.rate_rps == rate and a.source == "poisson" and a.seed == 7
    # the mean gap is 1/rate within 4 standard errors (1/(rate·√n) for exponential gaps)
    assert abs(gaps.mean() - 1 / rate) < 4 / (rate * math.sqrt(n))
    # the gaps are exponential (Kolmogorov–Smirnov against Exp(rate)); seeded, so this p is fixed
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01
    # counts in 1-second windows are Poisson(rate): their variance equals their mean (dispersion ≈ 1)
    counts = np.bincount(np.floor(np.asarray(a.times_s)).astype(int))[:-1]
    assert abs(counts.var(ddof=1) / counts.mean() - 1) < 0.35
    assert np.all(np.diff(a.times_s) >= 0)


def test_the_seed_fixes_the_schedule_and_rates_stretch_one_pattern():
    a = poisson_arrivals(10.0, seed=3, min_requests=500)
    assert a.times_s == poisson_arrivals(10.0, seed=3, min_requests=500).times_s  # reproducible
    assert a.times_s != poisson_arrivals(10.0, seed=4, min_requests=500).times_s  # another seed, another draw
    b = poisson_arrivals(40.0, seed=3, min_requests=500)
    assert np.allclose(np.asarray(b.times_s) * 4.0, a.times_s, rtol=1e-12)  # the same pattern, 4× faster
    # more arrivals asked for extend the same sequence (drawn in fixed chunks)
    longer = poisson_arrivals(10.0, seed=3, min_requests=9000)
    assert longer.times_s[:500] == a.times_s


def test_a_schedule_meets_both_minimums_and_no_more():
    a = poisson_arrivals(100.0, seed=0, min_requests=50, min_duration_s=3.0)  # the duration decides
    assert a.span_s >= 3.0 and a.times_s[-2] < 3.0 and len(a) > 50
    b = poisson_arrivals(100.0, seed=0, min_requests=800, min_duration_s=0.5)  # the count decides
    assert len(b) == 800 and b.span_s >= 0.5
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, seed=0, min_requests=1)
    with pytest.raises(ValueError):
        poisson_arrivals(math.nan, seed=0, min_requests=1)
    assert all_at_once(5).times_s == (0.0,) * 5


def test_a_trace_replays_as_written_and_stretches_to_a_rate(tmp_path):
    times = [0.0, 0.01, 0.01, 0.05, 0.2]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": t, "note": "kept aside"}) + "\n" for t in times) + "\n")
    read = read_trace(path)
    assert read == tuple(times)
    replay = trace_arrivals(read, "trace.jsonl")
    assert replay.times_s == tuple(times) and replay.rate_rps == pytest.approx(5 / 0.2) == trace_rate(read)
    assert replay.source == "trace:trace.jsonl"
    fast = trace_arrivals(read, "trace.jsonl", rate_rps=50.0)  # twice the trace's own rate: half the gaps
    assert fast.rate_rps == 50.0 and np.allclose(fast.times_s, np.asarray(times) / 2)


@pytest.mark.parametrize("text, problem", [
    ('{"arrival_s": 0.1}\n{"arrival_s": 0.05}\n', "t.jsonl:2: field 'arrival_s': goes back"),
    ('{"arrival_s": -1}\n', "must be >= 0"),
    ('{"arrival_s": NaN}\n', "must be a finite number of seconds, got NaN"),
    ('{"arrival_s": "0.1"}\n', "got a str"),
    ('{"arrival_s": true}\n', "got a boolean"),
    ('{"t": 0.1}\n', "arrival_s"),
    ('[0.1]\n', "arrival_s"),
    ('{"arrival_s": 0.1\n', "not a JSON object"),
    ("\n\n", "no arrival"),
])
def test_a_bad_trace_is_refused_naming_the_line(tmp_path, text, problem):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_trace(path)
    assert str(path) in str(err.value) and problem in str(err.value)


def test_burstiness_one_is_the_poisson_schedule_as_it_always_was():
    a = poisson_arrivals(20.0, seed=5, min_requests=300)
    assert a.times_s == poisson_arrivals(20.0, seed=5, min_requests=300, burstiness=1.0).times_s
    expected = np.cumsum(np.random.default_rng(5).standard_exponential(4096))[:300] / 20.0  # the draws of before
    assert np.array_equal(np.asarray(a.times_s), expected) and a.source == "poisson"


@pytest.mark.parametrize("k", [0.25, 4.0])
def test_bursty_gaps_are_gamma_with_the_rate_asked_for(k):
    """vLLM's --burstiness: gaps Gamma(shape k, scale 1/(k·rate)): mean 1/rate, squared coefficient of
    variation 1/k — bursts and lulls below 1, evener than Poisson above; rates stretch one pattern."""
    from scipy import stats  # here, not at collection: only this test's process needs scipy
    rate, n = 50.0, 40_000
    a = poisson_arrivals(rate, seed=2, min_requests=n, burstiness=k)
    gaps = np.diff((0.0,) + a.times_s)
    assert a.source == f"gamma(burstiness={k:g})" and len(a) == n
    sd = math.sqrt(1 / k) / rate  # a gap's standard deviation
    assert abs(gaps.mean() - 1 / rate) < 4 * sd / math.sqrt(n)
    assert gaps.var(ddof=1) * rate**2 == pytest.approx(1 / k, rel=0.05)
    assert stats.kstest(gaps, "gamma", args=(k, 0, 1 / (k * rate))).pvalue > 0.01
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue < 1e-6  # not Poisson
    counts = np.bincount(np.floor(np.asarray(a.times_s)).astype(int))[:-1]  # per second: dispersion ≈ 1/k
    assert (counts.var(ddof=1) / counts.mean() > 2) if k < 1 else (counts.var(ddof=1) / counts.mean() < 0.5)
    b = poisson_arrivals(2 * rate, seed=2, min_requests=n, burstiness=k)
    assert np.allclose(np.asarray(b.times_s) * 2, a.times_s, rtol=1e-12)  # common random numbers


@pytest.mark.parametrize("serving, field, problem", [
    ("{burstiness: 0.5, arrivals: t.jsonl}", "serving.burstiness", "a trace's arrivals are its own"),
    ("{rates: [4], think_ms: 5}", "serving.think_ms", "closed-loop client's think time"),
    ("{concurrency: [2, 2]}", "serving.concurrency", "lists a count of clients twice"),
    ("{concurrency: [0]}", "serving.concurrency[0]", ">= 1"),
    ("{concurrency: [5000]}", "serving.concurrency[0]", "<= 4096"),
    ("{rates: [4], burstiness: 0}", "serving.burstiness", ">= 0.01"),
    ("{slo_ms: 100, search: {over: clients}}", "serving.search.over", "rate"),
])
def test_closed_loop_and_burstiness_fields_are_checked(tmp_path, serving, field, problem):
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager

    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0}\n')
    path = tmp_path / "w.yaml"
    path.write_text("kind: text\nscenario: server\nshape: {requests: 1, questions: 1, seq_tokens: 64, candidates: 2, "
                    f"candidate_tokens: 2}}\nserving: {serving}\n")
    pm = plugin_manager()
    with pytest.raises(ConfigError) as err:
        load_workload(path, collect(pm, "dohnuts_bench_register_workload_kinds"),
                      collect(pm, "dohnuts_bench_register_targets"), gpu=False)
    assert f"field '{field}'" in str(err.value) and problem in str(err.value), str(err.value)


def test_concurrency_belongs_to_the_server_scenario(tmp_path):
    from dohnuts.bench.measure.workload import load_workload
    from dohnuts.bench.plugins import collect, plugin_manager

    path = tmp_path / "w.yaml"
    path.write_text("kind: text\nscenario: offline\nserving: {concurrency: [2]}\n")
    pm = plugin_manager()
    with pytest.raises(ConfigError, match="field 'serving.concurrency': applies to the server scenario"):
        load_workload(path, collect(pm, "dohnuts_bench_register_workload_kinds"),
                      collect(pm, "dohnuts_bench_register_targets"), gpu=False)
