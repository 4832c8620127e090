"""LoRA adapters on the backbone's projections.

`apply_lora` swaps each targeted `nn.Linear` for a `LoRALinear` that keeps the frozen base
weight under the same name (so base checkpoints still load) and adds `lora_A` (r, in) and
`lora_B` (out, r): y = x Wᵀ + (α / r) · dropout(x) Aᵀ Bᵀ. B starts at zero, so an adapted model
starts equal to its base. During training the adapters stay in the autograd graph; `merge_lora`
folds them into the base weights for deployment (one GEMM per projection, no adapter cost).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj",  # gated attention
    "in_proj_qkv", "in_proj_z", "out_proj",  # Gated DeltaNet
    "gate_proj", "up_proj", "down_proj",  # SwiGLU MLP
)


MAX_RANK = 1024  # far above any useful rank; bounds what an argument or a file can make us allocate


@dataclass(frozen=True)
class LoRAConfig:
    """The adapters' shape, checked on construction (also when a config is decoded: dohnuts.schema)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        from dohnuts.schema import Invalid, is_finite, short

        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 < self.rank <= MAX_RANK:
            raise Invalid(f"must be an integer in 1..{MAX_RANK}, got {short(self.rank)}", field="rank")
        if not (is_finite(self.alpha) and self.alpha > 0):
            raise Invalid(f"must be a finite number > 0, got {short(self.alpha)}", field="alpha")
        if not (is_finite(self.dropout) and 0.0 <= self.dropout < 1.0):
            raise Invalid(f"must lie in [0, 1), got {short(self.dropout)}", field="dropout")
        if isinstance(self.targets, str) or not isinstance(self.targets, (list, tuple)) or not self.targets or \
                not all(isinstance(t, str) and t for t in self.targets):
            raise Invalid(f"must be a non-empty list of layer names, got {short(self.targets)}", field="targets")
        object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Module):
    """A frozen linear map plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, cfg: LoRAConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.weight.requires_grad_(False)
        self.bias = base.bias
        dev = base.weight.device
        # Adapters are FP32 master weights whatever the base dtype (autocast runs them in BF16).
        a = torch.empty(cfg.rank, self.in_features)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        self.lora_A = nn.Parameter(a.to(dev))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, cfg.rank, device=dev))
        self.scaling = cfg.scaling
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)  # (..., out)
        xd = F.dropout(x, self.dropout, self.training) if self.dropout else x
        a, b = self.lora_A, self.lora_B
        if not torch.is_autocast_enabled(x.device.type):
            a, b = a.to(x.dtype), b.to(x.dtype)
        # The scale goes on the rank-r activations, and the update is accumulated into y by the
        # second GEMM itself (addmm): no element-wise pass over the (…, out) output for either.
        h = F.linear(xd, a) * self.scaling  # (..., r)
        out = torch.addmm(y.reshape(-1, y.shape[-1]), h.reshape(-1, h.shape[-1]), b.t())
        return out.view(y.shape)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """An nn.Linear with W + (α/r)·B·A (computed in FP32, stored in the base dtype)."""
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=self.weight.device, dtype=self.weight.dtype)
        delta = (self.lora_B.float() @ self.lora_A.float()) * self.scaling  # (out, in)
        out.weight.copy_((self.weight.float() + delta).to(self.weight.dtype))
        out.weight.requires_grad_(False)
        if self.bias is not None:
            out.bias.copy_(self.bias)
        return out


def apply_lora(model: nn.Module, cfg: LoRAConfig, seed: int = 0) -> list[str]:
    """Replace targeted linears in place; freeze everything else. Returns the adapted names.

    Adapter initialisation is seeded (not drawn from the global RNG), so the same seed gives
    the same adapters whatever ran before."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    adapted: list[str] = []
    matched: set[str] = set()
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in cfg.targets and isinstance(child, nn.Linear):
                setattr(module, child_name, LoRALinear(child, cfg, gen))
                adapted.append(f"{name}.{child_name}" if name else child_name)
                matched.add(child_name)
    for target in cfg.targets:
        if target not in matched:
            warnings.warn(f"LoRA target {target!r} matches no linear layer of the model", stacklevel=2)
    return adapted


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its base weight, in place. Returns how many were merged."""
    n = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, child_name, child.merged())
                n += 1
    return n


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items() if ".lora_A" in k or ".lora_B" in k}
