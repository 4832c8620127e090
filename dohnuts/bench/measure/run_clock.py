"""A run's wall-clock milestones, kept in run.json (`measured.timing`)."""

from __future__ import annotations

import datetime
import time

import psutil

from dohnuts.bench.analysis.records import CallRecord


class RunClock:
    """A run's wall-clock milestones in seconds from its process's start, kept in run.json
    (`measured.timing`): when the ceilings were measured, each workload's first and last record,
    the end. What a user meets on a fresh machine — seconds to a first result, minutes to a
    suite — is read there, not from a stopwatch around the command. A `RecordSink` mirror."""

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
        self.timing["workloads"].setdefault(record.workload.name, {"first_result_s": now})["last_result_s"] = now


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="seconds")
