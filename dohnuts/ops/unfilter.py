"""A PNG's row filters undone: inflated scanlines (filter byte first) → RGB pixels.

The fused path (a GPU that runs the fused kernels, at most `MAX_UNFILTER_ROWS` rows) is one Triton
program (dohnuts.ops._unfilter_kernel). The reference path follows the PNG specification row by
row in plain torch, a pixel at a time where the filter reads the pixel to its left (Average,
Paeth): slow, and exact like the kernel. The runtime sends a plain PNG to the device only where
the fused path runs (dohnuts.runtime.images); elsewhere libspng decodes it on the host.
"""

from __future__ import annotations

import torch

from dohnuts.ops._dispatch import use_fused

MAX_UNFILTER_ROWS = 1024  # dohnuts.ops._unfilter_kernel.MAX_ROWS (the kernel's module imports Triton)


def png_unfilter(filtered: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(H, 1 + 3W) uint8 scanlines, each a filter byte (0–4) then its 3W filtered bytes → (H, W, 3)
    uint8 pixels, on the scanlines' device."""
    if use_fused(filtered) and height <= MAX_UNFILTER_ROWS:
        # Triton: on a GPU only (the CPU runs the reference path without it)
        from dohnuts.ops._unfilter_kernel import unfilter_triton

        return unfilter_triton(filtered, height, width)
    return png_unfilter_reference(filtered, height, width)


def png_unfilter_reference(filtered: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The PNG specification's reconstruction (section 9), row by row, a byte at a time."""
    if filtered.dtype != torch.uint8 or tuple(filtered.shape) != (height, 1 + 3 * width):
        raise ValueError(f"unfilter: expected ({height}, {1 + 3 * width}) uint8 rows, got "
                         f"{tuple(filtered.shape)} {filtered.dtype}")
    n = 3 * width
    up, out = [0] * n, []
    for r, line in enumerate(filtered.cpu().tolist()):
        kind, raw, row = line[0], line[1:], [0] * n
        if kind not in (0, 1, 2, 3, 4):
            raise ValueError(f"unfilter: row {r} has filter type {kind} (0–4 exist)")
        for c in range(n):
            a = row[c - 3] if c >= 3 else 0
            b = up[c]
            if kind == 0:
                pred = 0
            elif kind == 1:
                pred = a
            elif kind == 2:
                pred = b
            elif kind == 3:
                pred = (a + b) >> 1
            else:
                d = up[c - 3] if c >= 3 else 0
                p = a + b - d
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - d)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else d)
            row[c] = (raw[c] + pred) & 255
        out.append(row)
        up = row
    return torch.tensor(out, dtype=torch.uint8, device=filtered.device).view(height, width, 3)
