"""transformers' `config.json` ↔ dohnuts' model configs (dohnuts.config).

`from_hf_config` reads a Qwen3.5 `config.json` (text-only `qwen3_5_text` or the full `qwen3_5`)
as transformers reads it, with transformers' defaults for the keys a file may leave out;
`to_hf_text_config` / `to_hf_vision_config` write the dicts transformers' config classes take
(the reference implementation in tests, the transformers peer of the benchmark).

The keys a config.json shares with TextConfig and VisionConfig (`head_dim`, `rms_norm_eps`, ...)
are checked by those configs' own declarations, with the file's path in the message
(`text_config.head_dim`). Declared here, as msgspec Structs, are only the keys dohnuts' configs do
not have: where the rotary's values may stand (`rope_parameters`, its legacy name `rope_scaling`,
and the top-level keys the dict overrides), `full_attention_interval`, and the features Qwen3.5
does not use (`hidden_act` other than silu, `attention_bias`). Other keys are ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from dohnuts.config import LAYER_TYPES, ModelConfig, TextConfig, VisionConfig, default_layer_types
from dohnuts.errors import ConfigError
from dohnuts.schema import Finite, convert


# A rotary value may be overridden by another (the dict's wins over the top level's): where it is
# not, it is checked as the TextConfig field it becomes; where it is, it must still be a finite
# number (transformers reads it as one).
class HFRotary(msgspec.Struct):
    rope_theta: Finite | None = None
    partial_rotary_factor: Finite | None = None


class HFText(msgspec.Struct):
    rope_theta: Finite | None = None
    partial_rotary_factor: Finite | None = None
    rope_parameters: HFRotary | None = None
    rope_scaling: HFRotary | None = None
    full_attention_interval: Annotated[int, Meta(ge=1, description="every how many layers one is full attention")] = 4
    hidden_act: Literal["silu"] = "silu"  # Qwen3.5's MLP (dohnuts implements SwiGLU only)
    attention_bias: bool | None = None  # true is refused: Qwen3.5's projections have no bias


class HFVision(msgspec.Struct):
    rope_parameters: HFRotary | None = None
    rope_scaling: HFRotary | None = None


class HFModel(msgspec.Struct):
    text_config: HFText | None = None
    vision_config: HFVision | None = None


_TEXT_KEYS = set(TextConfig.__struct_fields__) - {"source"}
_VISION_KEYS = set(VisionConfig.__struct_fields__) - {"source"}
_TOKEN_KEYS = ("image_token_id", "vision_start_token_id", "vision_end_token_id")


# transformers' defaults for keys a config.json may leave out (transformers 5.x
# models/qwen3_5/configuration_qwen3_5.py: Qwen3_5TextConfig fields and __post_init__,
# RotaryEmbeddingConfigMixin.default_theta, Qwen3_5TextRotaryEmbedding's mrope_section default,
# Qwen3_5VisionConfig fields). Some differ from TextConfig's defaults (rope_theta,
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


def _at(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _hf_rope(d: dict[str, Any], source: str, prefix: str) -> dict[str, Any]:
    """rope_theta / partial_rotary_factor / mrope_section as transformers resolves them.

    `rope_scaling` (legacy name) wins over `rope_parameters`; inside the dict a value wins over
    the top-level `rope_theta` / `partial_rotary_factor` keys, which win over the defaults
    (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict). `mrope_section` is read from the
    dict only (a top-level `mrope_section` is ignored by transformers, and so here)."""
    rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
    nested = [k for k in rope if k in LAYER_TYPES]
    if nested:  # transformers' text rotary then finds no top-level rope_type and fails
        raise ConfigError(f"per-layer-type entries {nested} are not supported by Qwen3.5", source=source,
                          field=_at(prefix, "rope_parameters"))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    # "mrope" (a Qwen2-VL spelling) is accepted as the default rotary it means here.
    if rope_type not in ("default", "mrope"):
        raise ConfigError(f"unsupported rope_type {rope_type!r}", source=source, field=_at(prefix, "rope_parameters"))
    theta = d.get("rope_theta", _HF_ROPE_THETA)
    # Qwen3_5TextConfig defaults a missing top-level factor to 0.25; an explicit null leaves it
    # unset and the rotary then falls back to 1.0.
    factor = d.get("partial_rotary_factor", _HF_PARTIAL_ROTARY_FACTOR)
    return {
        "rope_theta": rope.get("rope_theta", theta),
        "partial_rotary_factor": rope.get("partial_rotary_factor", 1.0 if factor is None else factor),
        "mrope_section": rope.get("mrope_section", _HF_MROPE_SECTION),
    }


def _text_from_hf(d: dict[str, Any], source: str, prefix: str = "") -> TextConfig:
    """The text config of a config.json's text part `d` (its keys checked by HFText already)."""
    if d.get("attention_bias"):
        raise ConfigError("attention_bias=true is not supported", source=source, field=_at(prefix, "attention_bias"))
    kwargs = dict(_HF_TEXT_DEFAULTS)
    kwargs.update({k: d[k] for k in _TEXT_KEYS - _ROPE_KEYS - {"layer_types"} if k in d})
    layer_types = d.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, (list, tuple)) or not layer_types):
        raise ConfigError(f"must list one type per layer, got {layer_types!r}", source=source,
                          field=_at(prefix, "layer_types"))
    kwargs["layer_types"] = layer_types or ()  # none: every 4th layer full attention, as TextConfig makes them
    kwargs.update(_hf_rope(d, source, prefix))
    text = convert(kwargs, TextConfig, source=source, prefix=prefix)
    interval = d.get("full_attention_interval", 4)
    if layer_types is None and interval != 4:  # Qwen3_5TextConfig.__post_init__: every interval-th layer
        text = msgspec.structs.replace(text, layer_types=default_layer_types(text.num_hidden_layers, interval))
    return text


def _vision_from_hf(d: dict[str, Any], source: str, prefix: str) -> VisionConfig:
    kwargs = dict(_HF_VISION_DEFAULTS)
    kwargs.update({k: d[k] for k in _VISION_KEYS if k in d and d[k] is not None})
    rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
    if "rope_theta" in rope:
        kwargs["rope_theta"] = rope["rope_theta"]
    for key in ("patch_size", "temporal_patch_size"):  # written as a list by some exporters: its first entry
        if isinstance(kwargs.get(key), list) and kwargs[key]:
            kwargs[key] = kwargs[key][0]
    return convert(kwargs, VisionConfig, source=source, prefix=prefix)


def from_hf_config(d: dict[str, Any], *, source: str, name: str) -> ModelConfig:
    """Translate a transformers `config.json` (model_type qwen3_5 or qwen3_5_text).

    Keys left out take transformers' defaults; a `qwen3_5` config without `text_config` or
    `vision_config` gets the default text model or vision tower, as transformers builds them."""
    if not isinstance(d, dict):
        raise ConfigError(f"must be a JSON object, got {type(d).__name__}", source=source)
    model_type = d.get("model_type")
    if model_type == "qwen3_5_text":
        convert(d, HFText, source=source)
        return ModelConfig(name=name, text=_text_from_hf(d, source), vision=None)
    if model_type == "qwen3_5":
        convert(d, HFModel, source=source)
        text = _text_from_hf(d.get("text_config") or {}, source, "text_config")
        vision = _vision_from_hf(d.get("vision_config") or {}, source, "vision_config")
        ids = {k: d[k] for k in _TOKEN_KEYS if k in d}
        return convert({"name": name, "text": text, "vision": vision, **ids}, ModelConfig, source=source)
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
