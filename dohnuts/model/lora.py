"""LoRA adapters on the backbone's projections.

`apply_lora` swaps each targeted `nn.Linear` for a `LoRALinear` that keeps the frozen base
weight under the same name (so base checkpoints still load) and adds `lora_A` (r, in) and
`lora_B` (out, r): y = x Wᵀ + (α / r) · dropout(x) Aᵀ Bᵀ. B starts at zero, so an adapted model
starts equal to its base. `merge_lora` folds them into the base weights for deployment.

Training and prediction run an adapted projection the same way, `linear_group`: the frozen base
as one GEMM — over a whole packed group of siblings when the layer's weights are packed
(dohnuts.model.packing), so an adapted model keeps inference's packed projections — accumulating
onto the adapters' rank-r updates, written first into their columns (`_LinearGroup`). Its
backward is written out for the same reason: the input's gradient is one rank-Σr GEMM and the
base GEMM accumulating onto it, where autograd over the plain composition would copy every output
once (an out-of-place `addmm`) and sum the input's gradients from every sibling and every adapter
(an element-wise pass each). The adapters are FP32 master weights; a pass reads their compute-dtype
copies (`_Copies`), made once after each optimizer step rather than cast in every pass, and the
backward writes their gradients in FP32 straight from the GEMMs.
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from dohnuts.schema import Invalid, is_finite, short

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
        # Adapters are FP32 master weights whatever the base dtype (passes read their copies: `_Copies`).
        a = torch.empty(cfg.rank, self.in_features)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        self.lora_A = nn.Parameter(a.to(dev))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, cfg.rank, device=dev))
        self.scaling = cfg.scaling
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_group(x, (self,), self.weight)

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


# Every optimizer step (any optimizer: fused AdamW does not bump its parameters' version
# counters) makes the adapters' compute copies stale; the next use rebuilds them (`_copies`).
_generation = 0


def _optimizer_stepped(*_args) -> None:
    global _generation
    _generation += 1


register_optimizer_step_post_hook(_optimizer_stepped)

_LIVE: weakref.WeakSet[_Copies] = weakref.WeakSet()


class _Copies:
    """One group's adapters in the compute dtype, made once per parameter version — after each
    optimizer step, not in every pass: `a` (Σr, in), the rows of every Aᵢ; `bd` (Σout, Σr), each Bᵢ
    on its diagonal block of the group's columns, zero elsewhere; `a_s` and `bd_s` the same scaled
    by the adapters' α / r. Rebuilt in place (CUDA graphs read their addresses) when a parameter
    is replaced, changed in place (its version), or an optimizer has stepped. An in-place change
    through `.data` bumps no version and is not seen: change adapters through the parameters."""

    __slots__ = ("lora", "spans", "scales", "ranks", "key", "a", "a_s", "bd", "bd_s", "__weakref__")

    def __init__(self, linears: tuple[nn.Module, ...], dtype: torch.dtype, device: torch.device):
        self.lora, self.spans, self.scales, col = [], [], [], 0
        for m in linears:
            n = m.weight.shape[0]
            if isinstance(m, LoRALinear):
                self.lora.append(m)
                self.spans.append((col, col + n))
                self.scales.append(m.scaling)
            col += n
        self.ranks = [m.lora_A.shape[0] for m in self.lora]
        shape_a, shape_bd = (sum(self.ranks), self.lora[0].in_features), (col, sum(self.ranks))
        with torch.inference_mode(False):  # made during prediction, read by training's autograd too
            self.a, self.a_s = (torch.empty(shape_a, dtype=dtype, device=device) for _ in range(2))
            self.bd, self.bd_s = (torch.zeros(shape_bd, dtype=dtype, device=device) for _ in range(2))
        self.key = None

    def _key(self) -> tuple:
        return (_generation,) + tuple((id(p), p._version, p.data_ptr()) for m in self.lora
                                      for p in (m.lora_A, m.lora_B))

    def fresh(self) -> _Copies:
        """Rebuild the copies in place if a master weight moved since they were made."""
        key = self._key()
        if key == self.key:
            return self
        if self.a.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("LoRA adapters changed since their compute copies were made, inside a CUDA graph "
                               "capture: refresh them before capturing (dohnuts.model.lora.refresh_adapter_copies)")
        with torch.inference_mode(False), torch.no_grad():
            torch.cat([m.lora_A for m in self.lora], out=self.a)
            r0 = 0
            for (c0, c1), s, m, r in zip(self.spans, self.scales, self.lora, self.ranks):
                torch.mul(m.lora_A, s, out=self.a_s[r0:r0 + r])
                self.bd[c0:c1, r0:r0 + r].copy_(m.lora_B)
                torch.mul(m.lora_B, s, out=self.bd_s[c0:c1, r0:r0 + r])
                r0 += r
        self.key = self._key()
        return self


def _copies(linears: tuple[nn.Module, ...], lora: list[LoRALinear], dtype: torch.dtype,
            device: torch.device) -> _Copies:
    cache = lora[0].__dict__.setdefault("_copies", {})
    k = (tuple(map(id, linears)), dtype, device)
    c = cache.get(k)
    if c is None or c.lora != [m for m in linears if isinstance(m, LoRALinear)]:
        c = cache[k] = _Copies(linears, dtype, device)
        _LIVE.add(c)
    return c.fresh()


def refresh_adapter_copies() -> None:
    """Bring every adapter's compute copies up to date, in place: before a CUDA graph replays
    passes that read them (an eager pass refreshes its own)."""
    for c in list(_LIVE):
        c.fresh()


def _mm(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b written in `dtype`: a weight gradient straight into the FP32 masters' dtype (on CUDA
    the GEMM writes FP32, no cast kernel; the CPU has no such GEMM and casts)."""
    if a.dtype == dtype:
        return torch.mm(a, b)
    if a.is_cuda and dtype == torch.float32:
        return torch.mm(a, b, out_dtype=dtype)
    return torch.mm(a, b).to(dtype)


class _LinearGroup(torch.autograd.Function):
    """y = x Wᵀ (+ bias) + Σᵢ sᵢ · (xd Aᵢᵀ) Bᵢᵀ in adapter i's columns, as two GEMMs.

    x (N, in) and xd (the adapters' input after dropout; None: x itself), W (Σout, in), `c` the
    adapters' compute copies (`_Copies`: the scaled and unscaled A's and block-diagonal B's, in
    x's dtype), then the master Aᵢ, Bᵢ themselves, which only receive gradients, in their own
    dtype (FP32 under autocast, written by the GEMMs directly). The adapters' updates are written
    first — one GEMM of inner size Σr, zero in the columns of plain members — and the base GEMM
    accumulates onto them (cuBLAS with C = D, β = 1), so the wide output is written once and read
    once inside a compute-bound GEMM. The backward does the same for the input's gradient. The
    base weight and bias are frozen (a LoRA base); their gradients are computed anyway if asked."""

    @staticmethod
    def forward(ctx, x, xd, w, bias, c, *masters):
        u = torch.mm(x if xd is None else xd, c.a_s.t())  # (N, Σr): every adapter's sᵢ·(xd Aᵢᵀ) at once
        y = torch.mm(u, c.bd.t()) if bias is None else torch.addmm(bias, u, c.bd.t())  # (N, Σout)
        y.addmm_(x, w.t())  # the base GEMM, accumulating onto the adapters' updates
        ctx.spans, ctx.ranks = c.spans, c.ranks
        ctx.dtype = masters[0].dtype
        ctx.dropout = xd is not None
        ctx.save_for_backward(x, xd, w, c.a, c.bd_s, u)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, xd, w, a, bd_s, u = ctx.saved_tensors
        need = ctx.needs_input_grad
        dy = dy.contiguous()
        du = torch.mm(dy, bd_s)  # (N, Σr): the gradient of xd Aᵢᵀ, the scales included
        dbs = [None] * len(ctx.ranks)
        if any(need[6::2]):
            dbd = _mm(dy.t(), u, ctx.dtype)  # (Σout, Σr): one GEMM; only the diagonal blocks are used
            r0 = 0
            for i, ((c0, c1), r) in enumerate(zip(ctx.spans, ctx.ranks)):
                dbs[i] = dbd[c0:c1, r0:r0 + r]
                r0 += r
        dx = dxd = None
        if need[0]:
            if ctx.dropout:
                dx = torch.mm(dy, w)
            else:
                dx = torch.mm(du, a)  # the adapters' share first, the base GEMM accumulating onto it
                dx.addmm_(dy, w)
        if ctx.dropout and need[1]:
            dxd = torch.mm(du, a)
        das = _mm(du.t(), x if xd is None else xd, ctx.dtype).split(ctx.ranks)  # (Σr, in) → (rᵢ, in) each
        dw = torch.mm(dy.t(), x) if need[2] else None
        dbias = dy.sum(0) if need[3] else None
        grads = [g for pair in zip(das, dbs) for g in pair]
        return dx, dxd, dw, dbias, None, *grads


def linear_group(x: torch.Tensor, linears: tuple[nn.Module, ...], weight: torch.Tensor) -> torch.Tensor:
    """x (..., in) through sibling linears whose weights are `weight`'s consecutive row blocks
    (one linear's own weight, or a packed group's, dohnuts.model.packing) → (..., Σ out): one GEMM
    for the bases, every LoRA member's update added into its columns (`_LinearGroup`). Plain
    members add nothing; a group with no adapter is just the GEMM. Under autocast every operand
    runs in the autocast dtype (the adapters' FP32 master weights through their compute copies,
    made once per optimizer step)."""
    lora = [m for m in linears if isinstance(m, LoRALinear)]
    bias = linears[0].bias if len(linears) == 1 else None
    if not lora:
        return F.linear(x, weight, bias)
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).to(dtype)
    p = lora[0].dropout
    xd = F.dropout(x2, p, lora[0].training) if p and lora[0].training else None
    c = _copies(linears, lora, dtype, x.device)
    masters = [t for m in lora for t in (m.lora_A, m.lora_B)]
    with torch.autocast(dev, enabled=False):
        y = _LinearGroup.apply(x2, xd, weight.to(dtype), None if bias is None else bias.to(dtype), c, *masters)
    return y.view(*lead, c.bd.shape[0])
