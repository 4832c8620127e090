"""Validity gates: calls measured on a throttled or down-clocked GPU are flagged and left out.

No GPU is needed: fake `pynvml` and `amdsmi` modules are put in sys.modules and report chosen
clocks and throttle reasons; the real samplers are built on them, and the flags are followed end
to end — sampler → telemetry window → the runner's record `validity` → `valid_records`.
"""

from __future__ import annotations

import sys
import time
import types
from enum import IntEnum
from types import SimpleNamespace

import pytest
import torch

import msgspec

from dohnuts.bench.analysis.measurement_quality import validity_summary
from dohnuts.bench.analysis.records import Validity, valid_records
from dohnuts.bench.calls import CallResult
from dohnuts.bench.contracts import RunContext
from dohnuts.bench.measure.call import measure_call
from dohnuts.bench.measure.record import TargetContext
from dohnuts.bench.measure.telemetry import TelemetryThread, call_validity
from dohnuts.runtime.work import WorkCounts
from dohnuts_bench_plugins.telemetry import (
    NVML_CLOCK_EVENT_REASONS, NVML_THROTTLING_BITS, AmdSmiSampler, NvmlSampler, decode_nvml_reasons,
)
from tests.bench.typed_records import typed, typed_all, written

SW_POWER_CAP, HW_SLOWDOWN, SYNC_BOOST, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x10, 0x20, 0x40, 0x80
GPU_IDLE, APP_CLOCKS, DISPLAY_CLOCK = 0x1, 0x2, 0x100


# --- fake vendor libraries -------------------------------------------------------------------

class FakeNvml(types.ModuleType):
    """pynvml's calls the sampler makes, reporting `state` (SM clock, reasons bitmask)."""

    NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 2, 0

    def __init__(self, sm=1980, max_sm=1980, reasons=0, event_api=True):
        super().__init__("pynvml")
        self.state = {"sm": sm, "reasons": reasons}
        self.max_sm, self.max_queries = max_sm, 0
        get = lambda handle: self.state["reasons"]
        if event_api:
            self.nvmlDeviceGetCurrentClocksEventReasons = get
        else:  # drivers/bindings older than the "clocks event" rename
            self.nvmlDeviceGetCurrentClocksThrottleReasons = get

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        self.max_queries += 1
        return self.max_sm

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self.state["sm"] if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPowerUsage(self, handle):
        return 612_000  # mW

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=100, memory=35)


class FakeAmdSmi(types.ModuleType):
    """amdsmi's calls the sampler makes. `metrics` are gpu_metrics fields ("N/A" = unsupported)."""

    AmdSmiClkType = IntEnum("AmdSmiClkType", "SYS GFX DF DCEF SOC MEM")
    AmdSmiTemperatureType = IntEnum("AmdSmiTemperatureType", "EDGE HOTSPOT VRAM")
    AmdSmiTemperatureMetric = IntEnum("AmdSmiTemperatureMetric", "CURRENT MAX")

    def __init__(self, clk=2100, max_clk=2100, metrics=None, gfx_activity=100):
        super().__init__("amdsmi")
        self.state = {"clk": clk, "gfx_activity": gfx_activity,
                      "metrics": metrics if metrics is not None else mi300_metrics()}
        self.max_clk = max_clk

    def amdsmi_init(self, *flags):
        pass

    def amdsmi_get_processor_handles(self):
        return ["mi300x-0"]

    def amdsmi_get_clock_info(self, handle, clk_type):
        assert clk_type == self.AmdSmiClkType.GFX
        return {"clk": self.state["clk"], "min_clk": 500, "max_clk": self.max_clk, "clk_locked": False,
                "clk_deep_sleep": 100}

    def amdsmi_get_gpu_metrics_info(self, handle):
        return dict(self.state["metrics"])

    def amdsmi_get_gpu_activity(self, handle):
        return {"gfx_activity": self.state["gfx_activity"], "umc_activity": 40, "mm_activity": "N/A"}

    def amdsmi_get_power_info(self, handle):
        return {"current_socket_power": 640, "average_socket_power": 600, "power_limit": 750}

    def amdsmi_get_temp_metric(self, handle, kind, metric):
        return 55

    def amdsmi_get_violation_status(self, handle):  # pragma: no cover - must not be called (blocks 100 ms)
        raise AssertionError("the sampler must not call amdsmi_get_violation_status (it sleeps 100 ms)")


def mi300_metrics(counter=1000, ppt=0, socket=0, prochot=0, vr=0, hbm=0) -> dict:
    return {"accumulation_counter": counter, "ppt_residency_acc": ppt, "socket_thm_residency_acc": socket,
            "prochot_residency_acc": prochot, "vr_thm_residency_acc": vr, "hbm_thm_residency_acc": hbm,
            "throttle_status": "N/A", "indep_throttle_status": "N/A"}


def navi_metrics(throttled: bool) -> dict:
    return {"accumulation_counter": "N/A", "ppt_residency_acc": "N/A", "socket_thm_residency_acc": "N/A",
            "prochot_residency_acc": "N/A", "vr_thm_residency_acc": "N/A", "hbm_thm_residency_acc": "N/A",
            "throttle_status": throttled, "indep_throttle_status": "N/A"}


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def amd(monkeypatch):
    fake = FakeAmdSmi()
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    return fake


# --- NVML reasons ------------------------------------------------------------------------------

def test_nvml_reason_bits_match_the_installed_bindings():
    pynvml = pytest.importorskip("pynvml")
    if isinstance(pynvml, FakeNvml):  # pragma: no cover
        pytest.skip("a fake pynvml is installed")
    names = {"GpuIdle": "gpu_idle", "ApplicationsClocksSetting": "applications_clocks_setting",
             "SwPowerCap": "sw_power_cap", "HwSlowdown": "hw_slowdown", "SyncBoost": "sync_boost",
             "SwThermalSlowdown": "sw_thermal_slowdown", "HwThermalSlowdown": "hw_thermal_slowdown",
             "HwPowerBrakeSlowdown": "hw_power_brake_slowdown", "DisplayClockSetting": "display_clock_setting"}
    for suffix, ours in names.items():
        value = getattr(pynvml, f"nvmlClocksEventReason{suffix}", None)
        if value is None:
            value = getattr(pynvml, f"nvmlClocksThrottleReason{suffix}")
        assert NVML_CLOCK_EVENT_REASONS[value] == ours
    assert NVML_THROTTLING_BITS == 0xE8  # HW slowdown, SW/HW thermal, power brake (not the power cap)


def test_decode_counts_only_clock_reducing_reasons():
    active, throttling = decode_nvml_reasons(GPU_IDLE | APP_CLOCKS | SW_POWER_CAP | HW_THERMAL | DISPLAY_CLOCK)
    assert active == ["gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_thermal_slowdown",
                      "display_clock_setting"]
    assert throttling == ["hw_thermal_slowdown"]
    assert decode_nvml_reasons(GPU_IDLE | APP_CLOCKS) == (["gpu_idle", "applications_clocks_setting"], [])
    assert decode_nvml_reasons(1 << 40)[0] == [f"bit_{1 << 40:#x}"]
    every = SW_POWER_CAP | HW_SLOWDOWN | SYNC_BOOST | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE
    assert decode_nvml_reasons(every)[1] == ["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                             "hw_power_brake_slowdown"]


@pytest.mark.parametrize("event_api", [True, False], ids=["clocks-event-api", "throttle-api"])
def test_nvml_sampler_reports_max_clock_once_and_decoded_reasons(monkeypatch, event_api):
    fake = FakeNvml(sm=1410, max_sm=1980, reasons=SW_POWER_CAP | GPU_IDLE, event_api=event_api)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = NvmlSampler()
    assert s.unavailable is None
    first, second = s.sample(), s.sample()
    assert fake.max_queries == 1  # queried once, at construction
    assert first == second
    assert first["sm_clock_mhz"] == 1410 and first["max_sm_clock_mhz"] == 1980 and first["power_w"] == 612.0
    assert first["throttle_reasons"] == 0x5
    assert first["clock_events"] == ["gpu_idle", "sw_power_cap"] and first["throttling"] == []
    assert first["power_capped"] == ["sw_power_cap"]
    assert first["idle"] is True


def test_nvml_unavailable_without_the_library(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert NvmlSampler().unavailable.startswith("NVML unavailable")


# --- call_validity on samples ----------------------------------------------------------------------

def _nv(sm=1980, max_sm=1980, throttling=(), idle=False):
    return {"nvml": {"sm_clock_mhz": sm, "max_sm_clock_mhz": max_sm, "throttling": list(throttling), "idle": idle}}


def test_validity_of_samples():
    assert call_validity([_nv(), _nv(1800)]) == {"valid": True, "reasons": [], "detail": [], "gpu_samples": 2}
    v = call_validity([_nv(), _nv(1500), _nv(1400, throttling=["hw_slowdown"]), _nv(1980)])
    assert v["valid"] is False and v["gpu_samples"] == 4
    assert v["reasons"] == ["nvml: throttled (hw_slowdown)", "nvml: SM clock below 0.9 × max 1980 MHz"]
    assert v["detail"] == ["in 1/4 samples", "1400–1500 MHz in 2/4 samples"]
    # the power cap is the sustained regime of dense work: a low clock it explains stays valid, counted
    capped = call_validity([_nv(), _nv(1650) | {"nvml": _nv(1650)["nvml"] | {"power_capped": ["sw_power_cap"]}}])
    assert capped == {"valid": True, "reasons": [], "detail": [], "gpu_samples": 2, "power_capped": 1}
    # a sample of an earlier version counted the cap as throttling: read under today's rule
    old = call_validity([_nv(1650, throttling=["sw_power_cap"])])
    assert old["valid"] is True and old["power_capped"] == 1
    assert call_validity([_nv(1650, throttling=["sw_power_cap", "hw_slowdown"])])["reasons"] == [
        "nvml: throttled (hw_slowdown)"]
    # the threshold is a parameter: at 0.7 × 1980 = 1386 MHz, 1400 and 1500 MHz pass
    assert call_validity([_nv(1500), _nv(1400)], min_clock_fraction=0.7)["valid"] is True
    assert call_validity([_nv(1781)])["valid"] is False and call_validity([_nv(1782)])["valid"] is True
    # an idle GPU parks its clock: not a throttle (its throttling reasons still count)
    assert call_validity([_nv(345, idle=True)])["valid"] is True
    assert call_validity([_nv(345, idle=True, throttling=["hw_slowdown"])])["reasons"] == [
        "nvml: throttled (hw_slowdown)"]
    # no GPU sampler (a CPU run), a failing sensor, a missing maximum: nothing checked, valid
    assert call_validity([{"host": {"cpu_percent": 50.0}}]) == {"valid": True, "reasons": [], "detail": [],
                                                                "gpu_samples": 0}
    assert call_validity([{"nvml": {"error": "GPU is lost"}}])["gpu_samples"] == 0
    assert call_validity([{"nvml": {"sm_clock_mhz": 300, "max_sm_clock_mhz": None}}])["valid"] is True
    amd = {"amdsmi": {"gfx_clock_mhz": 1300, "max_gfx_clock_mhz": 2100, "throttling": []}}
    assert call_validity([amd])["reasons"] == ["amdsmi: GFX clock below 0.9 × max 2100 MHz"]


def test_threshold_is_configurable(monkeypatch):
    assert TelemetryThread([]).min_clock_fraction == 0.9
    monkeypatch.setenv("DOHNUTS_BENCH_MIN_CLOCK_FRACTION", "0.75")
    assert TelemetryThread([]).min_clock_fraction == 0.75
    assert TelemetryThread([], min_clock_fraction=0.5).min_clock_fraction == 0.5
    from dohnuts.errors import ConfigError

    for garbage in ("1.5", "abc", "nan", "-0.1", "0"):  # one line naming the variable, never a traceback
        monkeypatch.setenv("DOHNUTS_BENCH_MIN_CLOCK_FRACTION", garbage)
        with pytest.raises(ConfigError, match=r"^environment variable DOHNUTS_BENCH_MIN_CLOCK_FRACTION: must be a "
                                              r"number in \(0, 1\], got"):
            TelemetryThread([])
    with pytest.raises(ValueError, match="min_clock_fraction"):
        TelemetryThread([], min_clock_fraction=0.0)


def test_window_validity_sees_every_sample_not_only_the_kept_ones(nvml):
    telemetry = TelemetryThread([NvmlSampler()])
    t0 = time.perf_counter()
    for i in range(20):
        nvml.state["reasons"] = HW_SLOWDOWN if i == 1 else 0
        telemetry._poll_once()
    t1 = time.perf_counter()
    window, validity = telemetry.window_and_validity(t0, t1)
    assert len(window) == 8 and all(not w["nvml"]["throttling"] for w in window)  # sample 1 was thinned away
    assert validity["valid"] is False and validity["reasons"] == ["nvml: throttled (hw_slowdown)"]
    assert validity["detail"] == ["in 1/20 samples"] and validity["gpu_samples"] == 20
    assert window == telemetry.window(t0, t1)


# --- end to end through the runner -------------------------------------------------------------------

class GpuStateTarget:
    """A target whose call walks the fake GPU through `call` (one state per stage) while the
    telemetry thread samples (here: polled inline, deterministically)."""

    def __init__(self, telemetry, apply):
        self.telemetry, self.apply = telemetry, apply

    def run_call(self, call, timer):
        for i, state in enumerate(call):
            with timer.stage(f"stage{i}"):
                self.apply(state)
                self.telemetry._poll_once()
        return CallResult(decisions=1, work=WorkCounts(sequences=1, seq_lens=(8,), padded_len=8, candidates=2))


def _measure(tmp_path, target, telemetry, call, iteration=0):
    from dohnuts.model.build import resolve_source

    cfg, _ = resolve_source("tiny")
    run = RunContext(run_id="r", run_dir=tmp_path, device=torch.device("cpu"), hwspec=None, console=None)
    spec = SimpleNamespace(name="w", kind="text", file="w.yaml", file_hash="0", model="tiny")
    tspec = SimpleNamespace(label="fake", name="fake", options={})
    prov = {"device": {"name": "fake GPU"}}
    ctx = TargetContext(run, spec, tspec, torch.device("cpu"), torch.float32, cfg, prov, telemetry, ranks={})
    return measure_call(ctx, target, call, iteration)


def test_nvml_flags_reach_the_record_and_valid_records(tmp_path, nvml):
    telemetry = TelemetryThread([NvmlSampler()])

    def apply(state):
        nvml.state.update(state)

    target = GpuStateTarget(telemetry, apply)
    full = {"sm": 1980, "reasons": 0}
    calls = {
        "clean": [full, full, full],
        "power-capped": [full, {"sm": 1800, "reasons": SW_POWER_CAP}, full],  # clock still ≥ 0.9 × max
        "slow-clock": [full, {"sm": 1200, "reasons": APP_CLOCKS}, full],  # app clocks: not a reason, but slow
        "idle-gaps": [full, {"sm": 210, "reasons": GPU_IDLE}, full],
        "thermal": [{"sm": 990, "reasons": HW_THERMAL | HW_SLOWDOWN}, full, full],
    }
    records = {name: _measure(tmp_path, target, telemetry, call, i) for i, (name, call) in enumerate(calls.items())}
    for rec in records.values():
        written(rec)  # within every bound of the record's type
        assert rec.validity.gpu_samples == 3
    assert records["clean"].validity.valid and records["idle-gaps"].validity.valid
    assert records["power-capped"].validity.valid and records["power-capped"].validity.power_capped == 1
    assert records["slow-clock"].validity.reasons == ["nvml: SM clock below 0.9 × max 1980 MHz"]
    assert records["thermal"].validity.reasons == [
        "nvml: throttled (hw_slowdown)", "nvml: throttled (hw_thermal_slowdown)",
        "nvml: SM clock below 0.9 × max 1980 MHz"]
    # the record's telemetry window holds what was decided on
    assert [w["nvml"]["sm_clock_mhz"] for w in records["thermal"].telemetry] == [990, 1980, 1980]

    legacy = msgspec.structs.replace(records["clean"], validity=None)  # a record of an older run: counts as valid
    kept, dropped = valid_records([*records.values(), legacy])
    assert dropped == 2
    assert [r.iteration for r in kept] == [0, 1, 3, 0]
    summary = validity_summary([*records.values(), legacy])
    assert summary == {("w", "fake"): {"n": 6, "invalid": 2, "power_capped": 1, "reasons": {
        "nvml: SM clock below 0.9 × max 1980 MHz": 2,
        "nvml: throttled (hw_slowdown)": 1, "nvml: throttled (hw_thermal_slowdown)": 1}}}


def test_nvml_threshold_from_the_telemetry_thread(tmp_path, nvml):
    telemetry = TelemetryThread([NvmlSampler()], min_clock_fraction=0.5)
    target = GpuStateTarget(telemetry, nvml.state.update)
    rec = _measure(tmp_path, target, telemetry, [{"sm": 1200, "reasons": 0}])
    assert rec.validity.valid is True  # 1200 ≥ 0.5 × 1980


def test_amd_violation_residency_flags_reach_the_record(tmp_path, amd):
    sampler = AmdSmiSampler()
    assert sampler.unavailable is None and sampler.max_gfx_clock_mhz == 2100
    telemetry = TelemetryThread([sampler])

    def apply(state):
        amd.state.update(state)

    target = GpuStateTarget(telemetry, apply)
    # residencies rise with the accumulation counter: ppt (PVIOL) by 30 of 100 ticks = 30 %
    clean = _measure(tmp_path, target, telemetry, [
        {"metrics": mi300_metrics(counter=1100)}, {"metrics": mi300_metrics(counter=1200)}])
    capped = _measure(tmp_path, target, telemetry, [
        {"metrics": mi300_metrics(counter=1300)}, {"metrics": mi300_metrics(counter=1400, ppt=30)},
        {"metrics": mi300_metrics(counter=1500, ppt=30)}], iteration=1)
    hot = _measure(tmp_path, target, telemetry, [
        {"metrics": mi300_metrics(counter=1600, ppt=30, hbm=5), "clk": 1500}], iteration=2)
    assert clean.validity == Validity(valid=True, reasons=[], detail=[], gpu_samples=2)
    reading = capped.telemetry[1]["amdsmi"]
    assert reading["gfx_clock_mhz"] == 2100 and reading["max_gfx_clock_mhz"] == 2100
    assert reading["throttle_source"] == "violation_residency"
    assert reading["violation_percent"] == {"prochot_thrm": 0, "ppt_pwr": 30, "socket_thrm": 0, "vr_thrm": 0,
                                            "hbm_thrm": 0}
    # PVIOL is the power cap: kept and counted, as NVML's software power cap is
    assert reading["throttling"] == [] and reading["power_capped"] == ["ppt_pwr"] and reading["power_w"] == 640
    assert capped.validity == Validity(valid=True, reasons=[], detail=[], gpu_samples=3, power_capped=1)
    # HBM thermal is throttling, and no power cap explains the low clock (ppt did not rise)
    assert hot.validity.reasons == ["amdsmi: throttled (hbm_thrm)", "amdsmi: GFX clock below 0.9 × max 2100 MHz"]
    kept, dropped = valid_records([clean, capped, hot])
    assert (len(kept), dropped) == (2, 1) and kept == [clean, capped]


def test_amd_throttle_status_on_older_asics(tmp_path, amd):
    amd.state["metrics"] = navi_metrics(False)
    telemetry = TelemetryThread([AmdSmiSampler()])
    target = GpuStateTarget(telemetry, amd.state.update)
    ok = _measure(tmp_path, target, telemetry, [{}, {"gfx_activity": 0, "clk": 100}])  # idle: parked clock
    bad = _measure(tmp_path, target, telemetry, [{"metrics": navi_metrics(True), "gfx_activity": 100, "clk": 2100}])
    assert ok.validity.valid is True and ok.telemetry[1]["amdsmi"]["idle"] is True
    assert bad.telemetry[0]["amdsmi"]["throttle_source"] == "throttle_status"
    assert bad.validity.reasons == ["amdsmi: throttled (throttle_status)"]
    assert valid_records([ok, bad])[1] == 1


def test_amd_unavailable_without_the_library(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert AmdSmiSampler().unavailable.startswith("amdsmi unavailable")


def test_valid_records_without_validity_fields():
    recs = typed_all([{"iteration": 0}, {"iteration": 1, "validity": {"valid": True, "reasons": []}},
                      {"iteration": 2, "validity": {"valid": False, "reasons": ["nvml: throttled (sync_boost)"]}}])
    kept, dropped = valid_records(recs)
    assert [r.iteration for r in kept] == [0, 1] and dropped == 1
    assert valid_records([]) == ([], 0)


def test_clock_summary_of_a_group_of_calls():
    """Median and lowest clock over the non-idle samples of every call, the device maximum and the
    power-capped count, from NVML (SM) or amdsmi (GFX) readings; None without any clock."""
    from dohnuts.bench.analysis.summary import summarize
    from dohnuts.bench.measure.telemetry import clock_summary
    from dohnuts.bench.report.text_report import quality_table

    def rec(*readings):
        return typed({"telemetry": [{"host": {"cpu_percent": 5.0}, "nvml": r, "dt_ms": 1.0} for r in readings]})

    capped = {"sm_clock_mhz": 1590, "max_sm_clock_mhz": 1980, "power_capped": ["sw_power_cap"]}
    recs = [rec(capped, {"sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "power_capped": []}),
            rec({"sm_clock_mhz": 1290, "max_sm_clock_mhz": 1980, "power_capped": ["sw_power_cap"]},
                {"sm_clock_mhz": 210, "max_sm_clock_mhz": 1980, "idle": True})]  # idle: not counted
    assert clock_summary(recs) == {"median_mhz": 1590, "min_mhz": 1290, "max_mhz": 1980, "samples": 3,
                                   "power_capped_samples": 2}
    amd = [typed({"telemetry": [{"amdsmi": {"gfx_clock_mhz": 2400, "max_gfx_clock_mhz": 2500}},
                                {"amdsmi": {"gfx_clock_mhz": 2300, "max_gfx_clock_mhz": 2500}}]})]
    assert clock_summary(amd)["median_mhz"] == 2350 and clock_summary(amd)["max_mhz"] == 2500
    assert clock_summary([typed({"telemetry": [{"host": {"cpu_percent": 1.0}}]}), typed({})]) is None

    # In the report's quality table: one column per group, "—" where nothing was sampled.
    from tests.bench.test_bounds import _record

    work = WorkCounts(sequences=2, seq_lens=(40, 30), padded_len=40, candidates=6)
    def full(r):  # the fields the summary reads beside the analysis record
        return r | {"tokens": {"useful": 70, "padded": 10, "repeated": 0}, "extra": {}}

    gpu = [typed(full(_record(work, {"forward": 5.0}, wall=6.0, iteration=i, device="NVIDIA H200"))
                 | {"telemetry": recs[i].telemetry}) for i in range(2)]
    cpu = [typed(full(_record(work, {"forward": 5.0}, wall=6.0, iteration=i, target="transformers"))) for i in range(2)]
    rows = summarize(gpu + cpu)
    assert rows[0]["gpu_clock"]["median_mhz"] == 1590 and rows[1]["gpu_clock"] is None
    from rich.console import Console

    console = Console(record=True, width=250)
    console.print(quality_table(rows))
    text = console.export_text()
    assert "1590 (1290) / 1980" in text and "GPU clock" in text
