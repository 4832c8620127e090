"""Triton kernel: a PNG's row filters undone on the GPU (8-bit truecolour, 3 bytes a pixel).

A PNG is a zlib stream of scanlines, each a filter byte (0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth)
and the row's bytes minus a prediction from the pixel to the left, the one above and the one above
to the left. The host inflates the stream (dohnuts.runtime.images); this kernel undoes the filters
where the tower reads the pixels. Pixel (r, c) needs (r, c − 1), (r − 1, c) and (r − 1, c − 1), so
the one program runs a wavefront over groups of four rows: at step s the group of rows 4t … 4t + 3
undoes column c = s − t (H/4 + W − 1 steps), its first row from the group above's last (stored the
step before and read back after a barrier: the only memory on the chain of dependent steps), its
other three from the row just undone, in registers, with the left and upper-left pixels kept there
too. Each step's filtered bytes are loaded the step before. A thread a row group's channel (M57 in
docs/history/evolution.md: the A/B against one row a thread, the warps swept). The arithmetic is the PNG
specification's, integer for integer, so the pixels equal libspng's bit for bit
(tests/runtime/test_images_device_path.py in Triton's interpreter, tests/gpu/test_images_device.py
on a GPU). CPU tensors run in Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 1024  # one program holds every row group (4 · BLOCK_T ≥ H); taller images stay on the host path
ROWS = 4  # rows a thread


@triton.jit
def _predict(ftype, left, up, upleft):
    """The filter's prediction of a pixel from its left, upper and upper-left neighbours."""
    p = left + up - upleft
    pa = tl.abs(p - left)
    pb = tl.abs(p - up)
    pc = tl.abs(p - upleft)
    paeth = tl.where((pa <= pb) & (pa <= pc), left, tl.where(pb <= pc, up, upleft))
    return tl.where(ftype == 0, 0, tl.where(ftype == 1, left, tl.where(ftype == 2, up,
                    tl.where(ftype == 3, (left + up) >> 1, paeth))))


@triton.jit
def _unfilter_kernel(F, P, H, W, stride_f, BLOCK_T: tl.constexpr):
    """F (H, ≥ 1 + 3W) filtered scanlines, filter byte first → P (H, W, 3) pixels; thread t holds
    rows 4t … 4t + 3 (r0 … r0 + 3)."""
    t = tl.arange(0, BLOCK_T)[:, None]
    k = tl.arange(0, 4)[None, :]  # three channels, padded to a power of two
    r0 = t * 4
    ok0, ok1, ok2, ok3 = r0 < H, r0 + 1 < H, r0 + 2 < H, r0 + 3 < H
    f0 = tl.load(F + r0 * stride_f, mask=ok0, other=0).to(tl.int32)
    f1 = tl.load(F + (r0 + 1) * stride_f, mask=ok1, other=0).to(tl.int32)
    f2 = tl.load(F + (r0 + 2) * stride_f, mask=ok2, other=0).to(tl.int32)
    f3 = tl.load(F + (r0 + 3) * stride_f, mask=ok3, other=0).to(tl.int32)
    l0 = tl.zeros([BLOCK_T, 4], tl.int32)  # each row's pixel to the left (0 left of the row)
    l1 = tl.zeros([BLOCK_T, 4], tl.int32)
    l2 = tl.zeros([BLOCK_T, 4], tl.int32)
    l3 = tl.zeros([BLOCK_T, 4], tl.int32)
    ul0 = tl.zeros([BLOCK_T, 4], tl.int32)  # the first row's upper left (rows 1–3: the row above's left)
    first = (t == 0) & (k < 3)  # step 0: the first group at column 0
    n0 = tl.load(F + r0 * stride_f + 1 + k, mask=first & ok0, other=0).to(tl.int32)
    n1 = tl.load(F + (r0 + 1) * stride_f + 1 + k, mask=first & ok1, other=0).to(tl.int32)
    n2 = tl.load(F + (r0 + 2) * stride_f + 1 + k, mask=first & ok2, other=0).to(tl.int32)
    n3 = tl.load(F + (r0 + 3) * stride_f + 1 + k, mask=first & ok3, other=0).to(tl.int32)
    for s in range(0, (H + 3) // 4 + W - 1):
        c = s - t
        ok = (c >= 0) & (c < W) & (k < 3)
        a0, a1, a2, a3 = n0, n1, n2, n3  # loaded the step before: off the chain of dependent steps
        nxt = (c + 1 >= 0) & (c + 1 < W) & (k < 3)  # column c + 1, the next step's
        n0 = tl.load(F + r0 * stride_f + 4 + c * 3 + k, mask=nxt & ok0, other=0).to(tl.int32)
        n1 = tl.load(F + (r0 + 1) * stride_f + 4 + c * 3 + k, mask=nxt & ok1, other=0).to(tl.int32)
        n2 = tl.load(F + (r0 + 2) * stride_f + 4 + c * 3 + k, mask=nxt & ok2, other=0).to(tl.int32)
        n3 = tl.load(F + (r0 + 3) * stride_f + 4 + c * 3 + k, mask=nxt & ok3, other=0).to(tl.int32)
        up0 = tl.load(P + (r0 - 1) * (W * 3) + c * 3 + k, mask=ok & ok0 & (r0 > 0), other=0).to(tl.int32)
        v0 = (a0 + _predict(f0, l0, up0, ul0)) & 255
        v1 = (a1 + _predict(f1, l1, v0, l0)) & 255
        v2 = (a2 + _predict(f2, l2, v1, l1)) & 255
        v3 = (a3 + _predict(f3, l3, v2, l2)) & 255
        tl.store(P + r0 * (W * 3) + c * 3 + k, v0.to(tl.uint8), mask=ok & ok0)
        tl.store(P + (r0 + 1) * (W * 3) + c * 3 + k, v1.to(tl.uint8), mask=ok & ok1)
        tl.store(P + (r0 + 2) * (W * 3) + c * 3 + k, v2.to(tl.uint8), mask=ok & ok2)
        tl.store(P + (r0 + 3) * (W * 3) + c * 3 + k, v3.to(tl.uint8), mask=ok & ok3)
        ul0 = tl.where(ok, up0, ul0)
        l0 = tl.where(ok, v0, l0)
        l1 = tl.where(ok, v1, l1)
        l2 = tl.where(ok, v2, l2)
        l3 = tl.where(ok, v3, l3)
        tl.debug_barrier()  # this step's last rows are the next step's rows above


def warps(height: int) -> int:
    """The launch's warps: a thread a row group's channel (its four lanes, the fourth masked), at most 32."""
    return max(1, min(32, triton.next_power_of_2(triton.cdiv(height, ROWS)) // 8))


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
    block = triton.next_power_of_2(triton.cdiv(height, ROWS))
    _unfilter_kernel[(1,)](filtered, out, height, width, filtered.stride(0), BLOCK_T=block,
                           num_warps=warps(height))
    return out
