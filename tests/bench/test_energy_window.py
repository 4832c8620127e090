"""A target's energy per call over a window of back-to-back calls (dohnuts.bench.measure.call
.energy_window): a stepped counter like NVML's (one step per 100 ms) reads 0 or a whole step
for one short call, so the summary takes the window instead. Checked against a fake counter of
known power: the window is within one step of power × its duration, and per call that is
power × a call's time, where the per-call readings are off by up to a whole step."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch

from dohnuts.bench.analysis.records import EnergyWindow
from dohnuts.bench.analysis.summary import energy_summary, summarize
from dohnuts.bench.calls import CallResult
from dohnuts.bench.contracts import RunContext
from dohnuts.bench.measure.call import ENERGY_WINDOW_MIN_CALLS, ENERGY_WINDOW_S, energy_window, measure_call
from dohnuts.bench.measure.record import TargetContext
from dohnuts.bench.measure.telemetry import Sampler, TelemetryThread
from dohnuts.runtime.work import WorkCounts

POWER_W, STEP_S = 400.0, 0.1


class SteppedCounter(Sampler):
    """A GPU energy counter that advances POWER_W × STEP_S joules every STEP_S seconds."""

    name = "nvml"

    def __init__(self):
        self.t0 = time.perf_counter()

    def energy_counter(self) -> float:
        return int((time.perf_counter() - self.t0) / STEP_S) * POWER_W * STEP_S

    def sample(self) -> dict:
        return {}


class SleepTarget:
    """A call that takes `ms` milliseconds (the device 'busy' all the while)."""

    def __init__(self, ms: float):
        self.ms, self.calls = ms, 0

    def run_call(self, call, timer):
        self.calls += 1
        time.sleep(self.ms / 1e3)
        return CallResult(decisions=4, work=WorkCounts(sequences=1, seq_lens=(8,), padded_len=8, candidates=4))


def _ctx(tmp_path, telemetry) -> TargetContext:
    from dohnuts.model.build import resolve_source

    cfg, _ = resolve_source("tiny")
    run = RunContext(run_id="r", run_dir=tmp_path, device=torch.device("cpu"), hwspec=None, console=None)
    spec = SimpleNamespace(name="w", kind="text", file="w.yaml", file_hash="0", model="tiny")
    tspec = SimpleNamespace(label="fake", name="fake", options={})
    return TargetContext(run, spec, tspec, torch.device("cpu"), torch.float32, cfg,
                         {"device": {"name": "fake GPU"}}, telemetry, ranks={})


def test_the_window_is_power_times_its_duration_within_one_step(tmp_path):
    telemetry = TelemetryThread([SteppedCounter()])
    ctx = _ctx(tmp_path, telemetry)
    target = SleepTarget(12)
    window = energy_window(ctx, target, [[0], [1]])
    assert window["calls"] == target.calls >= ENERGY_WINDOW_MIN_CALLS
    assert window["seconds"] >= ENERGY_WINDOW_S
    # the counter read right before the first call and right after the last: at most one step off
    assert abs(window["joules"] - POWER_W * window["seconds"]) <= POWER_W * STEP_S * 1.05

    # in the records and the summary: per call = the window over its calls (not the per-call steps)
    ctx = dataclasses.replace(ctx, energy_window=window)
    recs = [measure_call(ctx, target, [0], i) for i in range(4)]
    assert all(r.energy.window == EnergyWindow(**window) for r in recs)
    summary = energy_summary(recs)
    per_call = window["joules"] / window["calls"]
    assert summary["energy_j_per_call"] == pytest.approx(per_call)
    assert summary["energy_j_per_decision"] == pytest.approx(per_call / 4)
    assert summary["energy_calls"] == window["calls"] and summary["energy_method"].startswith("window of")
    # ... which is power × a call's time (the sleep's overshoot included) to the step's error
    call_s = window["seconds"] / window["calls"]
    assert per_call == pytest.approx(POWER_W * call_s, rel=POWER_W * STEP_S * 1.05 / window["joules"])
    # one 12 ms call reads 0 or a 40 J step: never near the truth on its own
    assert all(r.energy.joules in (0.0, POWER_W * STEP_S, 2 * POWER_W * STEP_S) for r in recs)
    [row] = summarize(recs)
    assert row["energy_j_per_call"] == pytest.approx(per_call)


def test_no_counter_no_window_and_no_call(tmp_path):
    telemetry = TelemetryThread([])
    ctx = _ctx(tmp_path, telemetry)
    target = SleepTarget(1)
    assert energy_window(ctx, target, [[0]]) is None and target.calls == 0
    rec = measure_call(ctx, target, [0], 0)
    assert rec.energy.window is None and energy_summary([rec])["energy_method"] is None
