"""Speed regression gates (pytest-benchmark), run on purpose — never as unit tests:

    pytest benchmarks/test_regressions.py --benchmark-enable \
        --benchmark-storage=file://results/baselines --benchmark-compare --benchmark-compare-fail=median:25%

compares against the newest saved baseline of this machine kind and fails when a median got
25% slower. Save a new baseline with `--benchmark-save=<name>` after an intended change. The
benchmarks run on whatever device is present (the CPU tiny preset by default; on a GPU machine,
set DOHNUTS_BENCH_PRESET=qwen3.5-2b).
"""

from __future__ import annotations

import os

import pytest
import torch

import dohnuts.api as api
from dohnuts.runtime.predict import Predictor
from dohnuts.train.task import synthetic_requests

PRESET = os.environ.get("DOHNUTS_BENCH_PRESET", "tiny")


@pytest.fixture(scope="module")
def model():
    return api.load(PRESET)


def _sync(model):
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def test_backbone_forward(benchmark, model):
    ids = torch.randint(0, 256, (8, 256), device=model.device)

    def run():
        with torch.inference_mode():
            model.model.backbone(ids)
        _sync(model)

    benchmark(run)


def test_predict_call(benchmark, model):
    (req,) = synthetic_requests(1, questions=8, seed=0)
    pred = Predictor(model)
    benchmark(lambda: pred.call(req))
    pred.close()


def test_shared_prefix_call(benchmark, model):
    (req,) = synthetic_requests(1, questions=8, shared_prefix=300, seed=0)
    pred = Predictor(model, share_prefix=True)
    assert pred.prepare(req).plan.prefix_len > 0
    benchmark(lambda: pred.call(req))
    pred.close()
