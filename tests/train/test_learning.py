"""The tiny preset learns the project's synthetic task well above chance within a CPU-minute."""

from __future__ import annotations

import pytest

import torch

import dohnuts.api as api
from dohnuts.model.lora import LoRAConfig
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import OptimConfig, Updater, make_optimizer
from dohnuts.train.task import synthetic_requests


def _accuracy(model, reqs):
    right = total = 0
    for res, req in zip(model.predict(reqs), reqs):
        for qr, q in zip(res.questions, req.questions):
            right += q.rewards[qr.choice] == 1.0
            total += 1
    return right / total


@pytest.mark.slow
def test_tiny_learns_synthetic_task():
    torch.manual_seed(0)
    model = api.load("tiny", lora=LoRAConfig(rank=8))
    train = synthetic_requests(200, seed=1)
    held_out = synthetic_requests(30, seed=2, id_prefix="held")  # 240 questions, 4 candidates
    chance = 0.25
    assert _accuracy(model, held_out) < chance + 0.1
    cfg = OptimConfig(lr=3e-3)
    updater = Updater(model, make_optimizer(model, cfg), RLCDConfig(), cfg)
    for _ in updater.run([train[(4 * step + j) % len(train)] for j in range(4)] for step in range(30)):
        pass
    updater.close()
    assert _accuracy(model, held_out) > 0.6  # measured 0.817 (deterministic: seeded data, LoRA, head; ledger M60)
