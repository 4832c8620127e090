"""SwiGLU: silu(gate) * up, the MLP's activation — on two tensors, or on one packed (..., 2I)
gate/up GEMM output (dohnuts.model.packing)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import use_fused
from dohnuts.ops._fla import fla


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@functools.cache
def _fla_swiglu():
    """fla's SwiGLU, imported at the first unpacked call: its module's torch.compile'd helpers are
    imports no other path needs (docs/history/evolution.md M44)."""
    fla()  # fla's package inits deferred before any of its modules is imported (dohnuts.ops._fla)
    # Triton and fla: on a GPU only, and this module only where unpacked projections need it
    from fla.modules.activations import swiglu

    return swiglu


def swiglu_fused(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _fla_swiglu()(gate, up)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return swiglu_fused(gate, up) if use_fused(gate) else swiglu_reference(gate, up)


def _halves(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if gu.shape[-1] % 2:
        raise ValueError(f"a packed gate/up tensor needs an even last dim, got {tuple(gu.shape)}")
    return gu.chunk(2, dim=-1)


def swiglu_packed_reference(gu: torch.Tensor) -> torch.Tensor:
    return swiglu_reference(*_halves(gu))


def swiglu_packed_fused(gu: torch.Tensor) -> torch.Tensor:
    _halves(gu)  # the shape check
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._swiglu_kernel import swiglu_packed_fn

    return swiglu_packed_fn(gu)


def swiglu_packed(gu: torch.Tensor) -> torch.Tensor:
    """silu(gu[..., :I]) * gu[..., I:] for gu (..., 2I) → (..., I): one kernel, no split copies."""
    return swiglu_packed_fused(gu) if use_fused(gu) else swiglu_packed_reference(gu)
