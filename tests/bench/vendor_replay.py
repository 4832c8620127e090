"""Replays of the vendor telemetry libraries: `amdsmi` and `pynvml` modules whose functions answer
with the responses recorded in tests/bench/fixtures/ (amdsmi_rx7900xtx.json, nvml_h200.json; each
file says which documented functions, units and versions its responses follow).

A replay serves one machine: every device of the fixture, each replaying one scenario (a sequence
of samples); `advance()` moves every device to its next sample, so a test walks a call through its
samples exactly as the telemetry thread would see them. Only the functions the samplers call exist:
a sampler that calls anything else fails with AttributeError, which is the point.
"""

from __future__ import annotations

import json
import types
from enum import IntEnum
from pathlib import Path
from types import SimpleNamespace

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class _Replay(types.ModuleType):
    FIXTURE = ""

    def __init__(self, module: str, scenarios: list[str], data: dict | None = None):
        super().__init__(module)
        self.data = data if data is not None else fixture(self.FIXTURE)
        devices = self.data["devices"]
        if len(scenarios) != len(devices):
            raise ValueError(f"one scenario per device ({len(devices)}), got {scenarios}")
        self.samples = [self.data["scenarios"][s] for s in scenarios]
        self.step = 0
        self.calls: list[str] = []

    def advance(self, steps: int = 1) -> None:
        self.step = min(self.step + steps, min(len(s) for s in self.samples) - 1)

    def _now(self, device: int, key: str):
        self.calls.append(key)
        return self._answer(self.samples[device][self.step][key])

    def _static(self, device: int, key: str):
        self.calls.append(key)
        return self._answer(self.data["devices"][device][key])

    @staticmethod
    def _answer(value):
        """A recorded response; `{"raises": message}` stands for the library's exception."""
        if isinstance(value, dict) and "raises" in value:
            raise RuntimeError(value["raises"])
        return value


# -- amdsmi -----------------------------------------------------------------------------------------

class AmdHandle(SimpleNamespace):
    """amdsmi's processor handle (an opaque ctypes object in the real binding)."""


class AmdSmiReplay(_Replay):
    """The amdsmi functions the sampler calls, with the binding's signatures (amdsmi 7.0.2, ROCm 7.0.2;
    tests/bench/test_vendor_validity.py checks the names, the arities and the responses' keys
    against the installed binding's source)."""

    FIXTURE = "amdsmi_rx7900xtx.json"
    # the enums' members as the binding defines them (values do not matter, names do)
    AmdSmiClkType = IntEnum("AmdSmiClkType", "SYS GFX DF DCEF SOC MEM PCIE VCLK0 VCLK1 DCLK0 DCLK1")
    AmdSmiTemperatureType = IntEnum("AmdSmiTemperatureType", "EDGE HOTSPOT JUNCTION VRAM HBM_0 HBM_1 HBM_2 HBM_3 PLX")
    AmdSmiTemperatureMetric = IntEnum("AmdSmiTemperatureMetric", "CURRENT MAX MIN MAX_HYST MIN_HYST CRITICAL "
                                      "CRITICAL_HYST EMERGENCY EMERGENCY_HYST CRIT_MIN CRIT_MIN_HYST OFFSET LOWEST HIGHEST")

    def __init__(self, scenarios: list[str], data: dict | None = None):
        super().__init__("amdsmi", scenarios, data)
        self.handles = [AmdHandle(device=i) for i in range(len(self.samples))]

    def amdsmi_init(self, *flags):
        self.calls.append("amdsmi_init")

    def amdsmi_get_processor_handles(self):
        return list(self.handles)

    def amdsmi_get_lib_version(self):
        return self.data["amdsmi_get_lib_version"]

    def amdsmi_get_gpu_device_bdf(self, h):
        return self._static(h.device, "amdsmi_get_gpu_device_bdf")

    def amdsmi_get_gpu_device_uuid(self, h):
        return self._static(h.device, "amdsmi_get_gpu_device_uuid")

    def amdsmi_get_gpu_driver_info(self, h):
        return self._static(h.device, "amdsmi_get_gpu_driver_info")

    def amdsmi_get_gpu_asic_info(self, h):
        return self._static(h.device, "amdsmi_get_gpu_asic_info")

    def amdsmi_get_power_cap_info(self, h):  # the binding passes sensor 0 itself
        return self._static(h.device, "amdsmi_get_power_cap_info")

    def amdsmi_get_temp_metric(self, h, sensor, metric):
        return self._static(h.device, f"amdsmi_get_temp_metric {sensor.name} {metric.name}")

    def amdsmi_get_clock_info(self, h, kind):
        if kind.name == "GFX":
            return self._now(h.device, "amdsmi_get_clock_info GFX")
        return self._static(h.device, f"amdsmi_get_clock_info {kind.name}")

    def amdsmi_get_power_info(self, h):
        return self._now(h.device, "amdsmi_get_power_info")

    def amdsmi_get_gpu_metrics_info(self, h):
        return self._now(h.device, "amdsmi_get_gpu_metrics_info")

    def amdsmi_get_gpu_activity(self, h):
        return self._now(h.device, "amdsmi_get_gpu_activity")

    def amdsmi_get_energy_count(self, h):
        return self._now(h.device, "amdsmi_get_energy_count")

    def energy_j(self, device: int, step: int) -> float:
        """The counter of `device` at `step`, in joules (what the sampler should read)."""
        e = self.samples[device][step]["amdsmi_get_energy_count"]
        return e["energy_accumulator"] * e["counter_resolution"] / 1e6


# -- NVML -------------------------------------------------------------------------------------------

class NvmlReplay(_Replay):
    """The pynvml functions the sampler calls (nvidia-ml-py)."""

    FIXTURE = "nvml_h200.json"
    NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 2, 0
    _CLOCK = {1: "SM", 2: "MEM"}

    def __init__(self, scenarios: list[str], data: dict | None = None):
        super().__init__("pynvml", scenarios, data)

    def nvmlInit(self):
        self.calls.append("nvmlInit")

    def nvmlSystemGetDriverVersion(self):
        return self.data["nvmlSystemGetDriverVersion"]

    def nvmlSystemGetNVMLVersion(self):
        return self.data["nvmlSystemGetNVMLVersion"]

    def nvmlDeviceGetCount(self):
        return len(self.samples)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.samples):
            raise RuntimeError("NVMLError_InvalidArgument: Invalid Argument")
        return ("nvml-device", index)

    def nvmlDeviceGetName(self, h):
        return self._static(h[1], "nvmlDeviceGetName")

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(**self._static(h[1], "nvmlDeviceGetPciInfo"))

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._static(h[1], f"nvmlDeviceGetMaxClockInfo {self._CLOCK[clock]}")

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._static(h[1], "nvmlDeviceGetEnforcedPowerLimit")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return self._static(h[1], "nvmlDeviceGetPowerManagementDefaultLimit")

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._now(h[1], f"nvmlDeviceGetClockInfo {self._CLOCK[clock]}")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._now(h[1], "nvmlDeviceGetPowerUsage")

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._now(h[1], "nvmlDeviceGetTemperature GPU")

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(**self._now(h[1], "nvmlDeviceGetUtilizationRates"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._now(h[1], "nvmlDeviceGetCurrentClocksEventReasons")

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._now(h[1], "nvmlDeviceGetTotalEnergyConsumption")

    def energy_j(self, device: int, step: int) -> float:
        return self.samples[device][step]["nvmlDeviceGetTotalEnergyConsumption"] / 1e3
