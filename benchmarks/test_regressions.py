"""Speed regression gates (pytest-benchmark + a statistical verdict), run on purpose — never as unit tests.

Measure this build and gate it against saved pytest-benchmark baselines of this machine kind:

    pytest benchmarks/test_regressions.py --benchmark-enable --benchmark-save-data \\
        --benchmark-json=/tmp/current.json
    dohnuts-bench gate /tmp/current.json --baseline results/baselines/h200-2b-*.json

(The gate of the product's workloads — `dohnuts-bench gate --against REV`, both builds timed in
interleaved rounds, or `dohnuts-bench baseline` then `dohnuts-bench gate RUN` — is the README's;
these are the hot paths timed on their own, against saved files: the coarse way.)

`dohnuts-bench gate` (dohnuts/bench/commands/gate.py) compares every benchmark's raw timings with the
pooled baseline runs': a bootstrap confidence interval of the ratio of medians and a rank test (dohnuts.bench.analysis.compare),
with a tolerance taken from the spread measured (within runs, and between the baseline's runs)
instead of a fixed percentage (a fixed 25 % failed twice on unchanged code on the 2-core CI
machine). It exits 1 when a benchmark is slower beyond that, 0 otherwise. After an intended
change, save three new baseline runs spread over time — minutes apart, not seconds: three runs
taken 6 s apart on the 2-core CI machine (the cpu-tiny-* files, since removed) made a tolerance
that the same commit failed by 3.2–3.7× later (`results/baselines/<machine>-{1,2,3}.json`;
h200-2b-* are the H200's, made with DOHNUTS_BENCH_PRESET=qwen3.5-2b: `BASELINES=3 bash
benchmarks/gpu_session.sh`).

The workloads are the product's hot paths: one prediction call, a shared-prefix call, an image
call with the feature cache warm, and one training update (4 microbatches) — on whatever device
is present (the tiny preset on a CPU by default). DOHNUTS_BENCH_SLOWDOWN=2 doubles every
measured call on purpose (tests/bench/test_regression_gate.py proves the gate catches it);
DOHNUTS_BENCH_ROUNDS (default 15) and DOHNUTS_BENCH_THREADS set the rounds and torch's threads.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from PIL import Image

import dohnuts
from dohnuts.model.lora import LoRAConfig
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import OptimConfig, Updater, make_optimizer
from dohnuts.train.task import synthetic_requests

PRESET = os.environ.get("DOHNUTS_BENCH_PRESET", "tiny")
SLOWDOWN = float(os.environ.get("DOHNUTS_BENCH_SLOWDOWN", "1"))
ROUNDS = int(os.environ.get("DOHNUTS_BENCH_ROUNDS", "15"))
if os.environ.get("DOHNUTS_BENCH_THREADS"):  # fewer threads: steadier timings on a shared machine
    torch.set_num_threads(int(os.environ["DOHNUTS_BENCH_THREADS"]))


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _measured(fn, device):
    """fn, synchronised; slowed down by DOHNUTS_BENCH_SLOWDOWN on purpose (gate tests)."""
    def run():
        t0 = time.perf_counter()
        fn()
        _sync(device)
        if SLOWDOWN > 1:
            time.sleep((time.perf_counter() - t0) * (SLOWDOWN - 1))
    return run


def _bench(benchmark, fn, device):
    benchmark.pedantic(_measured(fn, device), rounds=ROUNDS, warmup_rounds=2, iterations=1)


@pytest.fixture(scope="module")
def model():
    return dohnuts.load(PRESET)


def test_predict_call(benchmark, model):
    (req,) = synthetic_requests(1, questions=8, seed=0)
    pred = Predictor(model)
    assert pred.prepare(req).plan.prefix_len == 0  # one batched pass
    _bench(benchmark, lambda: pred.call(req), model.device)
    pred.close()


def test_shared_prefix_call(benchmark, model):
    (req,) = synthetic_requests(1, questions=8, shared_prefix=300, seed=0)
    pred = Predictor(model)
    assert pred.prepare(req).plan.prefix_len > 0  # the shared pass
    _bench(benchmark, lambda: pred.call(req), model.device)
    pred.close()


def test_image_call_warm_cache(benchmark, model, tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(path)
    req = Request(id="img", questions=(Question("q", "what is shown?", ("a cat", "a dog", "a car")),),
                  prefix="a photo", image=str(path))
    pred = Predictor(model)
    pred.call(req)  # fills the cache: every measured call hits
    _bench(benchmark, lambda: pred.call(req), model.device)
    assert model.image_cache.stats().encode_calls == 1
    pred.close()


def test_train_update(benchmark):
    session = dohnuts.load(PRESET, lora=LoRAConfig(rank=8))
    cfg = OptimConfig()
    updater = Updater(session, make_optimizer(session, cfg), RLCDConfig(), cfg)
    reqs = synthetic_requests(4, questions=4, seed=1)
    _bench(benchmark, lambda: updater.update(reqs), session.device)
    updater.close()
