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


def test_spent_adds_each_phase_seconds_per_workload_and_target(monkeypatch):
    """`spent` sums a phase's seconds where the runner names it: a workload's own phases and each
    target's; the report sums them by phase and names the longest, largest first; malformed
    entries are dropped."""
    from dohnuts.bench.analysis.machine import time_spent, timing_line, timing_of
    from dohnuts.bench.measure.run_clock import spent

    clock = iter([0.0, 2.0, 10.0, 10.5, 20.0, 23.0, 30.0, 30.25])  # perf_counter at each enter and exit
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    timing: dict = {}
    with spent(timing, "text", "references"):
        pass                                                          # 2 s
    with spent(timing, "text", "first call", "dohnuts"):
        pass                                                          # 0.5 s
    with spent(timing, "text", "first call", "dohnuts"):
        pass                                                          # 3 s more: summed
    try:
        with spent(timing, "text", "measured calls", "transformers"):
            raise KeyboardInterrupt                                   # 0.25 s: counted though interrupted
    except KeyboardInterrupt:
        pass
    assert timing == {"workloads": {"text": {"spent_s": {"references": 2.0},
                                             "targets_s": {"dohnuts": {"first call": 3.5},
                                                           "transformers": {"measured calls": 0.25}}}}}
    timing["workloads"]["text"]["targets_s"]["bad"] = {"warm-up": "long", "build": -1.0}
    timing["workloads"]["text"]["first_result_s"] = 15.0
    t = timing_of(timing)
    assert t["workloads"]["text"] == {"first_result_s": 15.0, "spent_s": {"references": 2.0},
                                      "targets_s": {"dohnuts": {"first call": 3.5},
                                                    "transformers": {"measured calls": 0.25}}}
    totals, items = time_spent(t)
    assert list(totals.items()) == [("first call", 3.5), ("references", 2.0), ("measured calls", 0.25)]
    assert items[0] == ("text", "dohnuts", "first call", 3.5) and items[1] == ("text", "", "references", 2.0)
    assert timing_line(t) == ("Time from the process's start: first result of each workload at: text 15.0 s; "
                              "spent on: first call 3.5 s, references 2.0 s, measured calls 0.2 s; the longest: "
                              "text · dohnuts first call 3.5 s, text references 2.0 s, text · transformers "
                              "measured calls 0.2 s.")
