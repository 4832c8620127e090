"""Preprocessing: patches equal transformers' Qwen2-VL image processor; keys follow pixels; bad files fail cleanly."""

from __future__ import annotations

import io
import struct
import warnings
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from dohnuts.config import preset
from dohnuts.errors import ImageError
from dohnuts.runtime.images import MAX_PIXELS, MIN_PIXELS, pixel_values, prepare_image, smart_resize

VISION = preset("tiny").vision  # patch 16, temporal 2, merge 2 (the public sizes' geometry)
FACTOR = VISION.patch_size * VISION.spatial_merge_size


def _random_image(h: int, w: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(arr[..., 0] if channels == 1 else arr, mode)


def _encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _hf_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=VISION.patch_size, temporal_patch_size=VISION.temporal_patch_size,
        merge_size=VISION.spatial_merge_size, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )


@pytest.mark.parametrize("h, w, mode", [
    (100, 150, "RGB"),  # upscaled to the minimum budget
    (1500, 900, "RGB"),  # downscaled to the maximum budget
    (256, 320, "RGB"),  # already on the grid: no resize
    (90, 200, "RGBA"),  # transparency composited onto white
    (33, 47, "L"),  # greyscale
])
def test_patches_equal_transformers_processor(h, w, mode):
    """The slow (PIL) Qwen2VL processor with Qwen3-VL settings gives the same pixel_values and grid."""
    data = _encode(_random_image(h, w, mode), "PNG")
    ours = prepare_image(data, VISION, name="x.png")
    ref = _hf_processor()(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist()
    assert ours.patches.dtype == torch.uint8  # the host's part: pixels cut into patches
    values = pixel_values(ours.patches, VISION.temporal_patch_size)  # the device's part
    assert values.dtype == torch.float32 and torch.equal(values, ref["pixel_values"])  # bit for bit
    assert ours.token_count == ours.patches.shape[0] // VISION.spatial_merge_size ** 2


def test_patch_order_by_hand(tmp_path):
    """On a 256×320 image (no resize), check rows against the documented layout directly."""
    im = _random_image(256, 320, seed=7)
    path = tmp_path / "grid.png"
    im.save(path)
    prepared = prepare_image(path, VISION)
    pixels = (torch.from_numpy(np.array(im)).float() / 255 - 0.5) / 0.5  # (H, W, C)
    P = VISION.patch_size
    gw = 320 // P  # 20 patch columns, 10 merge blocks per block row

    def expected(r: int, c: int) -> torch.Tensor:  # patch at patch row r, column c
        block = pixels[r * P:(r + 1) * P, c * P:(c + 1) * P].permute(2, 0, 1)  # (C, P, P)
        return torch.stack([block, block], dim=1).flatten()  # (C, Tp, P, P): the frame twice

    # Row index = ((block_row · blocks_per_row + block_col) · 2 + in_row) · 2 + in_col.
    values = pixel_values(prepared.patches, VISION.temporal_patch_size)
    raw = torch.from_numpy(np.array(im))  # (H, W, C) uint8
    for index, (r, c) in {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 2), 4 * (gw // 2): (2, 0),
                          4 * (gw // 2) + 7: (3, 3)}.items():
        assert torch.allclose(values[index], expected(r, c), atol=1e-6), (index, r, c)
        assert torch.equal(prepared.patches[index], raw[r * P:(r + 1) * P, c * P:(c + 1) * P].permute(2, 0, 1).flatten())
    assert prepared.grid_thw == (1, 16, 20) and prepared.width == 320 and prepared.height == 256


@pytest.mark.parametrize("h, w", [(1, 1), (7, 1300), (3000, 4000), (480, 640), (32, 32), (100, 19000)])
def test_smart_resize_bounds(h, w):
    th, tw = smart_resize(h, w, FACTOR)
    assert th % FACTOR == 0 and tw % FACTOR == 0
    assert MIN_PIXELS <= th * tw <= MAX_PIXELS
    # Aspect kept to within one grid step on each side.
    assert abs(th / tw - h / w) <= (h / w) * (FACTOR / th + FACTOR / tw) + 1e-9


def test_same_pixels_same_key_in_any_lossless_format(tmp_path):
    im = _random_image(61, 83, seed=3)
    files = {"a.png": ("PNG", {}), "copy_b.webp": ("WEBP", {"lossless": True}), "c.bmp": ("BMP", {})}
    keys = set()
    for name, (fmt, kwargs) in files.items():
        (tmp_path / name).write_bytes(_encode(im, fmt, **kwargs))
        keys.add(prepare_image(tmp_path / name, VISION).key)
    keys.add(prepare_image(_encode(im, "PNG"), VISION, name="upload").key)  # bytes, not a path
    assert len(keys) == 1

    changed = np.asarray(im).copy()
    changed[40, 17, 1] ^= 1  # one channel of one pixel, off by one
    other = prepare_image(_encode(Image.fromarray(changed), "PNG"), VISION, name="changed.png")
    assert other.key not in keys
    assert not torch.equal(other.patches, prepare_image(tmp_path / "a.png", VISION).patches)


@pytest.fixture
def key_threads(request, monkeypatch):
    """The key's piece threads set to `request.param` (0: every piece on the caller), a new pool."""
    from dohnuts.runtime import images

    monkeypatch.setattr(images, "KEY_THREADS", request.param)
    monkeypatch.setattr(images, "_KEY_POOL", [])
    yield request.param
    for pool in images._KEY_POOL:
        pool.shutdown()


@pytest.mark.parametrize("key_threads", [0, 1, 4], indirect=True)
@pytest.mark.parametrize("shape", [(4, 6, 3), (256, 171, 3), (448, 448, 3)])
def test_the_key_is_sha256_over_the_header_and_each_pieces_sha256(shape, key_threads):
    """The key by hand: sha256(header ‖ sha256(piece 0) ‖ sha256(piece 1) ‖ …) over KEY_CHUNK-byte
    pieces of the pixels (one piece, one just over a piece, 4.6 pieces), whatever the threads
    hashing the pieces; any changed byte of any piece changes it."""
    import hashlib

    from dohnuts.runtime.images import KEY_CHUNK, PREPROCESS_POLICY, content_key

    pixels = np.random.default_rng(len(shape)).integers(0, 256, shape, dtype=np.uint8)
    h, w = shape[:2]
    header = (f"{PREPROCESS_POLICY}|patch={VISION.patch_size}|temporal={VISION.temporal_patch_size}"
              f"|merge={VISION.spatial_merge_size}|channels={VISION.in_channels}|{w}x{h}"
              f"|sha256 of {KEY_CHUNK}-byte pieces|").encode()
    raw = pixels.tobytes()
    want = hashlib.sha256(header + b"".join(hashlib.sha256(raw[i:i + KEY_CHUNK]).digest()
                                            for i in range(0, len(raw), KEY_CHUNK))).hexdigest()
    assert content_key(pixels, VISION) == want == content_key(Image.fromarray(pixels), VISION)
    for at in {0, len(raw) // 2, len(raw) - 1}:
        changed = pixels.copy().reshape(-1)
        changed[at] ^= 1
        assert content_key(changed.reshape(shape), VISION) != want


def test_key_includes_dimensions():
    """The same RGB bytes laid out as 4×6 and 6×4 are different images."""
    raw = np.random.default_rng(1).integers(0, 256, (4 * 6 * 3,), dtype=np.uint8)
    a = prepare_image(_encode(Image.fromarray(raw.reshape(4, 6, 3)), "PNG"), VISION, name="a")
    b = prepare_image(_encode(Image.fromarray(raw.reshape(6, 4, 3)), "PNG"), VISION, name="b")
    assert a.key != b.key


def _png_header_only(width: int, height: int, data: bytes = b"") -> bytes:
    """A PNG whose header claims width×height but whose pixel data is `data` (tiny)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")


def _truncated() -> bytes:
    data = _encode(_random_image(200, 300), "PNG")
    return data[: len(data) // 2]


def _corrupt() -> bytes:
    data = bytearray(_encode(_random_image(200, 300), "PNG"))
    data[100:140] = bytes(40)  # zeros over compressed pixel data: the chunk CRC no longer matches
    return bytes(data)


@pytest.mark.parametrize("name, make, phrase", [
    ("truncated.png", _truncated, "truncated or corrupt"),
    ("truncated.jpg", lambda: _encode(_random_image(64, 64), "JPEG")[:300], "truncated or corrupt"),
    ("corrupt.png", _corrupt, "truncated or corrupt"),
    ("garbage.png", lambda: b"not an image at all" * 10, "cannot be identified"),
    ("empty.png", lambda: b"", "empty"),
    ("zero_width.png", lambda: _png_header_only(0, 10), "zero width or height"),
    ("zero_height.png", lambda: _png_header_only(10, 0), "zero width or height"),
    ("bomb_ours.png", lambda: _png_header_only(9000, 9000), "decompression bomb"),  # over our 64 Mpx limit
    ("bomb_warn.png", lambda: _png_header_only(10000, 10000), "decompression bomb"),  # Pillow's warning
    ("bomb_error.png", lambda: _png_header_only(100000, 100000), "decompression bomb"),  # Pillow's error
    ("aspect.png", lambda: _encode(Image.new("RGB", (1000, 4)), "PNG"), "aspect ratio"),
])
def test_bad_images_raise_image_error_naming_the_file(tmp_path, name, make, phrase):
    path = tmp_path / name
    path.write_bytes(make())
    for source in (path, path.read_bytes()):
        with warnings.catch_warnings(record=True) as caught, pytest.raises(ImageError) as info:
            warnings.simplefilter("always")
            prepare_image(source, VISION, name=None if source is path else name)
        message = str(info.value)
        assert name in message and phrase in message, message
        assert "\n" not in message
        assert not caught, [str(w.message) for w in caught]  # Pillow's bomb warning became the error


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ImageError, match="nope.png: does not exist"):
        prepare_image(tmp_path / "nope.png", VISION)
    with pytest.raises(ImageError, match="is a directory, not an image file"):
        prepare_image(tmp_path, VISION)


def _png(array: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG", **save)
    return buf.getvalue()


def test_plain_pngs_decode_by_libspng_to_pillows_pixels(monkeypatch):
    """An 8-bit truecolour PNG goes to libspng and gives Pillow's pixels; every other PNG (alpha,
    palette, grey, 16-bit, interlaced, a transparent colour) goes to Pillow and is unchanged."""
    import imagecodecs

    from dohnuts.runtime import images

    calls = []
    real = imagecodecs.spng_decode
    monkeypatch.setattr(imagecodecs, "spng_decode", lambda data: calls.append(1) or real(data))
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    pillow = lambda data: np.asarray(images.decode_rgb(data))  # noqa: E731
    got = images.decode_pixels(_png(rgb))
    assert calls == [1] and got.dtype == np.uint8 and np.array_equal(got, rgb)
    rgba = rng.integers(0, 256, (37, 53, 4), dtype=np.uint8)
    transparent_colour = _png(rgb, transparency=(1, 2, 3))
    others = {
        "rgba": _png(rgba),
        "palette": _png(np.asarray(Image.fromarray(rgb).convert("P"))),
        "grey": _png(rgb[..., 0]),
        "16-bit": (lambda im: (im.save(b := io.BytesIO(), format="PNG"), b.getvalue())[1])(
            Image.fromarray(rgb[..., 0].astype(np.uint16) * 257)),
        "interlaced": (lambda b: b[:28] + b"\x01" + b[29:])(_png(rgb)),  # only the flag: Pillow reads it so
        "tRNS": transparent_colour,
    }
    for name, data in others.items():
        calls.clear()
        try:
            want = pillow(data)
        except ImageError as exc:
            with pytest.raises(ImageError, match=str(exc).split(":")[-1].strip()[:20]):
                images.decode_pixels(data)
        else:
            assert np.array_equal(images.decode_pixels(data), want), name
        assert calls == [], name


def test_a_corrupt_plain_png_reports_pillows_error():
    """libspng refuses a PNG whose image data is cut short; Pillow decodes it again and its error,
    naming the file, is the one raised — as before libspng."""
    from dohnuts.runtime import images

    data = _png(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    cut = data[:len(data) // 2]
    with pytest.raises(ImageError) as fast:
        images.decode_pixels(cut, name="cut.png")
    with pytest.raises(ImageError) as pillow:
        images.decode_rgb(cut, name="cut.png")
    assert str(fast.value) == str(pillow.value) and "cut.png" in str(fast.value)


def test_prepare_keys_and_patches_are_unchanged_by_the_png_decoder(tmp_path, monkeypatch):
    """The same image prepared through libspng and through Pillow: one content key, equal patches."""
    from dohnuts.runtime import images

    vision = preset("tiny").vision
    path = tmp_path / "a.png"
    path.write_bytes(_png(np.random.default_rng(2).integers(0, 256, (64, 96, 3), dtype=np.uint8)))
    fast = prepare_image(path, vision)
    monkeypatch.setattr(images, "_plain_png_size", lambda data: None)
    slow = prepare_image(path, vision)
    assert fast.key == slow.key and torch.equal(fast.patches, slow.patches) and fast.grid_thw == slow.grid_thw


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
@pytest.mark.parametrize("key_threads", [2], indirect=True)  # a pool, whatever this host's cores
def test_a_forked_child_keys_images_with_its_own_threads(key_threads):
    """The key's piece threads do not survive a fork: the child makes its own, and keys alike."""
    import os

    from dohnuts.runtime import images
    from dohnuts.runtime.images import content_key

    pixels = np.random.default_rng(5).integers(0, 256, (448, 448, 3), dtype=np.uint8)
    want = content_key(pixels, VISION)
    assert images._KEY_POOL  # the parent's pool exists now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a hang here would fail the test by its timeout, not pass it
        try:
            os.write(w, content_key(pixels, VISION).encode())
        finally:
            os._exit(0)
    os.close(w)
    import select
    import signal

    answered, _, _ = select.select([r], [], [], 60)  # a hang guard only: the child answers in milliseconds
    if not answered:
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode() if answered else "no answer: the child hung on the parent's threads"
    os.waitpid(pid, 0)
    assert got == want
