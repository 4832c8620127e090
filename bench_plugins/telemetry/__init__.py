"""Built-in telemetry samplers: psutil (always), NVML on NVIDIA (`nvml.py`), amdsmi on AMD
(`amd.py`), each on this process's own GPU (`devices.py`).

A sampler whose library or device is missing records why in `unavailable`; the runner says so
once and leaves it out. Both GPU samplers report the keys the one validity rule reads
(dohnuts.bench.measure.telemetry: `throttling`, `power_capped`, the clock and its maximum, `idle`), read
the device's cumulative energy counter (`energy_counter`) and describe the device for provenance
(`device_facts`).
"""

from __future__ import annotations

import os

import psutil

from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.measure.telemetry import Sampler
from dohnuts_bench_plugins.telemetry.amd import AMD_THROTTLERS, AmdSmiSampler, decode_amd_throttlers  # noqa: F401
from dohnuts_bench_plugins.telemetry.devices import parse_pci, pick_device, torch_pci_address  # noqa: F401
from dohnuts_bench_plugins.telemetry.nvml import (  # noqa: F401
    NVML_CLOCK_EVENT_REASONS, NVML_GPU_IDLE, NVML_POWER_CAP_BITS, NVML_THROTTLING_BITS, NvmlSampler,
    decode_nvml_reasons, nvml_power_capped,
)


class PsutilSampler(Sampler):
    name = "host"

    def __init__(self):
        self.proc = psutil.Process(os.getpid())
        psutil.cpu_percent(None)  # prime: the first reading is meaningless

    def sample(self) -> dict:
        return {"cpu_percent": psutil.cpu_percent(None), "rss_bytes": self.proc.memory_info().rss}


def _absent(cls, reason: str):
    s = cls.__new__(cls)
    s.unavailable = reason
    return s


def own_gpu_sampler():
    """The GPU sampler of this process's device (torch's current device: NVML on NVIDIA, amdsmi on
    AMD), for tools beside the harness (benchmarks/); `unavailable` says why when it cannot read."""
    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    import torch

    if not torch.cuda.is_available():
        return _absent(NvmlSampler, "no GPU")
    index = torch.cuda.current_device()
    cls = AmdSmiSampler if torch.version.hip is not None else NvmlSampler
    return cls(index, torch_pci_address(index))


def clock_mhz(reading: dict) -> float | None:
    """The GPU clock of a GPU sampler's reading: NVML's SM clock or amdsmi's GFX clock."""
    return reading.get("sm_clock_mhz", reading.get("gfx_clock_mhz"))


@hookimpl
def dohnuts_bench_register_telemetry():
    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    import torch

    samplers = [PsutilSampler()]
    gpu = torch.cuda.is_available()
    hip = gpu and torch.version.hip is not None
    if gpu:  # a launched rank samples its own GPU: torch's current device, found by PCI address
        index = torch.cuda.current_device()
        pci = torch_pci_address(index)
    samplers.append(NvmlSampler(index, pci) if gpu and not hip else _absent(NvmlSampler, "no NVIDIA GPU"))
    samplers.append(AmdSmiSampler(index, pci) if hip else _absent(AmdSmiSampler, "no AMD GPU"))
    return samplers
