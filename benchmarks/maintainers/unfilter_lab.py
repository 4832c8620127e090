"""A PNG's row filters undone on the GPU as a wavefront (the runtime's kernel, dohnuts/ops/_unfilter_kernel.py),
checked bit for bit against libspng and timed beside the host decode, then one PNG's whole
preparation both ways (`prepare_image`'s host path and the GPU path it takes on a fused device; ledger M37, M42).

Pixel (r, c) needs (r, c-1), (r-1, c), (r-1, c-1): step s handles every row r at column c = s - r, so a
single program of BLOCK_R rows runs H + W - 1 steps, each reading the row above from memory (written the
step before: a barrier between steps) and keeping left / upper-left in registers.

    PYTHONPATH=. TRITON_INTERPRET=1 python benchmarks/maintainers/unfilter_lab.py --check   # the logic, on a CPU
    PYTHONPATH=. python benchmarks/maintainers/unfilter_lab.py OUT.json                      # a GPU: parity and times

Its results on the H200 are in docs/history/evolution.md M37 and M42 (M37 also has the variant that
read the row above through `tl.gather`: slower, closed).
"""
import hashlib, io, json, statistics, sys, time, zlib
import numpy as np
import torch
from PIL import Image
import imagecodecs

from dohnuts.config import preset
from dohnuts.ops._unfilter_kernel import unfilter_triton as unfilter
from dohnuts.runtime.images import _png_image_data as idat, prepare_image
from dohnuts.runtime.timing import device_times_ms
from tests.runtime.png_cases import png as png_with_filters  # a PNG whose row r uses filter kinds[r]


def cases(rng, sizes):
    for (h, w) in sizes:
        smooth = np.asarray(Image.fromarray(rng.integers(0, 256, (max(1, h // 32), max(1, w // 32), 3), dtype=np.uint8))
                            .resize((w, h), Image.BILINEAR))
        noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO(); Image.fromarray(smooth).save(buf, format="PNG")
        yield f"{h}x{w} smooth, Pillow's filters", buf.getvalue()
        yield f"{h}x{w} noise, every filter", png_with_filters(noise, rng.integers(0, 5, h))
        yield f"{h}x{w} smooth, every filter", png_with_filters(smooth, rng.integers(0, 5, h))


def main() -> int:
    check = "--check" in sys.argv
    dev = torch.device("cpu" if check else "cuda")
    rng = np.random.default_rng(0)
    sizes = [(7, 5), (24, 19)] if check else [(448, 448), (512, 384), (1024, 1024), (33, 900)]
    report = {}
    for name, data in cases(rng, sizes):
        want = imagecodecs.spng_decode(data)
        H, W = want.shape[:2]
        inflated = np.frombuffer(imagecodecs.zlibng_decode(idat(data)), np.uint8).reshape(H, 1 + W * 3)
        f = torch.from_numpy(inflated.copy()).to(dev)
        got = unfilter(f, H, W).cpu().numpy()
        ok = bool(np.array_equal(got, want))
        report[name] = {"equal": ok}
        print(f"{name:40s} equal {ok}", flush=True)
        if not ok:
            print("   first differences at", np.argwhere(got != want)[:5].tolist())
    if not check:
        data = next(d for n, d in cases(np.random.default_rng(0), [(448, 448)]) if "Pillow" in n)
        H = W = 448
        z = idat(data)
        pinned = torch.empty((H, 1 + W * 3), dtype=torch.uint8).pin_memory()
        def host():
            buf = imagecodecs.zlibng_decode(z)
            pinned.numpy().reshape(-1)[:] = np.frombuffer(buf, np.uint8)
        t = {}
        def into_pinned():  # the runtime's inflate since M44 (dohnuts.runtime.images._start_on_device)
            imagecodecs.deflate_decode(z, out=pinned.numpy().reshape(-1))
        for name, fn in [("host: zlib-ng inflate + pinned copy", host),
                         ("host: libdeflate inflate into pinned memory", into_pinned),
                         ("host: libspng decode", lambda: imagecodecs.spng_decode(data)),
                         ("host: zlib inflate", lambda: zlib.decompress(z))]:
            ts = []
            for _ in range(100):
                t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
            t[name] = statistics.median(ts) * 1e3
        f = pinned.to("cuda")
        big = torch.randint(0, 256, (1024, 1 + 1024 * 3), dtype=torch.uint8, device="cuda")
        big[:, 0] = 4
        t["device: unfilter kernel 448²"] = statistics.median(device_times_ms(lambda: unfilter(f, H, W), 5, 50))
        ks = device_times_ms(lambda: unfilter(big, 1024, 1024), 2, 20)
        t["device: unfilter kernel 1024² (Paeth rows)"] = statistics.median(ks)
        ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            f = pinned.to("cuda", non_blocking=True); px = unfilter(f, H, W).cpu(); hashlib.sha256(px.numpy()).digest()
            ts.append(time.perf_counter() - t0)
        t["h2d + unfilter + d2h + sha256 (host wall)"] = statistics.median(ts) * 1e3
        # The whole preparation of this PNG both ways on one machine: the host path (no device
        # given: libspng, key, patches) and the GPU path prepare_image takes on a fused device.
        vision = preset("2b").vision
        for name, kw in [("prepare_image, host path", {}), ("prepare_image, GPU path", {"device": torch.device("cuda")})]:
            ts = []
            for _ in range(100):
                t0 = time.perf_counter(); prepare_image(data, vision, **kw); ts.append(time.perf_counter() - t0)
            t[name] = statistics.median(ts) * 1e3
        for k, v in t.items():
            print(f"{k:46s} {v:7.3f} ms")
        report["times_ms"] = t
        json.dump(report, open(sys.argv[1], "w"), indent=1)
    return 0 if all(v.get("equal", True) for v in report.values() if isinstance(v, dict) and "equal" in v) else 1


if __name__ == "__main__":
    sys.exit(main())
