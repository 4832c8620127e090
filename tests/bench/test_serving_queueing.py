"""Queueing arithmetic of the server loop on a fake target with a known service time, on a
simulated clock (exact, and independent of how busy the machine is): a hand-computed schedule,
the M/D/1 mean wait ρ/(2μ(1 − ρ)) and waiting-time distribution, the bounded queue and the
deadline; the percentile's interval; the SLO search converging to the analytic M/D/1 answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dohnuts.bench.measure.serving.arrivals import poisson_arrivals
from dohnuts.bench.measure.serving.clock import SimulatedClock
from dohnuts.bench.measure.serving.queueing import md1_latency_quantile, md1_max_rate, md1_mean_wait, md1_wait_cdf
from dohnuts.bench.measure.serving.search import SearchPlan, next_rate, search_result, slo_search
from dohnuts.bench.measure.serving.server import serve_serial
from dohnuts.bench.measure.serving.stats import (
    Rules, min_requests_for, quantile_interval, summarize_point, wilson_interval,
)

D = 0.010  # the fake target's service time: 10 ms, always


def fake_server(arrivals, capacity=None, deadline=None, service=D):
    """The one-at-a-time server over a fake target whose every call takes `service` seconds."""
    clock = SimulatedClock()

    def run_one(req):
        clock.advance(service)
        return "result", 0.0

    return serve_serial(run_one, arrivals, capacity=capacity, clock=clock, deadline=deadline)


def test_a_hand_computed_schedule():
    # arrivals (s): r0 at 0, r1 .001, r2 .002, r3 .0025 (finds 2 waiting: refused), r4 at .03
    reqs = fake_server([0.0, 0.001, 0.002, 0.0025, 0.030], capacity=2)
    assert [r.outcome for r in reqs] == ["served", "served", "served", "dropped", "served"]
    start = [r.start for r in reqs]
    done = [r.completion for r in reqs]
    assert start[:3] == pytest.approx([0.0, 0.010, 0.020]) and done[:3] == pytest.approx([0.010, 0.020, 0.030])
    assert start[3] is None and done[3] is None
    assert start[4] == pytest.approx(0.030) and done[4] == pytest.approx(0.040)  # arrives as r2 leaves: no wait
    waits = [r.start - r.arrival for r in reqs if r.start is not None]
    assert waits == pytest.approx([0.0, 0.009, 0.018, 0.0])
    assert [r.latency for r in reqs if r.latency is not None] == pytest.approx([0.010, 0.019, 0.028, 0.010])


def test_the_deadline_abandons_the_queue_and_issues_nothing_after_it():
    # five arrivals at once, 10 ms each; the deadline at 25 ms: r0, r1, r2 start by then (at 0,
    # 10, 20 ms), r3 and r4 still wait when r2 ends at 30 ms: abandoned; the arrival at 40 ms,
    # after the deadline, is never issued
    reqs = fake_server([0.0] * 5 + [0.040], deadline=0.025)
    assert [r.outcome for r in reqs] == ["served"] * 3 + ["abandoned"] * 2
    assert reqs[2].completion == pytest.approx(0.030)


def _batch_means_se(values: np.ndarray, batches: int = 50) -> float:
    """The standard error of a mean of correlated values (queueing waits), by batch means."""
    means = values[: len(values) // batches * batches].reshape(batches, -1).mean(axis=1)
    return float(means.std(ddof=1) / math.sqrt(batches))


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_mean_wait_is_md1s(rho):
    rate = rho / D
    assert md1_mean_wait(rate, D) == pytest.approx(rho / (2 * (1 / D) * (1 - rho)))  # ρ / (2μ(1 − ρ))
    reqs = fake_server(poisson_arrivals(rate, seed=11, min_requests=60_000).times_s)
    waits = np.array([r.start - r.arrival for r in reqs])
    expected = md1_mean_wait(rate, D)
    se = _batch_means_se(waits)
    assert abs(waits.mean() - expected) < 4 * se, (waits.mean(), expected, se)
    assert se < 0.06 * expected  # the check is sharp: the tolerance is a few per cent of the answer
    # the service is the fake target's own
    assert all(r.completion - r.start == pytest.approx(D) for r in reqs)


def test_wait_distribution_is_md1s():
    rho, rate = 0.6, 0.6 / D
    assert md1_wait_cdf(0.0, rate, D) == pytest.approx(1 - rho)  # P(W = 0) = 1 − ρ
    assert md1_wait_cdf(0.004, rate, D) == pytest.approx((1 - rho) * math.exp(rate * 0.004))  # t < D
    assert md1_wait_cdf(1.0, rate, D) == pytest.approx(1.0)
    reqs = fake_server(poisson_arrivals(rate, seed=5, min_requests=60_000).times_s)
    waits = np.array([r.start - r.arrival for r in reqs])
    for t in (0.0, 0.005, 0.012, 0.025, 0.05):
        assert abs((waits <= t + 1e-12).mean() - md1_wait_cdf(t, rate, D)) < 0.012, t
    # the latency quantile inverts the distribution
    q = md1_latency_quantile(0.99, rate, D)
    assert md1_wait_cdf(q - D, rate, D) == pytest.approx(0.99, abs=1e-6)


def test_quantile_interval_and_the_minimum_count():
    assert min_requests_for(0.99) == 368 and min_requests_for(0.9) == 36 and min_requests_for(0.5) == 6
    xs = list(range(1, 368 + 1))
    assert quantile_interval(xs, 0.99)[1] == 368  # bounded at the minimum...
    assert quantile_interval(xs[:-1], 0.99)[1] is None  # ...not below it
    # coverage: the 95 % interval of the p90 of uniform samples holds 0.9 in >= 95 % of seeded trials
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(2000):
        low, high = quantile_interval(sorted(rng.random(200)), 0.9)
        hits += low <= 0.9 <= high
    assert hits / 2000 >= 0.95
    low, high = wilson_interval(82, 100)
    assert low < 0.82 < high and high - low == pytest.approx(0.15, abs=0.01)


def test_a_point_counts_refused_requests_as_misses():
    rules = Rules(min_requests=10, min_duration_s=1.0)
    lat = [0.01] * 95  # 95 served within 10 ms, 5 refused: the p99 is a miss
    s = summarize_point(100.0, lat, [0.0] * 95, [0.01] * 95, offered=100, dropped=5, abandoned=0, duration_s=2.0,
                        percentile=0.99, slo_ms=50.0, rules=rules)
    assert s.latency_ms is None and s.meets_slo is False and s.p50_ms == pytest.approx(10.0)
    assert s.throughput_rps == pytest.approx(47.5) and s.goodput_rps == pytest.approx(47.5) and s.valid
    short = summarize_point(100.0, lat, [0.0] * 95, [0.01] * 95, offered=9, dropped=0, abandoned=0, duration_s=0.5,
                            percentile=0.5, slo_ms=50.0, rules=rules)
    assert not short.valid and len(short.reasons) == 2  # too few requests, too short: invalid, said so


def _md1_point(rate: float, *, n: int = 30_000, seed: int = 3):
    reqs = fake_server(poisson_arrivals(rate, seed=seed, min_requests=n).times_s)
    return summarize_point(rate, [r.completion - r.arrival for r in reqs], [r.start - r.arrival for r in reqs],
                           [r.completion - r.start for r in reqs], offered=len(reqs), dropped=0, abandoned=0,
                           duration_s=max(r.completion for r in reqs), percentile=0.99, slo_ms=50.0,
                           rules=Rules(368, 0.0))


def test_slo_search_converges_to_the_md1_answer():
    slo = 0.050  # p99 latency within 50 ms, at 10 ms a call
    best = md1_max_rate(D, slo, 0.99)
    assert md1_latency_quantile(0.99, best, D) == pytest.approx(slo, rel=1e-4)
    assert 50 < best < 60  # ρ ≈ 0.56: a p99 of five service times leaves little room
    plan = SearchPlan(low=1.0, high=1 / D, points=12, resolution=0.01, step=1.25)
    tried = slo_search(_md1_point, 0.6 * best, plan)  # a poor first guess: the search climbs
    result = search_result(tried)
    assert result.max_rate_rps == pytest.approx(best, rel=0.04)
    assert result.failing is not None and result.failing.rate_rps / result.max_rate_rps - 1 <= 0.02
    assert [p.rate_rps for p in tried][:3] == pytest.approx([0.6 * best, 0.75 * best, 0.9375 * best])


def test_search_steps():
    plan = SearchPlan(low=1.0, high=100.0, points=8, resolution=0.05, step=2.0)
    assert next_rate(10.0, None, plan) == 20.0 and next_rate(80.0, None, plan) == 100.0
    assert next_rate(100.0, None, plan) is None  # passed at the top: done
    assert next_rate(None, 10.0, plan) == 5.0 and next_rate(None, 1.0, plan) is None
    assert next_rate(10.0, 40.0, plan) == pytest.approx(20.0)  # geometric bisection
    assert next_rate(10.0, 10.4, plan) is None  # bracketed within the resolution


def test_a_slow_target_s_search_starts_at_the_lowest_rate_its_budget_allows():
    """A target at 51 ms a call, SLO p99 ≤ 100 ms, 368 requests a point, budget_s 60,
    max_duration_s 40: M/D/1's answer (1.8 req/s) would take 200 s of arrivals, so the search
    starts at the lowest rate whose arrivals end before the point's deadline (a point cut there is
    short of its 368 requests: invalid) — a probe that fits when the search checks it, not only at
    the instant the boundary was found."""
    import types

    from dohnuts.bench.measure.serving import scenario
    from dohnuts.bench.measure.serving.config import SearchFields, ServingFields
    from dohnuts.bench.measure.serving.search import PointSummary

    serving = ServingFields(slo_ms=100, percentile=99, queue=64, min_duration_s=2, max_duration_s=40, budget_s=60,
                            search=SearchFields(low_rps=1, points=6, resolution=0.05, step=1.25))
    measured, said = [], []

    class Runner:
        rules = scenario.Rules(scenario.min_requests("server", serving), serving.min_duration_s)
        ctx = types.SimpleNamespace(spec=types.SimpleNamespace(serving=serving, seed=0, name="w"),
                                    target=types.SimpleNamespace(label="t"))

        def say(self, text, warning=False):
            said.append(text)

        def measure(self, arrivals, role, capacity):
            measured.append((role, arrivals.span_s))
            return PointSummary.__new__(PointSummary)  # never read: the search is stopped below

    def one_probe(measure, first, plan, fits):
        assert fits(first)  # the first probe fits when the search checks it
        return [measure(first)]

    import unittest.mock

    with unittest.mock.patch.object(scenario, "slo_search", one_probe), \
            unittest.mock.patch.object(scenario, "search_result",
                                       lambda tried: types.SimpleNamespace(words=lambda: "…")):
        scenario.run_server(Runner(), 0.05146)
    assert measured and measured[0][0] == "search" and 38 < measured[0][1] <= 40
    assert any("would outlast budget_s 60 s or max_duration_s 40 s" in s for s in said)


# -- closed loop ------------------------------------------------------------------------------------


def closed_server(clients, *, think=0.0, seed=0, min_requests=1, min_duration=0.0, deadline=None, service=D):
    from dohnuts.bench.measure.serving.arrivals import ClosedLoop

    return fake_server(ClosedLoop(clients, think, seed, min_requests, min_duration), deadline=deadline,
                       service=service)


def test_a_closed_loop_by_hand():
    # 3 clients, no think time, 10 ms a request: all three send at 0 and are served at 0, 10, 20 ms;
    # each sends again as it is answered, so from then on every request waits for the other two
    reqs = closed_server(3, min_requests=7)
    assert len(reqs) == 7 and all(r.outcome == "served" for r in reqs)
    assert [r.client for r in reqs] == [0, 1, 2, 0, 1, 2, 0]
    assert [r.arrival for r in reqs] == pytest.approx([0, 0, 0, 0.010, 0.020, 0.030, 0.040])
    assert [r.start for r in reqs] == pytest.approx([0, 0.010, 0.020, 0.030, 0.040, 0.050, 0.060])
    assert [r.latency for r in reqs] == pytest.approx([0.010, 0.020, 0.030] + [0.030] * 4)  # N·D in steady state
    # a client never has two requests in flight
    for c in range(3):
        mine = [r for r in reqs if r.client == c]
        assert all(b.arrival >= a.completion - 1e-12 for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("clients, think", [(1, 0.02), (4, 0.02), (8, 0.005)])
def test_a_closed_loop_obeys_the_response_time_law(clients, think):
    """N = X · (R + Z) (the interactive response-time law, exact up to the last cycles) and the
    asymptotic bounds of a closed queue: X ≤ min(N / (D + Z), 1 / D), R ≥ max(D, N·D − Z)."""
    reqs = closed_server(clients, think=think, seed=4, min_requests=6000)
    span = max(r.completion for r in reqs)
    x = len(reqs) / span
    r_mean = np.mean([r.latency for r in reqs])
    z = [b.arrival - a.completion for c in range(clients)
         for a, b in zip(*(lambda m: (m, m[1:]))([r for r in reqs if r.client == c]))]
    z_mean = float(np.mean(z))
    assert z_mean == pytest.approx(think, rel=0.06)  # exponential think times of the mean asked
    assert x * (r_mean + z_mean) == pytest.approx(clients, rel=0.01)
    assert x <= min(clients / (D + z_mean), 1 / D) * 1.001
    assert r_mean >= max(D, clients * D - z_mean) * 0.999


def test_think_times_are_seeded_per_client():
    a = closed_server(4, think=0.01, seed=9, min_requests=200)
    b = closed_server(4, think=0.01, seed=9, min_requests=200)
    c = closed_server(4, think=0.01, seed=10, min_requests=200)
    assert [r.arrival for r in a] == [r.arrival for r in b]  # reproducible
    assert [r.arrival for r in a] != [r.arrival for r in c]
    from dohnuts.bench.measure.serving.arrivals import ClosedLoop

    loop = ClosedLoop(4, 0.01, seed=9)
    assert _take(loop.think_times(2), 5) == _take(ClosedLoop(4, 0.01, seed=9).think_times(2), 5)  # its own stream,
    assert _take(loop.think_times(0), 5) != _take(loop.think_times(1), 5)  # not its neighbour's
    assert all(x > 0 for x in _take(loop.think_times(3), 100))
    assert _take(ClosedLoop(4, 0.0).think_times(0), 3) == [0.0] * 3  # no think time


def _take(gen, n):
    return [next(gen) for _ in range(n)]


def test_a_closed_loop_meets_both_minimums_and_stops_at_its_deadline():
    reqs = closed_server(2, min_requests=4, min_duration=0.1)  # the duration decides: sent until 100 ms
    assert max(r.arrival for r in reqs) >= 0.1 and sorted(r.arrival for r in reqs)[-2] < 0.1
    cut = closed_server(4, min_requests=1000, deadline=0.055)
    assert {r.outcome for r in cut} == {"served", "abandoned"}
    assert max(r.start for r in cut if r.start is not None) <= 0.055 + 1e-12
    assert all(r.arrival <= 0.055 + 1e-12 for r in cut)


def _closed_point(clients: float, slo_ms: float = 55.0):
    reqs = closed_server(int(clients), min_requests=400)
    return summarize_point(0.0, [r.latency for r in reqs], [r.start - r.arrival for r in reqs],
                           [r.completion - r.start for r in reqs], offered=len(reqs), dropped=0, abandoned=0,
                           duration_s=max(r.completion for r in reqs), percentile=0.99, slo_ms=slo_ms,
                           rules=Rules(368, 0.0), concurrency=int(clients))


def test_the_slo_search_over_clients_finds_the_closed_loop_answer():
    # without think time N clients see N·D: p99 ≤ 55 ms holds for 5 clients (50 ms), not for 6 (60 ms)
    plan = SearchPlan(low=1, high=64, points=10, resolution=0.01, step=2.0, clients=True)
    tried = slo_search(_closed_point, 2, plan)
    assert [p.concurrency for p in tried][:3] == [2, 4, 8]  # doubling, then bisection on whole clients
    result = search_result(tried)
    assert result.clients and result.max_concurrency == 5 and result.max_rate_rps is None
    assert result.failing.concurrency == 6 and result.point.latency_ms == pytest.approx(50.0)
    assert "5 clients" in result.words() and "6 clients fails" in result.words()


def test_search_steps_over_clients():
    plan = SearchPlan(low=1, high=100, points=8, resolution=0.0, step=1.25, clients=True)
    assert next_rate(1.0, None, plan) == 2.0 and next_rate(8.0, None, plan) == 10.0  # at least one client more
    assert next_rate(None, 2.0, plan) == 1.0 and next_rate(None, 1.0, plan) is None
    assert next_rate(4.0, 9.0, plan) == 6.0 and next_rate(5.0, 6.0, plan) is None  # neighbours: the exact answer
