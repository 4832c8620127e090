"""AMD GPU telemetry from amdsmi (the `amd` extra, or the copy ROCm ships).

Readings: GFX clock (MHz) and its maximum, activity (%), power (W), temperatures (°C) and the
throttle state, classified by the rule NVML's readings follow (dohnuts.bench.measure.telemetry): what holds
the power or current limit — the sustained regime of dense work — goes to `power_capped` (kept,
counted); thermal limits, hot voltage regulators, PROCHOT and fast current protection go to
`throttling` (the call is excluded). The energy counter (`amdsmi_get_energy_count`) gives each call
its energy; `device_facts` the driver, the library, the power cap and the maximum clocks.

Where the throttle state comes from, as AMD documents it per generation:

- MI300 and newer (gpu_metrics 1.6+): the violation residencies. A kind is active when its
  residency rose by at least 1 % of the accumulation counter since the previous sample (what
  `amdsmi_get_violation_status()` computes over a 100 ms wait, which the sampler cannot afford).
  `ppt_pwr` (PVIOL) is the power cap; the thermal kinds (TVIOL, PROCHOT, VR, HBM) are throttling.
- Navi and MI100/MI200: `indep_throttle_status` of `amdsmi_get_gpu_metrics_info()`, the
  ASIC-independent throttler bits of the Linux driver (amdgpu_smu.h, `SMU_THROTTLER_*_BIT`,
  below). The Python binding of ROCm 6.3 and later returns it — and `throttle_status` — as a bool
  (`_validate_if_max_uint(..., isBool=True)`): then the cause is inferred from the readings of
  the same sample. Power at its limit (≥ 95 % of the power cap) is the power cap; a temperature
  at its critical limit is thermal throttling; throttling that neither explains is excluded as
  `indep_throttle_status` (cause not reported).
"""

from __future__ import annotations

import threading

from dohnuts.bench.measure.telemetry import Sampler
from dohnuts_bench_plugins.telemetry.devices import pick_device

# indep_throttle_status: the Linux driver's ASIC-independent throttler bits (amdgpu_smu.h).
AMD_THROTTLERS = {
    0: "ppt0", 1: "ppt1", 2: "ppt2", 3: "ppt3", 4: "spl", 5: "fppt", 6: "sppt", 7: "sppt_apu",
    16: "tdc_gfx", 17: "tdc_soc", 18: "tdc_mem", 19: "tdc_vdd", 20: "tdc_cvip", 21: "edc_cpu", 22: "edc_gfx",
    23: "apcc",
    32: "temp_gpu", 33: "temp_core", 34: "temp_mem", 35: "temp_edge", 36: "temp_hotspot", 37: "temp_soc",
    38: "temp_vr_gfx", 39: "temp_vr_soc", 40: "temp_vr_mem0", 41: "temp_vr_mem1", 42: "temp_liquid0",
    43: "temp_liquid1", 44: "vrhot0", 45: "vrhot1", 46: "prochot_cpu", 47: "prochot_gfx",
    56: "ppm", 57: "fit",
}
# The sustained power and current limits (package power tracking, TDC): the regime a consumer card
# such as the 355 W RX 7900 XTX runs dense work in — kept and counted, like NVML's power cap.
AMD_POWER_CAP_BITS = frozenset(range(0, 8)) | frozenset(range(16, 21))
# Thermal limits, hot voltage regulators, PROCHOT, and the fast (peak) current protection EDC —
# NVML's thermal and hardware slowdowns: the call is excluded. APCC, PPM and FIT are neither: the
# clock check alone judges a call they slow.
AMD_THROTTLING_BITS = frozenset({21, 22}) | frozenset(range(32, 48))
POWER_AT_LIMIT = 0.95  # power at ≥ 95 % of the cap: the cap explains a (bool) throttle status

# gpu_metrics residency accumulators (MI300 and newer, gpu_metrics v1.6+).
AMD_RESIDENCY = {"prochot_thrm": "prochot_residency_acc", "ppt_pwr": "ppt_residency_acc",
                 "socket_thrm": "socket_thm_residency_acc", "vr_thrm": "vr_thm_residency_acc",
                 "hbm_thrm": "hbm_thm_residency_acc"}
AMD_RESIDENCY_POWER = frozenset({"ppt_pwr"})
# gpu_metrics temperature → the amdsmi sensor whose CRITICAL metric is its limit
AMD_TEMPERATURES = {"temperature_edge": "EDGE", "temperature_hotspot": "HOTSPOT", "temperature_mem": "VRAM"}


def amd_num(x) -> float | None:
    """An amdsmi reading as a number; None for "N/A", missing or non-numeric values."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def decode_amd_throttlers(mask: int) -> tuple[list[str], list[str], list[str]]:
    """(every active throttler, those that count as throttling, those that are the power cap) of
    an indep_throttle_status bitmask."""
    active, throttling, capped = [], [], []
    for bit in range(64):
        if mask >> bit & 1:
            name = AMD_THROTTLERS.get(bit, f"bit_{bit}")
            active.append(name)
            if bit in AMD_THROTTLING_BITS:
                throttling.append(name)
            elif bit in AMD_POWER_CAP_BITS:
                capped.append(name)
    return active, throttling, capped


def _celsius(x) -> float | None:
    """A temperature limit from amdsmi_get_temp_metric: °C (what the library returns), or
    millidegrees (what its header documents; no GPU limit reaches 1000 °C)."""
    v = amd_num(x)
    if v is None or v <= 0:
        return None
    return v / 1000.0 if v >= 1000 else v


class AmdSmiSampler(Sampler):
    """The amdsmi readings of this process's GPU: torch's device `index`, found by its PCI address
    `pci` (`DDDD:BB:DD`) among amdsmi's handles when given (dohnuts_bench_plugins.telemetry.devices)."""

    name = "amdsmi"

    def __init__(self, index: int = 0, pci: str | None = None):
        try:
            # an optional dependency (the `amd` extra), found or not where the sampler starts; it
            # raises KeyError, not ImportError, when libamd_smi.so is missing
            import amdsmi

            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
            if not handles:
                raise RuntimeError("no AMD GPU")
            self.smi = amdsmi
            self.handle, self.device_match = pick_device([(h, self._bdf(h)) for h in handles], index, pci)
        except Exception as exc:
            self.unavailable = f"amdsmi unavailable ({type(exc).__name__}: {exc})"
            return
        # Queried once: the maximum clock, the power cap and the temperature limits of a run.
        self.max_gfx_clock_mhz = self._clock_max("GFX")
        self.power_limit_w = self._power_limit_w()
        self.temperature_limits_c = self._temperature_limits()
        self._energy_error = None
        try:
            self._energy_j()
        except Exception as exc:  # e.g. a virtual machine guest: not supported
            self._energy_error = f"{type(exc).__name__}: {exc}"
        self._prev = None  # (accumulation_counter, {kind: residency}) of the previous sample
        self._prev_lock = threading.Lock()  # the telemetry thread and the runner both sample
        try:
            self._prev = self._residency(amdsmi.amdsmi_get_gpu_metrics_info(self.handle))
        except Exception:
            pass

    # -- queried once ----------------------------------------------------------------------------

    def _bdf(self, handle) -> str | None:
        try:
            return self.smi.amdsmi_get_gpu_device_bdf(handle)
        except Exception:
            return None

    def _clock_max(self, kind: str) -> float | None:
        try:
            return amd_num(self.smi.amdsmi_get_clock_info(self.handle, getattr(self.smi.AmdSmiClkType, kind))
                           .get("max_clk"))
        except Exception:
            return None

    def _power_limit_w(self) -> float | None:
        """The power cap in W: amdsmi_get_power_cap_info (µW; a PPT sensor index in newer
        bindings), else amdsmi_get_power_info's power_limit (W)."""
        smi, h = self.smi, self.handle
        try:
            try:
                cap = smi.amdsmi_get_power_cap_info(h)
            except TypeError:  # newer bindings: (handle, sensor_ind)
                cap = smi.amdsmi_get_power_cap_info(h, 0)
            value = amd_num(cap.get("power_cap"))
            if value:
                return value / 1e6
        except Exception:
            pass
        try:
            value = amd_num(smi.amdsmi_get_power_info(h).get("power_limit"))
            return value if value and value < 1e5 else (value / 1e6 if value else None)  # W, or µW in newer builds
        except Exception:
            return None

    def _temperature_limits(self) -> dict[str, float]:
        smi, out = self.smi, {}
        for key, sensor in AMD_TEMPERATURES.items():
            kind = getattr(smi.AmdSmiTemperatureType, sensor, None)
            if kind is None and sensor == "HOTSPOT":  # older bindings call it JUNCTION
                kind = getattr(smi.AmdSmiTemperatureType, "JUNCTION", None)
            if kind is None:
                continue
            try:
                limit = _celsius(smi.amdsmi_get_temp_metric(self.handle, kind, smi.AmdSmiTemperatureMetric.CRITICAL))
            except Exception:
                continue
            if limit:
                out[key] = limit
        return out

    def _energy_j(self) -> float:
        e = self.smi.amdsmi_get_energy_count(self.handle)
        acc = amd_num(e.get("energy_accumulator", e.get("power")))  # "power": the name before ROCm 6.4
        resolution = amd_num(e.get("counter_resolution"))
        if acc is None or not resolution:
            raise RuntimeError(f"no energy counter in {sorted(e)}")
        return acc * resolution / 1e6  # accumulator × resolution = µJ

    # -- the telemetry contract --------------------------------------------------------------------

    def energy_counter(self) -> float:
        """Joules the GPU has used since the counter started."""
        if self._energy_error is not None:
            raise RuntimeError(self._energy_error)
        return self._energy_j()

    def device_facts(self) -> dict:
        """Driver and amdsmi versions, the power cap and its default (W), the maximum GFX and memory
        clocks (MHz), the ASIC, and how the device was matched; a fact that cannot be read is left
        out."""
        smi, h = self.smi, self.handle
        facts: dict = {"vendor": "amd", "device_match": self.device_match}

        def cap_info():
            try:
                return smi.amdsmi_get_power_cap_info(h)
            except TypeError:
                return smi.amdsmi_get_power_cap_info(h, 0)

        def lib_version():
            v = smi.amdsmi_get_lib_version()
            if isinstance(v, dict):
                return ".".join(str(v[k]) for k in ("major", "minor", "release") if k in v)
            return str(v)

        queries = {
            "name": lambda: smi.amdsmi_get_gpu_asic_info(h).get("market_name"),
            "gfx_target": lambda: smi.amdsmi_get_gpu_asic_info(h).get("target_graphics_version"),
            "compute_units": lambda: (lambda a: a.get("num_compute_units", a.get("num_of_compute_units")))(
                smi.amdsmi_get_gpu_asic_info(h)),
            "driver_version": lambda: smi.amdsmi_get_gpu_driver_info(h).get("driver_version"),
            "amdsmi_version": lib_version,
            "pci_bus_id": lambda: smi.amdsmi_get_gpu_device_bdf(h),
            "uuid": lambda: smi.amdsmi_get_gpu_device_uuid(h),
            "power_limit_w": lambda: self.power_limit_w,
            "default_power_limit_w": lambda: (amd_num(cap_info().get("default_power_cap")) or 0) / 1e6 or None,
            "max_gfx_clock_mhz": lambda: self.max_gfx_clock_mhz,
            "max_mem_clock_mhz": lambda: self._clock_max("MEM"),
            "temperature_limits_c": lambda: self.temperature_limits_c or None,
        }
        for key, query in queries.items():
            try:
                value = query()
            except Exception:
                continue
            if value is not None and value != "N/A":
                facts[key] = value
        facts["energy_counter"] = "available" if self._energy_error is None else f"unavailable ({self._energy_error})"
        return facts

    # -- one sample --------------------------------------------------------------------------------

    @staticmethod
    def _residency(metrics: dict):
        counter = amd_num(metrics.get("accumulation_counter"))
        acc = {k: amd_num(metrics.get(key)) for k, key in AMD_RESIDENCY.items()}
        acc = {k: v for k, v in acc.items() if v is not None}
        return (counter, acc) if counter is not None and acc else None

    def _throttle(self, metrics: dict, power_w: float | None, temperatures: dict) -> dict:
        now = self._residency(metrics)
        if now is not None:
            with self._prev_lock:
                prev, self._prev = self._prev, now
            if prev is None or now[0] <= prev[0]:
                return {"throttle_source": "violation_residency"}  # no interval yet: nothing to judge
            span = now[0] - prev[0]
            percent = {k: int((v - prev[1][k]) * 100 // span) for k, v in now[1].items()
                       if k in prev[1] and v >= prev[1][k]}
            active = [k for k, p in percent.items() if p > 0]
            return {"throttle_source": "violation_residency", "violation_percent": percent,
                    "throttling": [k for k in active if k not in AMD_RESIDENCY_POWER],
                    "power_capped": [k for k in active if k in AMD_RESIDENCY_POWER]}
        for key in ("indep_throttle_status", "throttle_status"):
            value = metrics.get(key)
            if not isinstance(value, bool) and amd_num(value) is None:
                continue  # "N/A": not reported by this ASIC
            if key == "indep_throttle_status" and not isinstance(value, bool):
                active, throttling, capped = decode_amd_throttlers(int(value))
                return {"throttle_source": key, "throttle_status": int(value), "throttlers": active,
                        "throttling": throttling, "power_capped": capped}
            # A bool (the binding of ROCm 6.3 and later) or the ASIC-specific throttle_status: the cause
            # is inferred.
            return {"throttle_source": key, "throttle_status": bool(value),
                    **self._inferred(bool(value), key, power_w, temperatures)}
        return {"throttle_source": None}

    def _inferred(self, active: bool, key: str, power_w: float | None, temperatures: dict) -> dict:
        """Why a throttle status without bits is active, from the same sample's power and
        temperatures (module docstring)."""
        if not active:
            return {"throttling": [], "power_capped": []}
        hot = [f"{name.removeprefix('temperature_')}_at_limit" for name, t in temperatures.items()
               if t is not None and name in self.temperature_limits_c and t >= self.temperature_limits_c[name]]
        at_cap = bool(power_w and self.power_limit_w and power_w >= POWER_AT_LIMIT * self.power_limit_w)
        return {"throttling": hot or ([] if at_cap else [key]), "power_capped": ["power_at_limit"] if at_cap else []}

    def sample(self) -> dict:
        smi, h = self.smi, self.handle
        out: dict = {"max_gfx_clock_mhz": self.max_gfx_clock_mhz}
        missing = {}
        try:
            clock = smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)
            out["gfx_clock_mhz"] = amd_num(clock.get("clk", clock.get("cur_clk")))
            if out["max_gfx_clock_mhz"] is None:
                out["max_gfx_clock_mhz"] = amd_num(clock.get("max_clk"))
        except Exception as exc:
            missing["gfx_clock"] = str(exc)
        power_w = None
        try:
            power = smi.amdsmi_get_power_info(h)
            # socket_power (ROCm 6.4+), current (MI300), average (Navi, MI200 and earlier): the first given
            power_w = next((v for v in map(amd_num, (power.get("socket_power"), power.get("current_socket_power"),
                                                     power.get("average_socket_power"))) if v), None)
            out["power_w"] = power_w
        except Exception as exc:
            missing["power"] = str(exc)
        try:
            metrics = smi.amdsmi_get_gpu_metrics_info(h)
            temperatures = {k: amd_num(metrics.get(k)) for k in AMD_TEMPERATURES}
            out["temperature_c"] = temperatures["temperature_edge"]
            out["hotspot_c"] = temperatures["temperature_hotspot"]
            out.update(self._throttle(metrics, power_w, temperatures))
        except Exception as exc:
            missing["throttle_status"] = str(exc)
        try:
            activity = smi.amdsmi_get_gpu_activity(h)
            out["gfx_activity_percent"] = amd_num(activity.get("gfx_activity"))
            out["umc_activity_percent"] = amd_num(activity.get("umc_activity"))
            if out["gfx_activity_percent"] == 0:
                out["idle"] = True  # nothing ran on GFX: its clock is parked, not throttled
        except Exception as exc:
            missing["activity"] = str(exc)
        if missing:
            out["unavailable"] = missing
        return out
