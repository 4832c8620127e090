"""Where a number came from: code revision, package versions, machine and device."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import socket
import subprocess
from pathlib import Path

import torch

PACKAGES = ("dohnuts", "torch", "triton", "fla-core", "transformers", "pluggy", "numpy")


@functools.cache
def git_revision() -> str:
    root = Path(__file__).resolve().parents[2]
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
            mod = {"fla-core": "fla"}.get(name, name)
            try:
                out[name] = getattr(__import__(mod), "__version__", "present")
            except Exception:
                out[name] = "absent"
    return out


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "index": device.index or 0,
                "memory_bytes": props.total_memory, "sms": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}


def provenance(device: torch.device) -> dict:
    return {"git": git_revision(), "packages": package_versions(), "python": platform.python_version(),
            "host": socket.gethostname(), "platform": platform.platform(), "device": device_info(device)}
