"""`dohnuts-bench run --nvtx` and the profiler conventions of issue 49: each stage of a measured
(steady) call is an NVTX range in the domain `dohnuts` — named by its stage, balanced, on those
calls only, its cost inside the harness overhead and flagged there; the measured calls bracketed
by `torch.cuda.profiler.start()`/`stop()`; `--nvtx` refused in one line without the nvtx package.

A fake `nvtx` module records the calls (the real package needs no GPU either, but a tool attached
to see its ranges): these tests run on the CPU."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dohnuts.bench.calls import CallResult
from dohnuts.bench.cli import main
from dohnuts.bench.contracts import RunContext
from dohnuts.bench.measure import runner, trace
from dohnuts.bench.measure.call import measure_call, untimed_call_ms
from dohnuts.bench.measure.record import TargetContext
from dohnuts.bench.measure.telemetry import TelemetryThread
from dohnuts.runtime.timing import NVTX_DOMAIN, NvtxRanges, StageTimer, empty_stage_cost
from dohnuts.runtime.work import WorkCounts

CPU = torch.device("cpu")
WORKLOAD = """kind: text
targets: [dohnuts]
model: tiny
warmup: 2
repeat: 3
shape: {requests: 1, questions: 2, seq_tokens: 48, candidates: 2, candidate_tokens: 2}
"""


def fake_nvtx(log: list) -> types.ModuleType:
    """An `nvtx` module whose push_range / pop_range append ("push", message, domain) and ("pop",
    domain) to `log`."""
    module = types.ModuleType("nvtx")
    module.push_range = lambda message=None, color=None, domain=None, **kw: log.append(("push", message, domain))
    module.pop_range = lambda domain=None: log.append(("pop", domain))
    return module


def balanced_names(log: list) -> list[str]:
    """The ranges of `log` in the order they closed, checking that every pop closes the innermost
    open range of the `dohnuts` domain and that none is left open."""
    stack, closed = [], []
    for entry in log:
        if entry[0] == "push":
            assert entry[2] == NVTX_DOMAIN
            stack.append(entry[1])
        elif entry[0] == "pop":
            assert entry[1] == NVTX_DOMAIN and stack, f"a pop with no open range: {entry}"
            closed.append(stack.pop())
    assert not stack, f"ranges left open: {stack}"
    return closed


def test_each_stage_is_a_range_named_by_it_in_the_dohnuts_domain():
    log = []
    timer = StageTimer(CPU, nvtx=NvtxRanges(fake_nvtx(log)))
    with timer.stage("prepare"):
        pass
    with timer.stage("forward"):
        with timer.stage("h2d"):  # a stage inside another: nested ranges
            pass
    assert log == [("push", "prepare", "dohnuts"), ("pop", "dohnuts"), ("push", "forward", "dohnuts"),
                   ("push", "h2d", "dohnuts"), ("pop", "dohnuts"), ("pop", "dohnuts")]
    assert balanced_names(log) == ["prepare", "h2d", "forward"]
    assert timer.entries == 3 and set(timer.result()) == {"prepare", "forward", "h2d"}


def test_a_stage_that_raises_still_closes_its_range():
    log = []
    timer = StageTimer(CPU, nvtx=NvtxRanges(fake_nvtx(log)))
    with pytest.raises(ValueError):
        with timer.stage("forward"):
            raise ValueError("boom")
    assert balanced_names(log) == ["forward"]


def test_the_calibration_times_a_stage_with_its_range():
    log = []
    cal = empty_stage_cost(CPU, n=10, warmup=2, batches=2, nvtx=NvtxRanges(fake_nvtx(log)))
    assert cal["nvtx"] is True and cal["stages"] == 20
    assert balanced_names(log) == ["empty"] * (2 + 20)  # the warm-up stages too
    assert "nvtx" not in empty_stage_cost(CPU, n=10, warmup=2, batches=2)  # absent: no ranges


class SleepyTarget:
    def run_call(self, call, timer):
        for name, seconds in call:
            with timer.stage(name):
                time.sleep(seconds)
        return CallResult(decisions=1, work=WorkCounts(sequences=1, seq_lens=(8,), padded_len=8, candidates=2))


def test_ranges_are_on_steady_calls_only_and_their_records_say_so(tmp_path):
    from dohnuts.model.build import resolve_source

    log = []
    cfg, _ = resolve_source("tiny")
    run = RunContext(run_id="r", run_dir=tmp_path, device=CPU, hwspec=None, console=None, nvtx=True)
    spec = SimpleNamespace(name="w", kind="text", file="w.yaml", file_hash="0", model="tiny")
    tspec = SimpleNamespace(label="sleepy", name="sleepy", options={})
    ctx = TargetContext(run, spec, tspec, CPU, torch.float32, cfg, {"device": {"name": "cpu"}}, TelemetryThread([]),
                        ranks={}, stage_ranges=NvtxRanges(fake_nvtx(log)))
    call = [("prepare", 0.001), ("forward", 0.002), ("forward", 0.001)]
    first = measure_call(ctx, SleepyTarget(), call, -1, phase="first-call")
    assert run.measured["harness_calibration"]["cpu"]["nvtx"] is True  # calibrated as the steady stages run
    calibration_ranges = len(log)
    assert first.harness_overhead.nvtx is False
    twin = untimed_call_ms(ctx, SleepyTarget(), call)  # the A/B's untimed twin: no timer, no range
    assert len(log) == calibration_ranges
    steady = measure_call(ctx, SleepyTarget(), call, 0, twin_ms=twin)
    assert steady.harness_overhead.nvtx is True
    assert balanced_names(log[calibration_ranges:]) == ["prepare", "forward", "forward"]
    assert steady.harness_overhead.stage_entries == 3


def test_the_measured_window_brackets_its_body_on_cuda_only(monkeypatch):
    log = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: log.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: log.append("stop"))
    with trace.measured_window(torch.device("cuda")):  # a device object only: nothing runs on a GPU
        log.append("call")
    with pytest.raises(KeyboardInterrupt):  # an interrupted run still stops the capture
        with trace.measured_window(torch.device("cuda")):
            raise KeyboardInterrupt
    with trace.measured_window(CPU):
        log.append("cpu call")
    assert log == ["start", "call", "stop", "start", "stop", "cpu call"]


@pytest.mark.slow(seconds=15)
def test_a_nvtx_run_puts_ranges_and_the_capture_window_around_the_measured_calls_only(tmp_path, monkeypatch):
    """The whole run with a fake nvtx, the capture window made to run as on CUDA: every range is a
    stage of a steady call (their count is the steady records' stage entries: none on the warm-up,
    the first call, the twins or the stream) and falls inside the window, which holds exactly the
    steady calls; their records say ranges were on, and so does the report's overhead column."""
    events = []
    monkeypatch.setitem(sys.modules, "nvtx", fake_nvtx(events))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append(("start",)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append(("stop",)))
    real_window, real_measure = runner.measured_window, runner.measure_call
    monkeypatch.setattr(runner, "measured_window", lambda device: real_window(torch.device("cuda")))

    def logged_measure(ctx, target, call, iteration, phase="steady", twin_ms=None):
        events.append(("call", phase, iteration))
        return real_measure(ctx, target, call, iteration, phase=phase, twin_ms=twin_ms)

    monkeypatch.setattr(runner, "measure_call", logged_measure)
    wl = tmp_path / "text-nvtx.yaml"
    wl.write_text(WORKLOAD)
    assert main(["run", str(wl), "--out", str(tmp_path / "runs"), "--quiet", "--nvtx"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    steady = [r for r in records if r["phase"] == "steady"]
    assert len(steady) >= 3 and {r["phase"] for r in records} == {"first-call", "steady", "stream"}

    # the window holds the steady calls, nothing else
    start, stop = events.index(("start",)), events.index(("stop",))
    assert events.count(("start",)) == events.count(("stop",)) == 1
    first_call = events.index(("call", "first-call", -1))
    assert first_call < start
    inside = events[start + 1:stop]
    assert [e for e in inside if e[0] == "call"] == [("call", "steady", i) for i in range(len(steady))]
    assert not [e for e in events[stop:] if e[0] in ("push", "pop", "call")]
    ranges = balanced_names([e for e in inside if e[0] in ("push", "pop")])
    assert len(ranges) == sum(s["count"] for r in steady for s in r["stages"].values())
    assert sorted(set(ranges)) == sorted({name for r in steady for name in r["stages"]})
    # before it only the calibration's ranges (at the first call: a stage timed with its range, as the
    # steady calls run them); the first call, the warm-up and the twins have none
    assert balanced_names([e for e in events[:start] if e[0] in ("push", "pop")]) == ["empty"] * (20 + 200 * 5)

    assert all(r["harness_overhead"]["nvtx"] is True for r in steady)
    assert all("nvtx" not in (r["harness_overhead"] or {}) for r in records if r["phase"] != "steady")
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["measured"]["harness_calibration"]["cpu"]["nvtx"] is True
    rows = {r["target"]: r for r in json.loads((run_dir / "summary.json").read_text())["summary"]}
    assert rows["dohnuts"]["harness_overhead"]["nvtx"] is True  # the steady calls' row
    assert not (rows["dohnuts · first-call"].get("harness_overhead") or {}).get("nvtx")
    assert "NVTX ranges on" in (run_dir / "report.txt").read_text()


def test_nvtx_without_the_package_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "nvtx", None)  # `import nvtx` raises ImportError
    wl = tmp_path / "text-nvtx.yaml"
    wl.write_text(WORKLOAD)
    assert main(["run", str(wl), "--out", str(tmp_path / "runs"), "--quiet", "--nvtx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--nvtx" in err[0] and "pip install 'dohnuts[nvidia]'" in err[0]
    assert not (tmp_path / "runs").exists()  # refused before the run directory was made


def test_the_real_nvtx_package_takes_the_ranges():
    """NVIDIA's package itself (skipped where it is not installed): with no tool attached its
    ranges cost little and change no stage time's bookkeeping."""
    nvtx = pytest.importorskip("nvtx")
    timer = StageTimer(CPU, nvtx=NvtxRanges(nvtx))
    for _ in range(3):
        with timer.stage("forward"):
            pass
    assert timer.result()["forward"].count == 3 and timer.entries == 3
    assert empty_stage_cost(CPU, n=10, warmup=2, batches=2, nvtx=NvtxRanges(nvtx))["nvtx"] is True


def test_the_nvidia_extra_installs_nvtx():
    import tomllib

    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert "nvtx>=0.2.10" in extras["nvidia"]
