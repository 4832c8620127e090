"""transformers' `config.json` ↔ dohnuts' model configs (dohnuts.config).

`from_hf_config` reads a Qwen3.5 `config.json` (text-only `qwen3_5_text` or the full `qwen3_5`)
as transformers reads it, with transformers' defaults for the keys a file may leave out;
`to_hf_text_config` / `to_hf_vision_config` write the dicts transformers' config classes take
(the reference implementation in tests, the transformers peer of the benchmark)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from dohnuts.config import ModelConfig, TextConfig, VisionConfig, default_layer_types
from dohnuts.errors import ConfigError
from dohnuts.schema import Finite, convert


# What a config.json may hold, typed (msgspec, dohnuts.schema): every number that is read must be a
# finite number (a NaN or an infinity, which Python's JSON reader accepts, would make every score
# NaN) and every count an integer, named by its path when it is not (`text_config.rms_norm_eps`).
# The bounds of each field are TextConfig's and VisionConfig's own checks; other keys are ignored.
class HFRotary(msgspec.Struct):
    rope_theta: Finite | None = None
    partial_rotary_factor: Finite | None = None


_Count = int | None


class HFText(msgspec.Struct):
    vocab_size: _Count = None
    hidden_size: _Count = None
    intermediate_size: _Count = None
    num_hidden_layers: _Count = None
    num_attention_heads: _Count = None
    num_key_value_heads: _Count = None
    head_dim: _Count = None
    linear_num_key_heads: _Count = None
    linear_num_value_heads: _Count = None
    linear_key_head_dim: _Count = None
    linear_value_head_dim: _Count = None
    linear_conv_kernel_dim: _Count = None
    max_position_embeddings: _Count = None
    full_attention_interval: _Count = None
    rms_norm_eps: Finite | None = None
    rope_theta: Finite | None = None
    partial_rotary_factor: Finite | None = None
    rope_parameters: HFRotary | None = None
    rope_scaling: HFRotary | None = None


class HFVision(msgspec.Struct):
    depth: _Count = None
    hidden_size: _Count = None
    intermediate_size: _Count = None
    num_heads: _Count = None
    out_hidden_size: _Count = None
    spatial_merge_size: _Count = None
    in_channels: _Count = None
    num_position_embeddings: _Count = None
    rope_parameters: HFRotary | None = None
    rope_scaling: HFRotary | None = None


class HFModel(msgspec.Struct):
    text_config: HFText | None = None
    vision_config: HFVision | None = None
    image_token_id: _Count = None
    vision_start_token_id: _Count = None
    vision_end_token_id: _Count = None



_TEXT_KEYS = {f.name for f in dataclasses.fields(TextConfig)} - {"source"}
_VISION_KEYS = {f.name for f in dataclasses.fields(VisionConfig)} - {"source"}


# transformers' defaults for keys a config.json may leave out (transformers 5.x
# models/qwen3_5/configuration_qwen3_5.py: Qwen3_5TextConfig fields and __post_init__,
# RotaryEmbeddingConfigMixin.default_theta, Qwen3_5TextRotaryEmbedding's mrope_section default,
# Qwen3_5VisionConfig fields). Some differ from the dataclass defaults above (rope_theta,
# linear_num_value_heads, max_position_embeddings), which describe the presets.
_HF_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
}
_HF_ROPE_THETA = 10000.0
_HF_PARTIAL_ROTARY_FACTOR = 0.25
_HF_MROPE_SECTION = (11, 11, 10)
_HF_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 3584,
}
_ROPE_KEYS = {"rope_theta", "partial_rotary_factor", "mrope_section"}


def _hf_rope(d: dict[str, Any], layer_types: list[Any], source: str) -> dict[str, Any]:
    """rope_theta / partial_rotary_factor / mrope_section as transformers resolves them.

    `rope_scaling` (legacy name) wins over `rope_parameters`; inside the dict a value wins over
    the top-level `rope_theta` / `partial_rotary_factor` keys, which win over the defaults
    (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict). `mrope_section` is read from the
    dict only (a top-level `mrope_section` is ignored by transformers, and so here)."""
    rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"must be an object, got {rope!r}", source=source, field="rope_parameters")
    nested = [k for k in rope if k in layer_types]
    if nested:  # transformers' text rotary then finds no top-level rope_type and fails
        raise ConfigError(f"per-layer-type entries {nested} are not supported by Qwen3.5", source=source,
                          field="rope_parameters")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    # "mrope" (a Qwen2-VL spelling) is accepted as the default rotary it means here.
    if rope_type not in ("default", "mrope"):
        raise ConfigError(f"unsupported rope_type {rope_type!r}", source=source, field="rope_parameters")
    theta = d.get("rope_theta", _HF_ROPE_THETA)
    # Qwen3_5TextConfig defaults a missing top-level factor to 0.25; an explicit null leaves it
    # unset and the rotary then falls back to 1.0.
    factor = d.get("partial_rotary_factor", _HF_PARTIAL_ROTARY_FACTOR)
    return {
        "rope_theta": rope.get("rope_theta", theta),
        "partial_rotary_factor": rope.get("partial_rotary_factor", 1.0 if factor is None else factor),
        "mrope_section": rope.get("mrope_section", _HF_MROPE_SECTION),
    }


def _text_from_hf(d: dict[str, Any], source: str) -> TextConfig:
    if not isinstance(d, dict):
        raise ConfigError(f"must be an object, got {d!r}", source=source, field="text_config")
    kwargs = dict(_HF_TEXT_DEFAULTS)
    kwargs.update({k: d[k] for k in _TEXT_KEYS - _ROPE_KEYS - {"layer_types"} if k in d})
    layers = kwargs["num_hidden_layers"]
    layer_types = d.get("layer_types")
    if layer_types is None:  # Qwen3_5TextConfig.__post_init__: every full_attention_interval-th layer
        interval = d.get("full_attention_interval", 4)
        if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
            raise ConfigError(f"must be a positive integer, got {interval!r}", source=source,
                              field="full_attention_interval")
        layer_types = default_layer_types(layers, interval) if isinstance(layers, int) and layers > 0 else []
    elif not isinstance(layer_types, (list, tuple)) or (not layer_types and layers):
        raise ConfigError(f"must list one type per layer, got {layer_types!r}", source=source, field="layer_types")
    kwargs["layer_types"] = tuple(layer_types)
    kwargs.update(_hf_rope(d, list(layer_types), source))
    if d.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"unsupported hidden_act {d['hidden_act']!r}", source=source, field="hidden_act")
    if d.get("attention_bias"):
        raise ConfigError("attention_bias=true is not supported", source=source, field="attention_bias")
    try:
        return TextConfig(source=source, **kwargs)
    except TypeError as exc:  # pragma: no cover - defensive: a value of the wrong kind
        raise ConfigError(str(exc), source=source) from None


def _vision_from_hf(d: dict[str, Any], source: str) -> VisionConfig:
    if not isinstance(d, dict):
        raise ConfigError(f"must be an object, got {d!r}", source=source, field="vision_config")
    kwargs = dict(_HF_VISION_DEFAULTS)
    kwargs.update({k: d[k] for k in _VISION_KEYS if k in d and d[k] is not None})
    rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
    if isinstance(rope, dict) and "rope_theta" in rope:
        kwargs["rope_theta"] = rope["rope_theta"]
    for key in ("patch_size", "temporal_patch_size"):
        if isinstance(kwargs.get(key), (list, tuple)):
            kwargs[key] = int(kwargs[key][0])
    try:
        return VisionConfig(source=source, **kwargs)
    except TypeError as exc:  # pragma: no cover - defensive: a value of the wrong kind
        raise ConfigError(str(exc), source=source) from None


def _nested(read, d: dict, key: str, source: str):
    """`read` of the sub-config `key`, its errors naming the field by its path (`text_config.head_dim`)."""
    try:
        return read(d.get(key) or {}, source)
    except ConfigError as exc:
        if exc.field is None or exc.field == key:
            raise
        raise ConfigError(exc.message, source=source, field=f"{key}.{exc.field}") from None


def from_hf_config(d: dict[str, Any], *, source: str, name: str) -> ModelConfig:
    """Translate a transformers `config.json` (model_type qwen3_5 or qwen3_5_text).

    Keys left out take transformers' defaults; a `qwen3_5` config without `text_config` or
    `vision_config` gets the default text model or vision tower, as transformers builds them."""
    if not isinstance(d, dict):
        raise ConfigError(f"must be a JSON object, got {type(d).__name__}", source=source)
    model_type = d.get("model_type")
    if model_type == "qwen3_5_text":
        convert(d, HFText, source=source)
        return ModelConfig(name=name, text=_text_from_hf(d, source), vision=None, source=source)
    if model_type == "qwen3_5":
        convert(d, HFModel, source=source)
        text = _nested(_text_from_hf, d, "text_config", source)
        vision = _nested(_vision_from_hf, d, "vision_config", source)
        ids = {k: d[k] for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id") if k in d}
        return ModelConfig(name=name, text=text, vision=vision, source=source, **ids)
    raise ConfigError(f"is {model_type!r}; expected 'qwen3_5' or 'qwen3_5_text'", source=source, field="model_type")


_HF_TEXT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                 "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "rms_norm_eps",
                 "max_position_embeddings")
_HF_VISION_KEYS = ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size",
                   "temporal_patch_size", "spatial_merge_size", "in_channels", "num_position_embeddings", "hidden_act")


def to_hf_text_config(cfg: TextConfig) -> dict[str, Any]:
    """The transformers `Qwen3_5TextConfig` keyword arguments for the same architecture."""
    return {k: getattr(cfg, k) for k in _HF_TEXT_KEYS} | {
        "layer_types": list(cfg.layer_types),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
            "mrope_section": list(cfg.mrope_section),
            "mrope_interleaved": True,
        },
    }


def to_hf_vision_config(cfg: VisionConfig) -> dict[str, Any]:
    """The transformers `Qwen3_5VisionConfig` keyword arguments for the same tower."""
    return {k: getattr(cfg, k) for k in _HF_VISION_KEYS}
