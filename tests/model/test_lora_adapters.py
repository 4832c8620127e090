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
from tests.hostile import HOSTILE_ADAPTER_META
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


def test_the_same_adapter_saves_to_the_same_bytes(tmp_path):
    """Same weights, same bytes: saved again, and re-exported after a load (safetensors itself
    writes the metadata in its hash map's order, which changes from save to save)."""
    import hashlib

    model = api.load("tiny", lora=LoRAConfig(rank=4))
    _randomize_adapters(model, seed=5)
    digests = set()
    for i in range(8):
        save_adapter(model, tmp_path / f"a{i}.safetensors", extra={"update": 3, "dev_accuracy": 0.5})
        digests.add(hashlib.sha256((tmp_path / f"a{i}.safetensors").read_bytes()).hexdigest())
    again = api.load("tiny", adapter=tmp_path / "a0.safetensors", merge=False)
    save_adapter(again, tmp_path / "re-export.safetensors", extra={"update": 3, "dev_accuracy": 0.5})
    digests.add(hashlib.sha256((tmp_path / "re-export.safetensors").read_bytes()).hexdigest())
    assert len(digests) == 1


def test_corrupt_adapter(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="bad.safetensors: cannot be read"):
        api.load("tiny", adapter=path)


def test_bench_target_serves_an_adapter_merged(tmp_path):
    """The bench's dohnuts target with `adapter:` measures the model as `dohnuts predict --adapter`
    serves it: adapters merged into the base, the adapter's temperature, the same scores."""
    from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget
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
    assert target.model.lora is None and target.model.temperature == 0.7  # merged: the session has no adapters
    # ... and its records say which were merged (the cost model counts no adapter FLOPs for them)
    assert target.lora_info == {"rank": 4, "targets": list(model.lora.targets), "merged": True}
    assert not any(isinstance(m, LoRALinear) for m in target.model.model.modules())
    (req,) = synthetic_requests(1, seed=6)
    result = target.run_call(PredictCall(req), NULL_TIMER)
    assert result.decisions == len(req.questions)
    assert relative_error(_scores(target.model, [req]), _scores(model, [req])) < 1e-5
    target.close()


# -- hostile adapter files: every field checked at load, one line naming the file and the field ----------

@pytest.fixture(scope="module")
def saved_adapter(tmp_path_factory):
    """(tensors, metadata) of a valid tiny adapter, to be rewritten with one hostile change."""
    from safetensors import safe_open

    model = api.load("tiny", lora=LoRAConfig(rank=2))
    _randomize_adapters(model, seed=1)
    path = tmp_path_factory.mktemp("adapter") / "good.safetensors"
    save_adapter(model, path)
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def _hostile(tmp_path, saved, *, meta=None, tensors=None, drop=()):
    from safetensors.torch import save_file

    t, m = dict(saved[0]), dict(saved[1])
    m.update(meta or {})
    for key in drop:
        m.pop(key)
    if tensors:
        tensors(t)
    path = tmp_path / "hostile.safetensors"
    save_file(t, str(path), metadata=m)
    return path


# The cases every command that takes an adapter is tested with (tests/hostile.py), and those only the
# reader needs: a list with a bad element, an absurd rank, a list for the config, a JSON error in
# `extra`, a bad field inside base_identity, another format.
HOSTILE_META = HOSTILE_ADAPTER_META + [
    ({"lora": '{"rank": 2, "alpha": 16, "dropout": 0.0, "targets": ["q_proj", 3]}'}, "lora.targets[1]",
     "must be a string"),
    ({"lora": '{"rank": 1000000000, "alpha": 16, "dropout": 0.0, "targets": ["q_proj"]}'}, "lora.rank",
     "must be an integer in 1..1024"),
    ({"lora": "[]"}, "lora", "must be"),
    ({"extra": "{"}, "extra", "is not valid JSON"),
    ({"base_identity": '{"weights": 5}'}, "base_identity.weights", "must be a string"),
    ({"format": "other"}, "format", "expected 'dohnuts-adapter-1'"),
]


@pytest.mark.parametrize("meta, field, why", HOSTILE_META, ids=[f"{c[1]}-{i}" for i, c in enumerate(HOSTILE_META)])
def test_hostile_adapter_metadata_is_one_line_naming_the_field(tmp_path, saved_adapter, meta, field, why):
    path = _hostile(tmp_path, saved_adapter, meta=meta)
    with pytest.raises(CheckpointError) as info:
        api.load("tiny", adapter=path)
    text = str(info.value)
    assert text.startswith(f"{path}: field '{field}': ") and why in text and "\n" not in text, text


def test_missing_metadata_and_non_finite_or_integer_tensors(tmp_path, saved_adapter):
    for key in ("lora", "base_identity"):
        with pytest.raises(CheckpointError, match=rf"field '{key}': is missing"):
            api.load("tiny", adapter=_hostile(tmp_path, saved_adapter, drop=[key]))
    name = next(k for k in saved_adapter[0] if k.endswith("lora_A"))

    def nan(t):
        t[name] = t[name].clone().index_fill(0, torch.tensor([0]), float("nan"))

    with pytest.raises(CheckpointError, match=rf"hostile.safetensors: tensor '{name}' holds non-finite values"):
        api.load("tiny", adapter=_hostile(tmp_path, saved_adapter, tensors=nan))
    with pytest.raises(CheckpointError, match=r"tensor 'head.weight' is I32; adapter tensors must be floating"):
        api.load("tiny", adapter=_hostile(tmp_path, saved_adapter,
                                          tensors=lambda t: t.update({"head.weight": t["head.weight"].int()})))


def test_an_adapter_that_is_a_fifo_or_too_large_is_not_opened(tmp_path, monkeypatch):
    import dohnuts.adapters as adapters
    from tests.hostile import fifo, no_hang

    with no_hang(), pytest.raises(CheckpointError, match=r"pipe: is a FIFO \(named pipe\), not an adapter file"):
        api.load("tiny", adapter=fifo(tmp_path / "pipe"))
    big = tmp_path / "big.safetensors"
    big.write_bytes(b"\0" * 2048)
    monkeypatch.setattr(adapters, "MAX_ADAPTER_BYTES", 1024)
    with pytest.raises(CheckpointError, match=r"big.safetensors: is 2.0 KiB, over the 1.0 KiB limit for an adapter"):
        api.load("tiny", adapter=big)


def test_scoring_model_train_sets_what_module_train_sets():
    """ScoringModel.train sets the flags directly, not through nn.Module.train's recursion: the
    same flags as nn.Module.train on every submodule, both ways, and a submodule with
    its own train() still gets the call."""
    from torch import nn

    from tests.reference import adapted_tiny

    model = adapted_tiny().model
    calls = []

    class Own(nn.Module):
        def train(self, mode=True):
            calls.append(mode)
            return super().train(mode)

    model.head.extra = Own()
    for mode in (True, False, True):
        model.train(mode)
        got = [m.training for m in model.modules()]
        nn.Module.train(model, not mode)
        nn.Module.train(model, mode)
        assert got == [m.training for m in model.modules()] == [mode] * len(got)
    assert calls[::3] == [True, False, True]  # ours, then nn.Module.train's two per round
    model.eval()
    assert not any(m.training for m in model.modules())
    with pytest.raises(ValueError):
        model.train("yes")
