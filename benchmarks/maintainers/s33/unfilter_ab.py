"""Session 33's A/B (kept in git at one commit, then removed: benchmarks/README.md): the unfilter wavefront's variants on one GPU, bit-checked against libspng.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s33/unfilter_ab.py OUT.json  (from the repository root)"""
import io, json, statistics, sys
import numpy as np, torch, triton, triton.language as tl, imagecodecs
from PIL import Image
from dohnuts.runtime.images import _png_image_data as idat
import importlib.util
from pathlib import Path
_spec = importlib.util.spec_from_file_location("old_unfilter_kernel", Path(__file__).with_name("old_unfilter_kernel.py"))
_old = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_old)
v0 = _old._unfilter_kernel  # the runtime's kernel of M42-M45 (at 27e6a0a)
from tests.runtime.png_cases import png as png_with_filters


@triton.jit
def v1(F, P, H, W, stride_f, BLOCK_R: tl.constexpr, AHEAD: tl.constexpr):
    r = tl.arange(0, BLOCK_R)[:, None]
    k = tl.arange(0, 4)[None, :]
    row_ok = r < H
    ftype = tl.load(F + r * stride_f, mask=row_ok, other=0).to(tl.int32)
    left = tl.zeros([BLOCK_R, 4], tl.int32)
    upleft = tl.zeros([BLOCK_R, 4], tl.int32)
    raw1 = tl.load(F + r * stride_f + 1 + (0 - r) * 3 + k, mask=row_ok & (r == 0) & (k < 3), other=0).to(tl.int32)
    raw2 = tl.load(F + r * stride_f + 1 + (1 - r) * 3 + k, mask=row_ok & (1 - r >= 0) & (1 - r < W) & (k < 3), other=0).to(tl.int32)
    for s in range(0, H + W - 1):
        c = s - r
        ok = row_ok & (c >= 0) & (c < W) & (k < 3)
        raw = raw1
        if AHEAD == 2:
            raw1 = raw2
            cn = c + 2
            raw2 = tl.load(F + r * stride_f + 1 + cn * 3 + k, mask=row_ok & (cn >= 0) & (cn < W) & (k < 3), other=0).to(tl.int32)
        else:
            cn = c + 1
            raw1 = tl.load(F + r * stride_f + 1 + cn * 3 + k, mask=row_ok & (cn >= 0) & (cn < W) & (k < 3), other=0).to(tl.int32)
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
        tl.debug_barrier()


def cases():
    rng = np.random.default_rng(0)
    for h, w in [(448, 448), (1024, 1024), (33, 900)]:
        smooth = np.asarray(Image.fromarray(rng.integers(0, 256, (max(1, h // 32), max(1, w // 32), 3), dtype=np.uint8)).resize((w, h), Image.BILINEAR))
        buf = io.BytesIO(); Image.fromarray(smooth).save(buf, format="PNG")
        yield f"{h}x{w} pillow", buf.getvalue()
        yield f"{h}x{w} every filter", png_with_filters(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), rng.integers(0, 5, h))


def timed(fn, n=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    out = {}
    for name, data in cases():
        want = imagecodecs.spng_decode(data)
        H, W = want.shape[:2]
        f = torch.from_numpy(np.frombuffer(imagecodecs.zlibng_decode(idat(data)), np.uint8).reshape(H, 1 + 3 * W).copy()).cuda()
        block = triton.next_power_of_2(H)
        base_warps = min(32, max(4, block * 4 // 128))
        variants = {f"v0 head w{base_warps}": lambda o, w=base_warps: v0[(1,)](f, o, H, W, f.stride(0), BLOCK_R=block, num_warps=w)}
        for ahead in (1, 2):
            for w in sorted({4, 8, base_warps, 32}):
                variants[f"v1 ahead{ahead} w{w}"] = lambda o, w=w, a=ahead: v1[(1,)](f, o, H, W, f.stride(0), BLOCK_R=block, AHEAD=a, num_warps=w)
        for vn, run in variants.items():
            o = torch.zeros((H, W, 3), dtype=torch.uint8, device="cuda")
            try:
                run(o); torch.cuda.synchronize()
                eq = bool(np.array_equal(o.cpu().numpy(), want))
                ms = timed(lambda: run(o))
            except Exception as e:
                eq, ms = repr(e)[:200], None
            out[f"{name} | {vn}"] = {"equal": eq, "ms": ms}
            print(f"{name:22s} {vn:20s} equal {eq} {ms if ms is None else round(ms, 4)} ms", flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)


main()
