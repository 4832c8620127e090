"""Built-in telemetry samplers: psutil (always), NVML on NVIDIA, amdsmi on AMD.

A sampler whose library or device is missing records why in `unavailable`; the runner says so
once and leaves it out.
"""

from __future__ import annotations

import os
import threading

import psutil

from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.telemetry import Sampler


class PsutilSampler(Sampler):
    name = "host"

    def __init__(self):
        self.proc = psutil.Process(os.getpid())
        psutil.cpu_percent(None)  # prime: the first reading is meaningless

    def sample(self) -> dict:
        return {"cpu_percent": psutil.cpu_percent(None), "rss_bytes": self.proc.memory_info().rss}


# NVML clock-event ("throttle") reason bits: nvmlClocksEventReason* (= nvmlClocksThrottleReason*)
# in nvidia-ml-py / nvml.h. Decoded by name; only THROTTLING_BITS count against a call.
NVML_CLOCK_EVENT_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",  # also "user defined clocks"
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",  # nvmlClocksThrottleReasonBoardLimit (newer drivers)
    0x400: "reliability",  # nvmlClocksThrottleReasonReliability (newer drivers)
}
NVML_GPU_IDLE = 0x001
# The reasons that mean the clock was pulled below the device's sustained regime: hardware
# slowdown, thermal slowdown, the power brake. They invalidate a call.
NVML_THROTTLING_BITS = 0x008 | 0x020 | 0x040 | 0x080
# The software power cap is the regime dense work runs in on a datacentre GPU (the H200:
# docs/known-issues.md KI-15): the clock is set to stay within the power limit. A call under it is recorded and counted
# (`power_capped`), not excluded — excluding it would leave out every heavy call. Sync boost only
# aligns clocks across GPUs.
NVML_POWER_CAP_BITS = 0x004


def decode_nvml_reasons(mask: int) -> tuple[list[str], list[str]]:
    """(every active reason, the active reasons that count as throttling) of an NVML bitmask."""
    active, throttling = [], []
    for bit in range(64):
        b = 1 << bit
        if mask & b:
            name = NVML_CLOCK_EVENT_REASONS.get(b, f"bit_{b:#x}")
            active.append(name)
            if b & NVML_THROTTLING_BITS:
                throttling.append(name)
    return active, throttling


def nvml_power_capped(mask: int) -> list[str]:
    return [NVML_CLOCK_EVENT_REASONS[b] for b in (0x004,) if mask & b & NVML_POWER_CAP_BITS]


class NvmlSampler(Sampler):
    """SM/memory clocks (MHz) and the SM clock's maximum, power (W), temperature (°C),
    utilisation (%), and the clock-event (throttle) reasons: the raw bitmask, every active reason
    decoded (`clock_events`) and those that reduce the clock (`throttling`); `idle` when the GPU
    reports itself idle."""

    name = "nvml"

    def __init__(self, index: int = 0):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # library absent, driver absent, no NVIDIA device
            self.unavailable = f"NVML unavailable ({type(exc).__name__}: {exc})"
            return
        try:  # queried once: the device's maximum SM clock does not change during a run
            self.max_sm_clock_mhz = int(pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM))
        except Exception:
            self.max_sm_clock_mhz = None
        self._reasons = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))

    def sample(self) -> dict:
        nv, h = self.nv, self.handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        out = {
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "max_sm_clock_mhz": self.max_sm_clock_mhz,
            "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "gpu_util_percent": util.gpu,
            "mem_util_percent": util.memory,
        }
        if self._reasons is not None:
            try:
                mask = int(self._reasons(h))
            except Exception as exc:  # not supported on this device: the clock check still runs
                out["throttle_reasons"] = f"unavailable: {exc}"
            else:
                active, throttling = decode_nvml_reasons(mask)
                out.update(throttle_reasons=mask, clock_events=active, throttling=throttling,
                           power_capped=nvml_power_capped(mask), idle=bool(mask & NVML_GPU_IDLE))
        return out


def _amd_num(x) -> float | None:
    """An amdsmi reading as a number; None for "N/A", missing or non-numeric values."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


# gpu_metrics residency accumulators (MI300 and newer, gpu_metrics v1.6+): the counters
# amdsmi_get_violation_status() differences over 100 ms to report its active_* flags. The sampler
# differences them between its own consecutive samples instead (that call blocks 100 ms).
AMD_RESIDENCY = {"prochot_thrm": "prochot_residency_acc", "ppt_pwr": "ppt_residency_acc",
                 "socket_thrm": "socket_thm_residency_acc", "vr_thrm": "vr_thm_residency_acc",
                 "hbm_thrm": "hbm_thm_residency_acc"}


class AmdSmiSampler(Sampler):
    """GFX clock (MHz) and its maximum, activity (%), power (W), temperature (°C) and throttle
    status from AMD's amdsmi.

    Throttle status, as AMD documents it per generation: on MI300 and newer the violation
    residencies (PVIOL/TVIOL, PROCHOT, VR and HBM thermal) — a kind is active when its residency
    rose by at least 1 % of the accumulation counter since the previous sample, which is what
    `amdsmi_get_violation_status()` computes over a 100 ms wait; on Navi and MI100/MI200
    `throttle_status` / `indep_throttle_status` of `amdsmi_get_gpu_metrics_info()`.
    """

    name = "amdsmi"

    def __init__(self, index: int = 0):
        try:
            import amdsmi  # raises KeyError, not ImportError, when libamd_smi.so is missing

            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
            if not handles:
                raise RuntimeError("no AMD GPU")
            self.smi, self.handle = amdsmi, handles[index]
        except Exception as exc:
            self.unavailable = f"amdsmi unavailable ({type(exc).__name__}: {exc})"
            return
        self.max_gfx_clock_mhz = None
        try:  # queried once
            self.max_gfx_clock_mhz = _amd_num(amdsmi.amdsmi_get_clock_info(
                self.handle, amdsmi.AmdSmiClkType.GFX).get("max_clk"))
        except Exception:
            pass
        self._prev = None  # (accumulation_counter, {kind: residency}) of the previous sample
        self._prev_lock = threading.Lock()  # the telemetry thread and the runner both sample
        try:
            self._prev = self._residency(amdsmi.amdsmi_get_gpu_metrics_info(self.handle))
        except Exception:
            pass

    @staticmethod
    def _residency(metrics: dict):
        counter = _amd_num(metrics.get("accumulation_counter"))
        acc = {k: _amd_num(metrics.get(key)) for k, key in AMD_RESIDENCY.items()}
        acc = {k: v for k, v in acc.items() if v is not None}
        return (counter, acc) if counter is not None and acc else None

    def _throttle(self, metrics: dict) -> dict:
        now = self._residency(metrics)
        if now is not None:
            with self._prev_lock:
                prev, self._prev = self._prev, now
            if prev is None or now[0] <= prev[0]:
                return {"throttle_source": "violation_residency"}  # no interval yet: nothing to judge
            span = now[0] - prev[0]
            percent = {k: int((v - prev[1][k]) * 100 // span) for k, v in now[1].items()
                       if k in prev[1] and v >= prev[1][k]}
            return {"throttle_source": "violation_residency", "violation_percent": percent,
                    "throttling": [k for k, p in percent.items() if p > 0]}
        for key in ("indep_throttle_status", "throttle_status"):
            value = metrics.get(key)
            if isinstance(value, bool) or _amd_num(value) is not None:
                active = bool(value)
                reason = key if isinstance(value, bool) else f"{key}={int(value):#x}"
                return {"throttle_source": key, "throttling": [reason] if active else []}
        return {"throttle_source": None}

    def sample(self) -> dict:
        smi, h = self.smi, self.handle
        out: dict = {"max_gfx_clock_mhz": self.max_gfx_clock_mhz}
        missing = {}
        try:
            clock = smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)
            out["gfx_clock_mhz"] = _amd_num(clock.get("clk", clock.get("cur_clk")))
            if out["max_gfx_clock_mhz"] is None:
                out["max_gfx_clock_mhz"] = _amd_num(clock.get("max_clk"))
        except Exception as exc:
            missing["gfx_clock"] = str(exc)
        try:
            out.update(self._throttle(smi.amdsmi_get_gpu_metrics_info(h)))
        except Exception as exc:
            missing["throttle_status"] = str(exc)
        try:
            activity = smi.amdsmi_get_gpu_activity(h)
            out["gfx_activity_percent"] = _amd_num(activity.get("gfx_activity"))
            out["umc_activity_percent"] = _amd_num(activity.get("umc_activity"))
            if out["gfx_activity_percent"] == 0:
                out["idle"] = True  # nothing ran on GFX: its clock is parked, not throttled
        except Exception as exc:
            missing["activity"] = str(exc)
        try:
            power = smi.amdsmi_get_power_info(h)
            out["power_w"] = next((v for v in map(_amd_num, (power.get("current_socket_power"),
                                                             power.get("average_socket_power"))) if v), None)
        except Exception as exc:
            missing["power"] = str(exc)
        try:
            out["temperature_c"] = smi.amdsmi_get_temp_metric(h, smi.AmdSmiTemperatureType.EDGE,
                                                              smi.AmdSmiTemperatureMetric.CURRENT)
        except Exception as exc:
            missing["temperature_c"] = str(exc)
        if missing:
            out["unavailable"] = missing
        return out


@hookimpl
def dohnuts_bench_register_telemetry():
    import torch

    samplers = [PsutilSampler()]
    if torch.cuda.is_available() and torch.version.hip is None:
        samplers.append(NvmlSampler(torch.cuda.current_device()))  # a launched rank: its own GPU
    else:
        s = NvmlSampler.__new__(NvmlSampler)
        s.unavailable = "no NVIDIA GPU"
        samplers.append(s)
    if torch.cuda.is_available() and torch.version.hip is not None:
        samplers.append(AmdSmiSampler())
    else:
        s = AmdSmiSampler.__new__(AmdSmiSampler)
        s.unavailable = "no AMD GPU"
        samplers.append(s)
    return samplers
