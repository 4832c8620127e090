"""A plain PNG prepared on the GPU (KI-23, dohnuts.runtime.images): the unfilter kernel against
libspng, the device path's key and patches against the host path's, on several threads at once, and
a session's scores with the device path against the host path's."""

from __future__ import annotations

import threading

import imagecodecs
import numpy as np
import pytest
import torch

from dohnuts.config import preset
from dohnuts.runtime import images
from dohnuts.ops._unfilter_kernel import unfilter_triton
from dohnuts.runtime.images import _png_image_data, _start_on_device, prepare_image
from tests.gpu.helpers import DEV
from tests.runtime.png_cases import noise, png, smooth

pytestmark = pytest.mark.gpu
VISION = preset("qwen3.5-2b").vision


def _cases():
    rng = np.random.default_rng(0)
    for h, w in [(448, 448), (512, 384), (1024, 1024), (33, 900), (1, 7)]:
        yield f"{h}x{w} pillow", png(smooth(h, w, seed=h))
        yield f"{h}x{w} every filter", png(noise(h, w, seed=w), rng.integers(0, 5, h))
        yield f"{h}x{w} smooth, every filter", png(smooth(h, w), rng.integers(0, 5, h), idat_parts=3)


@pytest.mark.parametrize("name, data", list(_cases()), ids=[n for n, _ in _cases()])
def test_the_unfilter_kernel_equals_libspng(name, data):
    want = imagecodecs.spng_decode(data)
    h, w = want.shape[:2]
    rows = np.frombuffer(imagecodecs.zlibng_decode(_png_image_data(data)), np.uint8).copy()
    got = unfilter_triton(torch.from_numpy(rows).view(h, -1).to(DEV), h, w)
    assert np.array_equal(got.cpu().numpy(), want), name


@pytest.mark.parametrize("h, w, every_filter", [(448, 448, False), (512, 384, True), (1024, 1024, False), (256, 768, True)])
def test_the_device_path_gives_the_host_paths_key_and_patches(h, w, every_filter):
    data = png(noise(h, w, seed=h), np.random.default_rng(w).integers(0, 5, h)) if every_filter else png(smooth(h, w))
    dev = _start_on_device(data, VISION, torch.device(DEV), "x.png").finish()
    assert dev is not None and dev.patches.is_cuda
    host = prepare_image(data, VISION, name="x.png")
    assert dev.key == host.key and torch.equal(dev.patches.cpu(), host.patches)
    assert (dev.grid_thw, dev.token_count) == (host.grid_thw, host.token_count)


def test_threads_preparing_at_once_each_get_their_own_images():
    datas = [png(smooth(448, 448, seed=i)) if i % 2 else png(noise(448, 448, seed=i), np.arange(448) % 5)
             for i in range(8)]
    want = [prepare_image(d, VISION) for d in datas]
    got: list = [None] * len(datas)

    def work(i):
        got[i] = prepare_image(datas[i], VISION, device=torch.device(DEV))

    for _ in range(3):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(datas))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for g, w in zip(got, want):
            assert g.patches.is_cuda and g.key == w.key and torch.equal(g.patches.cpu(), w.patches)


def test_a_sessions_scores_with_the_device_path_equal_the_host_paths(monkeypatch, tmp_path):
    """The same requests scored twice by one session, the images prepared on the host and then on
    the device (each time into an emptied feature cache): the same scores, bit for bit."""
    from PIL import Image

    import dohnuts.api as api
    from dohnuts.runtime.images import ImageKeyMemo
    from dohnuts.runtime.requests import Question, Request
    from tests.gpu.helpers import _wide_tiny

    _wide_tiny(monkeypatch)
    session = api.load("tiny", device=DEV, dtype=torch.bfloat16)
    assert images._unfilters_on(session.device)  # a GPU with the fused kernels
    reqs = []
    for i in range(3):
        path = tmp_path / f"{i}.png"
        Image.fromarray(smooth(256 + 64 * i, 320, seed=i)).save(path)
        qs = (Question("a", "what?", ("red", "green")), Question("b", "how many?", ("one", "two", "three")))
        reqs.append(Request(id=f"img{i}", questions=qs, prefix="a photo", image=str(path)))
    reqs.append(reqs[0])

    def scores():
        session.image_cache.clear()
        session._image_keys = ImageKeyMemo()
        return [torch.tensor([s for q in r.questions for s in q.scores]) for r in session.predict(reqs)]

    with monkeypatch.context() as m:
        m.setattr(images, "_unfilters_on", lambda device: False)
        host = scores()
    device = scores()
    for h, d in zip(host, device):
        assert torch.equal(h, d)
