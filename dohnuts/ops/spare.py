"""Outputs with spare columns, for the one GEMM of a LoRA group over [x | u].

A producer asked for `spare` columns (an RMSNorm, packed SwiGLU) writes its rows (..., D) as the
first D columns of a (..., D + width(spare)) buffer and returns them as a (..., D) tensor with that
row stride: what every reader sees is the same values and shape as without the spare. The tensor
carries a mark: the spare columns not yet taken. An adapted projection group reading it
(`dohnuts.model.lora.linear_group`) may `claim` its Σr of them, the next ones in order: it writes
its adapters' rank-Σr product u there and runs the frozen base and the adapters' up-projection as
one GEMM over the row's first D + j + Σr columns, [x | earlier claims' columns | u], against
[W | 0 | B] — where it otherwise wrote the output from u and read it back into the base GEMM. A
layer asks its producer for the Σr of every group that will read the rows (Gated DeltaNet's
qkv/b/a group, then in_proj_z); a reader that finds too few columns left computes as without them.
A claimant writes its columns at once (its forward follows the claim), so a later claimant's GEMM
never reads unwritten memory, even against its zero weights.

The rows and a claimant's wide view are aliases of one storage, not views of each other: each has
its own version counter, so writing u bumps no version of the rows that another op (a gather, an
earlier projection) saved for its backward, and autograd never sees the spare columns. The width
is rounded up to 16 columns: rows stay aligned for the GEMM and keep the row strides' divisibility
that Triton specialises on.
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
    setattr(rows, _MARK, (0, spare))  # (taken, total)
    return rows


def widen(y: torch.Tensor, spare: int) -> torch.Tensor:
    """y's values in a tensor from `empty(y.shape, spare)` (the reference paths' producers; a copy,
    differentiable)."""
    if spare <= 0:
        return y
    out = empty(y.shape, spare, dtype=y.dtype, device=y.device)
    out.copy_(y)
    return out


def claim(x: torch.Tensor, spare: int, rows: torch.Tensor | None = None) -> int | None:
    """Take the next `spare` spare columns of the 2-D rows x (N, K), with that many left: x is a
    marked tensor, or a view covering all of one (row stride K + the buffer's width) — the marked
    tensor given as `rows` (the group's own input: inference mode records no view base) or x's
    base. Returns j, the columns taken before (this claim's are K + j … K + j + spare − 1), or None.
    The caller must write its columns before any later claim (`dohnuts.model.lora._LinearGroup`)."""
    owner = next((t for t in (x, rows, x._base) if t is not None and getattr(t, _MARK, None) is not None), None)
    left = None if owner is None else getattr(owner, _MARK, None)
    if left is None or spare <= 0 or spare > left[1] - left[0] or x.dim() != 2 or not x.shape[0]:
        return None
    taken, total = left
    n, k = x.shape
    row = k + width(total)
    if not (owner.numel() == n * k and x.stride() == (row, 1) and x.storage_offset() == owner.storage_offset()
            and x.untyped_storage().nbytes() >= (x.storage_offset() + n * row) * x.element_size()):
        return None
    setattr(owner, _MARK, (taken + spare, total))
    return taken


def with_spare(x: torch.Tensor, columns: int) -> torch.Tensor:
    """The claimed rows x (N, K) with the first `columns` spare columns after them: (N, K + columns),
    an alias of x's storage (its own version counter, outside autograd)."""
    return _alias(x, x, (x.shape[0], x.shape[1] + columns), x.stride())
