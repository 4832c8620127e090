"""SwiGLU: silu(gate) * up, the MLP's activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import use_fused


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu_fused(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    from dohnuts.ops._fla import fla

    return fla().swiglu(gate, up)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return swiglu_fused(gate, up) if use_fused(gate) else swiglu_reference(gate, up)
