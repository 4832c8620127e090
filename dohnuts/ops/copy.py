"""A copy into a (B, H, R, C) tensor from a source that may be broadcast over the batch.

The fused path (CUDA, no autograd recording, unit stride in C) is one Triton kernel with
vectorised tiles (dohnuts.ops._copy_kernel); everything else is `dst.copy_(src)`, whose numbers
are the same: a copy is exact either way.
"""

from __future__ import annotations

import torch

from dohnuts.ops._dispatch import recording, use_fused


def copy4d(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst[...] = src; dst (B, H, R, C), src (B or 1, H, R, C) or a view broadcast to it. Returns dst."""
    if use_fused(dst) and not recording(src, dst) and dst.dim() == 4 and dst.stride(-1) == 1 and src.stride(-1) == 1:
        # Triton and fla: on a GPU only (the CPU runs the reference path without them)
        from dohnuts.ops._copy_kernel import copy4d_triton

        if src.shape[0] != 1 and src.stride(0) == 0:  # an expanded view: read its one batch row
            src = src[:1]
        return copy4d_triton(dst, src)
    return dst.copy_(src)
