"""Training lifecycle: resume reproduces an uninterrupted run; initialize-from is verified."""

from __future__ import annotations

import json

import pytest
import torch

from dohnuts.errors import CheckpointError
from dohnuts.model.lora import LoRAConfig
from dohnuts.train.task import synthetic_requests
from dohnuts.train.checkpoints import checkpoint_adapter
from dohnuts.train.trainer import Partitions, TrainConfig, Trainer, microbatch_order


def _data(questions=8):
    """8-question training requests (one a microbatch: an update averages 32 questions)."""
    return Partitions(train=synthetic_requests(12, questions=questions, seed=1),
                      dev=synthetic_requests(3, questions=2, seed=2), calib=synthetic_requests(3, questions=2, seed=3),
                      test=synthetic_requests(3, questions=2, seed=4))


def _cfg(out, updates, **kw):
    return TrainConfig(model="tiny", out=str(out), updates=updates, eval_every=2, warmup=2,
                       lora=LoRAConfig(rank=2), **kw)


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path):
    full = Trainer(_cfg(tmp_path / "full", 6), _data(), log=lambda m: None)
    full.train()
    part = Trainer(_cfg(tmp_path / "part", 6), _data(), log=lambda m: None)
    part.train(stop_at=4)  # interrupted after the evaluation at update 4
    resumed = Trainer(_cfg(tmp_path / "part", 6), _data(), log=lambda m: None)
    assert resumed.resume() and resumed.update == 4
    resumed.train()
    a, _ = checkpoint_adapter(tmp_path / "full")  # the last checkpoint's adapters
    b, _ = checkpoint_adapter(tmp_path / "part")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    summary = resumed.finish()
    assert summary["best_update"] in (0, 2, 4, 6)
    log = [json.loads(x) for x in (tmp_path / "part" / "train_log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in log if r["kind"] == "update"] == [1, 2, 3, 4, 5, 6]
    assert log[0]["kind"] == "dev" and log[0]["update"] == 0  # step 0 is evaluated (eligible)


@pytest.mark.slow
def test_initialize_from_verified(tmp_path):
    first = Trainer(_cfg(tmp_path / "a", 2), _data(), log=lambda m: None)
    first.train()
    second = Trainer(_cfg(tmp_path / "b", 2, initialize_from=str(tmp_path / "a" / "best.safetensors")), _data(),
                     log=lambda m: None)
    second.train()
    with pytest.raises(CheckpointError, match="base_identity.weights"):
        Trainer(_cfg(tmp_path / "c", 2, seed=5, initialize_from=str(tmp_path / "a" / "best.safetensors")), _data())


def test_microbatch_order_is_a_permutation_per_epoch():
    n = 10
    seen = [i for u in range(5) for i in microbatch_order(n, seed=3, update=u)]  # 20 draws = 2 epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))


def test_microbatch_order_with_several_requests_per_microbatch():
    n = 12
    assert [microbatch_order(n, seed=3, update=u, per=1) for u in range(3)] == \
        [microbatch_order(n, seed=3, update=u) for u in range(3)]
    first, second = (microbatch_order(n, seed=3, update=u, per=3) for u in range(2))
    assert len(first) == len(second) == 12  # 4 microbatches of 3 requests
    assert sorted(first) == list(range(12)) and sorted(second) == list(range(12))  # one epoch each
    assert first == microbatch_order(n, seed=3, update=0) + microbatch_order(n, seed=3, update=1) + \
        microbatch_order(n, seed=3, update=2)  # the same data order, drawn 12 at a time


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_with_another_microbatch_size(tmp_path):
    """2-question requests: 4 to a microbatch. A checkpoint written when an update took one request
    per microbatch (before KI-10's fix: no key) would continue another data order."""
    first = Trainer(_cfg(tmp_path / "run", 4), _data(questions=2), log=lambda m: None)
    assert first.per == 4
    first.train(stop_at=2)
    first.close()
    ckpt = tmp_path / "run" / "checkpoints" / (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["requests_per_microbatch"] == 4
    del manifest["requests_per_microbatch"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="1 request"):
        Trainer(_cfg(tmp_path / "run", 4), _data(questions=2), log=lambda m: None).resume()
