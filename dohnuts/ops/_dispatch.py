"""How an op chooses its path: the device decides, there is no public switch.

CUDA tensors take the fused path (fla / Triton / SDPA-flash); everything else takes the
plain-torch reference path with the same signature. On a CUDA device without fla installed the
fused path fails loudly rather than falling back silently to a slow reference.
"""

from __future__ import annotations

import torch


def use_fused(x: torch.Tensor) -> bool:
    return x.is_cuda
