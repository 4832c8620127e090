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


# -- hostile checkpoint directories: one line naming the file and field, never a hang or a traceback ----

def _tiny_checkpoint(path, *, mutate=None, config=None):
    """The tiny preset's text backbone as a checkpoint directory (seeded weights, no transformers);
    `mutate(state_dict)` edits the tensors, `config(dict)` the config.json, before they are written."""
    from safetensors.torch import save_file

    from dohnuts.hf_config import to_hf_text_config
    from dohnuts.model.checkpoint import init_weights
    from dohnuts.model.text import TextBackbone

    path.mkdir(parents=True, exist_ok=True)
    model = TextBackbone(preset("tiny").text)
    init_weights(model, 0)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if mutate:
        mutate(sd)
    save_file(sd, str(path / "model.safetensors"))
    cfg = {**to_hf_text_config(preset("tiny").text), "model_type": "qwen3_5_text"}
    if config:
        config(cfg)
    (path / "config.json").write_text(json.dumps(cfg))  # json.dumps writes NaN/Infinity as a hostile file would
    return path


def test_a_tiny_checkpoint_directory_loads(tmp_path):
    import dohnuts.api as api

    session = api.load(str(_tiny_checkpoint(tmp_path / "ok")), device="cpu")
    assert session.base_identity["weights"].startswith("checkpoint:")


@pytest.mark.parametrize("where, value, field, why", [
    ("rms_norm_eps", float("nan"), "rms_norm_eps", "must be a finite number, got NaN"),
    ("rope_theta", float("inf"), "rope_theta", "must be a finite number, got infinite"),
    ("partial_rotary_factor", float("nan"), "partial_rotary_factor", "must be a finite number, got NaN"),
    ("rope_parameters.partial_rotary_factor", float("inf"), "rope_parameters.partial_rotary_factor",
     "must be a finite number, got infinite"),
    ("rope_parameters.rope_theta", float("-inf"), "rope_parameters.rope_theta", "finite"),
    ("max_position_embeddings", -5, "max_position_embeddings", "must be an integer in 1.."),
    ("num_hidden_layers", 200_000, "num_hidden_layers", "must be an integer in 1..1024"),
    # without layer_types: a trillion layers once built their default layer types before any check (a hang)
    ("num_hidden_layers", 10**12, "num_hidden_layers", "must be an integer in 1..1024"),
    ("vocab_size", 10**30, "vocab_size", "a very large number"),
    ("hidden_size", True, "hidden_size", "must be an integer"),
    ("head_dim", 2.5, "head_dim", "must be an integer"),
])
def test_non_finite_and_absurd_config_numbers_are_refused_naming_the_field(tmp_path, where, value, field, why):
    def edit(cfg):
        *parents, key = where.split(".")
        d = cfg
        for p in parents:
            d = d[p]
        d[key] = value
        if key == "num_hidden_layers":
            cfg.pop("layer_types")

    root = _tiny_checkpoint(tmp_path, config=edit)
    import time

    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        resolve_source(str(root))
    assert time.perf_counter() - t0 < 5  # 200,000 layers are refused, not built
    assert f"config.json: field '{field}': " in str(info.value) and why in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_config_json_that_is_not_text_a_directory_or_a_fifo(tmp_path):
    from tests.hostile import fifo, no_hang

    root = _tiny_checkpoint(tmp_path / "a")
    (root / "config.json").write_bytes(b'{"model_type": "qwen3_5_text", "x": "\xff\xfe"}')
    with pytest.raises(ConfigError, match=r"config.json: is not UTF-8 text \(byte 0xff"):
        resolve_source(str(root))
    (root / "config.json").unlink()
    (root / "config.json").mkdir()
    with pytest.raises(CheckpointError, match=r"config.json: is a directory, not a JSON file"):
        resolve_source(str(root))
    (root / "config.json").rmdir()
    fifo(root / "config.json")
    with no_hang(), pytest.raises(CheckpointError, match=r"config.json: is a FIFO \(named pipe\)"):
        resolve_source(str(root))


def test_hostile_index_and_shards(tmp_path):
    from tests.hostile import fifo, no_hang

    root = _tiny_checkpoint(tmp_path / "a")
    index = root / "model.safetensors.index.json"
    for weight_map, why in [(["model.safetensors"], "field 'weight_map': must be a mapping"),
                            ({}, "field 'weight_map': is empty"),
                            ({"norm.weight": 5}, "field 'weight_map.norm.weight': must be a string"),
                            ({"norm.weight": "../model.safetensors"}, "a shard must be a file name"),
                            ({"norm.weight": "pipe.safetensors"}, "pipe.safetensors: is a FIFO")]:
        index.write_text(json.dumps({"weight_map": weight_map}))
        if "pipe" in why and not (root / "pipe.safetensors").exists():
            fifo(root / "pipe.safetensors")
        with no_hang(), pytest.raises(CheckpointError) as info:
            _load(root)
        assert why in str(info.value) and "\n" not in str(info.value), str(info.value)
    index.write_bytes(json.dumps({"weight_map": {"norm.weight": "model.safetensors"}}).encode() + b"\n\xff")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        _load(root)


@pytest.mark.parametrize("dtype, why", [(torch.int64, "is I64; weights must be floating point"),
                                        (torch.bool, "is BOOL; weights must be floating point"),
                                        (torch.float32, "holds non-finite values (NaN or infinite)")])
def test_integer_boolean_and_non_finite_weights_are_refused_naming_the_tensor(tmp_path, dtype, why):
    def mutate(sd):
        w = sd["layers.1.mlp.up_proj.weight"]
        sd["layers.1.mlp.up_proj.weight"] = w.to(dtype) if dtype != torch.float32 else w.index_fill(0, torch.tensor([3]),
                                                                                                      float("nan"))

    root = _tiny_checkpoint(tmp_path, mutate=mutate)
    with pytest.raises(CheckpointError) as info:
        _load(root)
    assert "model.safetensors: tensor 'layers.1.mlp.up_proj.weight' " + why in str(info.value), str(info.value)


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused_at_load(tmp_path):
    import dohnuts.api as api

    def small_vocab(sd):  # a consistent checkpoint: embedding of 200 rows
        sd["embed_tokens.weight"] = sd["embed_tokens.weight"][:200].clone()

    root = _tiny_checkpoint(tmp_path, mutate=small_vocab, config=lambda c: c.update(vocab_size=200))
    with pytest.raises(CheckpointError, match=r"config.json: field 'vocab_size': is 200, but the largest id of its "
                                              r"tokenizer \(bytes\) is 258"):
        api.load(str(root), device="cpu")


def test_stray_files_beside_a_model_are_not_read(tmp_path):
    """A `*.safetensors` that is no part of the model (here: 8 bytes announcing a 2**62-byte header)
    once made the weights fingerprint read it whole (MemoryError); only the model's files are read."""
    import dohnuts.api as api

    root = _tiny_checkpoint(tmp_path)
    before = api.load(str(root), device="cpu").base_identity
    (root / "stray.safetensors").write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    assert api.load(str(root), device="cpu").base_identity == before


def test_a_folder_named_like_a_preset_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()  # no config.json: not a checkpoint
    cfg, ckpt = resolve_source("tiny")
    assert ckpt is None and cfg == preset("tiny")
    with pytest.raises(CheckpointError, match="config.json is missing"):
        resolve_source("./tiny/")  # written as a path, it is the folder
    _tiny_checkpoint(tmp_path / "tiny")  # with a config.json it is a checkpoint: the folder wins
    assert resolve_source("tiny")[1].resolve() == tmp_path / "tiny"
