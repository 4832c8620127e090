"""The image feature cache: bounded bytes, exact hits, one encode per batch, LRU order."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from dohnuts.config import preset
from dohnuts.model.vision import build_vision_tower
from dohnuts.runtime.image_cache import DEFAULT_MAX_BYTES, ImageFeatureCache
from dohnuts.runtime.images import PreparedImage, pixel_values, prepare_image

WIDTH = 8  # patch row width of the fake images
HIDDEN = 16  # feature width of the fake encoder


def _image(key: str, grid: tuple[int, int, int], seed: int = 0) -> PreparedImage:
    t, h, w = grid
    patches = torch.randn(t * h * w, WIDTH, generator=torch.Generator().manual_seed(seed))
    return PreparedImage(key=key, patches=patches, grid_thw=grid, token_count=t * h * w // 4,
                         width=w * 16, height=h * 16, source=key)


class RecordingEncoder:
    """Sums each merge block of 4 patch rows and projects to HIDDEN; records every call."""

    def __init__(self):
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.proj = torch.randn(WIDTH, HIDDEN, generator=torch.Generator().manual_seed(99))

    def __call__(self, patches: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        self.calls.append((patches.clone(), grid_thw.clone()))
        return patches.view(-1, 4, WIDTH).sum(1) @ self.proj  # (N / 4, HIDDEN)


def _nbytes(img: PreparedImage) -> int:
    return img.token_count * HIDDEN * 4  # float32 features


def test_default_bound_is_128_mib():
    assert ImageFeatureCache().stats().max_bytes == 128 * 2**20 == DEFAULT_MAX_BYTES


def test_bytes_never_exceed_the_bound():
    bound = 10_000
    cache, enc = ImageFeatureCache(bound), RecordingEncoder()
    grids = [(1, 2, 2), (1, 4, 6), (1, 8, 8), (1, 2, 4), (1, 6, 6), (1, 4, 4)]
    stored = 0
    for i in range(40):
        img = _image(f"k{i}", grids[i % len(grids)], seed=i)
        cache.features([img], enc)
        s = cache.stats()
        assert s.bytes <= bound, (i, s)
        stored_now = sum(_nbytes(_image(f"k{j}", grids[j % len(grids)])) for j in range(i + 1) if f"k{j}" in cache)
        assert s.bytes == stored_now and s.entries == len(cache)
        stored = max(stored, s.bytes)
    s = cache.stats()
    assert s.evictions > 0 and s.misses == 40 and s.hits == 0 and s.encode_calls == 40
    assert stored > bound // 2  # the cache really filled up, not trivially empty


def test_entry_larger_than_the_bound_is_served_not_stored():
    cache, enc = ImageFeatureCache(1_000), RecordingEncoder()
    small, big = _image("small", (1, 2, 2)), _image("big", (1, 8, 8))  # 64 B and 1024 B
    cache.features([small], enc)
    (out,) = cache.features([big], enc)
    assert out.shape == (16, HIDDEN)
    assert "big" not in cache and "small" in cache
    assert cache.stats().bytes == _nbytes(small) and cache.stats().evictions == 0


def _png(h: int, w: int, seed: int) -> bytes:
    buf = io.BytesIO()
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def test_hit_returns_exactly_what_the_miss_computed():
    """With the real (tiny) tower and real preprocessing."""
    vision = preset("tiny").vision
    tower = build_vision_tower(vision, seed=0).eval()
    images = [prepare_image(_png(h, w, seed), vision, name=f"img{seed}")
              for seed, (h, w) in enumerate([(40, 70), (90, 60)])]
    cache = ImageFeatureCache()
    calls = []

    def encode(patches, grid_thw):
        calls.append(grid_thw.tolist())
        with torch.no_grad():
            return tower(pixel_values(patches, vision.temporal_patch_size), grid_thw)

    cold = cache.features(images, encode)
    warm = cache.features(images[::-1], encode)
    assert calls == [[list(images[0].grid_thw), list(images[1].grid_thw)]]  # one call, both images
    assert torch.equal(warm[1], cold[0]) and torch.equal(warm[0], cold[1])
    assert [f.shape[0] for f in cold] == [img.token_count for img in images]
    s = cache.stats()
    assert (s.hits, s.misses, s.encode_calls, s.entries) == (2, 2, 1, 2)
    assert s.bytes == sum(f.numel() * 4 for f in cold)


def test_batch_with_duplicates_and_misses_encodes_once():
    cache, enc = ImageFeatureCache(), RecordingEncoder()
    a, b, c = _image("a", (1, 4, 6), 1), _image("b", (1, 2, 2), 2), _image("c", (1, 4, 4), 3)
    (c_cold,) = cache.features([c], enc)
    enc.calls.clear()

    out = cache.features([a, b, a, c, b, a], enc)
    assert len(enc.calls) == 1
    patches, grids = enc.calls[0]
    assert grids.tolist() == [[1, 4, 6], [1, 2, 2]]  # each distinct miss once, in first-seen order
    assert torch.equal(patches, torch.cat([a.patches, b.patches]))
    assert out[0] is out[2] is out[5] and out[1] is out[4]
    assert out[3] is c_cold
    expected_a = a.patches.view(-1, 4, WIDTH).sum(1) @ enc.proj  # a encoded on its own
    assert torch.allclose(out[0], expected_a, atol=1e-6)
    s = cache.stats()
    # c's first call: 1 miss; this batch: a, b missed, the other 4 served without encoding.
    assert (s.misses, s.hits, s.encode_calls, s.entries) == (3, 4, 2, 3)


def test_least_recently_used_is_evicted_first():
    size = _nbytes(_image("x", (1, 4, 4)))
    cache, enc = ImageFeatureCache(3 * size), RecordingEncoder()
    imgs = {k: _image(k, (1, 4, 4), i) for i, k in enumerate("ABCDE")}
    for k in "ABC":
        cache.features([imgs[k]], enc)
    cache.features([imgs["A"]], enc)  # touch A: order is now B, C, A
    cache.features([imgs["D"]], enc)  # evicts B
    assert [k for k in "ABCDE" if k in cache] == ["A", "C", "D"]
    cache.features([imgs["C"]], enc)  # order A, D, C
    cache.features([imgs["E"]], enc)  # evicts A
    assert [k for k in "ABCDE" if k in cache] == ["C", "D", "E"]
    n_calls = len(enc.calls)
    cache.features([imgs["B"]], enc)  # B was evicted: encoded again
    assert len(enc.calls) == n_calls + 1
    assert cache.stats().evictions == 3


def test_encoder_output_of_the_wrong_size_is_refused_and_nothing_stored():
    cache = ImageFeatureCache()
    with pytest.raises(RuntimeError, match="image tokens"):
        cache.features([_image("a", (1, 4, 4))], lambda p, g: torch.zeros(3, HIDDEN))
    assert len(cache) == 0 and cache.stats().bytes == 0
