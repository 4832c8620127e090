"""PNG files for the device path's tests: every row filter, several IDAT chunks, encoded here."""

from __future__ import annotations

import io
import zlib

import numpy as np
from PIL import Image


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + kind + payload + zlib.crc32(kind + payload).to_bytes(4, "big")


def filtered_rows(pixels: np.ndarray, kinds) -> bytes:
    """The PNG scanlines of (H, W, 3) uint8 pixels, row r filtered with kinds[r] (0–4)."""
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
        pred = [np.zeros_like(a), a, b, (a + b) // 2, paeth][int(kinds[r])]
        rows.append(bytes([int(kinds[r])]) + ((x[r] - pred) & 255).astype(np.uint8).tobytes())
    return b"".join(rows)


def png(pixels: np.ndarray, kinds=None, *, idat_parts: int = 1, stream: bytes | None = None) -> bytes:
    """A plain 8-bit RGB PNG of `pixels` with the given row filters (Pillow's own when None), its
    zlib stream split over `idat_parts` IDAT chunks; `stream` replaces the zlib stream."""
    H, W, _ = pixels.shape
    if kinds is None and stream is None:
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        return buf.getvalue() if idat_parts == 1 else _resplit(buf.getvalue(), idat_parts)
    z = stream if stream is not None else zlib.compress(filtered_rows(pixels, kinds), 6)
    cut = [len(z) * i // idat_parts for i in range(idat_parts + 1)]
    ihdr = W.to_bytes(4, "big") + H.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
            + b"".join(_chunk(b"IDAT", z[cut[i]:cut[i + 1]]) for i in range(idat_parts)) + _chunk(b"IEND", b""))


def _resplit(data: bytes, parts: int) -> bytes:
    at, z, head = 8, b"", None
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        if data[at + 4:at + 8] == b"IDAT":
            z += data[at + 8:at + 8 + n]
        elif data[at + 4:at + 8] == b"IHDR":
            head = data[:at + 12 + n]
        at += 12 + n
    cut = [len(z) * i // parts for i in range(parts + 1)]
    return head + b"".join(_chunk(b"IDAT", z[cut[i]:cut[i + 1]]) for i in range(parts)) + _chunk(b"IEND", b"")


def smooth(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(1, h // 16), max(1, w // 16), 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR))


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
