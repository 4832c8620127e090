"""run.json's `measured.timing` (dohnuts.bench.measure.run_clock.RunClock): seconds from the process's
start to the ceilings, to each workload's first and last record, and to the end of measuring."""

from __future__ import annotations

import time
import types

import psutil

from dohnuts.bench.measure.run_clock import RunClock
from tests.bench.typed_records import typed


def test_milestones_are_seconds_from_the_process_start(monkeypatch):
    monkeypatch.setattr(psutil, "Process", lambda: types.SimpleNamespace(create_time=lambda: 1000.0))
    now = iter([1012.5, 1015.25, 1016.0, 1040.0, 1041.0, 1139.996])
    monkeypatch.setattr(time, "time", lambda: next(now))
    timing: dict = {}
    clock = RunClock(timing)
    clock.mark("prepared")                                           # 12.5 s: the ceilings
    clock.write(typed({"workload": {"name": "text"}}))               # text's first record at 15.25 s
    clock.write(typed({"workload": {"name": "text"}}))               # and its last at 16 s
    clock.write(typed({"workload": {"name": "train-step"}}))         # 40 s
    clock.write(typed({"workload": {"name": "train-step"}}))         # 41 s
    clock.mark("measured")
    assert timing["process_started"] == "1970-01-01T00:16:40+00:00"
    assert timing["prepared_s"] == 12.5 and timing["measured_s"] == 140.0
    assert timing["workloads"] == {"text": {"first_result_s": 15.25, "last_result_s": 16.0},
                                   "train-step": {"first_result_s": 40.0, "last_result_s": 41.0}}


def test_the_report_says_the_milestones_and_ignores_malformed_ones():
    from dohnuts.bench.analysis.machine import timing_line, timing_of

    t = timing_of({"prepared_s": 12.5, "measured_s": 140.0, "process_started": "x",
                   "workloads": {"text": {"first_result_s": 15.25, "last_result_s": 16.0},
                                 "train-step": {"first_result_s": "soon"}, "bad": 3}})
    assert t == {"prepared_s": 12.5, "measured_s": 140.0,
                 "workloads": {"text": {"first_result_s": 15.25, "last_result_s": 16.0}, "train-step": {}}}
    assert timing_line(t) == ("Time from the process's start: ceilings measured by 12.5 s; first result of each "
                              "workload at: text 15.2 s; all measured by 140.0 s.")
    for junk in (None, [], {"workloads": []}, {"prepared_s": True}, {"measured_s": float("nan")},
                 {"measured_s": -1.0}):
        assert timing_line(timing_of(junk)) is None
