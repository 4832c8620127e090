"""Scratch (session 41): tests/gpu/test_training.py::test_training_and_prediction_score_a_request_alike
over seeded adapters (its own draw uses the global CUDA RNG, so its value follows the tests run
before it), with the adapted groups' wide GEMM (claims taken) and without (every claim refused):
the relative error of training's scores against prediction's, per seed.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s41/train_predict_gap.py OUT.json"""
import json, sys

import pytest
import torch

import dohnuts.api as api
from dohnuts.model.lora import LoRAConfig, LoRALinear
from dohnuts.ops import spare
from dohnuts.runtime.pipeline import Pipeline
from dohnuts.train.task import synthetic_requests
from tests.gpu.helpers import DEV, _wide_tiny
from tests.reference import relative_error

CLAIM = spare.claim
out = {"wide": [], "two": []}
with pytest.MonkeyPatch.context() as mp:
    _wide_tiny(mp)
    (req,) = synthetic_requests(1, questions=6, shared_prefix=300, seed=4)
    for seed in range(12):
        for variant in ("wide", "two"):
            spare.claim = CLAIM if variant == "wide" else (lambda x, n: None)
            session = api.load("tiny", device=DEV, dtype=torch.bfloat16, lora=LoRAConfig(rank=4))
            g = torch.Generator(device=DEV).manual_seed(seed)
            with torch.no_grad():
                for m in session.model.modules():
                    if isinstance(m, LoRALinear):
                        m.lora_B.normal_(0, 0.05, generator=g)
            hb = session.prepare(req, train=True)
            pipe = Pipeline(session.device)
            dev = pipe.wait(*pipe.transfer(hb))
            session.model.eval()
            with torch.inference_mode():
                served = session.score(hb, dev)[0].float()
            session.model.train()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                trained = session.model(dev.score_inputs(None), recompute=True).float()
            out[variant].append(round(relative_error(trained.detach(), served), 5))
            pipe.close()
        print(seed, out["wide"][-1], out["two"][-1], flush=True)
spare.claim = CLAIM
json.dump(out, open(sys.argv[1], "w"), indent=1)
