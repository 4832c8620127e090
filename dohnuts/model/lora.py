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

Where the group's input was written with spare columns for it (dohnuts.ops.spare: a layer asks
its norm or SwiGLU for `input_spare` columns), the forward is one GEMM instead: the adapters'
rank-Σr product u goes into those columns and [x | u] · [W | B]ᵀ gives the output, the base
weight and the adapters' B's kept side by side as one more compute copy (`_Copies.wide`).
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from typing import Annotated

import msgspec
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from dohnuts.ops import spare as spare_columns
from dohnuts.schema.decode import NonBlank, check_fields, integer_in, number_in

DEFAULT_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj",  # gated attention
    "in_proj_qkv", "in_proj_z", "out_proj",  # Gated DeltaNet
    "gate_proj", "up_proj", "down_proj",  # SwiGLU MLP
)


MAX_RANK = 1024  # far above any useful rank; bounds what an argument or a file can make us allocate

# The adapters' shape, declared once: LoRAConfig's fields, and an adapter file's `lora` metadata
# (dohnuts.adapters.AdapterLoRA) typed alike.
Rank = integer_in(1, MAX_RANK)
Alpha = number_in("a finite number > 0", gt=0.0)  # the update's scale is alpha / rank
Dropout = number_in("a number in [0, 1)", ge=0.0, lt=1.0)
Targets = Annotated[tuple[NonBlank, ...], msgspec.Meta(min_length=1, description="layer names")]


class LoRAConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The adapters' shape, within its declared bounds however it is made (decoded with a training
    config or an adapter file, or built in code: `check_fields` raises Invalid naming the field)."""

    rank: Rank = 8
    alpha: Alpha = 16.0
    dropout: Dropout = 0.0
    targets: Targets = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        check_fields(self)

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
    through `.data` bumps no version and is not seen: change adapters through the parameters.

    `wide(w, j)`, made at the first call with a widened input: [W | 0 | bd] (Σout, in + j + Σr), the
    group's base weight, j zero columns (the spare columns claimed before this group's) and `bd`,
    for the forward's one GEMM over the widened input; one a j, kept in step with both in place
    (the base weight's pointer and version), never replaced while its shape holds."""

    __slots__ = ("lora", "spans", "scales", "ranks", "key", "a", "a_s", "bd", "bd_s", "ww", "w", "w_key",
                 "__weakref__")

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
        self.ww: dict[int, torch.Tensor] = {}
        self.w = self.w_key = None

    def _key(self) -> tuple:
        return (_generation,) + tuple((id(p), p._version, p.data_ptr()) for m in self.lora
                                      for p in (m.lora_A, m.lora_B))

    def fresh(self) -> _Copies:
        """Rebuild the copies in place if a master weight moved since they were made."""
        if self.w is not None and _weight_key(self.w) != self.w_key:
            self._base_moved(self.w)
        key = self._key()
        if key == self.key:
            return self
        self._outside_capture()
        with torch.inference_mode(False), torch.no_grad():
            torch.cat([m.lora_A for m in self.lora], out=self.a)
            r0 = 0
            for (c0, c1), s, m, r in zip(self.spans, self.scales, self.lora, self.ranks):
                torch.mul(m.lora_A, s, out=self.a_s[r0:r0 + r])
                self.bd[c0:c1, r0:r0 + r].copy_(m.lora_B)
                torch.mul(m.lora_B, s, out=self.bd_s[c0:c1, r0:r0 + r])
                r0 += r
            for ww in self.ww.values():
                ww[:, ww.shape[1] - self.bd.shape[1]:].copy_(self.bd)
        self.key = self._key()
        return self

    def _outside_capture(self, what: str = "LoRA adapters changed") -> None:
        if self.a.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{what} since their compute copies were made, inside a CUDA graph capture: "
                               "refresh them before capturing (dohnuts.model.lora.refresh_adapter_copies)")

    def wide(self, w: torch.Tensor, j: int = 0) -> torch.Tensor:
        """[W | 0 | bd] (Σout, in + j + Σr) for the group's base weight w (Σout, in). Call after
        `fresh`."""
        if _weight_key(w) != self.w_key:
            self._base_moved(w)
        ww = self.ww.get(j)
        if ww is None:
            self._outside_capture("a LoRA group's wide weight is missing")
            k, r = w.shape[1], self.bd.shape[1]
            with torch.inference_mode(False), torch.no_grad():
                ww = self.ww[j] = torch.empty(w.shape[0], k + j + r, dtype=self.bd.dtype, device=self.bd.device)
                ww[:, :k].copy_(w)
                ww[:, k:k + j].zero_()
                ww[:, k + j:].copy_(self.bd)
        return ww

    def _base_moved(self, w: torch.Tensor) -> None:
        """The base weight's new values into every wide copy, in place (new copies where its shape
        changed: a re-created group)."""
        self._outside_capture("a LoRA group's base weight changed")
        k = w.shape[1]
        with torch.inference_mode(False), torch.no_grad():
            for j, ww in list(self.ww.items()):
                if ww.shape != (w.shape[0], k + j + self.bd.shape[1]):
                    del self.ww[j]
                    continue
                ww[:, :k].copy_(w)
        self.w, self.w_key = w, _weight_key(w)


def _weight_key(w: torch.Tensor) -> tuple:
    """What identifies a base weight's current values: its place, layout and version (an inference
    tensor has no version: it cannot change outside inference mode)."""
    return (w.data_ptr(), w.shape, w.stride(), w.dtype, 0 if w.is_inference() else w._version)


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
    base weight and bias are frozen (a LoRA base); their gradients are computed anyway if asked.

    `ww` ([W | 0 | bd], `_Copies.wide`; None: the above): Σr of x's spare columns are claimed
    (dohnuts.ops.spare), u is written there and the output is the one GEMM over x's row up to them
    [x | … | u] · wwᵀ (the zero columns meet earlier claims' columns). The backward is the same
    either way."""

    @staticmethod
    def forward(ctx, x, xd, w, bias, c, ww, *masters):
        if ww is None:
            u = torch.mm(x if xd is None else xd, c.a_s.t())  # (N, Σr): every adapter's sᵢ·(xd Aᵢᵀ) at once
            y = torch.mm(u, c.bd.t()) if bias is None else torch.addmm(bias, u, c.bd.t())  # (N, Σout)
            y.addmm_(x, w.t())  # the base GEMM, accumulating onto the adapters' updates
        else:
            xw = spare_columns.with_spare(x, ww.shape[1] - x.shape[1])  # (N, in + j + Σr): u's columns last
            u = torch.mm(x, c.a_s.t(), out=xw[:, ww.shape[1] - c.a_s.shape[0]:])
            y = torch.mm(xw, ww.t()) if bias is None else torch.addmm(bias, xw, ww.t())
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
        return dx, dxd, dw, dbias, None, None, *grads


def linear_group(x: torch.Tensor, linears: tuple[nn.Module, ...], weight: torch.Tensor) -> torch.Tensor:
    """x (..., in) through sibling linears whose weights are `weight`'s consecutive row blocks
    (one linear's own weight, or a packed group's, dohnuts.model.packing) → (..., Σ out): one GEMM
    for the bases, every LoRA member's update added into its columns (`_LinearGroup`). Plain
    members add nothing; a group with no adapter is just the GEMM. Under autocast every operand
    runs in the autocast dtype (the adapters' FP32 master weights through their compute copies,
    made once per optimizer step). Given an input written with `input_spare(linears, …)` spare
    columns, the forward claims them for its one GEMM (`_LinearGroup`)."""
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
    ww = None
    if xd is None and weight.dtype == dtype:  # a claim writes its columns: only where the forward will
        j = spare_columns.claim(x2, c.a.shape[0], x)
        if j is not None:
            ww = c.wide(weight, j)
    with torch.autocast(dev, enabled=False):
        y = _LinearGroup.apply(x2, xd, weight.to(dtype), None if bias is None else bias.to(dtype), c, ww, *masters)
    return y.view(*lead, c.bd.shape[0])


def input_spare(linears: tuple[nn.Module, ...], weight: Callable[[], torch.Tensor | None]) -> int:
    """The spare columns (Σr) a producer should write the input of `linear_group(x, linears,
    weight())` with, so that its forward runs as one GEMM (dohnuts.ops.spare); 0 where it would not
    take them: no adapter, a dropout that draws the adapters' input, or no packed weight (`weight`
    gives None; asked only when the group has adapters, so a model without them pays no check)."""
    lora = [m for m in linears if isinstance(m, LoRALinear)]
    if not lora or (lora[0].dropout and lora[0].training) or weight() is None:
        return 0
    return sum(m.lora_A.shape[0] for m in lora)
