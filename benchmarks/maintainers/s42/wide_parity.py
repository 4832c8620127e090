"""Scratch (sessions 41–42): where the wide GEMM moves a GPU's scores — the tiny LoRA session of
tests/gpu/test_training.py (seeded adapters), prediction and training's forward, with every claim
refused (`two`), only first claims (`first`: j = 0) and all (`wide`), in BF16 (training under
autocast, as the test) and FP32; pairwise relative errors and the claims each run took, by offset.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s42/wide_parity.py OUT.json"""
import collections, json, sys

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
claims = collections.Counter()


def counted(x, n, rows=None, only_first=False):
    j = CLAIM(x, n, rows)
    if j is not None and only_first and j > 0:
        return None  # the columns stay taken: a later reader cannot claim them either
    if j is not None:
        claims[(j, n)] += 1
    return j


scores, taken = {}, {}
with pytest.MonkeyPatch.context() as mp:
    _wide_tiny(mp)
    (req,) = synthetic_requests(1, questions=6, shared_prefix=300, seed=4)
    for dtype, variant in [(d, v) for d in (torch.bfloat16, torch.float32) for v in ("two", "first", "wide")]:
        spare.claim = {"two": lambda x, n, rows=None: None, "first": lambda x, n, rows=None: counted(x, n, rows, True),
                       "wide": counted}[variant]
        variant = f"{variant}-{str(dtype)[6:]}"
        session = api.load("tiny", device=DEV, dtype=dtype, lora=LoRAConfig(rank=4))
        g = torch.Generator(device=DEV).manual_seed(0)
        with torch.no_grad():
            for m in session.model.modules():
                if isinstance(m, LoRALinear):
                    m.lora_B.normal_(0, 0.05, generator=g)
        hb = session.prepare(req, train=True)
        pipe = Pipeline(session.device)
        dev = pipe.wait(*pipe.transfer(hb))
        for mode in ("predict", "train"):
            claims.clear()
            if mode == "predict":
                session.model.eval()
                with torch.inference_mode():
                    s = session.score(hb, dev)[0].float()
            else:
                session.model.train()
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                    s = session.model(dev.score_inputs(None), recompute=True).float().detach()
            scores[(variant, mode)] = s
            taken[f"{variant}/{mode}"] = {f"j={j},r={n}": c for (j, n), c in sorted(claims.items())}
        pipe.close()
spare.claim = CLAIM
keys = list(scores)
out = {"claims": taken, "rel": {f"{a[0]}/{a[1]} vs {b[0]}/{b[1]}": round(relative_error(scores[a], scores[b]), 5)
                               for i, a in enumerate(keys) for b in keys[i + 1:]}}
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
