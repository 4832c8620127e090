"""When requests arrive: a seeded Poisson process or its bursty kin (gamma gaps), the times of a trace
file, or a closed loop of clients.

A schedule is the arrival times of one load point, in seconds from its start, non-decreasing.

Poisson: gaps drawn as unit-rate exponentials from `numpy.random.default_rng(seed)` in fixed
chunks, divided by the rate. Every rate of one seed therefore sees the *same* pattern, stretched
(common random numbers): two rates of a search differ by their rate, not by their luck, so the
latency percentile moves with the rate alone. Enough arrivals are drawn for the point's minimums
(LoadGen's rule: at least `min_requests` requests and at least `min_duration_s` of arrivals).

Bursty (`burstiness` k ≠ 1, vLLM's `--burstiness`): the gaps are gamma-distributed with shape k and
mean 1/rate (unit-mean Gamma(k, 1/k) draws divided by the rate, common random numbers as above):
their squared coefficient of variation is 1/k, so k < 1 sends requests in bursts separated by
lulls, k > 1 more evenly than Poisson, and k = 1 is the Poisson process itself (drawn as before:
the same seed gives the same schedule it always gave).

Closed loop (`ClosedLoop`, vLLM's `--max-concurrency`, LoadGen's MultiStream in spirit): N clients,
each sending its next request when its previous one returned plus a think time (exponential with
mean `think_s`, each client its own seeded stream; 0: none). The schedule is not known in advance:
it unfolds with the server's responses (dohnuts.bench.measure.serving.server.ClosedLoopAdmission). A closed
loop measures what a fixed user population sees — its latency includes no waiting a client has
not caused — and its throughput is what the server gives N users; an open schedule (the rest of
this module) measures latency at an offered rate, queueing included.

Trace: a JSONL file, one object a line, `{"arrival_s": 0.0137}` (seconds from the trace's start,
finite, non-negative, non-decreasing; other keys are ignored). Replayed as written, or stretched
to another mean rate (a trace's shape at the rate a search asks for). Every problem is one
ConfigError naming the file, the line and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dohnuts.errors import ConfigError
from dohnuts.schema import why_not_finite

CHUNK = 4096  # gaps drawn per call of the generator: the draws do not depend on how many are needed
MAX_ARRIVALS = 10_000_000  # one load point; a typo cannot ask for a schedule that never ends
MAX_TRACE_BYTES = 1 << 30
THINK_STREAM = 2  # numpy SeedSequence streams: a client's think times (variety.ORDER_STREAM is 1)


@dataclass(frozen=True)
class Arrivals:
    """The arrival times of one load point (seconds from its start) and what they were drawn as."""

    times_s: tuple[float, ...]
    rate_rps: float  # the offered rate (Poisson: λ; a trace: its requests over its span, or the rate asked)
    source: str  # "poisson" or "trace:<file>"
    seed: int | None = None

    def __len__(self) -> int:
        return len(self.times_s)

    @property
    def span_s(self) -> float:
        return self.times_s[-1] if self.times_s else 0.0


def poisson_arrivals(rate_rps: float, *, seed: int, min_requests: int, min_duration_s: float = 0.0,
                     burstiness: float = 1.0) -> Arrivals:
    """A Poisson process of `rate_rps` arrivals a second (with `burstiness` k ≠ 1: gamma gaps of
    shape k, the same mean), drawn until it holds at least `min_requests` arrivals and its last
    arrival is at least `min_duration_s` in."""
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"a Poisson rate must be a positive number of requests a second, got {rate_rps!r}")
    if min_requests < 1 or not (math.isfinite(min_duration_s) and min_duration_s >= 0):
        raise ValueError(f"needs min_requests >= 1 and a finite min_duration_s >= 0, got {min_requests}, "
                         f"{min_duration_s}")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise ValueError(f"burstiness must be a positive gamma shape, got {burstiness!r}")
    rng = np.random.default_rng(seed)

    def unit_gaps() -> np.ndarray:  # mean 1: exponential (Poisson), or Gamma(k, 1/k)
        if burstiness == 1.0:
            return rng.standard_exponential(CHUNK)
        return rng.standard_gamma(burstiness, CHUNK) / burstiness

    unit = min_duration_s * rate_rps  # the span in unit-rate time
    times = np.empty(0)
    total = 0.0
    while len(times) < min_requests or total < unit:
        if len(times) >= MAX_ARRIVALS:
            raise ValueError(f"{rate_rps} requests/s for {min_duration_s} s needs more than {MAX_ARRIVALS} arrivals")
        chunk = total + np.cumsum(unit_gaps())
        times = np.concatenate([times, chunk])
        total = float(times[-1])
    # the first index that meets both minimums
    by_count = min_requests - 1
    by_time = int(np.searchsorted(times, unit, side="left"))
    last = max(by_count, min(by_time, len(times) - 1))
    source = "poisson" if burstiness == 1.0 else f"gamma(burstiness={burstiness:g})"
    return Arrivals(tuple(float(t) for t in times[: last + 1] / rate_rps), float(rate_rps), source, seed)


@dataclass(frozen=True)
class ClosedLoop:
    """A closed-loop load point (module docstring): `clients` users, each sending its next request
    when its previous one returned plus a think time; issuing stops once the point holds at least
    `min_requests` requests and one was issued at least `min_duration_s` in (LoadGen's minimums, as
    an open schedule meets them)."""

    clients: int
    think_s: float = 0.0  # mean think time (exponential), 0: none
    seed: int = 0
    min_requests: int = 1
    min_duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.clients < 1 or self.min_requests < 1:
            raise ValueError(f"a closed loop needs clients >= 1 and min_requests >= 1, got {self.clients}, "
                             f"{self.min_requests}")
        for name in ("think_s", "min_duration_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {getattr(self, name)!r}")

    @property
    def source(self) -> str:
        return "closed-loop"

    def think_times(self, client: int):
        """The think times of one client, in order (seconds): its own seeded stream, so a
        client's pauses do not depend on the order in which the others' responses came back."""
        rng = np.random.default_rng((self.seed, THINK_STREAM, client))
        while True:
            for x in rng.standard_exponential(64):
                yield float(x) * self.think_s


def all_at_once(n: int) -> Arrivals:
    """`n` requests handed over together at time 0 (the offline scenario)."""
    if n < 1:
        raise ValueError(f"needs at least one request, got {n}")
    return Arrivals((0.0,) * n, math.inf, "offline")


def read_trace(path: str | Path) -> tuple[float, ...]:
    """The arrival times of a trace file (module docstring); ConfigError naming file:line and field."""
    path = Path(path)
    source = str(path)
    try:
        if not path.is_file():
            raise ConfigError("is not a trace file (a JSONL of {\"arrival_s\": seconds} lines)", source=source)
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ConfigError(f"is larger than {MAX_TRACE_BYTES} bytes", source=source)
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot be read ({exc.strerror or exc})", source=source) from None
    times: list[float] = []
    for n, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ConfigError(f"is not a JSON object ({type(exc).__name__})", source=where) from None
        if not isinstance(obj, dict) or "arrival_s" not in obj:
            raise ConfigError("needs an object with `arrival_s`", source=where, field="arrival_s")
        t = obj["arrival_s"]
        bad = why_not_finite(t)
        if bad:
            raise ConfigError(f"must be a finite number of seconds, got {bad}", source=where, field="arrival_s")
        if t < 0:
            raise ConfigError(f"must be >= 0, got {t}", source=where, field="arrival_s")
        if times and t < times[-1]:
            raise ConfigError(f"goes back in time ({t} after {times[-1]}): arrivals must not decrease",
                              source=where, field="arrival_s")
        if len(times) >= MAX_ARRIVALS:
            raise ConfigError(f"holds more than {MAX_ARRIVALS} arrivals", source=source)
        times.append(float(t))
    if not times:
        raise ConfigError("holds no arrival", source=source)
    return tuple(times)


def trace_rate(times: tuple[float, ...]) -> float:
    """A trace's own mean rate: its arrivals over its span (the first arrival counted from 0)."""
    span = times[-1]
    return len(times) / span if span > 0 else math.inf


def trace_arrivals(times: tuple[float, ...], name: str, rate_rps: float | None = None) -> Arrivals:
    """A trace replayed as written (`rate_rps` None), or stretched in time to that mean rate."""
    own = trace_rate(times)
    if rate_rps is None or not math.isfinite(own):
        return Arrivals(times, own, f"trace:{name}")
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"a rate must be a positive number of requests a second, got {rate_rps!r}")
    scale = own / rate_rps
    return Arrivals(tuple(t * scale for t in times), float(rate_rps), f"trace:{name}")
