"""Which machine a run measured on, as one path-safe name: what a gate baseline is kept per.

    cpu-amd-epyc-2cores-1thread      a CPU run: the CPU model, its cores, the run's torch threads
    nvidia-h200                      a GPU run: the device's name

Timings are comparable only between runs of one machine class measured the same way, so a
baseline lives in `results/baselines/<machine id>/` (dohnuts.bench.commands.baseline) and `dohnuts-bench
gate` refuses a baseline of another machine. Every run writes its id into run.json
(`measured.machine.id`).
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import psutil


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "unknown"


def machine_id(device_type: str, *, gpu_name: str | None = None, cores: int | None = None,
               threads: int | None = None) -> str:
    """The id of a CPU run (`cpu-<model>-<cores>cores-<threads>thread(s)`) or a GPU run (`<gpu name>`)."""
    if device_type != "cpu":
        return slug(gpu_name or device_type)
    model = slug(cpu_model()).removeprefix("cpu-")
    parts = ["cpu", model]
    if cores:
        parts.append(f"{cores}cores")
    if threads:
        parts.append(f"{threads}thread" + ("s" if threads > 1 else ""))
    return "-".join(parts)


def this_machine(device) -> str:
    """The id of a run on `device` (a torch.device) with torch's current threads."""
    # torch: the store's commands read machine ids without it
    import torch

    if device.type == "cuda":
        return machine_id("cuda", gpu_name=torch.cuda.get_device_name(device))
    return machine_id("cpu", cores=psutil.cpu_count(), threads=torch.get_num_threads())


def recorded_machine(meta: dict) -> str:
    """The machine a run measured on, from its run.json: the id it recorded (`measured.machine.id`),
    or — for runs made before run.json recorded one — the id of what it does record: a GPU's name
    (the same id a run records now), a CPU's cores and threads under the model `unrecorded` (the
    CPU's model was not kept), `unknown` when it names no device."""
    measured = meta.get("measured") if isinstance(meta.get("measured"), dict) else {}
    machine = measured.get("machine") if isinstance(measured.get("machine"), dict) else {}
    if isinstance(machine.get("id"), str) and machine["id"]:
        return slug(machine["id"])
    provenance = meta.get("provenance") if isinstance(meta.get("provenance"), dict) else {}
    device = provenance.get("device") if isinstance(provenance.get("device"), dict) else {}
    kind, name = device.get("type"), device.get("name")
    if kind not in ("cpu", None) and isinstance(name, str):
        return machine_id(str(kind), gpu_name=name)
    if kind != "cpu":
        return "unknown"

    def count(x) -> int | None:
        return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None

    parts = ["cpu", "unrecorded"]
    if cores := count(machine.get("cpus")):
        parts.append(f"{cores}cores")
    if threads := count(machine.get("threads")) or count(device.get("threads")):
        parts.append(f"{threads}thread" + ("s" if threads > 1 else ""))
    return "-".join(parts)
