"""A plain PNG prepared where the tower runs (KI-23): the host inflates its stream, the device undoes
the row filters and cuts the patches. The same key and patches as the host path's libspng decode;
what does not qualify stays on the host. On the CPU the unfilter takes the op's reference path (and
the Triton kernel runs in Triton's interpreter); tests/gpu/test_images_device.py runs the GPU path."""

from __future__ import annotations

import io
import os
import time
import zlib

import imagecodecs
import numpy as np
import pytest
import torch
from PIL import Image

from dohnuts.config import preset
from dohnuts.errors import ImageError
from dohnuts.ops.unfilter import png_unfilter, png_unfilter_reference
from dohnuts.runtime import images
from dohnuts.runtime.images import _png_image_data, _start_on_device, patchify, patchify_device, prepare_image
from tests.runtime.png_cases import filtered_rows, noise, png, smooth

VISION = preset("tiny").vision  # patch 16, merge 2: a 32-pixel grid
CPU = torch.device("cpu")


def _inflated(data: bytes, h: int, w: int) -> torch.Tensor:
    rows = np.frombuffer(imagecodecs.zlibng_decode(_png_image_data(data)), np.uint8)
    return torch.from_numpy(rows.copy()).view(h, 1 + 3 * w)


@pytest.mark.parametrize("h, w", [(1, 9), (7, 5), (24, 19), (40, 33)])
@pytest.mark.parametrize("kind", ["each filter", "every filter mixed", "pillow"])
def test_the_reference_unfilter_equals_libspng(h, w, kind):
    pixels = smooth(h, w, seed=h) if kind == "pillow" else noise(h, w, seed=w)
    kinds = None if kind == "pillow" else (np.arange(h) % 5 if kind == "each filter"
                                            else np.random.default_rng(h).integers(0, 5, h))
    data = png(pixels, kinds)
    want = imagecodecs.spng_decode(data)
    assert np.array_equal(want, pixels)
    got = png_unfilter(_inflated(data, h, w), h, w)  # a CPU tensor: the reference path
    assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), want)


def test_the_reference_refuses_a_filter_type_past_paeth():
    rows = torch.from_numpy(np.frombuffer(filtered_rows(noise(2, 3), [0, 4]), np.uint8).copy()).view(2, 10)
    rows[1, 0] = 5
    with pytest.raises(ValueError, match="row 1 has filter type 5"):
        png_unfilter_reference(rows, 2, 3)


_INTERPRETED = """
import numpy as np, imagecodecs, torch
from dohnuts.ops._unfilter_kernel import unfilter_triton
from dohnuts.runtime.images import _png_image_data
from tests.runtime.png_cases import noise, png, smooth
rng = np.random.default_rng(0)
for h, w in [(1, 9), (7, 5), (24, 19), (33, 40)]:
    for pixels, kinds in [(noise(h, w, 1), np.arange(h) % 5), (noise(h, w, 2), rng.integers(0, 5, h)), (smooth(h, w), None)]:
        data = png(pixels, kinds)
        rows = np.frombuffer(imagecodecs.zlibng_decode(_png_image_data(data)), np.uint8).copy()
        wide = np.zeros((h, 1 + 3 * w + 5), np.uint8)  # a row stride wider than the row
        wide[:, : 1 + 3 * w] = rows.reshape(h, -1)
        for f in (torch.from_numpy(rows).view(h, -1), torch.from_numpy(wide)):
            got = unfilter_triton(f, h, w).numpy()
            assert np.array_equal(got, imagecodecs.spng_decode(data)), (h, w, kinds)
print("ok")
"""


@pytest.mark.slow
def test_the_unfilter_kernel_in_the_interpreter_equals_libspng():
    """The Triton kernel (one program, a wavefront over groups of four rows) gives libspng's pixels
    for every filter type, heights that are and are not a multiple of four, on contiguous rows and
    on rows with a wider stride."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True,
                         timeout=600, check=False, cwd=root)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_patches_cut_on_the_device_equal_the_hosts():
    pixels = noise(64, 96)
    host = patchify(pixels, VISION.patch_size, VISION.spatial_merge_size)
    dev = patchify_device(torch.from_numpy(pixels.copy()), VISION.patch_size, VISION.spatial_merge_size)
    assert dev.is_contiguous() and torch.equal(dev, host)


@pytest.mark.parametrize("case", ["every filter, 3 IDAT chunks", "pillow's filters", "pillow's, 2 chunks"])
def test_the_device_path_gives_the_host_paths_key_and_patches(case, monkeypatch):
    h, w = (256, 288) if case.startswith("every") else (288, 256)
    if case.startswith("every"):
        data = png(noise(h, w), np.random.default_rng(1).integers(0, 5, h), idat_parts=3)
    else:
        data = png(smooth(h, w), idat_parts=2 if "2 chunks" in case else 1)
    on_device = _start_on_device(data, VISION, CPU, "x.png").finish()
    assert on_device is not None  # the path was taken (on the CPU: the op's reference unfilter)
    host = prepare_image(data, VISION, name="x.png")
    monkeypatch.setattr(images, "_unfilters_on", lambda device: True)  # the CPU as if it were such a GPU
    via_device = prepare_image(data, VISION, name="x.png", device=CPU)
    for img in (on_device, via_device):
        assert img.key == host.key and torch.equal(img.patches, host.patches)
        assert (img.grid_thw, img.token_count, img.width, img.height) == \
               (host.grid_thw, host.token_count, host.width, host.height)


@pytest.mark.parametrize("case", ["needs a resize", "off the grid", "a filter byte of 5", "a short stream",
                                  "a long stream", "a corrupt stream", "greyscale", "too many rows"])
def test_what_does_not_qualify_stays_on_the_host(case, monkeypatch):
    h, w = 256, 288
    pixels = noise(h, w)
    kinds = np.arange(h) % 5
    rows = filtered_rows(pixels, kinds)
    if case == "needs a resize":
        data = png(noise(64, 64), np.zeros(64, int))  # below the minimum pixels: upscaled
    elif case == "off the grid":
        data = png(noise(260, 300), np.zeros(260, int))
    elif case == "a filter byte of 5":
        bad = bytearray(rows)
        bad[(1 + 3 * w) * 7] = 5
        data = png(pixels, stream=zlib.compress(bytes(bad)))
    elif case == "a short stream":
        data = png(pixels, stream=zlib.compress(rows[:-(1 + 3 * w)]))
    elif case == "a long stream":
        data = png(pixels, stream=zlib.compress(rows + rows[: 1 + 3 * w]))
    elif case == "a corrupt stream":
        z = bytearray(zlib.compress(rows))
        z[-2] ^= 0xFF  # the Adler-32 checksum
        data = png(pixels, stream=bytes(z))
    elif case == "greyscale":
        buf = io.BytesIO()
        Image.fromarray(pixels[..., 0]).save(buf, format="PNG")
        data = buf.getvalue()
    else:
        data = png(noise(1056, 64), np.zeros(1056, int))  # 1,056 rows: over the kernel's 1,024
    assert _start_on_device(data, VISION, CPU, "x.png") is None
    monkeypatch.setattr(images, "_unfilters_on", lambda device: True)
    # the host path decides, as it would without a device: the same image, or the same error
    outcomes = []
    for device in (CPU, None):
        try:
            img = prepare_image(data, VISION, name="x.png", device=device)
            outcomes.append((img.key, img.patches.numpy().tobytes()))
        except ImageError as exc:
            assert "x.png" in str(exc)
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    if case in ("a filter byte of 5", "a corrupt stream"):
        assert isinstance(outcomes[0], str)  # refused, in the host path's words


def test_only_a_gpu_with_the_fused_kernels_prepares_on_the_device(monkeypatch):
    """The device decides: the CPU (and a GPU whose probe failed) prepares on the host."""
    assert not images._unfilters_on(CPU)
    monkeypatch.setattr(images, "kernel_status", lambda device: "reference (no backend)")
    assert not images._unfilters_on(torch.device("cuda", 0))
    monkeypatch.setattr(images, "kernel_status", lambda device: "fused")
    assert images._unfilters_on(torch.device("cuda", 0))
    data = png(noise(256, 288), np.arange(256) % 5)
    monkeypatch.setattr(images, "_start_on_device", lambda *a: pytest.fail("the CPU went to the device path"))
    assert prepare_image(data, VISION, device=CPU).key == prepare_image(data, VISION).key


def test_the_row_limit_is_the_kernels():
    pytest.importorskip("triton")
    from dohnuts.ops._unfilter_kernel import MAX_ROWS
    from dohnuts.ops.unfilter import MAX_UNFILTER_ROWS

    assert MAX_UNFILTER_ROWS == MAX_ROWS


# -- the key resolved after the plan and collate (KI-23) ----------------------------------------------


def test_the_split_path_gives_the_synchronous_paths_key_and_patches(monkeypatch):
    """`start_image` returns the device path's image without its key (grid and patches known);
    `finish` keys it: the same image as `prepare_image`. The host path comes back keyed."""
    data = png(noise(256, 288), np.arange(256) % 5)
    want = prepare_image(data, VISION, name="x.png")
    host = images.start_image(data, VISION, name="x.png", device=CPU)  # the CPU: the host path
    assert host.image.key == want.key and host.finish() is host.image
    monkeypatch.setattr(images, "_unfilters_on", lambda device: True)
    pending = images.start_image(data, VISION, name="x.png", device=CPU)
    assert pending.image.key == "" and (pending.image.grid_thw, pending.image.token_count) == \
           (want.grid_thw, want.token_count)
    img = pending.finish()
    assert img.key == want.key and img.patches is pending.image.patches and torch.equal(img.patches, want.patches)
    assert (img.width, img.height, img.source) == (want.width, want.height, "x.png")
    assert prepare_image(data, VISION, name="x.png", device=CPU).key == want.key  # finished at once


def _session_on_the_device_path(monkeypatch, tmp_path):
    """A tiny session on the CPU taking the device path (the op's reference unfilter), and a
    request with a plain PNG on the tower's grid."""
    from dohnuts import api
    from dohnuts.runtime.requests import Question, Request

    monkeypatch.setattr(images, "_unfilters_on", lambda device: True)
    session = api.load("tiny")
    path = tmp_path / "a.png"
    path.write_bytes(png(noise(256, 288), np.arange(256) % 5))
    qs = (Question("q1", "what colour?", ("red", "green")), Question("q2", "how many?", ("one", "two", "three")))
    return session, Request(id="r", questions=qs, prefix="a photo", image=str(path)), str(path)


def test_a_session_plans_and_collates_before_the_key_then_carries_the_keyed_image(monkeypatch, tmp_path):
    session, req, path = _session_on_the_device_path(monkeypatch, tmp_path)
    want = prepare_image(path, VISION)
    order = []
    collate, finish = session._collate, images.PendingImage.finish
    monkeypatch.setattr(session, "_collate", lambda plan, image, *a: order.append(("collate", image.key))
                        or collate(plan, image, *a))
    monkeypatch.setattr(images.PendingImage, "finish", lambda self: order.append(("finish",)) or finish(self))
    hb = session.prepare(req)
    assert order == [("collate", ""), ("finish",)]  # the plan and collate ran with the key pending
    assert hb.image.key == want.key and hb.image.source == path
    assert hb.tensors.pixel_patches is hb.image.patches and torch.equal(hb.image.patches, want.patches)
    remembered = session._image_keys.get(session._image_keys.digest(path))
    assert remembered.key == want.key and remembered.patches is None
    # once its features are cached, the same file is known by its bytes: nothing started, no pixels
    session.predict([req])
    monkeypatch.setattr(images, "_start_on_device", lambda *a: pytest.fail("a known image went to the device"))
    again = session.prepare(req)
    assert again.image.key == want.key and again.image.patches is None and again.tensors.pixel_patches is None


def test_a_failed_finish_leaves_nothing_half_done(monkeypatch, tmp_path):
    """The key's failure surfaces as `prepare_image`'s would, after the wait; the image is not remembered."""
    session, req, path = _session_on_the_device_path(monkeypatch, tmp_path)
    waits = []
    wait = images.PendingImage.wait
    monkeypatch.setattr(images.PendingImage, "wait", lambda self: waits.append(1) or wait(self))

    def broken(*a):
        raise ImageError("cannot be keyed", source=path)

    monkeypatch.setattr(images, "content_key", broken)
    with pytest.raises(ImageError, match="cannot be keyed") as sync:
        prepare_image(path, VISION, device=CPU)
    with pytest.raises(ImageError, match="cannot be keyed") as split:
        session.prepare(req)
    assert str(split.value) == str(sync.value) and path in str(split.value)
    assert waits == [1, 1]  # each waited for its device work before keying
    assert session._image_keys.get(session._image_keys.digest(path)) is None


def test_a_request_failing_before_the_key_waits_for_the_device(monkeypatch, tmp_path):
    """A plan that fails while the device unfilters (too long a request): the device's work is
    waited for, the request's own error raised, the image not remembered."""
    from dohnuts.errors import RequestError

    session, req, path = _session_on_the_device_path(monkeypatch, tmp_path)
    session.max_len = 64  # the image alone takes 72 tokens
    waits, finishes = [], []
    wait, finish = images.PendingImage.wait, images.PendingImage.finish
    monkeypatch.setattr(images.PendingImage, "wait", lambda self: waits.append(1) or wait(self))
    monkeypatch.setattr(images.PendingImage, "finish", lambda self: finishes.append(1) or finish(self))
    with pytest.raises(RequestError) as failed:
        session.prepare(req)
    assert not isinstance(failed.value, ImageError)
    assert waits == [1] and finishes == []
    assert session._image_keys.get(session._image_keys.digest(path)) is None


@pytest.mark.parametrize("device_path", [True, False])
def test_a_new_file_is_read_once_and_forgetting_reads_it_again(monkeypatch, tmp_path, device_path):
    """A new image's file is read once: the memo hashes the bytes it read and the decode takes the
    same bytes. A known file is only stat'ed; `forget_images` (the cold workload's new image) empties
    the feature cache and the memo, so the next request reads, hashes and decodes it again."""
    session, req, path = _session_on_the_device_path(monkeypatch, tmp_path)
    if not device_path:
        monkeypatch.setattr(images, "_unfilters_on", lambda device: False)
    old = time.time_ns() - 60 * 10**9  # written a minute ago: its stat signature is trusted (not racy)
    os.utime(path, ns=(old, old))
    want = prepare_image(path, VISION)
    reads, starts = [], []
    read_file = images.read_file
    monkeypatch.setattr(images, "read_file", lambda p, **kw: reads.append(p) or read_file(p, **kw))
    start = images.start_image
    monkeypatch.setattr("dohnuts.runtime.session.start_image", lambda *a, **kw: starts.append(1) or start(*a, **kw))
    hb = session.prepare(req)
    assert reads == [path] and starts == [1]  # one read; the decode took its bytes
    assert hb.image.key == want.key and hb.image.source == path and torch.equal(hb.image.patches.cpu(), want.patches)
    session.predict([req])  # its features cached: the next request neither reads nor decodes
    again = session.prepare(req)
    assert reads == [path, path] and again.image.patches is None  # the predict's own prepare read it
    assert len(starts) == 2
    session.forget_images()
    assert len(session.image_cache) == 0 and session._image_keys.get(session._image_keys.digest(path)) is None
    assert reads == [path, path, path]  # the digest above read it: the memo had forgotten the file
    session.forget_images()
    fresh = session.prepare(req)
    assert reads == [path] * 4 and len(starts) == 3
    assert fresh.image.key == want.key and fresh.image.patches is not None
