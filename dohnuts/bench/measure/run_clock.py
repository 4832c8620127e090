"""A run's wall-clock milestones, kept in run.json (`measured.timing`)."""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Iterator

import psutil

from dohnuts.bench.analysis.records import CallRecord


class RunClock:
    """A run's wall-clock milestones in seconds from its process's start, kept in run.json
    (`measured.timing`): when the ceilings were measured, each workload's first and last record,
    the end (and, written by the runner through `spent`, the seconds of each phase). What a user
    meets on a fresh machine — seconds to a first result, minutes to a suite — is read there, not
    from a stopwatch around the command. A `RecordSink` mirror."""

    def __init__(self, timing: dict):
        self.t0 = psutil.Process().create_time()
        self.timing = timing
        timing.update(process_started=_iso(self.t0), workloads={})

    def seconds(self) -> float:
        return round(time.time() - self.t0, 2)

    def mark(self, name: str) -> None:
        self.timing[f"{name}_s"] = self.seconds()

    def write(self, record: CallRecord) -> None:
        now = self.seconds()
        w = self.timing.setdefault("workloads", {}).setdefault(record.workload.name, {})
        w.setdefault("first_result_s", now)
        w["last_result_s"] = now


# The phases `spent` names, in the order a workload runs them (the report sums them across workloads).
PHASES = ("inputs", "references", "build", "first call", "warm-up", "reference check", "energy window",
          "measured calls", "profile", "stream and served", "accuracy")


@contextlib.contextmanager
def spent(timing: dict, workload: str, phase: str, target: str | None = None) -> Iterator[None]:
    """Add the seconds the block takes to run.json's `measured.timing`: a workload's own phases
    (its inputs, the reference check's FP32 runs) under `workloads.<name>.spent_s`, a target's
    under `workloads.<name>.targets_s.<label>` — where a suite's minutes go, beside its milestones."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        w = timing.setdefault("workloads", {}).setdefault(workload, {})
        where = w.setdefault("spent_s", {}) if target is None else w.setdefault("targets_s", {}).setdefault(target, {})
        where[phase] = round(where.get(phase, 0.0) + time.perf_counter() - t0, 3)


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="seconds")
