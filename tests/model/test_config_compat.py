"""Checkpoint compatibility as transformers defines it.

Every Qwen3.5 `config.json` that transformers accepts and runs loads in dohnuts and gives the same
hidden states (CPU, FP32): head_dim other than 256, any partial_rotary_factor, mrope_section longer
or shorter than the rotary half-dimension (transformers never checks its sum), the rope_parameters
layouts transformers reads, and keys left out (transformers' defaults). What transformers refuses
or crashes on fails here with one ConfigError naming the field.
"""

from __future__ import annotations

import json
import re
import shutil

import msgspec
import pytest
import torch

from dohnuts.config import ModelConfig, default_layer_types, preset
from dohnuts.hf_config import from_hf_config, to_hf_text_config
from dohnuts.errors import ConfigError
from dohnuts.model.build import build_text_backbone, resolve_source
from dohnuts.model.checkpoint import read_config
from dohnuts.model.rope import axis_of_frequency, rotary_cos_sin
from dohnuts.model.vision import build_vision_tower, image_token_count, mrope_position_ids, splice_image_features
from tests.reference import hf_full_config, relative_error, save_text_checkpoint
from tests.model.test_vision import _image_span, _patches, _perturbed, _sequence

TINY = preset("tiny")
M = TINY.vision.spatial_merge_size


def _model_cfg(**text) -> ModelConfig:
    return ModelConfig(name="compat", text=msgspec.structs.replace(TINY.text, **text), vision=TINY.vision,
                       image_token_id=TINY.image_token_id, vision_start_token_id=TINY.vision_start_token_id,
                       vision_end_token_id=TINY.vision_end_token_id)


def _image_style_positions(batch: int, length: int) -> torch.Tensor:
    """Distinct T/H/W axes, as image tokens have (the pattern of test_backbone_parity)."""
    t = torch.arange(length)
    return torch.stack([t, (t * 2) % 37, (t * 3) % 41]).view(3, 1, length).expand(3, batch, length)


def _compare(model, ref, *, expect_mrope_effect: bool) -> tuple[float, float]:
    """Relative errors (plain text positions, image-style positions) of dohnuts vs transformers."""
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (2, 90))
    pos = _image_style_positions(2, 90)
    with torch.no_grad():
        plain = model(ids)[0]
        ours = model(ids, position_ids=pos)[0]
        err_text = relative_error(plain, ref(input_ids=ids).last_hidden_state)
        err_mrope = relative_error(ours, ref(input_ids=ids, position_ids=pos).last_hidden_state)
    assert err_text < 1e-4, f"text positions: relative error {err_text:.2e}"
    assert err_mrope < 1e-4, f"image-style positions: relative error {err_mrope:.2e}"
    if expect_mrope_effect:  # the H/W axes really drive some frequencies
        assert relative_error(ours, plain) > 1e-3
    return err_text, err_mrope


def _hf_text_config(**overrides) -> dict:
    d = {**to_hf_text_config(TINY.text), "model_type": "qwen3_5_text"}
    d["rope_parameters"] = dict(d["rope_parameters"])
    d.update(overrides)
    return d


# ---------------------------------------------------------------------------------------------
# The rotary tables alone, over many shapes: dohnuts' cos/sin equal transformers' exactly.


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 256])
@pytest.mark.parametrize("factor", [0.0, 0.25, 0.3125, 0.5, 1.0])
@pytest.mark.parametrize("sections", [[11, 11, 10], [24, 20, 20], [2, 1, 1], [0, 0, 0], [1, -1, 3],
                                      [5, 5, 5, 5], [0, 100, 1], [3, 2]])
def test_rotary_tables_equal_transformers(head_dim, factor, sections):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    d = _hf_text_config(head_dim=head_dim, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": factor, "mrope_section": sections})
    if len(sections) < 3:  # transformers indexes mrope_section[2]: IndexError in the forward
        with pytest.raises(ConfigError, match=r"field 'mrope_section'"):
            from_hf_config(d, source="config.json", name="x")
        return
    cfg = from_hf_config(d, source="config.json", name="x").text
    rope = Qwen3_5TextRotaryEmbedding(Qwen3_5TextConfig(**{k: v for k, v in d.items() if k != "model_type"}))
    gen = torch.Generator().manual_seed(head_dim)
    pos = torch.randint(0, 1000, (3, 2, 50), generator=gen)
    x = torch.zeros(1, dtype=torch.float32)
    cos_t, sin_t = rope(x, pos)
    cos, sin = rotary_cos_sin(cfg, pos, torch.float32)
    assert axis_of_frequency(cfg).numel() == rope.inv_freq.numel()
    assert cos.shape == cos_t.shape and torch.equal(cos, cos_t) and torch.equal(sin, sin_t)


# ---------------------------------------------------------------------------------------------
# Whole text backbones from transformers checkpoints (Qwen3_5TextModel.save_pretrained).


@pytest.mark.parametrize("head_dim, factor, sections, mrope_effect", [
    pytest.param(64, 0.25, (11, 11, 10), True, id="hd64-factor0.25-default-sections-cut-at-8"),
    pytest.param(48, 0.5, (11, 11, 10), True, id="hd48-factor0.5-default-sections-cut-at-12"),
    pytest.param(48, 0.25, (11, 11, 10), True, id="hd48-factor0.25-default-sections-cut-at-6"),
    pytest.param(64, 0.5, (2, 1, 1), True, id="hd64-sections-shorter-than-16"),
    pytest.param(48, 0.5, (1, 6, 2), True, id="hd48-H-long-W-short"),
    pytest.param(48, 0.3125, (3, 3, 2), True, id="hd48-odd-rotary-dim-15"),
    pytest.param(32, 1.0, (1, 2, 3, 9), True, id="hd32-full-rotary-4-sections"),
    pytest.param(64, 0.25, (4, -1, 2), True, id="hd64-negative-section"),
    pytest.param(64, 0.5, (16, 0, 0), False, id="hd64-all-T"),
    pytest.param(48, 0.0, (11, 11, 10), False, id="hd48-no-rotary"),
])
def test_text_checkpoint_hidden_states_match(tmp_path, head_dim, factor, sections, mrope_effect):
    cfg = _model_cfg(head_dim=head_dim, partial_rotary_factor=factor, mrope_section=sections)
    ref = save_text_checkpoint(cfg, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["head_dim"] == head_dim and saved["rope_parameters"]["mrope_section"] == list(sections)
    loaded, ckpt = resolve_source(str(tmp_path))
    assert loaded.text == cfg.text
    model = build_text_backbone(loaded, checkpoint_dir=ckpt)[0].eval()
    _compare(model, ref, expect_mrope_effect=mrope_effect)


# ---------------------------------------------------------------------------------------------
# config.json layouts transformers reads: both sides load the same directory.


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("compat_base")
    # Two full-attention layers (interval 2) so that layer_types can also be left to the interval.
    cfg = _model_cfg(head_dim=48, partial_rotary_factor=0.5, mrope_section=(1, 2, 3),
                     layer_types=default_layer_types(4, 2))
    save_text_checkpoint(cfg, path)
    return path


def _rope(c):
    return c["rope_parameters"]


def _move_theta_and_factor_to_top(c):
    c["rope_theta"], c["partial_rotary_factor"] = 500.0, 0.25
    del _rope(c)["rope_theta"], _rope(c)["partial_rotary_factor"]


def _top_level_loses_to_dict(c):
    c["rope_theta"], c["partial_rotary_factor"] = 1.0, 1.0


def _rename_to_rope_scaling(c):
    c["rope_scaling"] = c.pop("rope_parameters")


def _rope_scaling_wins(c):
    c["rope_scaling"] = {**_rope(c), "mrope_section": [0, 5, 5], "rope_theta": 123.0}


def _legacy_type_key(c):
    _rope(c)["type"] = _rope(c).pop("rope_type")


def _top_level_mrope_is_ignored(c):
    del _rope(c)["mrope_section"]
    c["mrope_section"] = [0, 8, 8]


def _optional_keys_left_out(c):
    for k in ("rms_norm_eps", "linear_conv_kernel_dim", "max_position_embeddings", "hidden_act", "attention_bias"):
        del c[k]


def _interval_instead_of_layer_types(c):
    del c["layer_types"]
    c["full_attention_interval"] = 2


def _null_layer_types(c):
    c["layer_types"] = None
    c["full_attention_interval"] = 2


def _zero_eps(c):
    c["rms_norm_eps"] = 0.0


LAYOUTS = {
    # name: (edit, the text config fields it must resolve to)
    "mrope-section-left-out": (lambda c: _rope(c).pop("mrope_section"), {"mrope_section": (11, 11, 10)}),
    "theta-and-factor-top-level": (_move_theta_and_factor_to_top, {"rope_theta": 500.0, "partial_rotary_factor": 0.25}),
    "dict-wins-over-top-level": (_top_level_loses_to_dict, {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "rope-scaling-name": (_rename_to_rope_scaling, {"mrope_section": (1, 2, 3)}),
    "rope-scaling-wins": (_rope_scaling_wins, {"mrope_section": (0, 5, 5), "rope_theta": 123.0}),
    "legacy-type-key": (_legacy_type_key, {"mrope_section": (1, 2, 3)}),
    "no-rope-parameters": (lambda c: c.pop("rope_parameters"),
                           {"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": (11, 11, 10)}),
    "top-level-mrope-ignored": (_top_level_mrope_is_ignored, {"mrope_section": (11, 11, 10)}),
    "optional-keys-left-out": (_optional_keys_left_out, {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768}),
    "interval-instead-of-layer-types": (_interval_instead_of_layer_types, {"layer_types": default_layer_types(4, 2)}),
    "null-layer-types": (_null_layer_types, {"layer_types": default_layer_types(4, 2)}),
    "zero-rms-norm-eps": (_zero_eps, {"rms_norm_eps": 0.0}),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_config_layouts_load_like_transformers(base_checkpoint, tmp_path, layout):
    from transformers import Qwen3_5TextModel

    edit, expected = LAYOUTS[layout]
    path = tmp_path / "ckpt"
    shutil.copytree(base_checkpoint, path)
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))
    ref = Qwen3_5TextModel.from_pretrained(path, dtype=torch.float32).eval()
    loaded, ckpt = resolve_source(str(path))
    for name, value in expected.items():
        assert getattr(loaded.text, name) == value, name
    hf_rope = ref.config.rope_parameters
    assert (loaded.text.rope_theta, loaded.text.partial_rotary_factor, loaded.text.mrope_section) == (
        hf_rope["rope_theta"], hf_rope["partial_rotary_factor"],
        tuple(hf_rope.get("mrope_section", (11, 11, 10))))
    assert loaded.text.layer_types == tuple(ref.config.layer_types)
    model = build_text_backbone(loaded, checkpoint_dir=ckpt)[0].eval()
    _compare(model, ref, expect_mrope_effect=True)


# ---------------------------------------------------------------------------------------------
# What transformers refuses or cannot run is refused here, with one line naming the field.


REFUSED = {
    "mrope-two-entries": ({"rope_parameters": {"rope_type": "default", "mrope_section": [1, 1]}}, "mrope_section"),
    "mrope-float": ({"rope_parameters": {"rope_type": "default", "mrope_section": [1, 1.5, 1]}}, "mrope_section[1]"),
    "mrope-null": ({"rope_parameters": {"rope_type": "default", "mrope_section": None}}, "mrope_section"),
    "factor-above-1": ({"partial_rotary_factor": 1.5, "rope_parameters": {"rope_type": "default"}},
                       "partial_rotary_factor"),
    "factor-negative": ({"partial_rotary_factor": -0.5, "rope_parameters": {"rope_type": "default"}},
                        "partial_rotary_factor"),
    "odd-head-fully-rotated": ({"head_dim": 15, "rope_parameters": {"rope_type": "default",
                                                                    "partial_rotary_factor": 1.0}},
                               "partial_rotary_factor"),
    "per-layer-type-rope": ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
                            "rope_parameters"),
    "layer-types-length": ({"layer_types": ["linear_attention", "full_attention"]}, "layer_types"),
    "empty-layer-types": ({"layer_types": []}, "layer_types"),
    "head-dim-null": ({"head_dim": None}, "head_dim"),
    "grouped-heads": ({"num_attention_heads": 3}, "num_key_value_heads"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_transformers_refuses_is_refused(tmp_path, case):
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    overrides, field = REFUSED[case]
    d = _hf_text_config(**overrides)
    with pytest.raises(Exception):  # transformers refuses the config, or fails to build or run it
        hf = Qwen3_5TextModel(Qwen3_5TextConfig.from_dict({k: v for k, v in d.items() if k != "model_type"}))
        hf(input_ids=torch.randint(0, 256, (1, 7)))
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=rf"config.json: field '{re.escape(field)}': ") as info:
        read_config(tmp_path)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# The full model (text + vision): Qwen3_5ForConditionalGeneration and Qwen3_5Model layouts, real
# image positions (get_rope_index's grid coordinates) through the loaded backbone.


@pytest.mark.parametrize("cls_name", ["Qwen3_5ForConditionalGeneration", "Qwen3_5Model"])
def test_full_model_checkpoint_with_images_matches(tmp_path, cls_name):
    import transformers

    cfg = _model_cfg(head_dim=48, partial_rotary_factor=0.5, mrope_section=(11, 11, 10))
    torch.manual_seed(0)
    hf = _perturbed(getattr(transformers, cls_name)(hf_full_config(cfg)))
    hf.save_pretrained(tmp_path)
    inner = hf.model if cls_name == "Qwen3_5ForConditionalGeneration" else hf
    loaded, ckpt = resolve_source(str(tmp_path))
    assert loaded.text == cfg.text and loaded.vision == cfg.vision
    backbone, vision_tensors = build_text_backbone(loaded, checkpoint_dir=ckpt)
    backbone.eval()
    tower = build_vision_tower(loaded.vision, tensors=vision_tensors).eval()

    grids = [[1, 4, 6], [1, 8, 12]]
    n = [image_token_count(g, M) for g in grids]
    ids = torch.tensor([_sequence([5, _image_span(n[0]), 7, _image_span(n[1]), 3], seed=3)])
    x, g = _patches(grids, seed=5)
    with torch.no_grad():
        theirs = inner(input_ids=ids, pixel_values=x, image_grid_thw=g,
                       mm_token_type_ids=(ids == cfg.image_token_id).int()).last_hidden_state
        embeds = splice_image_features(backbone.embed_tokens(ids), ids, tower(x, g), cfg.image_token_id)
        pos = mrope_position_ids(ids[0], g, image_token_id=cfg.image_token_id, spatial_merge_size=M)[:, None]
        ours, _ = backbone(inputs_embeds=embeds, position_ids=pos)
        text_positions_only, _ = backbone(inputs_embeds=embeds)
    err = relative_error(ours, theirs)
    assert err < 1e-4, f"relative error {err:.2e}"
    assert relative_error(text_positions_only, theirs) > 1e-4  # the image positions matter
