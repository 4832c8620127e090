"""Triton kernel: a PNG's row filters undone on the GPU (8-bit truecolour, 3 bytes a pixel).

A PNG is a zlib stream of scanlines, each a filter byte (0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth)
and the row's bytes minus a prediction from the pixel to the left, the one above and the one above
to the left. The host inflates the stream (dohnuts.runtime.images); this kernel undoes the filters
where the tower reads the pixels. Pixel (r, c) needs (r, c − 1), (r − 1, c) and (r − 1, c − 1), so
the one program runs a wavefront: step s handles every row r at column c = s − r (H + W − 1 steps),
reads the row above from memory (written the step before; a barrier between steps) and keeps the
left and upper-left pixels in registers. Each step's filtered bytes are loaded the step before, so
only the row above's read is on the chain of dependent steps; 32 warps for 448 rows and more
(docs/history/evolution.md M46 has the A/B). The arithmetic is the PNG specification's, integer for
integer, so the pixels equal libspng's bit for bit (tests/runtime/test_images_device_path.py in
Triton's interpreter, tests/gpu/test_images_device.py on a GPU); its times on the H200 are in
docs/history/evolution.md M37 and M42. CPU tensors run in Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 1024  # one program holds every row (BLOCK_R ≥ H); taller images stay on the host path


@triton.jit
def _unfilter_kernel(F, P, H, W, stride_f, BLOCK_R: tl.constexpr):
    """F (H, ≥ 1 + 3W) filtered scanlines, filter byte first → P (H, W, 3) pixels."""
    r = tl.arange(0, BLOCK_R)[:, None]
    k = tl.arange(0, 4)[None, :]  # three channels, padded to a power of two
    row_ok = r < H
    ftype = tl.load(F + r * stride_f, mask=row_ok, other=0).to(tl.int32)
    left = tl.zeros([BLOCK_R, 4], tl.int32)
    upleft = tl.zeros([BLOCK_R, 4], tl.int32)
    ahead = tl.load(F + r * stride_f + 1 + k, mask=row_ok & (r == 0) & (k < 3), other=0).to(tl.int32)  # step 0
    for s in range(0, H + W - 1):
        c = s - r
        ok = row_ok & (c >= 0) & (c < W) & (k < 3)
        raw = ahead  # loaded the step before: off the chain of dependent steps
        ahead = tl.load(F + r * stride_f + 4 + c * 3 + k, mask=row_ok & (c + 1 >= 0) & (c + 1 < W) & (k < 3),
                        other=0).to(tl.int32)  # column c + 1, the next step's
        up = tl.load(P + (r - 1) * (W * 3) + c * 3 + k, mask=ok & (r > 0), other=0).to(tl.int32)
        p = left + up - upleft
        pa = tl.abs(p - left)
        pb = tl.abs(p - up)
        pc = tl.abs(p - upleft)
        paeth = tl.where((pa <= pb) & (pa <= pc), left, tl.where(pb <= pc, up, upleft))
        pred = tl.where(ftype == 0, 0, tl.where(ftype == 1, left, tl.where(ftype == 2, up,
                        tl.where(ftype == 3, (left + up) >> 1, paeth))))
        val = (raw + pred) & 255
        tl.store(P + r * (W * 3) + c * 3 + k, val.to(tl.uint8), mask=ok)
        left = tl.where(ok, val, left)
        upleft = tl.where(ok, up, upleft)
        tl.debug_barrier()  # this step's row r is the next step's row above


def unfilter_triton(filtered: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(H, 1 + 3W) uint8 filtered scanlines (filter bytes 0–4, checked by the caller) → (H, W, 3)
    uint8 pixels, on the scanlines' device and current stream. H ≤ MAX_ROWS."""
    if filtered.dtype != torch.uint8 or filtered.dim() != 2 or filtered.shape[0] != height \
            or filtered.shape[1] < 1 + 3 * width or filtered.stride(1) != 1:
        raise ValueError(f"unfilter: expected ({height}, {1 + 3 * width}) uint8 rows, got "
                         f"{tuple(filtered.shape)} {filtered.dtype}")
    if not 0 < height <= MAX_ROWS or width <= 0:
        raise ValueError(f"unfilter: {height} rows of {width} pixels (1..{MAX_ROWS} rows)")
    out = torch.empty((height, width, 3), dtype=torch.uint8, device=filtered.device)
    block = triton.next_power_of_2(height)
    _unfilter_kernel[(1,)](filtered, out, height, width, filtered.stride(0), BLOCK_R=block,
                           num_warps=min(32, max(8, block // 16)))
    return out
