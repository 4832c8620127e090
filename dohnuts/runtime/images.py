"""Image preprocessing: file or bytes → patches for the vision tower, under one fixed policy.

The policy is versioned (`PREPROCESS_POLICY`) because cached image features are only valid for
the exact pixels the tower saw: change any step below and the version must change, which
changes every content key (dohnuts.runtime.image_cache) and so invalidates nothing by accident.

Policy v1 (the Qwen3-VL image processor's arithmetic, with a smaller pixel budget):

1. Decode with Pillow (first frame only; EXIF orientation is *not* applied, like transformers).
   Images over `MAX_DECODE_PIXELS` are refused from the header, before any pixel is decoded.
   The common PNG — 8-bit truecolour, not interlaced, no transparency — is decoded by libspng
   (through imagecodecs) instead: the same pixels (PNG is lossless) in less time than Pillow's, and
   with the GIL released, so the prediction workers decode in parallel while the launching thread
   runs (pyspng, the binding used before, held it; docs/history/evolution.md M35, M37); any other
   file, or one libspng refuses, goes to Pillow, whose errors are the ones reported.
2. Convert to RGB, compositing transparency onto white (as transformers' `convert_to_rgb`).
3. Resize (bicubic, on uint8) to `smart_resize`: both sides multiples of patch·merge (32), aspect
   kept, pixel count within [MIN_PIXELS, MAX_PIXELS] = [256², 1024²], i.e. 64..1024 text tokens.
   Qwen3-VL's own budget is 256²..4096², up to 16384 tokens an image: far too many for a
   scoring model on one card, so v1 caps at 1024².
4. Rescale to [0, 1], then normalise with mean = std = 0.5 per channel (Qwen3-VL's
   preprocessor values; Qwen2-VL's processor defaults to the OpenAI CLIP mean/std instead).
5. Repeat the frame temporal_patch_size times and flatten into (N, C·Tp·P·P) patches in
   spatial-merge-block order — exactly the rows of transformers' Qwen2-VL image processor.

Where each step runs: the host decodes, keys, resizes and cuts the uint8 pixels into patches
(`PreparedImage.patches`, (N, C·P·P) uint8: a quarter of a float frame's bytes, and no frame
repeat); steps 4 and 5 run on the device, where the tower reads them (`pixel_values`, the same
arithmetic element by element, so the values equal the reference processor's bit for bit). On the
H200's host the float steps and the copy into pinned memory had been half of a cold image's
preparation (docs/history/evolution.md M32). On a GPU that runs the fused kernels, a plain PNG
already on the tower's grid skips libspng as well: the host only inflates its zlib stream (libdeflate,
into page-locked memory), and the GPU undoes the row filters (dohnuts.ops.png_unfilter) and cuts
the patches, which stay there; the pixels come back once for the key (`_start_on_device`).

The content key is sha256 over the policy identity, the patch geometry, the original width and
height and the decoded RGB bytes — the bytes as a list of sha256 digests of `KEY_CHUNK`-byte
pieces, hashed at once on up to 4 threads where the host has 4 cores or more (hashlib releases the
GIL; `KEY_THREADS`): the same pixels hit under any
file name or lossless format, different pixels never do (a collision of the outer hash or of a
piece's is one of sha256). A fixed piece size keeps the key one machine's and the next's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import threading
import time
import warnings
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import imagecodecs
import numpy as np
import torch
from PIL import Image

from dohnuts.config import VisionConfig
from dohnuts.errors import DohnutsError, ImageError
from dohnuts.ops import kernel_status
from dohnuts.ops.unfilter import MAX_UNFILTER_ROWS, png_unfilter
from dohnuts.schema import check_file, read_file

PREPROCESS_POLICY = (
    "v1: pillow decode (first frame, no exif transpose), RGB over white, smart_resize bicubic to "
    "[65536, 1048576] px in multiples of patch*merge, x/255, mean=std=0.5, frame repeated to temporal_patch_size, "
    "qwen2-vl merge-block patch order"
)
MIN_PIXELS = 256 * 256
MAX_PIXELS = 1024 * 1024
MAX_ASPECT_RATIO = 200
# An image file is read whole (hashed, then decoded from memory): a file over this size is refused by
# its stat, before anything is read (8192² RGBA uncompressed is 256 MiB). A device (/dev/zero), a
# FIFO or a socket is refused by its type, likewise (dohnuts.schema.read_file).
MAX_IMAGE_BYTES = 256 * 1024 * 1024
# Refuse larger images from the header alone. 8192² stays below Pillow's own bomb warning
# threshold (≈ 89.5 M pixels), so an image we accept never trips Pillow's check first.
MAX_DECODE_PIXELS = 8192 * 8192
IMAGE_MEAN = (0.5, 0.5, 0.5)  # one value for every channel: `pixel_values` relies on it
IMAGE_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True, eq=False)
class PreparedImage:
    """One image ready for the tower. `key` identifies its pixels under this policy.

    patches (N, C·P·P) uint8 pixels in merge-block order (`pixel_values` makes the tower's
    (N, C·Tp·P·P) float input of them) — or None when the image was recognised by its file bytes
    (`ImageKeyMemo`) and its features were cached, so nothing was decoded;
    grid_thw = (1, H/P, W/P) patches; token_count = merged tokens it occupies in the text;
    width/height are the decoded size.
    """

    key: str
    patches: torch.Tensor | None
    grid_thw: tuple[int, int, int]
    token_count: int
    width: int
    height: int
    source: str


    @property
    def patch_count(self) -> int:
        return self.grid_thw[0] * self.grid_thw[1] * self.grid_thw[2]


class ImageKeyMemo:
    """File bytes → what decoding them gave (content key, grid, size), bounded LRU, thread-safe.

    Decoding, resizing and hashing the pixels cost milliseconds per image, for every request,
    because the feature cache is keyed by decoded pixels. The same bytes always decode to the same
    pixels under one policy, so a digest of the file's bytes (sha256: with the SHA extensions of
    today's x86 CPUs faster than blake2b) finds the content key of an image seen before; when its
    features are cached, the request needs no pixels at all. A new file is read once: `read`
    returns the bytes it hashed, which the decode takes.

    A file whose stat signature (device, inode, size, mtime and ctime in ns) is unchanged since it
    was hashed is not read again. As in git's index, a signature is trusted only when the file had
    not been modified within a "racy" window of its hashing: a second write in the same timestamp
    tick as the read could otherwise go unseen. The window is `RACY_S` where the file system stamps
    in whole seconds (FAT, some network file systems: a modification time with no sub-second
    part), else `RACY_FINE_S` (sub-second stamps advance with the kernel's clock tick, at most
    10 ms).
    """

    RACY_S = 2.0
    RACY_FINE_S = 0.1

    def __init__(self, max_entries: int = 4096):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, PreparedImage] = OrderedDict()
        self._stats: OrderedDict[str, tuple[tuple, str]] = OrderedDict()  # path → (signature, digest)
        self._lock = threading.Lock()

    @staticmethod
    def _hash(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def digest(self, source: str | Path | bytes) -> str | None:
        """The digest of the file's bytes (`read`'s, without the bytes)."""
        return self.read(source)[0]

    def read(self, source: str | Path | bytes) -> tuple[str | None, bytes | None]:
        """(digest of the file's bytes, the bytes where this read them): the digest is remembered
        per path while the file's stat signature is unchanged, and then nothing is read (bytes
        None). (None, None) when the file cannot be read — a device, a FIFO, a name too long, over
        MAX_IMAGE_BYTES, missing: decoding then reports why. The caller decodes the bytes it was
        given instead of reading the file again."""
        if isinstance(source, (bytes, bytearray)):
            return self._hash(source), bytes(source)
        path = str(source)
        try:
            st = check_file(path, max_bytes=MAX_IMAGE_BYTES, error=ImageError, what="an image file")
            sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            with self._lock:
                known = self._stats.get(path)
            if known is not None and known[0] == sig:
                return known[1], None
            data = read_file(path, max_bytes=MAX_IMAGE_BYTES, error=ImageError, what="an image file")
        except DohnutsError:
            return None, None
        digest = self._hash(data)
        racy_s = self.RACY_S if st.st_mtime_ns % 1_000_000_000 == 0 else self.RACY_FINE_S
        if time.time_ns() - st.st_mtime_ns > racy_s * 1e9:
            with self._lock:
                self._stats[path] = (sig, digest)
                self._stats.move_to_end(path)
                while len(self._stats) > self.max_entries:
                    self._stats.popitem(last=False)
        return digest, data

    def clear(self) -> None:
        """Forget every file and digest (as a new memo)."""
        with self._lock:
            self._entries.clear()
            self._stats.clear()

    def get(self, digest: str | None) -> PreparedImage | None:
        if digest is None:
            return None
        with self._lock:
            hit = self._entries.get(digest)
            if hit is not None:
                self._entries.move_to_end(digest)
            return hit

    def put(self, digest: str | None, img: PreparedImage) -> None:
        """Remember `img` without its patches (the memo holds metadata, not pixels)."""
        if digest is None:
            return

        with self._lock:
            self._entries[digest] = replace(img, patches=None)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


def smart_resize(height: int, width: int, factor: int, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, aspect kept, pixels in [min, max].

    The same arithmetic as transformers' Qwen2-VL `smart_resize` (Python's round-half-even included),
    so our grids equal the reference processor's.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} exceeds {MAX_ASPECT_RATIO}")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def decode_rgb(source: str | Path | bytes, *, name: str | None = None) -> Image.Image:
    """Decode an image file (path or bytes) to a loaded RGB Pillow image; ImageError otherwise."""
    where = name if name is not None else ("<bytes>" if isinstance(source, (bytes, bytearray)) else str(source))
    if isinstance(source, (bytes, bytearray)):
        if not source:
            raise ImageError("is empty (0 bytes)", source=where)
        fp = io.BytesIO(source)
    else:  # checked by stat before it is opened (type, size, name), then read whole
        data = read_file(source, max_bytes=MAX_IMAGE_BYTES, error=ImageError, what="an image file")
        if not data:
            raise ImageError("is empty (0 bytes)", source=where)
        fp = io.BytesIO(data)
    try:
        # Pillow warns (then errors at 2×) on huge images; make its warning an error too. Our own
        # header check below is the real limit, so this only matters above ≈ 89.5 M pixels.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(fp) as im:
                w, h = im.size
                if w <= 0 or h <= 0:
                    raise ImageError(f"has zero size ({w}×{h})", source=where)
                if w * h > MAX_DECODE_PIXELS:
                    raise ImageError(f"is {w}×{h} = {w * h} pixels, over the limit of {MAX_DECODE_PIXELS} "
                                     "(possible decompression bomb)", source=where)
                im.load()
                return _to_rgb(im)
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"is too large to decode (possible decompression bomb): {_one_line(exc)}",
                         source=where) from None
    except Image.UnidentifiedImageError:
        raise ImageError("cannot be identified as an image (unknown format, or an invalid header such as a zero "
                         "width or height)", source=where) from None
    except MemoryError:
        raise ImageError("ran out of memory while decoding", source=where) from None
    except Exception as exc:  # Pillow signals truncated/corrupt data with OSError, SyntaxError, ValueError, ...
        raise ImageError(f"cannot be decoded (truncated or corrupt): {_one_line(exc)}", source=where) from None


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _plain_png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of an 8-bit truecolour, non-interlaced PNG with no tRNS chunk before its
    image data (no transparency to composite), within the decode limit and with every chunk's CRC
    intact (libspng, as imagecodecs calls it, ignores some CRCs where Pillow refuses the file); None otherwise."""
    if len(data) < 33 or data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        return None
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    bit_depth, colour_type, interlace = data[24], data[25], data[28]
    if bit_depth != 8 or colour_type != 2 or interlace != 0 or not 0 < width * height <= MAX_DECODE_PIXELS:
        return None
    at, image_data, view = 8, False, memoryview(data)
    while at + 12 <= len(data):
        length, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8]
        end = at + 12 + length
        if end > len(data) or zlib.crc32(view[at + 4:end - 4]) != int.from_bytes(data[end - 4:end], "big"):
            return None
        if kind == b"tRNS" and not image_data:  # a transparent colour (it must precede the image data)
            return None
        if kind == b"IEND":
            return (width, height) if image_data else None
        image_data |= kind == b"IDAT"
        at = end
    return None


def _png_image_data(data: bytes) -> bytes:
    """The IDAT chunks' payloads of a PNG `_plain_png_size` accepted (its chunks walked and checked
    there), joined: one zlib stream of filtered scanlines."""
    parts, at, view = [], 8, memoryview(data)
    while at + 12 <= len(data):
        length, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8]
        if kind == b"IEND":
            break
        if kind == b"IDAT":
            parts.append(view[at + 8:at + 8 + length])
        at += 12 + length
    return b"".join(parts)


def decode_pixels(source: str | Path | bytes, *, name: str | None = None) -> np.ndarray:
    """Decode an image file (path or bytes) to RGB pixels (H, W, 3) uint8 under the policy's step
    1–2; ImageError otherwise. Plain PNGs by libspng, everything else by Pillow (module docstring)."""
    where = name if name is not None else ("<bytes>" if isinstance(source, (bytes, bytearray)) else str(source))
    data = bytes(source) if isinstance(source, (bytes, bytearray)) else read_file(
        source, max_bytes=MAX_IMAGE_BYTES, error=ImageError, what="an image file")
    size = _plain_png_size(data)
    if size is not None:
        try:
            pixels = imagecodecs.spng_decode(data)
        except Exception:  # corrupt or truncated: Pillow decodes it again and words the error
            pixels = None
        if pixels is not None and pixels.shape == (size[1], size[0], 3) and pixels.dtype == np.uint8:
            return pixels
    return np.asarray(decode_rgb(data, name=where))


def _to_rgb(im: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (transformers' convert_to_rgb)."""
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


KEY_CHUNK = 128 * 1024  # bytes of pixels a piece of the content key covers (part of the key's definition)
# Threads beside the caller that hash a key's pieces: none on a host of fewer than 4 cores, where a
# thread hand-off cost more than it saved within a prepare (docs/history/evolution.md M46).
KEY_THREADS = min(4, (os.cpu_count() or 1) - 1) if (os.cpu_count() or 1) >= 4 else 0
_KEY_POOL: list[ThreadPoolExecutor] = []
_KEY_POOL_LOCK = threading.Lock()


def _forget_key_pool() -> None:
    """In a forked child, which has none of the parent's threads (nor a lock one of them held)."""
    global _KEY_POOL_LOCK
    _KEY_POOL.clear()
    _KEY_POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_key_pool)


def _key_pool() -> ThreadPoolExecutor:
    """The threads that hash a key's pieces beside the caller (made once, on first use)."""
    if not _KEY_POOL:
        with _KEY_POOL_LOCK:
            if not _KEY_POOL:
                _KEY_POOL.append(ThreadPoolExecutor(max_workers=KEY_THREADS, thread_name_prefix="dohnuts-key"))
    return _KEY_POOL[0]


def _piece_digest(piece: memoryview) -> bytes:
    return hashlib.sha256(piece).digest()


def content_key(rgb: Image.Image | np.ndarray, vision: VisionConfig) -> str:
    """sha256 over policy, patch geometry, size and the sha256 of each `KEY_CHUNK` bytes of the
    decoded RGB pixels (hex; module docstring): a Pillow RGB image or its (H, W, 3) uint8 pixels
    give the same key. Every (KEY_THREADS + 1)-th piece is hashed on the calling thread, the others
    beside it (all on the caller where KEY_THREADS is 0)."""
    pixels = np.ascontiguousarray(np.asarray(rgb))
    h, w = pixels.shape[:2]
    header = (f"{PREPROCESS_POLICY}|patch={vision.patch_size}|temporal={vision.temporal_patch_size}"
              f"|merge={vision.spatial_merge_size}|channels={vision.in_channels}|{w}x{h}"
              f"|sha256 of {KEY_CHUNK}-byte pieces|").encode()
    data = memoryview(pixels).cast("B")
    pieces = [data[i:i + KEY_CHUNK] for i in range(0, len(data), KEY_CHUNK)] or [data]
    # every (KEY_THREADS + 1)-th piece on this thread, the others on the pool: an even share each
    mine = range(0, len(pieces), KEY_THREADS + 1)
    later = {i: _key_pool().submit(_piece_digest, p) for i, p in enumerate(pieces) if i not in mine}
    digests = {i: _piece_digest(pieces[i]) for i in mine}
    digest = hashlib.sha256(header)
    for i in range(len(pieces)):
        digest.update(digests[i] if i in digests else later[i].result())
    return digest.hexdigest()


def patchify(pixels: np.ndarray, patch_size: int, merge_size: int) -> torch.Tensor:
    """uint8 pixels (H, W, C) → (H/P · W/P, C·P·P) uint8 in merge-block order (Qwen2-VL processor
    layout, before its frame repeat).

    Row r is patch (block_row, block_col, in_row, in_col) in that nesting order; within a row the
    values run over (channel, pixel row, pixel column) — the Conv3d kernel's order without its
    frame axis.
    """
    H, W, C = pixels.shape
    P, m = patch_size, merge_size
    gh, gw = H // P, W // P
    x = pixels.reshape(gh // m, m, P, gw // m, m, P, C)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # (gh/m, gw/m, m, m, C, P, P)
    # One copy of the uint8 pixels, in numpy: torch's copy of this strided view runs on its intra-op
    # threads, which on a loaded host (or beside the run's other threads) cost milliseconds a call.
    return torch.from_numpy(np.ascontiguousarray(x).reshape(gh * gw, C * P * P))


def pixel_values(patches: torch.Tensor, temporal_patch_size: int) -> torch.Tensor:
    """uint8 patches (N, C·P·P) → the tower's float32 input (N, C·Tp·P·P), on their device:
    x / 255 in float64 rounded to float32, normalised in float32 ((x − mean) / std), the frame
    repeated Tp times — the reference processor's arithmetic element by element, so the result
    equals its `pixel_values` bit for bit. A few elementwise kernels on the GPU, and capturable
    in a CUDA graph (no host tensor is read)."""
    N, row = patches.shape
    x = (patches.double() * (1 / 255)).float()  # (N, C·P·P)
    C = len(IMAGE_MEAN)
    x = (x - IMAGE_MEAN[0]) / IMAGE_STD[0]  # the policy's mean and std are one value for every channel
    x = x.view(N, C, 1, row // C)
    return x.expand(N, C, temporal_patch_size, row // C).reshape(N, C * temporal_patch_size * (row // C))


def patchify_device(pixels: torch.Tensor, patch_size: int, merge_size: int) -> torch.Tensor:
    """`patchify` of (H, W, C) uint8 pixels already on a GPU: the same rows, one copy kernel there."""
    H, W, C = pixels.shape
    P, m = patch_size, merge_size
    gh, gw = H // P, W // P
    x = pixels.view(gh // m, m, P, gw // m, m, P, C).permute(0, 3, 1, 4, 6, 2, 5)
    return x.reshape(gh * gw, C * P * P)


_STREAMS = threading.local()  # per preparing thread: its own stream on each device


def _own_stream(device: torch.device) -> torch.cuda.Stream:
    streams = _STREAMS.__dict__.setdefault("by_device", {})
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return streams[device]


def _unfilters_on(device: torch.device) -> bool:
    """Whether a plain PNG is prepared on `device`: a GPU whose probe shows the fused kernels."""
    return device.type == "cuda" and kernel_status(device) == "fused"


class PendingImage:
    """An image whose preparation may still run on the device (`start_image`): `image` has every
    field but its key ("" until then); `finish()` waits for the device and returns the keyed image.
    Until the wait it holds the page-locked buffers the device copies from and into, so a caller that
    gives up before `finish` must still call `wait()`."""

    def __init__(self, image: PreparedImage, vision: VisionConfig | None = None,
                 stream: torch.cuda.Stream | None = None, buffers: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.image = image  # keyed already where `buffers` is None (the host path)
        self._vision, self._stream, self._buffers = vision, stream, buffers  # buffers: (inflated rows, pixels back)

    def wait(self) -> None:
        """The device's work done: the patches complete for any stream, the buffers free to go."""
        if self._stream is not None:
            self._stream.synchronize()

    def finish(self) -> PreparedImage:
        """The image with its key: the wait, then sha256 over the pixels that came back."""
        if self._buffers is None:
            return self.image
        self.wait()
        return replace(self.image, key=content_key(self._buffers[1].numpy(), self._vision))


def _start_on_device(data: bytes, vision: VisionConfig, device: torch.device, where: str) -> PendingImage | None:
    """A plain PNG already on the tower's grid (no resize) prepared where the tower runs: the host
    inflates its stream into page-locked memory (libdeflate, into a buffer of the known size), the
    device undoes the row filters and cuts the patches (dohnuts.ops.png_unfilter, on this thread's
    own stream), and the pixels come back once for the content key — the same key and patches as
    the host path, with libspng's decode (most of a cold call's preparation) replaced by an inflate
    (docs/history/evolution.md M37, M42 and M44 have the times). Returns with the device work
    launched, the key left to `PendingImage.finish` (the caller's host work runs meanwhile). None
    where the image does not qualify or its stream is not a whole, valid one (the host path then
    decodes it and words any error)."""
    size = _plain_png_size(data)
    if size is None:
        return None
    width, height = size
    factor = vision.patch_size * vision.spatial_merge_size
    if height > MAX_UNFILTER_ROWS or height % factor or width % factor:
        return None
    try:
        if smart_resize(height, width, factor) != (height, width):
            return None
    except ValueError:
        return None
    stride = 1 + 3 * width
    cuda = device.type == "cuda"  # prepare_image sends a GPU; the CPU tests call this with the CPU
    rows = torch.empty(height * stride, dtype=torch.uint8, pin_memory=cuda)
    try:
        inflated = imagecodecs.deflate_decode(_png_image_data(data), out=rows.numpy())
    except Exception:  # too long, truncated, a bad checksum: the host path reports it
        return None
    if len(inflated) != rows.numel() or int(rows.numpy()[::stride].max()) > 4:
        return None
    stream = _own_stream(device) if cuda else None
    back = torch.empty((height, width, 3), dtype=torch.uint8, pin_memory=cuda)
    try:
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            filtered = rows.to(device, non_blocking=True).view(height, stride)
            pixels = png_unfilter(filtered, height, width)
            patches = patchify_device(pixels, vision.patch_size, vision.spatial_merge_size)
            back.copy_(pixels, non_blocking=cuda)
    except BaseException:
        if cuda:
            stream.synchronize()  # what was launched lands before its buffers can go
        raise
    grid = (1, height // vision.patch_size, width // vision.patch_size)
    m = vision.spatial_merge_size
    image = PreparedImage(key="", patches=patches, grid_thw=grid, token_count=grid[1] * grid[2] // (m * m),
                          width=width, height=height, source=where)
    return PendingImage(image, vision, stream, (rows, back))


def _prepare_on_host(data: bytes, vision: VisionConfig, where: str) -> PreparedImage:
    """The host path: libspng or Pillow, the key, the resize and the patches (module docstring)."""
    pixels = decode_pixels(data, name=where)  # (H, W, 3) uint8
    key = content_key(pixels, vision)
    height, width = pixels.shape[:2]
    factor = vision.patch_size * vision.spatial_merge_size
    try:
        th, tw = smart_resize(height, width, factor)
    except ValueError as exc:
        raise ImageError(f"cannot be resized ({exc})", source=where) from None
    if (th, tw) != (height, width):
        pixels = np.asarray(Image.fromarray(pixels).resize((tw, th), resample=Image.Resampling.BICUBIC))
    patches = patchify(pixels, vision.patch_size, vision.spatial_merge_size)  # (N, C·P·P) uint8
    grid = (1, th // vision.patch_size, tw // vision.patch_size)
    m = vision.spatial_merge_size
    return PreparedImage(key=key, patches=patches, grid_thw=grid,
                         token_count=grid[0] * grid[1] * grid[2] // (m * m),
                         width=width, height=height, source=where)


def start_image(source: str | Path | bytes, vision: VisionConfig, *, name: str | None = None,
                device: torch.device | None = None) -> PendingImage:
    """`prepare_image` in two steps: returns once the device path's work is launched (its image
    without a key, the grid and token count known), `finish()` keys it; the host path's image
    comes back finished. The session plans and collates a request in between (KI-23)."""
    where = name if name is not None else ("<bytes>" if isinstance(source, (bytes, bytearray)) else str(source))
    if vision.in_channels != 3:
        raise ImageError(f"the vision tower expects {vision.in_channels} channels; policy v1 produces RGB",
                         source=where)
    data = bytes(source) if isinstance(source, (bytes, bytearray)) else read_file(
        source, max_bytes=MAX_IMAGE_BYTES, error=ImageError, what="an image file")
    if device is not None and _unfilters_on(device):
        pending = _start_on_device(data, vision, device, where)
        if pending is not None:
            return pending
    return PendingImage(_prepare_on_host(data, vision, where))


def prepare_image(source: str | Path | bytes, vision: VisionConfig, *, name: str | None = None,
                  device: torch.device | None = None) -> PreparedImage:
    """Decode, key, resize, normalise and patchify one image under PREPROCESS_POLICY.

    `device`: where the tower runs (the session passes its own). On a GPU that runs the fused
    kernels a plain PNG that needs no resize is unfiltered and cut into patches there
    (`_start_on_device`: its `patches` are on that device); every other image, and every image
    on another device, on the host. Both give the same key and patches."""
    return start_image(source, vision, name=name, device=device).finish()
