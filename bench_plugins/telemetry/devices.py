"""Which vendor device is this process's own: the one torch computes on, found by PCI address.

NVML and amdsmi number every GPU of the machine, whatever CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES
or ROCR_VISIBLE_DEVICES hide from torch, so torch's index can name another GPU in their lists. The
PCI address (domain, bus, device) names the same GPU everywhere: torch gives it for its device
(`pci_domain_id`, `pci_bus_id`, `pci_device_id` of the device properties), the vendor library for
each of its handles. Where torch gives none, the index is used, and the sampler says so.
"""

from __future__ import annotations

import re

_BDF = re.compile(r"^\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?\s*$")


def parse_pci(text) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address written `DDDD:BB:DD.F` (amdsmi), `DDDDDDDD:BB:DD.F`
    (NVML), `BB:DD.F` or `DDDD:BB:DD`; None for anything else (bytes are decoded first)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    if not isinstance(text, str):
        return None
    m = _BDF.match(text)
    if m is None:
        return None
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)


def torch_pci_address(index: int) -> str | None:
    """`DDDD:BB:DD` of torch's CUDA/HIP device `index`, or None when this torch does not say."""
    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    import torch

    props = torch.cuda.get_device_properties(index)
    bus, dev = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
    if not isinstance(bus, int) or not isinstance(dev, int):
        return None
    domain = getattr(props, "pci_domain_id", 0)
    return f"{domain if isinstance(domain, int) else 0:04x}:{bus:02x}:{dev:02x}"


def pick_device(candidates: list[tuple[object, str | None]], index: int, pci: str | None) -> tuple[object, str]:
    """The handle of this process's device among the vendor's (handle, PCI address) pairs, and how
    it was matched (`PCI 0000:03:00`, or `index 1 (...)` with the reason the address did not
    decide). RuntimeError when neither the address nor the index names a device."""
    want = parse_pci(pci)
    if want is not None:
        for handle, bdf in candidates:
            if parse_pci(bdf) == want:
                return handle, f"PCI {pci}"
        why = f"no device at PCI {pci} in the vendor's list"
    else:
        why = "torch gave no PCI address; under *_VISIBLE_DEVICES the index may name another GPU"
    if 0 <= index < len(candidates):
        return candidates[index][0], f"index {index} ({why})"
    raise RuntimeError(f"no device at index {index} ({len(candidates)} listed; {why})")
