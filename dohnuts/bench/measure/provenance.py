"""Where a number came from: code revision, package versions, machine and device.

The device, for both vendors: torch's view (name, memory, compute units, the CUDA capability or the
AMD GPU target, the CUDA or HIP version torch was built with, the ROCm release installed, the PCI
address), whether the fused kernels run on it (dohnuts.ops.kernel_status), and what the telemetry
samplers read of it (`gpu`: driver version, power limit, maximum clocks, the vendor library's
version, how the sampler matched this process's device).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch

from dohnuts.ops import kernel_status

# triton: PyPI's (CUDA, CPU); pytorch-triton-rocm: the Triton the ROCm wheel of torch ships.
# nvidia-ml-py and amdsmi: the telemetry libraries of the `nvidia` and `amd` extras.
PACKAGES = ("dohnuts", "torch", "triton", "pytorch-triton-rocm", "fla-core", "transformers", "pluggy", "numpy",
            "nvidia-ml-py", "amdsmi")


@functools.cache
def git_revision() -> str:
    root = Path(__file__).resolve().parents[3]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip()[:12] + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.cache
def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            mod = {"fla-core": "fla", "nvidia-ml-py": "pynvml", "pytorch-triton-rocm": None}.get(name, name)
            try:
                out[name] = getattr(__import__(mod), "__version__", "present") if mod else "absent"
            except Exception:  # amdsmi raises KeyError, not ImportError, without ROCm's library
                out[name] = "absent"
    return out


@functools.cache
def rocm_version() -> str | None:
    """The ROCm release installed (`$ROCM_PATH/.info/version`, default /opt/rocm), or None."""
    path = Path(os.environ.get("ROCM_PATH") or "/opt/rocm") / ".info" / "version"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def device_info(device: torch.device) -> dict:
    """torch's view of the device. `cuda` / `hip`: the CUDA or HIP version torch was built with
    (one of them is None); `arch`: the AMD GPU target (gfx1100) on ROCm, else None."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        out = {"type": "cuda", "name": props.name, "index": index,
               "memory_bytes": props.total_memory, "sms": props.multi_processor_count,
               "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
               "hip": torch.version.hip, "arch": getattr(props, "gcnArchName", None) or None}
        if torch.version.hip is not None:
            out["rocm"] = rocm_version()
        bus, dev = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
        if isinstance(bus, int) and isinstance(dev, int):
            out["pci_bus_id"] = f"{getattr(props, 'pci_domain_id', 0) or 0:04x}:{bus:02x}:{dev:02x}"
        return out
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}


def provenance(device: torch.device, telemetry=None) -> dict:
    """Everything a record says about where it came from. `telemetry`: the run's TelemetryThread,
    whose samplers describe the GPU (`gpu`: {sampler: facts}; empty on a CPU run)."""
    info = device_info(device)
    if device.type == "cuda":
        info["kernels"] = kernel_status(device)
    return {"git": git_revision(), "packages": package_versions(), "python": platform.python_version(),
            "host": socket.gethostname(), "platform": platform.platform(), "device": info,
            "gpu": telemetry.device_facts() if telemetry is not None else {}}
