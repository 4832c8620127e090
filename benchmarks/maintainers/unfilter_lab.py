"""A PNG's row filters undone on the GPU as a wavefront (KI-23's lever, not in the runtime), checked bit
for bit against libspng and timed beside the host decode (ledger M37).

Pixel (r, c) needs (r, c-1), (r-1, c), (r-1, c-1): step s handles every row r at column c = s - r, so a
single program of BLOCK_R rows runs H + W - 1 steps, each reading the row above from memory (written the
step before: a barrier between steps) and keeping left / upper-left in registers.

    TRITON_INTERPRET=1 python benchmarks/maintainers/unfilter_lab.py --check   # the logic, on a CPU
    python benchmarks/maintainers/unfilter_lab.py OUT.json                      # a GPU: parity and times

Its results on the H200, and the variant that read the row above through `tl.gather` (slower,
closed), are in docs/history/evolution.md M37.
"""
import hashlib, io, json, statistics, sys, time, zlib
import numpy as np
import torch
import triton
import triton.language as tl
from PIL import Image
import imagecodecs

from dohnuts.runtime.timing import device_times_ms


@triton.jit
def _unfilter(F, P, H, W, stride_f, BLOCK_R: tl.constexpr):
    r = tl.arange(0, BLOCK_R)[:, None]
    k = tl.arange(0, 4)[None, :]
    row_ok = r < H
    ftype = tl.load(F + r * stride_f, mask=row_ok, other=0).to(tl.int32)
    left = tl.zeros([BLOCK_R, 4], tl.int32)
    upleft = tl.zeros([BLOCK_R, 4], tl.int32)
    for s in range(0, H + W - 1):
        c = s - r
        ok = row_ok & (c >= 0) & (c < W) & (k < 3)
        raw = tl.load(F + r * stride_f + 1 + c * 3 + k, mask=ok, other=0).to(tl.int32)
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


def unfilter(filtered: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """(H, 1 + 3W) filtered scanlines (uint8, filter byte first) → (H, W, 3) pixels, on their device."""
    out = torch.empty((H, W, 3), dtype=torch.uint8, device=filtered.device)
    block = triton.next_power_of_2(H)
    _unfilter[(1,)](filtered, out, H, W, filtered.stride(0), BLOCK_R=block, num_warps=min(32, max(4, block * 4 // 128)))
    return out


def png_with_filters(pixels: np.ndarray, kinds: np.ndarray) -> bytes:
    """A plain 8-bit RGB PNG whose row r uses filter kinds[r] (0..4), encoded here."""
    H, W, _ = pixels.shape
    x = pixels.astype(np.int32).reshape(H, W * 3)
    rows = []
    for r in range(H):
        a = np.concatenate([[0, 0, 0], x[r, :-3]])
        b = x[r - 1] if r else np.zeros(W * 3, np.int32)
        c = np.concatenate([[0, 0, 0], b[:-3]])
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        pred = [np.zeros_like(a), a, b, (a + b) // 2, paeth][kinds[r]]
        rows.append(bytes([kinds[r]]) + ((x[r] - pred) & 255).astype(np.uint8).tobytes())
    raw = zlib.compress(b"".join(rows), 6)
    def chunk(t, d):
        return len(d).to_bytes(4, "big") + t + d + zlib.crc32(t + d).to_bytes(4, "big")
    ihdr = W.to_bytes(4, "big") + H.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def idat(data: bytes) -> bytes:
    at, out = 8, b""
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        if data[at + 4:at + 8] == b"IDAT":
            out += data[at + 8:at + 8 + n]
        at += 12 + n
    return out


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
        for name, fn in [("host: zlib-ng inflate + pinned copy", host), ("host: libspng decode", lambda: imagecodecs.spng_decode(data)),
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
        for k, v in t.items():
            print(f"{k:46s} {v:7.3f} ms")
        report["times_ms"] = t
        json.dump(report, open(sys.argv[1], "w"), indent=1)
    return 0 if all(v.get("equal", True) for v in report.values() if isinstance(v, dict) and "equal" in v) else 1


if __name__ == "__main__":
    sys.exit(main())
