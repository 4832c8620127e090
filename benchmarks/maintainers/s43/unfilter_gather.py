"""Scratch (session 43): the PNG unfilter's wavefront with the row above taken from the previous step's
values in registers (`tl.gather` along the rows: row r reads row r − 1's value of the step before)
instead of storing each step's pixels and loading them back after a barrier — the global round trip
on the chain of dependent steps (H + W − 1 of them). Equality with libspng (every filter type,
Pillow's adaptive filters) and the kernel's time against today's, at 448² and 1024², µs a launch.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s43/unfilter_gather.py OUT.json
(on a CPU under TRITON_INTERPRET=1: the equality checks only, small images)"""
import json, os, statistics, sys
import numpy as np
import imagecodecs
import torch
import triton
import triton.language as tl

from dohnuts.ops._unfilter_kernel import unfilter_triton
from dohnuts.runtime.images import _png_image_data
from tests.runtime.png_cases import noise, png, smooth


@triton.jit
def _unfilter_gather_kernel(F, P, H, W, stride_f, BLOCK_R: tl.constexpr):
    r = tl.arange(0, BLOCK_R)[:, None]
    k = tl.arange(0, 4)[None, :]
    row_ok = r < H
    ftype = tl.load(F + r * stride_f, mask=row_ok, other=0).to(tl.int32)
    left = tl.zeros([BLOCK_R, 4], tl.int32)
    upleft = tl.zeros([BLOCK_R, 4], tl.int32)
    prev = tl.zeros([BLOCK_R, 4], tl.int32)  # the previous step's values: row r at column s − 1 − r
    above = tl.maximum(r - 1, 0) + tl.zeros([BLOCK_R, 4], tl.int32)
    ahead = tl.load(F + r * stride_f + 1 + k, mask=row_ok & (r == 0) & (k < 3), other=0).to(tl.int32)
    for s in range(0, H + W - 1):
        c = s - r
        ok = row_ok & (c >= 0) & (c < W) & (k < 3)
        raw = ahead
        ahead = tl.load(F + r * stride_f + 4 + c * 3 + k, mask=row_ok & (c + 1 >= 0) & (c + 1 < W) & (k < 3),
                        other=0).to(tl.int32)
        up = tl.where(r > 0, tl.gather(prev, above, 0), 0)  # row r − 1 at column c, the step before
        p = left + up - upleft
        pa = tl.abs(p - left)
        pb = tl.abs(p - up)
        pc = tl.abs(p - upleft)
        paeth = tl.where((pa <= pb) & (pa <= pc), left, tl.where(pb <= pc, up, upleft))
        pred = tl.where(ftype == 0, 0, tl.where(ftype == 1, left, tl.where(ftype == 2, up,
                        tl.where(ftype == 3, (left + up) >> 1, paeth))))
        val = (raw + pred) & 255
        tl.store(P + r * (W * 3) + c * 3 + k, val.to(tl.uint8), mask=ok)
        prev = val
        left = tl.where(ok, val, left)
        upleft = tl.where(ok, up, upleft)


def unfilter_gather(filtered, height, width, warps=None):
    out = torch.empty((height, width, 3), dtype=torch.uint8, device=filtered.device)
    block = triton.next_power_of_2(height)
    _unfilter_gather_kernel[(1,)](filtered, out, height, width, filtered.stride(0), BLOCK_R=block,
                                  num_warps=warps or min(32, max(8, block // 16)))
    return out


def cases(sizes, dev):
    rng = np.random.default_rng(0)
    for h, w in sizes:
        for name, pixels, kinds in [("each", noise(h, w, 1), np.arange(h) % 5), ("mixed", noise(h, w, 2), rng.integers(0, 5, h)),
                                    ("paeth", noise(h, w, 3), np.full(h, 4)), ("pillow", smooth(h, w), None)]:
            data = png(pixels, kinds)
            rows = np.frombuffer(imagecodecs.zlibng_decode(_png_image_data(data)), np.uint8).copy()
            yield (h, w, name), torch.from_numpy(rows).view(h, -1).to(dev), imagecodecs.spng_decode(data)


if __name__ == "__main__":
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    dev = "cpu" if interp else "cuda"
    res = {"equal": {}, "us": {}}
    sizes = [(1, 9), (7, 5), (24, 19), (33, 40)] if interp else [(1, 9), (33, 40), (448, 448), (1024, 1024), (768, 1024)]
    for what, f, want in cases(sizes, dev):
        got = unfilter_gather(f, what[0], what[1]).cpu().numpy()
        res["equal"]["x".join(map(str, what))] = bool(np.array_equal(got, want))
        if not interp and what[0] >= 448 and what[2] in ("mixed", "pillow"):
            from triton.testing import do_bench
            fns = {"today": lambda: unfilter_triton(f, what[0], what[1])}
            for wp in (8, 16, 32):
                fns[f"gather_w{wp}"] = (lambda wp=wp: unfilter_gather(f, what[0], what[1], wp))
            t = {n: [] for n in fns}
            for _ in range(5):
                for n, fn in fns.items():
                    t[n].append(do_bench(fn, warmup=5, rep=40) * 1e3)
            res["us"]["x".join(map(str, what))] = {n: round(statistics.median(v), 1) for n, v in t.items()}
            print(what, res["us"]["x".join(map(str, what))], flush=True)
    print("all equal:", all(res["equal"].values()), [k for k, v in res["equal"].items() if not v])
    if len(sys.argv) > 1:
        json.dump(res, open(sys.argv[1], "w"), indent=1)
