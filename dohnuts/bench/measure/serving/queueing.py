"""M/D/1 arithmetic: Poisson arrivals at rate λ, one server, a deterministic service time D.

    ρ = λ·D (utilisation, < 1 for a stable queue), μ = 1/D
    mean wait in the queue        W_q = ρ / (2μ(1 − ρ)) = ρ·D / (2(1 − ρ))     (Pollaczek–Khinchine)
    waiting-time distribution     P(W ≤ t) = (1 − ρ) Σ_{k=0}^{⌊t/D⌋} (λ(kD − t))ᵏ / k! · e^{−λ(kD − t)}
                                  (Erlang's formula; P(W = 0) = 1 − ρ)
    latency (arrival → done)      W + D

The sum alternates in sign and its terms grow like e^{λt}, so it is summed in decimal arithmetic
with enough digits for the cancellation. The harness uses it for the SLO search's first guess (the
rate an M/D/1 server with the measured call time would sustain) and the tests check the server
loop against it on a fake target with a known service time.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext


def utilisation(rate: float, service: float) -> float:
    return rate * service


def md1_mean_wait(rate: float, service: float) -> float:
    """Mean time in the queue (before service) of an M/D/1 queue; inf at ρ >= 1."""
    rho = rate * service
    return math.inf if rho >= 1 else rho * service / (2 * (1 - rho))


def md1_wait_cdf(t: float, rate: float, service: float) -> float:
    """P(W <= t) for the waiting time W of an M/D/1 queue (module docstring)."""
    rho = rate * service
    if rho >= 1:
        return 0.0
    if t < 0:
        return 0.0
    n = int(math.floor(t / service))
    with localcontext() as ctx:
        ctx.prec = 40 + int(rate * t / 2.302585) + 1  # digits: the largest term is about e^{λt}
        lam, d, tt = Decimal(rate), Decimal(service), Decimal(t)
        total = Decimal(0)
        fact = Decimal(1)
        for k in range(n + 1):
            if k:
                fact *= k
            x = lam * (k * d - tt)  # <= 0
            total += (x ** k if k else Decimal(1)) / fact * (-x).exp()
        value = (Decimal(1) - Decimal(rho)) * total
    return min(1.0, max(0.0, float(value)))


def md1_latency_quantile(p: float, rate: float, service: float, *, tol: float = 1e-9) -> float:
    """The p-quantile of the latency W + D of an M/D/1 queue (inf at ρ >= 1)."""
    if rate * service >= 1:
        return math.inf
    if md1_wait_cdf(0.0, rate, service) >= p:
        return service
    lo, hi = 0.0, service
    while md1_wait_cdf(hi, rate, service) < p:
        lo, hi = hi, hi * 2
    while hi - lo > tol * max(1.0, hi):
        mid = (lo + hi) / 2
        if md1_wait_cdf(mid, rate, service) >= p:
            hi = mid
        else:
            lo = mid
    return hi + service


def md1_max_rate(service: float, slo: float, p: float, *, rel_tol: float = 1e-6) -> float:
    """The highest arrival rate at which an M/D/1 queue's p-quantile latency stays within `slo`
    (0 when even an idle server misses it: slo < D)."""
    if slo < service:
        return 0.0
    wait = slo - service
    lo, hi = 0.0, 1.0 / service  # the quantile grows with the rate
    while (hi - lo) > rel_tol * hi:
        mid = (lo + hi) / 2
        if md1_wait_cdf(wait, mid, service) >= p:
            lo = mid
        else:
            hi = mid
    return lo
