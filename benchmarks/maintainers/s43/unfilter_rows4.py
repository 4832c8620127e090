"""Scratch (session 43): the PNG unfilter's wavefront with four rows a thread — at step s, thread t undoes
rows 4t … 4t + 3 at column s − t, the first from the row above (thread t − 1's last, stored the step
before), the other three from the row just undone in registers — so H/4 + W − 1 dependent steps of a
global round trip and a barrier, over 4× fewer warps, against today's H + W − 1 (one row a thread).
Equality with libspng (every filter type, Paeth only, Pillow's) and µs a launch at 448² and 1024².
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s43/unfilter_rows4.py OUT.json
(on a CPU under TRITON_INTERPRET=1: the equality checks only, small images)"""
import json, os, statistics, sys
import numpy as np
import imagecodecs
import torch
import triton
import triton.language as tl

import importlib.util
_spec = importlib.util.spec_from_file_location("old_unfilter_kernel", os.path.join(os.path.dirname(__file__), "old_unfilter_kernel.py"))
_old = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_old)
unfilter_triton = _old.unfilter_triton  # today's kernel before session 43 (one row a thread)
from dohnuts.runtime.images import _png_image_data
from tests.runtime.png_cases import noise, png, smooth


@triton.jit
def _predict(ftype, left, up, upleft):
    p = left + up - upleft
    pa = tl.abs(p - left)
    pb = tl.abs(p - up)
    pc = tl.abs(p - upleft)
    paeth = tl.where((pa <= pb) & (pa <= pc), left, tl.where(pb <= pc, up, upleft))
    return tl.where(ftype == 0, 0, tl.where(ftype == 1, left, tl.where(ftype == 2, up,
                    tl.where(ftype == 3, (left + up) >> 1, paeth))))


@triton.jit
def _unfilter4_kernel(F, P, H, W, stride_f, BLOCK_T: tl.constexpr):
    t = tl.arange(0, BLOCK_T)[:, None]
    k = tl.arange(0, 4)[None, :]
    r0 = t * 4
    ok0, ok1, ok2, ok3 = r0 < H, r0 + 1 < H, r0 + 2 < H, r0 + 3 < H
    f0 = tl.load(F + r0 * stride_f, mask=ok0, other=0).to(tl.int32)
    f1 = tl.load(F + (r0 + 1) * stride_f, mask=ok1, other=0).to(tl.int32)
    f2 = tl.load(F + (r0 + 2) * stride_f, mask=ok2, other=0).to(tl.int32)
    f3 = tl.load(F + (r0 + 3) * stride_f, mask=ok3, other=0).to(tl.int32)
    l0 = tl.zeros([BLOCK_T, 4], tl.int32)
    l1 = tl.zeros([BLOCK_T, 4], tl.int32)
    l2 = tl.zeros([BLOCK_T, 4], tl.int32)
    l3 = tl.zeros([BLOCK_T, 4], tl.int32)
    ul0 = tl.zeros([BLOCK_T, 4], tl.int32)
    first = (t == 0) & (k < 3)  # step 0: thread 0 at column 0
    n0 = tl.load(F + r0 * stride_f + 1 + k, mask=first & ok0, other=0).to(tl.int32)
    n1 = tl.load(F + (r0 + 1) * stride_f + 1 + k, mask=first & ok1, other=0).to(tl.int32)
    n2 = tl.load(F + (r0 + 2) * stride_f + 1 + k, mask=first & ok2, other=0).to(tl.int32)
    n3 = tl.load(F + (r0 + 3) * stride_f + 1 + k, mask=first & ok3, other=0).to(tl.int32)
    steps = (H + 3) // 4 + W - 1
    for s in range(0, steps):
        c = s - t
        ok = (c >= 0) & (c < W) & (k < 3)
        a0, a1, a2, a3 = n0, n1, n2, n3  # loaded the step before: off the chain of dependent steps
        nxt = (c + 1 >= 0) & (c + 1 < W) & (k < 3)
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


@triton.jit
def _unfilter42_kernel(F, P, H, W, stride_f, BLOCK_T: tl.constexpr):
    """Four rows and two columns a thread a step: H/4 + W/2 − 1 steps."""
    t = tl.arange(0, BLOCK_T)[:, None]
    k = tl.arange(0, 4)[None, :]
    r0 = t * 4
    W3 = W * 3
    ok0, ok1, ok2, ok3 = r0 < H, r0 + 1 < H, r0 + 2 < H, r0 + 3 < H
    f0 = tl.load(F + r0 * stride_f, mask=ok0, other=0).to(tl.int32)
    f1 = tl.load(F + (r0 + 1) * stride_f, mask=ok1, other=0).to(tl.int32)
    f2 = tl.load(F + (r0 + 2) * stride_f, mask=ok2, other=0).to(tl.int32)
    f3 = tl.load(F + (r0 + 3) * stride_f, mask=ok3, other=0).to(tl.int32)
    z = tl.zeros([BLOCK_T, 4], tl.int32)
    l0, l1, l2, l3, ul0 = z, z, z, z, z
    b0 = F + r0 * stride_f + 1 + k
    b1 = b0 + stride_f
    b2 = b1 + stride_f
    b3 = b2 + stride_f
    first = (t == 0) & (k < 3)
    firstb = first & (t + 1 < W)  # t = 0 where first holds
    n00 = tl.load(b0, mask=first & ok0, other=0).to(tl.int32)
    n10 = tl.load(b1, mask=first & ok1, other=0).to(tl.int32)
    n20 = tl.load(b2, mask=first & ok2, other=0).to(tl.int32)
    n30 = tl.load(b3, mask=first & ok3, other=0).to(tl.int32)
    n01 = tl.load(b0 + 3, mask=firstb & ok0, other=0).to(tl.int32)
    n11 = tl.load(b1 + 3, mask=firstb & ok1, other=0).to(tl.int32)
    n21 = tl.load(b2 + 3, mask=firstb & ok2, other=0).to(tl.int32)
    n31 = tl.load(b3 + 3, mask=firstb & ok3, other=0).to(tl.int32)
    steps = (H + 3) // 4 + (W + 1) // 2 - 1
    for s in range(0, steps):
        c0 = (s - t) * 2
        oka = (c0 >= 0) & (c0 < W) & (k < 3)
        okb = (c0 >= 0) & (c0 + 1 < W) & (k < 3)
        a00, a10, a20, a30, a01, a11, a21, a31 = n00, n10, n20, n30, n01, n11, n21, n31
        na = (c0 + 2 >= 0) & (c0 + 2 < W) & (k < 3)
        nb = (c0 + 2 >= 0) & (c0 + 3 < W) & (k < 3)
        o = c0 * 3 + 6
        n00 = tl.load(b0 + o, mask=na & ok0, other=0).to(tl.int32)
        n10 = tl.load(b1 + o, mask=na & ok1, other=0).to(tl.int32)
        n20 = tl.load(b2 + o, mask=na & ok2, other=0).to(tl.int32)
        n30 = tl.load(b3 + o, mask=na & ok3, other=0).to(tl.int32)
        n01 = tl.load(b0 + o + 3, mask=nb & ok0, other=0).to(tl.int32)
        n11 = tl.load(b1 + o + 3, mask=nb & ok1, other=0).to(tl.int32)
        n21 = tl.load(b2 + o + 3, mask=nb & ok2, other=0).to(tl.int32)
        n31 = tl.load(b3 + o + 3, mask=nb & ok3, other=0).to(tl.int32)
        pu = P + (r0 - 1) * W3 + c0 * 3 + k
        u0 = tl.load(pu, mask=oka & ok0 & (r0 > 0), other=0).to(tl.int32)
        u1 = tl.load(pu + 3, mask=okb & ok0 & (r0 > 0), other=0).to(tl.int32)
        v00 = (a00 + _predict(f0, l0, u0, ul0)) & 255
        v01 = (a01 + _predict(f0, v00, u1, u0)) & 255
        v10 = (a10 + _predict(f1, l1, v00, l0)) & 255
        v11 = (a11 + _predict(f1, v10, v01, v00)) & 255
        v20 = (a20 + _predict(f2, l2, v10, l1)) & 255
        v21 = (a21 + _predict(f2, v20, v11, v10)) & 255
        v30 = (a30 + _predict(f3, l3, v20, l2)) & 255
        v31 = (a31 + _predict(f3, v30, v21, v20)) & 255
        q = P + r0 * W3 + c0 * 3 + k
        tl.store(q, v00.to(tl.uint8), mask=oka & ok0)
        tl.store(q + 3, v01.to(tl.uint8), mask=okb & ok0)
        tl.store(q + W3, v10.to(tl.uint8), mask=oka & ok1)
        tl.store(q + W3 + 3, v11.to(tl.uint8), mask=okb & ok1)
        tl.store(q + 2 * W3, v20.to(tl.uint8), mask=oka & ok2)
        tl.store(q + 2 * W3 + 3, v21.to(tl.uint8), mask=okb & ok2)
        tl.store(q + 3 * W3, v30.to(tl.uint8), mask=oka & ok3)
        tl.store(q + 3 * W3 + 3, v31.to(tl.uint8), mask=okb & ok3)
        ul0 = tl.where(okb, u1, tl.where(oka, u0, ul0))
        l0 = tl.where(okb, v01, tl.where(oka, v00, l0))
        l1 = tl.where(okb, v11, tl.where(oka, v10, l1))
        l2 = tl.where(okb, v21, tl.where(oka, v20, l2))
        l3 = tl.where(okb, v31, tl.where(oka, v30, l3))
        tl.debug_barrier()


def unfilter42(filtered, height, width, warps=None):
    out = torch.empty((height, width, 3), dtype=torch.uint8, device=filtered.device)
    block = triton.next_power_of_2(triton.cdiv(height, 4))
    _unfilter42_kernel[(1,)](filtered, out, height, width, filtered.stride(0), BLOCK_T=block,
                             num_warps=warps or max(1, min(32, block // 32)))
    return out


def unfilter4(filtered, height, width, warps=None):
    out = torch.empty((height, width, 3), dtype=torch.uint8, device=filtered.device)
    block = triton.next_power_of_2(triton.cdiv(height, 4))
    _unfilter4_kernel[(1,)](filtered, out, height, width, filtered.stride(0), BLOCK_T=block,
                            num_warps=warps or max(1, min(32, block // 32)))
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
    sizes = [(1, 9), (1, 1), (2, 3), (5, 7), (7, 5), (6, 2), (24, 19), (33, 40)] if interp else \
        [(1, 9), (1, 1), (5, 7), (33, 40), (447, 449), (449, 447), (448, 448), (1024, 1024), (768, 1024)]
    for what, f, want in cases(sizes, dev):
        key = "x".join(map(str, what))
        res["equal"][key] = bool(np.array_equal(unfilter4(f, what[0], what[1]).cpu().numpy(), want))
        res["equal"][key + "_42"] = bool(np.array_equal(unfilter42(f, what[0], what[1]).cpu().numpy(), want))
        if not interp:
            for wp in (1, 2, 4, 8):
                res["equal"][f"{key}_w{wp}"] = bool(np.array_equal(unfilter4(f, what[0], what[1], wp).cpu().numpy(), want))
                res["equal"][f"{key}_42_w{wp}"] = bool(np.array_equal(unfilter42(f, what[0], what[1], wp).cpu().numpy(), want))
        if not interp and what[0] >= 448 and what[2] in ("mixed", "pillow"):
            from triton.testing import do_bench
            fns = {"today": lambda: unfilter_triton(f, what[0], what[1])}
            for wp in (1, 2, 4, 8):
                fns[f"rows4_w{wp}"] = (lambda wp=wp: unfilter4(f, what[0], what[1], wp))
                fns[f"rows4cols2_w{wp}"] = (lambda wp=wp: unfilter42(f, what[0], what[1], wp))
            t = {n: [] for n in fns}
            for _ in range(5):
                for n, fn in fns.items():
                    t[n].append(do_bench(fn, warmup=5, rep=40) * 1e3)
            res["us"][key] = {n: round(statistics.median(v), 1) for n, v in t.items()}
            print(what, res["us"][key], flush=True)
    print("all equal:", all(res["equal"].values()), [k for k, v in res["equal"].items() if not v])
    if len(sys.argv) > 1:
        json.dump(res, open(sys.argv[1], "w"), indent=1)
