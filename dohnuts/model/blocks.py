"""The token-parallel building blocks of the text backbone: its norms, the SwiGLU MLP, the
embedding (also the vision tower's), and the helpers every layer shares (`take_rows`, the
`ALL_ROWS` default, activation checkpointing).

Parameter names equal transformers' Qwen3.5 (dohnuts.model.text)."""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

from dohnuts import ops
from dohnuts.model.lora import input_spare, linear_group
from dohnuts.model.packing import packed_weight


class _AllRows:
    """The default `rows` of a layer: every position (an explicit None means none: state only)."""

    def __repr__(self) -> str:
        return "ALL_ROWS"


ALL_ROWS = _AllRows()


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x (B, T, ...) at the positions rows (B, Q) of each batch row → (B, Q, ...)."""
    index = rows.view(*rows.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index)


def recomputed(fn, *args):
    """fn(*args) under activation checkpointing: what it saves for the backward pass is dropped
    and recomputed there (non-reentrant). The RNG state is kept for the recomputation (LoRA dropout
    draws masks) except while a CUDA graph is being captured, where it cannot be read — the graphs
    never run dropout (dohnuts.train.step)."""
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=not capturing)


class Embedding(nn.Embedding):
    """nn.Embedding, except that a table on the meta device is left uninitialised: the models are
    built there and then given seeded or checkpoint values (dohnuts.model.build), and torch's
    normal_ on a meta tensor imports torch._dynamo and Triton — 2 of the 4.5 s `dohnuts.load("tiny")`
    took on a 2-core CPU, for values that do not exist."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: y = x / rms(x) · (1 + w), w initialised to 0."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor, spare: int = 0) -> torch.Tensor:
        """norm(x); `spare`: written with that many spare columns for the LoRA group reading it
        (dohnuts.ops.spare)."""
        return ops.rms_norm(x, self.weight, self.eps, weight_offset=1.0, spare=spare)

    def add(self, delta: torch.Tensor, residual: torch.Tensor, spare: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + delta), residual + delta), fused on the GPU; `spare` as forward's."""
        return ops.add_rms_norm(delta, residual, self.weight, self.eps, weight_offset=1.0, spare=spare)

    def rope(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Per-head norm then the rotary embedding: x (B, T, H, D) → (B, H, T, D), one kernel on the GPU."""
        return ops.norm_rope(x, self.weight, self.eps, 1.0, *rope)


class GatedRMSNorm(nn.Module):
    """RMSNorm with a SiLU output gate (Gated DeltaNet's output norm); plain scale w, init 1."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)


class MLP(nn.Module):
    # Linears that read the same input and may run as one GEMM (dohnuts.model.packing).
    packed_projections = (("gate_proj", "up_proj"),)

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = packed_weight(self.gate_proj, self.up_proj)
        if w is None:
            return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x)))
        # one (..., 2I) GEMM output (adapters' updates added into it), read in place
        spare = input_spare((self.down_proj,), lambda: self.down_proj.weight)
        return self.down_proj(ops.swiglu_packed(linear_group(x, (self.gate_proj, self.up_proj), w), spare))

    def input_spare(self) -> int:
        """The spare columns for this MLP's input (`dohnuts.model.lora.input_spare`)."""
        return input_spare((self.gate_proj, self.up_proj), lambda: packed_weight(self.gate_proj, self.up_proj))
