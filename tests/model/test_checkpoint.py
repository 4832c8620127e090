"""Checkpoint directories: sharded and full-model layouts load; broken ones fail clearly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dohnuts.config import preset
from dohnuts.errors import CheckpointError, ConfigError
from dohnuts.model.build import build_text_backbone, resolve_source
from tests.reference import hf_full_config, relative_error, save_text_checkpoint


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharded")
    ref = save_text_checkpoint(preset("tiny"), path, max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").exists()
    return path, ref


def _load(path):
    cfg, ckpt = resolve_source(str(path))
    return build_text_backbone(cfg, checkpoint_dir=ckpt)[0]


def test_sharded_checkpoint_loads(sharded):
    path, ref = sharded
    model = _load(path)
    ids = torch.randint(0, 256, (1, 50))
    with torch.no_grad():
        assert relative_error(model(ids)[0], ref(input_ids=ids).last_hidden_state) < 1e-4


def test_full_model_layout_loads_text_and_vision(tmp_path):
    from transformers import Qwen3_5ForConditionalGeneration

    cfg = preset("tiny")
    torch.manual_seed(0)
    hf = Qwen3_5ForConditionalGeneration(hf_full_config(cfg)).eval()
    hf.save_pretrained(tmp_path)
    loaded_cfg, ckpt = resolve_source(str(tmp_path))
    assert loaded_cfg.vision is not None and loaded_cfg.text == cfg.text
    model, vision = build_text_backbone(loaded_cfg, checkpoint_dir=ckpt)
    assert any(k.startswith("blocks.") for k in vision)
    ids = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        theirs = hf.model.language_model(input_ids=ids).last_hidden_state
        assert relative_error(model(ids)[0], theirs) < 1e-4


def test_missing_shard_names_index_and_tensor(sharded, tmp_path):
    path, _ = sharded
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (broken / victim).unlink()
    with pytest.raises(CheckpointError, match=rf"model.safetensors.index.json.*{victim}.*tensor '"):
        _load(broken)


def test_wrong_shape_names_file_and_tensor(sharded, tmp_path):
    path, _ = sharded
    broken = tmp_path / "shape"
    shutil.copytree(path, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model-\d+-of-\d+\.safetensors.*mlp\.\w+_proj\.weight.*shape"):
        _load(broken)


def test_unknown_model_type(sharded, tmp_path):
    path, _ = sharded
    broken = tmp_path / "llama"
    shutil.copytree(path, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["model_type"] = "llama"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config.json: field 'model_type': is 'llama'"):
        _load(broken)


def test_corrupt_safetensors(tmp_path):
    save_text_checkpoint(preset("tiny"), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"model.safetensors: cannot be read as safetensors"):
        _load(tmp_path)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        resolve_source("huge")
