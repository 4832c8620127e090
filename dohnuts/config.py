"""Model configurations and named presets.

Field names follow Hugging Face `transformers`' `Qwen3_5TextConfig` / `Qwen3_5VisionConfig` so a
real checkpoint's `config.json` maps onto them one to one. Configs are frozen dataclasses,
validated on construction; an invalid value raises `ConfigError` naming the field.

Presets build seeded random weights (performance does not depend on weight values, and we
never time on zeros). `tiny` runs in seconds on a CPU; the others are the public Qwen3.5 sizes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dohnuts.errors import ConfigError

LAYER_TYPES = ("linear_attention", "full_attention")


def _check_positive(cfg: Any, names: tuple[str, ...], source: str | None) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"must be a positive integer, got {value!r}", source=source, field=name)


def default_layer_types(num_layers: int, interval: int = 4) -> tuple[str, ...]:
    """Qwen3.5's pattern: every `interval`-th layer is full attention, the rest Gated DeltaNet."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))


@dataclass(frozen=True)
class TextConfig:
    """The language backbone (Gated DeltaNet + gated attention + SwiGLU)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 256
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 16
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    layer_types: tuple[str, ...] = ()
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    max_position_embeddings: int = 262144
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_positive(
            self,
            (
                "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
                "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim",
            ),
            self.source,
        )
        if not self.layer_types:
            object.__setattr__(self, "layer_types", default_layer_types(self.num_hidden_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if not isinstance(self.mrope_section, (list, tuple)):
            raise ConfigError(f"must be a list of integers, got {self.mrope_section!r}", source=self.source,
                              field="mrope_section")
        object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}",
                source=self.source, field="layer_types",
            )
        for t in self.layer_types:
            if t not in LAYER_TYPES:
                raise ConfigError(f"unknown layer type {t!r} (expected one of {LAYER_TYPES})",
                                  source=self.source, field="layer_types")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of {self.num_key_value_heads}",
                source=self.source, field="num_key_value_heads",
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"linear_num_value_heads {self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads {self.linear_num_key_heads}",
                source=self.source, field="linear_num_value_heads",
            )
        # Rotary checks follow what transformers' Qwen3_5TextRotaryEmbedding can run: `rotary_dim`
        # = int(head_dim × partial_rotary_factor) (0 means no rotary at all); an odd rotary_dim has
        # (rotary_dim + 1) // 2 frequencies and rotates rotary_dim + 1 channels, which must fit in
        # the head (transformers refuses or fails on anything else).
        for name in ("partial_rotary_factor", "rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(f"must be a number, got {value!r}", source=self.source, field=name)
        if self.rotary_dim < 0 or 2 * ((self.rotary_dim + 1) // 2) > self.head_dim:
            raise ConfigError(
                f"head_dim {self.head_dim} × partial_rotary_factor {self.partial_rotary_factor} gives "
                f"{self.rotary_dim} rotary channels, outside [0, head_dim] once rounded up to even",
                source=self.source, field="partial_rotary_factor",
            )
        # mrope_section: only entries 1 (H) and 2 (W) are read, as slice stops 3·s over the
        # frequencies (longer sections are cut at the rotary half-dim, shorter ones leave the rest
        # on T, entry 0 and any entry past 2 are ignored) — the sum need not match anything.
        if len(self.mrope_section) < 3 or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in self.mrope_section[1:3]
        ):
            raise ConfigError(f"must list at least 3 integers (T, H, W), got {list(self.mrope_section)!r}",
                              source=self.source, field="mrope_section")
        if self.rope_theta <= 0:
            raise ConfigError(f"must be positive, got {self.rope_theta!r}", source=self.source, field="rope_theta")
        if not isinstance(self.max_position_embeddings, int) or isinstance(self.max_position_embeddings, bool):
            raise ConfigError(f"must be an integer, got {self.max_position_embeddings!r}", source=self.source,
                              field="max_position_embeddings")
        if self.rms_norm_eps < 0:
            raise ConfigError(f"must not be negative, got {self.rms_norm_eps!r}", source=self.source,
                              field="rms_norm_eps")

    @property
    def rotary_dim(self) -> int:
        """int(head_dim × partial_rotary_factor), transformers' `dim`: (rotary_dim + 1) // 2
        frequencies, rotating the first 2 × that many channels of each head."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower: ViT blocks over 16×16×2 patches, merged 2×2 into the text width."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 2304
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_positive(
            self,
            ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size",
             "temporal_patch_size", "spatial_merge_size", "in_channels", "num_position_embeddings"),
            self.source,
        )
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}",
                              source=self.source, field="num_heads")
        side = int(round(self.num_position_embeddings ** 0.5))
        if side * side != self.num_position_embeddings:
            raise ConfigError("must be a square number (a square grid of learned positions)",
                              source=self.source, field="num_position_embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class ModelConfig:
    """A whole model: text backbone, optional vision tower, and the special token ids they share."""

    name: str
    text: TextConfig
    vision: VisionConfig | None = None
    image_token_id: int = 248056
    vision_start_token_id: int = 248053
    vision_end_token_id: int = 248054

    def to_dict(self) -> dict[str, Any]:
        def clean(obj: Any) -> Any:
            d = dataclasses.asdict(obj)
            d.pop("source", None)
            return d

        return {
            "name": self.name,
            "text": clean(self.text),
            "vision": clean(self.vision) if self.vision is not None else None,
            "image_token_id": self.image_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
        }

    def config_hash(self) -> str:
        """A short stable identity of the architecture (not of the weights)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Presets. Public sizes from the Qwen3.5 family: vocab 248320, head_dim
# 256, linear key/value head dim 128, conv kernel 4, full attention every 4th layer, partial
# rotary 0.25, rope theta 1e7.


def _public(name: str, hidden: int, inter: int, layers: int, heads: int, kv: int, lin_k: int, lin_v: int,
            v_depth: int, v_hidden: int, v_inter: int, v_heads: int, v_out: int) -> ModelConfig:
    text = TextConfig(
        vocab_size=248320, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=256,
        linear_num_key_heads=lin_k, linear_num_value_heads=lin_v,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    )
    vision = VisionConfig(depth=v_depth, hidden_size=v_hidden, intermediate_size=v_inter, num_heads=v_heads,
                          out_hidden_size=v_out)
    return ModelConfig(name=name, text=text, vision=vision)


def _tiny() -> ModelConfig:
    # Small enough to train on a CPU in seconds; every structural feature of the real model is kept
    # (GQA, grouped value heads, partial interleaved rotary, a full-attention layer, a vision tower).
    text = TextConfig(
        vocab_size=264, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, rope_theta=10000.0, mrope_section=(2, 1, 1), max_position_embeddings=8192,
    )
    vision = VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                          num_position_embeddings=64)
    # Byte tokenizer specials (dohnuts.runtime.tokenizer.ByteTokenizer): 256.. are special ids.
    return ModelConfig(name="tiny", text=text, vision=vision, image_token_id=259,
                       vision_start_token_id=260, vision_end_token_id=261)


PRESETS: dict[str, Any] = {
    "tiny": _tiny,
    "qwen3.5-0.8b": lambda: _public("qwen3.5-0.8b", 1024, 3584, 24, 8, 2, 16, 16, 12, 768, 3072, 12, 1024),
    "qwen3.5-2b": lambda: _public("qwen3.5-2b", 2048, 6144, 24, 8, 2, 16, 16, 24, 1024, 4096, 16, 2048),
    "qwen3.5-4b": lambda: _public("qwen3.5-4b", 2560, 9216, 32, 16, 4, 16, 32, 24, 1024, 4096, 16, 2560),
    "qwen3.5-9b": lambda: _public("qwen3.5-9b", 4096, 12288, 32, 16, 4, 16, 32, 27, 1152, 4304, 16, 4096),
}
# Short aliases ("2b" for "qwen3.5-2b").
_ALIASES = {k.removeprefix("qwen3.5-"): k for k in PRESETS if k.startswith("qwen3.5-")}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset(name: str, *, source: str | None = None, field_name: str = "preset") -> ModelConfig:
    """The named preset; an unknown name raises ConfigError listing the known ones."""
    key = _ALIASES.get(name, name)
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})", source=source, field=field_name)
    return PRESETS[key]()


# --------------------------------------------------------------------------------------------
# Hugging Face config.json <-> ModelConfig


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


def from_hf_config(d: dict[str, Any], *, source: str, name: str) -> ModelConfig:
    """Translate a transformers `config.json` (model_type qwen3_5 or qwen3_5_text).

    Keys left out take transformers' defaults; a `qwen3_5` config without `text_config` or
    `vision_config` gets the default text model or vision tower, as transformers builds them."""
    if not isinstance(d, dict):
        raise ConfigError(f"must be a JSON object, got {type(d).__name__}", source=source)
    model_type = d.get("model_type")
    if model_type == "qwen3_5_text":
        return ModelConfig(name=name, text=_text_from_hf(d, source), vision=None)
    if model_type == "qwen3_5":
        text = _text_from_hf(d.get("text_config") or {}, source)
        vision = _vision_from_hf(d.get("vision_config") or {}, source)
        ids = {k: d[k] for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id") if k in d}
        return ModelConfig(name=name, text=text, vision=vision, **ids)
    raise ConfigError(f"is {model_type!r}; expected 'qwen3_5' or 'qwen3_5_text'", source=source, field="model_type")


def to_hf_text_config(cfg: TextConfig) -> dict[str, Any]:
    """The transformers `Qwen3_5TextConfig` keyword arguments for the same architecture."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim,
        "linear_value_head_dim": cfg.linear_value_head_dim,
        "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
        "layer_types": list(cfg.layer_types),
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
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
    return {
        "depth": cfg.depth,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_heads": cfg.num_heads,
        "out_hidden_size": cfg.out_hidden_size,
        "patch_size": cfg.patch_size,
        "temporal_patch_size": cfg.temporal_patch_size,
        "spatial_merge_size": cfg.spatial_merge_size,
        "in_channels": cfg.in_channels,
        "num_position_embeddings": cfg.num_position_embeddings,
        "hidden_act": cfg.hidden_act,
    }
