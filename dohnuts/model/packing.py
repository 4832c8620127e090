"""Packed projections: sibling linears that read the same input, run as ONE GEMM.

`fuse_projections(backbone)` re-stores each group of bias-free siblings that a layer names in its
`packed_projections` (an MLP's gate/up, attention's q/k/v, Gated DeltaNet's qkv/b/a) as
consecutive row blocks of one (Σ out, in) tensor. Each `weight` stays a Parameter under its own
name — a view of that tensor — so state-dict keys and values, loading with `copy_` and LoRA
wrapping are all unchanged. Members may be plain `nn.Linear`s or `LoRALinear`s (whose frozen base
weight is what is packed): training and prediction with adapters run the same packed GEMM as
prediction without them, each adapter's update added into its columns
(`dohnuts.model.lora.linear_group`).

The same step stores each depthwise conv's weight tap-major (`_tap_major`), as the conv kernels
read it: the same Parameter, shape and values, without the kernels' copy of it a layer and call.

`packed_weight(*linears)` hands a layer the whole tensor while the group is still stored that
way; the layer then runs one GEMM and splits the output's columns. Anything else gets None and
the layer runs its projections one by one: weights re-created by a load with `assign=True` or a
device/dtype move, base weights that are being trained, adapters with different dropouts. So a
stale packing can cost speed, never change a result, and the check is a few pointer comparisons
(no kernel, nothing recorded in a CUDA graph).
"""

from __future__ import annotations

import torch
from torch import nn

from dohnuts.model.lora import LoRALinear


def _packable(m: nn.Module) -> bool:
    return (type(m) is nn.Linear or isinstance(m, LoRALinear)) and m.bias is None


def _packed_view(linears: tuple[nn.Module, ...]) -> torch.Tensor | None:
    """The (Σ out, in) tensor whose row blocks are these linears' weights, or None."""
    if not all(_packable(m) for m in linears):
        return None  # a biased linear (or anything else) runs on its own
    if len({m.dropout for m in linears if isinstance(m, LoRALinear)}) > 1:
        return None  # the group's adapters share one dropout draw of the input
    first = linears[0].weight
    storage, offset, cols = first.untyped_storage().data_ptr(), first.storage_offset(), first.shape[1]
    rows = 0
    for m in linears:
        w = m.weight
        if (w.dtype != first.dtype or w.shape[1] != cols or not w.is_contiguous()
                or w.untyped_storage().data_ptr() != storage or w.storage_offset() != offset + rows * cols):
            return None
        rows += w.shape[0]
    return first.as_strided((rows, cols), (cols, 1))  # keeps first's storage offset


def packed_weight(*linears: nn.Module) -> torch.Tensor | None:
    """The packed weight of a group for one GEMM `x @ Wᵀ`, or None: run the linears one by one.

    Weights that require a gradient while autograd records also get None (their gradients then
    flow to each Parameter the ordinary way)."""
    if torch.is_grad_enabled() and any(getattr(m, "weight", None) is not None and m.weight.requires_grad
                                       for m in linears):
        return None
    return _packed_view(linears)


@torch.no_grad()
def fuse_projections(backbone: nn.Module) -> int:
    """Pack every group of plain linears the backbone's layers name (`packed_projections`), in place;
    and re-store each depthwise conv's weight tap-major (`_tap_major`).

    Idempotent: an already packed group is left as it is. A group with a biased (or
    mixed-dtype) member is skipped. Returns how many groups are packed afterwards."""
    n = 0
    for module in backbone.modules():
        if isinstance(module, nn.Conv1d) and module.groups == module.in_channels == module.out_channels:
            _tap_major(module)
        for names in getattr(module, "packed_projections", ()):
            linears = tuple(getattr(module, name) for name in names)
            if _packed_view(linears) is None and not _pack(linears):
                continue
            n += 1
    return n


def _pack(linears: tuple[nn.Module, ...]) -> bool:
    if not all(_packable(m) for m in linears):
        return False
    ws = [m.weight for m in linears]
    if len({(w.dtype, w.device, w.shape[1]) for w in ws}) != 1:
        return False
    packed = torch.cat([w.detach() for w in ws])  # (Σ out, in): one fresh storage, same dtype and device
    start = 0
    for m, w in zip(linears, ws):
        m.weight = nn.Parameter(packed[start:start + w.shape[0]], requires_grad=w.requires_grad)
        start += w.shape[0]
    return True


def _tap_major(conv: nn.Conv1d) -> None:
    """A depthwise conv's weight (D, 1, W) stored tap by tap — each tap's D channels contiguous, what
    the conv kernels read (dohnuts.ops._conv_kernel) — with the same values, shape and Parameter
    name, so state dicts, `copy_` loading and the reference path are unchanged; the kernels' copy
    of it a layer and call is gone. A weight already so stored is left alone; one re-created later
    (a load with `assign=True`, a move) is contiguous again and the kernels copy it as before."""
    w = conv.weight
    D, _, W = w.shape
    if w.stride(0) == 1 and w.stride(2) == D:
        return
    stored = w.detach().squeeze(1).t().contiguous()  # (W, D)
    conv.weight = nn.Parameter(stored.t().unsqueeze(1), requires_grad=w.requires_grad)


class _Columns(torch.autograd.Function):
    """`columns`' op: the forward's views, a backward that writes the gradient of y once."""

    @staticmethod
    def forward(ctx, y, sizes):
        ctx.sizes = sizes
        ctx.set_materialize_grads(False)
        return y.split(sizes, dim=-1)

    @staticmethod
    def backward(ctx, *grads):
        first = grads[0]
        base = None if first is None else first._base
        total = sum(ctx.sizes)
        if not (base is not None and base.shape == (*first.shape[:-1], total) and base.is_contiguous()
                and first.storage_offset() == base.storage_offset() and first.stride() == base.stride()):
            like = next((g for g in grads if g is not None), None)
            if like is None:
                return None, None
            return torch.cat([like.new_zeros(*like.shape[:-1], n) if g is None else g
                              for g, n in zip(grads, ctx.sizes)], dim=-1), None
        out = base  # the first part's gradient was written as the first columns of a buffer as wide as y
        col = ctx.sizes[0]
        for g, n in zip(grads[1:], ctx.sizes[1:]):
            if g is None:
                out[..., col:col + n].zero_()
            else:
                out[..., col:col + n].copy_(g)
            col += n
        return out, None


def columns(y: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """y.split(sizes, dim=-1) — a packed projection's parts, views of its output's columns — whose
    backward writes y's gradient once: where the first part's gradient comes as the first columns
    of a buffer as wide as y (the conv's backward writes Gated DeltaNet's qkv gradient so,
    `dohnuts.ops._conv_bwd_kernel`), the other parts' gradients are copied beside it and the buffer
    is y's gradient; otherwise they are concatenated, as autograd's split would. The contract: a
    first gradient that is a view of a contiguous buffer as wide as y offers that buffer's other
    columns to be written (only the conv's backward makes such a view)."""
    if not torch.is_grad_enabled() or not y.requires_grad:
        return y.split(sizes, dim=-1)
    return _Columns.apply(y, list(sizes))
