"""When requests arrive: a seeded Poisson process, or the times of a trace file.

A schedule is the arrival times of one load point, in seconds from its start, non-decreasing.

Poisson: gaps drawn as unit-rate exponentials from `numpy.random.default_rng(seed)` in fixed
chunks, divided by the rate. Every rate of one seed therefore sees the *same* pattern, stretched
(common random numbers): two rates of a search differ by their rate, not by their luck, so the
latency percentile moves with the rate alone. Enough arrivals are drawn for the point's minimums
(LoadGen's rule: at least `min_requests` requests and at least `min_duration_s` of arrivals).

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


def poisson_arrivals(rate_rps: float, *, seed: int, min_requests: int, min_duration_s: float = 0.0) -> Arrivals:
    """A Poisson process of `rate_rps` arrivals a second, drawn until it holds at least
    `min_requests` arrivals and its last arrival is at least `min_duration_s` in."""
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"a Poisson rate must be a positive number of requests a second, got {rate_rps!r}")
    if min_requests < 1 or not (math.isfinite(min_duration_s) and min_duration_s >= 0):
        raise ValueError(f"needs min_requests >= 1 and a finite min_duration_s >= 0, got {min_requests}, "
                         f"{min_duration_s}")
    rng = np.random.default_rng(seed)
    unit = min_duration_s * rate_rps  # the span in unit-rate time
    times = np.empty(0)
    total = 0.0
    while len(times) < min_requests or total < unit:
        if len(times) >= MAX_ARRIVALS:
            raise ValueError(f"{rate_rps} requests/s for {min_duration_s} s needs more than {MAX_ARRIVALS} arrivals")
        chunk = total + np.cumsum(rng.standard_exponential(CHUNK))
        times = np.concatenate([times, chunk])
        total = float(times[-1])
    # the first index that meets both minimums
    by_count = min_requests - 1
    by_time = int(np.searchsorted(times, unit, side="left"))
    last = max(by_count, min(by_time, len(times) - 1))
    return Arrivals(tuple(float(t) for t in times[: last + 1] / rate_rps), float(rate_rps), "poisson", seed)


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
