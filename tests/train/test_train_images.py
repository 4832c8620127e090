"""Images reach training by construction: the training path and the prediction path compute the
same loss and gradients for an image request; an update's images go through the one cache; the
CLI trains, resumes and initializes from adapters on image requests."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from dohnuts.cli import main
from dohnuts.model.scorer import candidate_logits
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.objective import RLCDConfig, rlcd_loss
from dohnuts.train.step import OptimConfig, Updater, make_optimizer, microbatch_loss
from tests.reference import adapted_tiny, relative_error


def _png(path, seed, size=(64, 48)):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return str(path)


def _request(image, rid="r"):
    q = Question("q", "which?", ("left", "right", "up"), rewards=(0.0, 1.0, 0.0))
    return Request(id=rid, questions=(q, Question("q2", "and now?", ("a", "b"), rewards=(1.0, 0.0))),
                   prefix="a picture", image=image)


def _session():
    return adapted_tiny()


def _grads(session):
    return torch.cat([p.grad.flatten() for p in session.trainable_parameters()])


def _training_path(session, req):
    """What Updater does for one microbatch: prepare(train) → image_features → microbatch_loss."""
    hb = session.prepare(req, train=True)
    (use,) = session.image_features([(hb, None)])
    session.model.zero_grad()
    loss = microbatch_loss(session.model, hb.tensors, RLCDConfig(), image_features=use.features)
    loss.backward()
    return float(loss.detach()), _grads(session)


def _prediction_path(session, req):
    """What Predictor does (prepare → transfer → Session.score), with gradients enabled."""
    pred = Predictor(session)
    hb = pred.prepare(req)
    dev = pred.pipeline.wait(*pred.pipeline.transfer(hb))
    session.model.zero_grad()
    scores, _ = session.score(hb, dev)
    rewards = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = rlcd_loss(candidate_logits(scores, dev.cand_matrix), rewards, RLCDConfig())
    loss.backward()
    pred.close()
    return float(loss.detach()), _grads(session)


def test_training_equals_prediction_path_for_an_image_request(tmp_path):
    session = _session()
    req = _request(_png(tmp_path / "a.png", 0))
    loss_t, grad_t = _training_path(session, req)
    session.image_cache.clear()
    loss_p, grad_p = _prediction_path(session, req)
    assert abs(loss_t - loss_p) < 1e-6
    assert relative_error(grad_t, grad_p) < 1e-6 and float(grad_t.norm()) > 0
    # Two different images give two different training losses (the bug this path replaced: the
    # training path ran on placeholder embeddings, so every image trained alike).
    loss_b, _ = _training_path(session, _request(_png(tmp_path / "b.png", 1)))
    assert abs(loss_b - loss_t) > 1e-4


@pytest.mark.slow
def test_an_update_serves_its_images_from_one_cache_call(tmp_path):
    session = _session()
    a, b = _png(tmp_path / "a.png", 2), _png(tmp_path / "b.png", 3)
    reqs = [_request(a, "r1"), _request(b, "r2"), _request(a, "r3"), _request(a, "r4")]
    cfg = OptimConfig(lr=1e-3)
    updater = Updater(session, make_optimizer(session, cfg), RLCDConfig(), cfg)
    res = updater.update(reqs)
    s = session.image_cache.stats()
    assert (s.encode_calls, s.misses, s.hits, s.entries) == (1, 2, 2, 2)  # misses encoded together
    patches = [session.prepare(r).image.patch_count for r in reqs[:2]]
    assert res.work.encoded_image_patches == tuple(patches) and res.work.cached_images == 2
    assert [w.image_tokens for w in res.work.microbatches] == [session.prepare(r).plan.image_tokens for r in reqs]
    # The next update finds every image cached: no encode at all.
    res2 = updater.update(reqs[::-1])
    assert session.image_cache.stats().encode_calls == 1 and res2.work.cached_images == 4
    updater.close()


def _image_data(root, n=12):
    """train/dev/calib/test JSONL of image requests (relative image paths, as the digits writer)."""
    (root / "images").mkdir(parents=True)
    seed = 0
    for split, count in (("train", n), ("dev", 3), ("calib", 3), ("test", 3)):
        lines = []
        for i in range(count):
            name = f"images/{split}{i}.png"
            seed += 1
            _png(root / name, seed, size=(40, 40))
            lines.append(json.dumps({"id": f"{split}{i}", "image": name, "questions": [
                {"id": "q", "text": "Which?", "candidates": ["x", "y"], "answer": i % 2}]}))
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.slow
def test_cli_trains_resumes_and_initializes_from_on_image_requests(tmp_path):
    data = _image_data(tmp_path / "data")
    run = tmp_path / "run"
    # one update a run (an update is 32 image questions here): a run, its resume and a run started
    # from its adapter each train and evaluate on images, which is the claim
    common = ["train", "--model", "tiny", "--data", str(data), "--eval-every", "1", "--lora-rank", "2",
              "--device", "cpu"]
    assert main([*common, "--out", str(run), "--updates", "1"]) == 0
    assert main([*common, "--out", str(run), "--updates", "2", "--resume"]) == 0
    log = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in log if r["kind"] == "update"] == [1, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_questions"] == 3 and 0.0 <= summary["test_accuracy"] <= 1.0
    other = tmp_path / "run2"
    assert main([*common, "--out", str(other), "--updates", "1",
                 "--initialize-from", str(run / "best.safetensors")]) == 0
    first_dev = [r for r in map(json.loads, (other / "train_log.jsonl").read_text().splitlines())
                 if r["kind"] == "dev"][0]
    best_dev = max(r["accuracy"] for r in log if r["kind"] == "dev" and r["update"] == summary["best_update"])
    assert first_dev["accuracy"] == pytest.approx(best_dev)  # step 0 of the new run = the adapter it starts from
