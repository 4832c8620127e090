"""NVIDIA GPU telemetry from NVML (nvidia-ml-py, the `nvidia` extra).

Readings: SM and memory clocks (MHz) and the SM clock's maximum, power (W), temperature (°C),
utilisation (%), and the clock-event ("throttle") reasons — the raw bitmask, every active reason
decoded (`clock_events`), those that pull the clock down (`throttling`: thermal, hardware slowdown,
the power brake) and the software power cap (`power_capped`), the regime dense work runs in. The
energy counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ, Volta and later) gives each call its
energy; `device_facts` the driver, the power limit and the maximum clocks for provenance.
"""

from __future__ import annotations

from dohnuts.bench.measure.telemetry import Sampler
from dohnuts_bench_plugins.telemetry.devices import pick_device

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
# The software power cap is the regime dense work runs in (the H200: docs/known-issues.md KI-15):
# the clock is set to stay within the power limit. A call under it is recorded and counted
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


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class NvmlSampler(Sampler):
    """The NVML readings of this process's GPU: torch's device `index`, found by its PCI address
    `pci` (`DDDD:BB:DD`) when given (dohnuts_bench_plugins.telemetry.devices)."""

    name = "nvml"

    def __init__(self, index: int = 0, pci: str | None = None):
        try:
            # an optional dependency (the `nvidia` / `amd` extra): imported where the sampler starts
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle, self.device_match = pick_device(self._candidates(pynvml, index, pci), index, pci)
        except Exception as exc:  # library absent, driver absent, no NVIDIA device
            self.unavailable = f"NVML unavailable ({type(exc).__name__}: {exc})"
            return
        try:  # queried once: the device's maximum SM clock does not change during a run
            self.max_sm_clock_mhz = int(pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM))
        except Exception:
            self.max_sm_clock_mhz = None
        self._reasons = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        self._energy_error = None
        try:  # Volta and later; NotSupported before
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception as exc:
            self._energy_error = f"{type(exc).__name__}: {exc}"

    @staticmethod
    def _candidates(nv, index: int, pci: str | None) -> list:
        """(handle, PCI bus id) of every NVML device; without `pci`, only up to `index` is needed."""
        if pci is None:
            return [(nv.nvmlDeviceGetHandleByIndex(i), None) for i in range(index + 1)]
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        return [(h, _text(nv.nvmlDeviceGetPciInfo(h).busId)) for h in handles]

    def energy_counter(self) -> float:
        """Joules the GPU has used since the driver loaded (NVML counts mJ)."""
        if self._energy_error is not None:
            raise RuntimeError(self._energy_error)
        return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3

    def device_facts(self) -> dict:
        """Driver and NVML versions, the power limit enforced and its default (W), the maximum SM
        and memory clocks (MHz), and how the device was matched; a fact that cannot be read is left
        out."""
        nv, h = self.nv, self.handle
        facts: dict = {"vendor": "nvidia", "device_match": self.device_match}
        queries = {
            "name": lambda: _text(nv.nvmlDeviceGetName(h)),
            "driver_version": lambda: _text(nv.nvmlSystemGetDriverVersion()),
            "nvml_version": lambda: _text(nv.nvmlSystemGetNVMLVersion()),
            "pci_bus_id": lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId),
            "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            "default_power_limit_w": lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1e3,
            "max_sm_clock_mhz": lambda: self.max_sm_clock_mhz,
            "max_mem_clock_mhz": lambda: int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
        }
        for key, query in queries.items():
            try:
                value = query()
            except Exception:
                continue
            if value is not None:
                facts[key] = value
        facts["energy_counter"] = "available" if self._energy_error is None else f"unavailable ({self._energy_error})"
        return facts

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
