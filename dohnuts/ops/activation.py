"""SwiGLU: silu(gate) * up, the MLP's activation — on two tensors, or on one packed (..., 2I)
gate/up GEMM output (dohnuts.model.packing). And the vision tower's first MLP layer with its
tanh-approximated GELU, `linear_gelu_tanh`."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import recording, use_fused
from dohnuts.ops._fla import fla
from dohnuts.ops.spare import widen


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


def swiglu_packed_fused(gu: torch.Tensor, spare: int = 0) -> torch.Tensor:
    _halves(gu)  # the shape check
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._swiglu_kernel import swiglu_packed_fn

    return swiglu_packed_fn(gu, spare)


def swiglu_packed(gu: torch.Tensor, spare: int = 0) -> torch.Tensor:
    """silu(gu[..., :I]) * gu[..., I:] for gu (..., 2I) → (..., I): one kernel, no split copies.
    `spare`: the output is written with that many spare columns for the LoRA group reading it
    (dohnuts.ops.spare; the values and shape are the same)."""
    if use_fused(gu):
        return swiglu_packed_fused(gu, spare)
    return widen(swiglu_packed_reference(gu), spare)


def linear_gelu_tanh_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def linear_gelu_tanh_fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    # torch's addmm with cuBLASLt's bias + GELU (tanh) epilogue: the GEMM writes the activation, so
    # the separate elementwise kernel and its read and write of the (rows, out) product are gone.
    # Where cuBLASLt cannot take it, torch runs the addmm and its own tanh GELU (the same result).
    y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
    return y.view(*x.shape[:-1], weight.shape[0])


def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x @ weight.T + bias): x (..., K), weight (N, K), bias (N,) → (..., N). The fused
    path (the activation in the GEMM's epilogue) is inference-only (the vision tower is frozen);
    under autograd the reference runs."""
    if use_fused(x) and not recording(x, weight, bias):
        return linear_gelu_tanh_fused(x, weight, bias)
    return linear_gelu_tanh_reference(x, weight, bias)
