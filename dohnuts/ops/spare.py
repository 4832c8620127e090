"""Outputs with spare columns, for the one GEMM of a LoRA group over [x | u].

A producer asked for `spare` columns (an RMSNorm, packed SwiGLU) writes its rows (..., D) as the
first D columns of a (..., D + width(spare)) buffer and returns them as a (..., D) tensor with that
row stride: what every reader sees is the same values and shape as without the spare. The tensor
carries a mark. The adapted projection group reading it (`dohnuts.model.lora.linear_group`) may
`claim` the spare once: it writes its adapters' rank-Σr product u into those columns and runs the
frozen base and the adapters' up-projection as one GEMM over [x | u] · [W | B]ᵀ, where it
otherwise wrote the output from u and read it back into the base GEMM. A claim clears the mark,
so a second reader of the same rows (a claim asks for exactly its own Σr) computes as it did
without it, and nothing reads the spare columns but the claimant.

The rows and the claimant's wide view are aliases of one storage, not views of each other: each
has its own version counter, so writing u bumps no version of the rows that another op (a gather,
an earlier projection) saved for its backward, and autograd never sees the spare columns. The
width is rounded up to 16 columns: rows stay aligned for the GEMM and keep the row strides'
divisibility that Triton specialises on.
"""

from __future__ import annotations

import torch

_MARK = "_dohnuts_spare"
_ALIGN = 16


def width(spare: int) -> int:
    """The columns a buffer with `spare` spare columns adds to each row."""
    return -(-spare // _ALIGN) * _ALIGN if spare > 0 else 0


def _alias(like: torch.Tensor, storage_of: torch.Tensor, shape, stride) -> torch.Tensor:
    """A tensor over storage_of's storage at its offset (no view: a version counter of its own)."""
    t = torch.empty(0, dtype=like.dtype, device=like.device)
    return t.set_(storage_of.untyped_storage(), storage_of.storage_offset(), shape, stride)


def empty(shape: tuple[int, ...] | torch.Size, spare: int, *, dtype: torch.dtype,
          device: torch.device) -> torch.Tensor:
    """An uninitialised (..., D) tensor of `shape`; with spare > 0 the first D columns of a
    (..., D + width(spare)) buffer, marked (row stride D + width(spare))."""
    if spare <= 0:
        return torch.empty(shape, dtype=dtype, device=device)
    *lead, d = shape
    buf = torch.empty(*lead, d + width(spare), dtype=dtype, device=device)
    rows = _alias(buf, buf, tuple(shape), buf.stride())
    setattr(rows, _MARK, spare)
    return rows


def widen(y: torch.Tensor, spare: int) -> torch.Tensor:
    """y's values in a tensor from `empty(y.shape, spare)` (the reference paths' producers; a copy,
    differentiable)."""
    if spare <= 0:
        return y
    out = empty(y.shape, spare, dtype=y.dtype, device=y.device)
    out.copy_(y)
    return out


def claim(x: torch.Tensor, spare: int) -> bool:
    """Whether the 2-D rows x (N, K) may take `spare` columns past their K: x is a marked tensor
    or a view of one covering all of it (row stride K + width(spare)) whose mark is `spare`. The
    first call on a marked tensor clears its mark, whatever it answers: the first reader that
    could claim the columns takes them or leaves them, once."""
    owner = x if getattr(x, _MARK, 0) else x._base
    mark = 0 if owner is None else getattr(owner, _MARK, 0)
    if not mark:
        return False
    setattr(owner, _MARK, 0)
    if mark != spare or x.dim() != 2 or not x.shape[0]:
        return False
    n, k = x.shape
    row = k + width(spare)
    return (owner.numel() == n * k and x.stride() == (row, 1) and x.storage_offset() == owner.storage_offset()
            and x.untyped_storage().nbytes() >= (x.storage_offset() + n * row) * x.element_size())


def with_spare(x: torch.Tensor, spare: int) -> torch.Tensor:
    """The claimed rows x (N, K) with their `spare` columns after them: (N, K + spare), an alias of
    x's storage (its own version counter, outside autograd)."""
    return _alias(x, x, (x.shape[0], x.shape[1] + spare), x.stride())
