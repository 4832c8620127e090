"""Built-in telemetry samplers: psutil (always), NVML on NVIDIA, amdsmi on AMD.

A sampler whose library or device is missing records why in `unavailable`; the runner says so
once and leaves it out.
"""

from __future__ import annotations

import os

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


class NvmlSampler(Sampler):
    """SM/memory clocks (MHz), power (W), temperature (°C), utilisation (%), throttle reasons."""

    name = "nvml"

    def __init__(self, index: int = 0):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # library absent, driver absent, no NVIDIA device
            self.unavailable = f"NVML unavailable ({type(exc).__name__}: {exc})"

    def sample(self) -> dict:
        nv, h = self.nv, self.handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        get_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = get_reasons(h)
        return {
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "gpu_util_percent": util.gpu,
            "mem_util_percent": util.memory,
            "throttle_reasons": int(reasons),
        }


class AmdSmiSampler(Sampler):
    """Clocks, power, temperature and activity from AMD's amdsmi."""

    name = "amdsmi"

    def __init__(self):
        try:
            import amdsmi

            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
            if not handles:
                raise RuntimeError("no AMD GPU")
            self.smi, self.handle = amdsmi, handles[0]
        except Exception as exc:
            self.unavailable = f"amdsmi unavailable ({type(exc).__name__}: {exc})"

    def sample(self) -> dict:
        smi, h = self.smi, self.handle
        out = {}
        for key, fn in (("activity", smi.amdsmi_get_gpu_activity), ("power", smi.amdsmi_get_power_info),
                        ("clock", lambda x: smi.amdsmi_get_clock_info(x, smi.AmdSmiClkType.GFX)),
                        ("temperature_c", lambda x: smi.amdsmi_get_temp_metric(
                            x, smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureMetric.CURRENT))):
            try:
                out[key] = fn(h)
            except Exception as exc:
                out[key] = f"unavailable: {exc}"
        return out


@hookimpl
def dohnuts_bench_register_telemetry():
    import torch

    samplers = [PsutilSampler()]
    if torch.cuda.is_available() and torch.version.hip is None:
        samplers.append(NvmlSampler())
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
