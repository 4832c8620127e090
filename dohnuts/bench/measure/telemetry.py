"""Background telemetry: samplers polled by one thread while a run measures.

A `Sampler` has a `name`, an `unavailable` reason (None when it works) and `sample()` → dict;
optionally `energy_counter()` → the device's cumulative energy in joules, and `device_facts()` →
what provenance records of the device (driver, power limit, clocks). The runner calls every
available sampler every `interval_s` and attaches to each call record the samples taken during that
call (at least the one nearest its end), so short calls still carry clocks, power and temperature.

The validity rule — one rule for every vendor. A GPU sampler reports, beside its readings, the keys
`call_validity` reads, in the same meaning for NVML and amdsmi:

- `throttling`: the active reasons that pull the clock below the device's sustained regime —
  thermal limits, hardware slowdown, the power brake or fast current protection — by name; an
  empty list when none;
- `power_capped`: the active reasons that mean the device holds its power (or sustained current)
  limit: NVML's software power cap, amdsmi's package power tracking (PPT, PVIOL) or a power reading
  at the cap. The sustained regime of dense work, not a fault;
- `sm_clock_mhz` / `max_sm_clock_mhz` (NVML) or `gfx_clock_mhz` / `max_gfx_clock_mhz` (amdsmi):
  the current clock and the device's maximum;
- `idle`: true when the device reports itself idle (no work, the clock parked low): its clock
  then says nothing about throttling and is not checked.

A call is invalid when any sample taken during it shows a throttling reason, or a clock below
`min_clock_fraction` (default 0.9; `DOHNUTS_BENCH_MIN_CLOCK_FRACTION` overrides it) of the maximum
that no power cap in the same sample explains. A power-capped call stays valid and is counted
(`power_capped` samples): a datacentre GPU, and a consumer card at its board power, runs dense work
at its power limit, and excluding those calls would leave out every heavy call (measured on the
H200: docs/known-issues.md KI-15). The runner writes `{"valid", "reasons", "detail",
"gpu_samples", "power_capped"}` into the record.

Energy. `TelemetryThread.energy()` reads the first available sampler's energy counter (NVML's
`nvmlDeviceGetTotalEnergyConsumption`, amdsmi's `amdsmi_get_energy_count`) right before and right
after a call; `call_energy` turns the two readings into the record's `energy` field,
`{"joules", "source", "reason"}` (docs/measurement.md).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dohnuts.errors import ConfigError

if TYPE_CHECKING:
    from dohnuts.bench.analysis.records import CallRecord

DEFAULT_MIN_CLOCK_FRACTION = 0.9
_LOOKBACK_S = 5.0
CLOCK_KEYS = (("sm_clock_mhz", "max_sm_clock_mhz", "SM"), ("gfx_clock_mhz", "max_gfx_clock_mhz", "GFX"))
# Reasons earlier versions listed under `throttling` that today's rule calls the power cap (NVML's
# software power cap; amdsmi's PVIOL residency): read as such in samples without `power_capped`.
LEGACY_POWER_CAP = ("sw_power_cap", "ppt_pwr")
# the CPU time fields that count as busy (psutil.cpu_times; guest time is inside user/nice): the
# load sampler and the interleaved gate's external load read the same ones
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
NO_ENERGY_COUNTER = "no telemetry sampler reads an energy counter here (no GPU sampler is available)"


def default_min_clock_fraction() -> float:
    """0.9, or `DOHNUTS_BENCH_MIN_CLOCK_FRACTION` when set (a number in (0, 1]); anything else is one
    ConfigError line naming the variable."""
    raw = os.environ.get("DOHNUTS_BENCH_MIN_CLOCK_FRACTION")
    if raw is None or not raw.strip():
        return DEFAULT_MIN_CLOCK_FRACTION
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:  # NaN fails too
        raise ConfigError(f"must be a number in (0, 1], got {raw[:40]!r}",
                          source="environment variable DOHNUTS_BENCH_MIN_CLOCK_FRACTION")
    return value


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def call_validity(samples: list[dict], min_clock_fraction: float = DEFAULT_MIN_CLOCK_FRACTION) -> dict:
    """Whether the samples taken during one call show a throttled or down-clocked GPU.

    `samples`: telemetry rows ({sampler name: reading, ...}; other keys such as `t`/`dt_ms` are
    ignored). Returns {"valid", "reasons", "detail", "gpu_samples"}: one reason per sampler and
    cause (a stable string, e.g. "nvml: throttled (sw_power_cap)"), `detail[i]` how many samples
    showed reason i (and the clocks seen); `gpu_samples` counts the readings that could be checked
    (0: nothing was checked, e.g. a CPU run — valid by default).
    """
    throttled: dict[tuple[str, str], int] = {}
    low: dict[tuple[str, str], list[float]] = {}
    checked: dict[str, int] = {}
    capped = 0
    for row in samples:
        for name, reading in row.items():
            if not isinstance(reading, dict) or "error" in reading:
                continue
            seen = False
            active = reading.get("throttling")
            power = reading.get("power_capped")
            if (isinstance(active, (list, tuple)) and "power_capped" not in reading
                    and any(r in LEGACY_POWER_CAP for r in active)):
                # a sample of an earlier version, which counted the power cap as throttling
                power = [r for r in active if r in LEGACY_POWER_CAP]
                active = [r for r in active if r not in LEGACY_POWER_CAP]
            is_capped = isinstance(power, (list, tuple)) and bool(power)
            capped += is_capped
            if isinstance(active, (list, tuple)):
                seen = True
                for r in dict.fromkeys(map(str, active)):
                    throttled[(name, r)] = throttled.get((name, r), 0) + 1
            for cur_key, max_key, label in CLOCK_KEYS:
                cur, top = _num(reading.get(cur_key)), _num(reading.get(max_key))
                if cur is None or not top:
                    continue
                seen = True
                if not reading.get("idle") and not is_capped and cur < min_clock_fraction * top:
                    low.setdefault((name, f"{label}|{top:g}"), []).append(cur)
            if seen:
                checked[name] = checked.get(name, 0) + 1
    reasons, detail = [], []
    for (name, reason), n in throttled.items():
        reasons.append(f"{name}: throttled ({reason})")
        detail.append(f"in {n}/{checked[name]} samples")
    for (name, key), clocks in low.items():
        label, top = key.split("|")
        reasons.append(f"{name}: {label} clock below {min_clock_fraction:g} × max {top} MHz")
        detail.append(f"{min(clocks):g}–{max(clocks):g} MHz in {len(clocks)}/{checked[name]} samples")
    out = {"valid": not reasons, "reasons": reasons, "detail": detail, "gpu_samples": max(checked.values(), default=0)}
    if capped:
        out["power_capped"] = capped
    return out


def clock_summary(records: list[CallRecord]) -> dict | None:
    """The GPU clock while a group of calls ran: median and lowest clock over every non-idle sample
    of their telemetry (NVML's SM or amdsmi's GFX clock), the device's maximum, and how many samples
    showed the power cap. None when no sample had a clock (a CPU run, no GPU sampler).

    Why it is reported: a datacentre GPU holds its power limit by lowering its clock (KI-15), so two
    runs of one build can differ by their clocks; the report says at which clock each was taken."""
    clocks, tops, capped = [], [], 0
    for rec in records:
        for row in rec.telemetry:
            for reading in row.values():
                if not isinstance(reading, dict) or reading.get("idle"):
                    continue
                for cur_key, max_key, _ in CLOCK_KEYS:
                    cur, top = _num(reading.get(cur_key)), _num(reading.get(max_key))
                    if cur is None:
                        continue
                    clocks.append(cur)
                    if top:
                        tops.append(top)
                    power = reading.get("power_capped")
                    capped += isinstance(power, (list, tuple)) and bool(power)
                    break
    if not clocks:
        return None
    clocks.sort()
    n = len(clocks)
    median = clocks[n // 2] if n % 2 else (clocks[n // 2 - 1] + clocks[n // 2]) / 2
    return {"median_mhz": median, "min_mhz": clocks[0], "max_mhz": max(tops) if tops else None,
            "samples": n, "power_capped_samples": capped}


class Sampler:
    name = "sampler"
    unavailable: str | None = None
    # () -> float: the device's cumulative energy in joules (raises when it cannot be read, saying
    # why); None: this sampler has no energy counter.
    energy_counter = None
    # () -> dict: facts of the device for provenance (driver, power limit, maximum clocks); None: none.
    device_facts = None

    def sample(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class EnergyReading:
    """One reading of a device's cumulative energy counter: the sampler it came from, the joules
    (None when it could not be read) and why not."""

    source: str | None
    joules: float | None
    reason: str | None = None


def call_energy(before: EnergyReading, after: EnergyReading) -> dict:
    """A record's `energy`: `{"joules": float | None, "source": sampler name | None, "reason": str |
    None}` — the counter's difference over the call (`reason` None), or None joules and why (no
    counter, a failed read, a counter that went backwards)."""
    source = before.source or after.source
    if before.joules is None or after.joules is None:
        return {"joules": None, "source": source,
                "reason": before.reason or after.reason or NO_ENERGY_COUNTER}
    delta = after.joules - before.joules
    if delta < 0:
        return {"joules": None, "source": source,
                "reason": "the energy counter went backwards during the call (a reset or a wrap)"}
    return {"joules": delta, "source": source, "reason": None}


@dataclass
class TelemetryThread:
    samplers: list
    interval_s: float = 0.1
    min_clock_fraction: float = field(default_factory=default_min_clock_fraction)
    _samples: list = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _facts: dict | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.min_clock_fraction <= 1.0:
            raise ValueError(f"min_clock_fraction must be in (0, 1], got {self.min_clock_fraction}")

    def _poll_once(self) -> None:
        t = time.perf_counter()
        row = {"t": t}
        for s in self.samplers:
            try:
                row[s.name] = s.sample()
            except Exception as exc:  # a flaky sensor must not end a measurement
                row[s.name] = {"error": str(exc)}
        with self._lock:
            self._samples.append(row)
            if len(self._samples) > 100_000:
                del self._samples[: len(self._samples) // 2]

    def energy(self) -> EnergyReading:
        """The device's cumulative energy now, read synchronously from the first sampler that has
        an energy counter (a GPU run has one GPU sampler). `samplers` are registered samplers
        (dohnuts.bench.plugins.RegisteredSampler) or `Sampler`s: both carry the optional members."""
        for s in self.samplers:
            counter = s.energy_counter
            if counter is None:
                continue
            try:
                return EnergyReading(s.name, float(counter()))
            except Exception as exc:  # a counter that cannot be read: the record says why
                return EnergyReading(s.name, None, f"{s.name}: energy counter unavailable ({exc})")
        return EnergyReading(None, None, NO_ENERGY_COUNTER)

    def device_facts(self) -> dict:
        """{sampler name: its `device_facts()`} of the samplers that describe their device, read
        once (a failure is recorded as the facts' `error`)."""
        if self._facts is None:
            facts = {}
            for s in self.samplers:
                describe = s.device_facts
                if describe is None:
                    continue
                try:
                    facts[s.name] = dict(describe())
                except Exception as exc:
                    facts[s.name] = {"error": f"{type(exc).__name__}: {exc}"}
            self._facts = facts
        return self._facts

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll_once()

    def start(self) -> None:
        if self.samplers and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dohnuts-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def window(self, t0: float, t1: float, limit: int = 8) -> list[dict]:
        """Samples taken in [t0, t1] (perf_counter), at most `limit`; a fresh one if none."""
        return self._thin(self._rows(t0, t1), t0, limit)

    def window_and_validity(self, t0: float, t1: float, limit: int = 8) -> tuple[list[dict], dict]:
        """`window(t0, t1, limit)` and `call_validity` of every sample taken in [t0, t1] — all of
        them, not only the `limit` the window keeps (a throttled sample is never thinned away)."""
        rows = self._rows(t0, t1)
        return self._thin(rows, t0, limit), call_validity(rows, self.min_clock_fraction)

    def _rows(self, t0: float, t1: float) -> list[dict]:
        if not self.samplers:
            return []
        with self._lock:
            # Newest first, stopping well before t0: the lookup costs the window, not the run's
            # history (rows are appended in time order up to one overlapping poll's duration).
            rows = []
            for r in reversed(self._samples):
                if r["t"] < t0 - _LOOKBACK_S:
                    break
                if t0 <= r["t"] <= t1:
                    rows.append(r)
            rows.sort(key=lambda r: r["t"])
        if not rows:
            self._poll_once()
            with self._lock:
                rows = [self._samples[-1]]
        return rows

    @staticmethod
    def _thin(rows: list[dict], t0: float, limit: int) -> list[dict]:
        if len(rows) > limit:
            step = len(rows) / limit
            rows = [rows[int(i * step)] for i in range(limit)]
        return [{k: v for k, v in r.items() if k != "t"} | {"dt_ms": (r["t"] - t0) * 1e3} for r in rows]
