"""LoRA: merged equals unmerged; adapters save, load and refuse a foreign base."""

from __future__ import annotations


import pytest
import torch

import dohnuts.api as api
from dohnuts.adapters import save_adapter
from dohnuts.errors import CheckpointError
from dohnuts.model.lora import LoRAConfig, LoRALinear, apply_lora
from dohnuts.model.text import TextBackbone
from dohnuts.config import preset
from dohnuts.train.task import synthetic_requests
from tests.reference import relative_error


def _scores(model, reqs):
    return torch.tensor([s for r in model.predict(reqs) for q in r.questions for s in q.scores])


def _randomize_adapters(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.05)


def test_merged_equals_unmerged():
    model = api.load("tiny", lora=LoRAConfig(rank=4, alpha=8))
    _randomize_adapters(model)
    reqs = synthetic_requests(3, seed=5)
    base = api.load("tiny")
    before = _scores(model, reqs)
    assert relative_error(before, _scores(base, reqs)) > 1e-3  # the adapters do change the scores
    adapters = sum(1 for m in model.model.modules() if isinstance(m, LoRALinear))
    assert adapters == 3 * 6 + 1 * 7  # tiny: 3 DeltaNet layers × (3 mixer + 3 MLP) + 1 attention × (4 + 3)
    n = model.merge_lora()
    assert n == adapters
    assert not any(isinstance(m, LoRALinear) for m in model.model.modules())
    assert relative_error(_scores(model, reqs), before) < 1e-5


def test_unmatched_target_warns():
    backbone = TextBackbone(preset("tiny").text)
    with pytest.warns(UserWarning, match="'nonexistent_proj' matches no linear"):
        apply_lora(backbone, LoRAConfig(targets=("q_proj", "nonexistent_proj")))


def test_only_adapters_and_head_train():
    model = api.load("tiny", lora=LoRAConfig(rank=2))
    names = {n for n, p in model.model.named_parameters() if p.requires_grad}
    assert names and all(".lora_A" in n or ".lora_B" in n or n.startswith("head.") for n in names)


def test_adapter_roundtrip_and_identity(tmp_path):
    model = api.load("tiny", lora=LoRAConfig(rank=4))
    _randomize_adapters(model, seed=3)
    model.temperature = 1.7
    path = tmp_path / "adapter.safetensors"
    save_adapter(model, path)
    reqs = synthetic_requests(2, seed=9)
    again = api.load("tiny", adapter=path)
    assert again.temperature == 1.7
    assert torch.equal(_scores(again, reqs), _scores(model, reqs))
    with pytest.raises(CheckpointError, match=r"adapter.safetensors: field 'base_identity.weights'"):
        api.load("tiny", adapter=path, seed=1)  # same architecture, other weights


def test_corrupt_adapter(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="bad.safetensors: cannot be read"):
        api.load("tiny", adapter=path)


def test_bench_target_serves_an_adapter_merged(tmp_path):
    """The bench's dohnuts target with `adapter:` measures the model as `dohnuts predict --adapter`
    serves it: adapters merged into the base, the adapter's temperature, the same scores."""
    from bench_plugins.targets.dohnuts_target import DohnutsTarget
    from dohnuts.bench.calls import PredictCall
    from dohnuts.runtime.timing import NULL_TIMER

    model = api.load("tiny", lora=LoRAConfig(rank=4))
    _randomize_adapters(model, seed=4)
    model.temperature = 0.7
    path = tmp_path / "adapter.safetensors"
    save_adapter(model, path)

    class Spec:
        kind, model, seed, file = "text", "tiny", 0, "w.yaml"

    target = DohnutsTarget(Spec(), torch.device("cpu"), torch.float32, DohnutsTarget.Options(adapter=str(path)))
    assert target.model.lora is None and target.model.temperature == 0.7 and target.lora_info is None
    assert not any(isinstance(m, LoRALinear) for m in target.model.model.modules())
    (req,) = synthetic_requests(1, seed=6)
    result = target.run_call(PredictCall(req), NULL_TIMER)
    assert result.decisions == len(req.questions)
    assert relative_error(_scores(target.model, [req]), _scores(model, [req])) < 1e-5
    target.close()
