"""Requests with images: scores equal those from transformers' vision features spliced in the
same way; the cache serves repeats; a bad image fails only its own request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

import dohnuts.api as api
from dohnuts.runtime.images import pixel_values
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.requests import Question, Request
from tests.reference import hf_full_config, relative_error, unshared


def _png(path, seed, size=(96, 64)):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return str(path)


def _request(image, rid="r", prefix="a photo"):
    qs = (Question("q1", "what colour?", ("red", "green")), Question("q2", "how many?", ("one", "two", "three")),
          Question("q3", "where?", ("here", "there")))
    return Request(id=rid, questions=qs, prefix=prefix, image=image)


def _scores(results):
    return torch.tensor([s for r in results for q in r.questions for s in q.scores])


def test_scores_equal_transformers_features_spliced(tmp_path):
    from transformers import Qwen3_5Model

    model = api.load("tiny")
    req = _request(_png(tmp_path / "a.png", 0))
    with unshared(model):
        ours = _scores(model.predict([req]))

    hf = Qwen3_5Model(hf_full_config(model.cfg)).eval()
    hf.visual.load_state_dict(model.model.visual.state_dict())
    model.image_cache.clear()  # (a cached image is prepared without its pixels)
    with unshared(model):
        hb = model.prepare(req)
    with torch.no_grad():
        values = pixel_values(hb.image.patches, model.cfg.vision.temporal_patch_size)  # the processor's pixel_values
        feats = hf.visual(values, grid_thw=torch.tensor([hb.image.grid_thw])).pooler_output
        scores = model.model(hb.tensors.score_inputs(feats))
    assert relative_error(ours, scores) < 1e-4
    # and the image really matters
    other = _scores(model.predict([_request(_png(tmp_path / "b.png", 1))]))
    assert relative_error(ours, other) > 1e-4


def test_shared_prefix_with_image_equals_unshared(tmp_path):
    model = api.load("tiny")
    req = _request(_png(tmp_path / "a.png", 3, size=(448, 448)))  # 196 image tokens
    # 196 + 2, "a photo\n", "Question: " = 216 shared tokens → 192 on the 64-token grid (inside the image)
    assert model.prepare(req).plan.prefix_len == 192
    shared = _scores(model.predict([req]))
    model.image_cache.clear()
    with unshared(model):
        plain = _scores(model.predict([req]))
    assert relative_error(shared, plain) < 1e-5


def test_cache_serves_repeats_and_same_pixels_other_file(tmp_path):
    model = api.load("tiny")
    a = _png(tmp_path / "a.png", 5)
    Image.open(a).save(tmp_path / "a_copy.bmp")
    pred = Predictor(model)
    works = [pred.call(_request(path))[1] for path in (a, a, str(tmp_path / "a_copy.bmp"))]
    assert [w.cached_images for w in works] == [0, 1, 1]
    n_patches = model.prepare(_request(a)).image.patch_count
    assert [w.encoded_image_patches for w in works] == [(n_patches,), (), ()]
    assert model.image_cache.stats().encode_calls == 1


def test_bad_image_fails_only_its_request(tmp_path):
    model = api.load("tiny")
    good = _png(tmp_path / "good.png", 7)
    bad = tmp_path / "bad.png"
    bad.write_bytes(Path(good).read_bytes()[:100])  # truncated
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    reqs = [_request(good, "r1"), _request(str(bad), "r2"), _request(str(empty), "r3"), _request(good, "r4")]
    out = model.predict(reqs)
    assert [type(r).__name__ for r in out] == ["RequestResult", "RequestFailure", "RequestFailure", "RequestResult"]
    assert "bad.png" in out[1].error and "empty.png" in out[2].error
    assert torch.equal(_scores([out[0]]), _scores([out[3]]))


def test_cached_image_is_recognised_by_its_bytes_without_decoding(tmp_path, monkeypatch):
    import dohnuts.runtime.session as session_mod

    model = api.load("tiny")
    calls = []
    for name in ("start_image", "prepare_image"):  # a request's preparation, and a decode at use
        real = getattr(session_mod, name)
        monkeypatch.setattr(session_mod, name, lambda *a, real=real, **k: calls.append(a[0]) or real(*a, **k))
    a = _png(tmp_path / "a.png", 11)
    (tmp_path / "same_bytes.png").write_bytes(Path(a).read_bytes())
    first = _scores(model.predict([_request(a)]))
    assert len(calls) == 1
    hb = model.prepare(_request(str(tmp_path / "same_bytes.png")))  # same bytes, other name: no decode
    assert len(calls) == 1 and hb.image.patches is None and hb.tensors.pixel_patches is None
    assert torch.equal(_scores(model.predict([_request(str(tmp_path / "same_bytes.png"))])), first)
    assert len(calls) == 1
    b = _png(tmp_path / "b.png", 12)  # other bytes: decoded
    model.predict([_request(b)])
    assert len(calls) == 2
    # Prepared without pixels, then evicted before use: decoded at use, same scores.
    hb = model.prepare(_request(a))
    assert hb.image.patches is None
    model.image_cache.clear()
    (use,) = model.image_features([(hb, None)])
    assert len(calls) == 3 and use.encoded_patches == hb.image.patch_count
    assert torch.equal(_scores(model.predict([_request(a)])), first)


def test_file_digest_is_remembered_while_the_file_is_unchanged(tmp_path, monkeypatch):
    """The digest of a file's bytes is reused while its stat signature holds, and recomputed when
    the file is rewritten (same size, other bytes), moved over, or was written too recently for
    its timestamp to be trusted (git's racy-file rule)."""
    import os
    import time

    from dohnuts.runtime.images import ImageKeyMemo

    import dohnuts.runtime.images as images

    memo, reads = ImageKeyMemo(), []
    real = images.read_file  # the memo's one read of a file's bytes (bounded, by type)
    monkeypatch.setattr(images, "read_file", lambda path, **kw: reads.append(Path(path).name) or real(path, **kw))
    f = tmp_path / "a.png"

    def write(data: bytes, age_s: float) -> None:
        f.write_bytes(data)
        t = time.time_ns() - int(age_s * 1e9)
        os.utime(f, ns=(t, t))

    write(b"x" * 1000, age_s=60)
    d1 = memo.digest(str(f))
    assert memo.digest(str(f)) == d1 and reads == ["a.png"]  # unchanged: not read again
    write(b"y" * 1000, age_s=50)  # same size, other bytes, other mtime
    d2 = memo.digest(str(f))
    assert d2 != d1 and reads == ["a.png"] * 2 and d2 == memo._hash(b"y" * 1000)
    other = tmp_path / "b.png"
    other.write_bytes(b"x" * 1000)
    os.replace(other, f)  # another inode under the same name
    assert memo.digest(str(f)) == d1 and len(reads) == 3
    write(b"z" * 1000, age_s=0)  # just written: its timestamp could hide a second write in the same tick
    assert memo.digest(str(f)) == memo.digest(str(f)) == memo._hash(b"z" * 1000) and len(reads) == 5
    write(b"w" * 1000, age_s=0.5)  # sub-second stamps: trusted from RACY_FINE_S on
    assert memo.digest(str(f)) == memo.digest(str(f)) == memo._hash(b"w" * 1000) and len(reads) == 6
    t = (time.time_ns() // 1_000_000_000 - 1) * 1_000_000_000  # whole-second stamps, 1 s ago: still racy
    f.write_bytes(b"v" * 1000)
    os.utime(f, ns=(t, t))
    assert memo.digest(str(f)) == memo.digest(str(f)) == memo._hash(b"v" * 1000) and len(reads) == 8
    assert memo.digest(str(tmp_path / "missing.png")) is None


def test_image_positions_depend_on_the_layout_only(tmp_path):
    """The per-layout MRoPE table equals the positions computed from the planned tokens themselves,
    for every question length of a request (and is the same object for the same layout)."""
    from dohnuts.model.vision import mrope_position_ids
    from dohnuts.runtime.session import image_head_positions

    model = api.load("tiny")
    with unshared(model):
        hb = model.prepare(_request(_png(tmp_path / "a.png", 5, size=(448, 448))))
    cfg = model.cfg
    for seq in hb.plan.sequences:
        want = mrope_position_ids(torch.tensor(seq), [hb.image.grid_thw], image_token_id=cfg.image_token_id,
                                  spatial_merge_size=cfg.vision.spatial_merge_size)
        got = image_head_positions(hb.image.grid_thw, hb.plan.image_tokens, len(seq), cfg.image_token_id,
                                   cfg.vision.spatial_merge_size)
        assert torch.equal(got, want)
    args = (hb.image.grid_thw, hb.plan.image_tokens, 300, cfg.image_token_id, cfg.vision.spatial_merge_size)
    assert image_head_positions(*args) is image_head_positions(*args)
