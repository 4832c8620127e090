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
from dohnuts.schema.values import short, why_not_finite

LAYER_TYPES = ("linear_attention", "full_attention")


# Upper bounds of a config's sizes: far above any real model (Qwen3.5 9B: 32 layers, width 4096,
# vocabulary 248320), low enough that a hostile config.json cannot make the model builder run for
# hours or allocate without end before any weight is checked.
MAX_LAYERS = 1024
MAX_WIDTH = 1 << 18  # hidden, intermediate and projection sizes
MAX_HEADS = 4096  # head counts and head sizes
MAX_VOCAB = 1 << 23
MAX_POSITIONS = 1 << 26
MAX_CONV_KERNEL = 64
_BOUNDS = {
    "vocab_size": MAX_VOCAB, "hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH, "out_hidden_size": MAX_WIDTH,
    "num_hidden_layers": MAX_LAYERS, "depth": MAX_LAYERS, "max_position_embeddings": MAX_POSITIONS,
    "linear_conv_kernel_dim": MAX_CONV_KERNEL, "num_position_embeddings": MAX_POSITIONS,
}


def _check_positive(cfg: Any, names: tuple[str, ...], source: str | None) -> None:
    """Each field a positive integer within its bound (`_BOUNDS`, else MAX_HEADS)."""
    for name in names:
        value = getattr(cfg, name)
        bound = _BOUNDS.get(name, MAX_HEADS)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= bound:
            got = "a very large number" if isinstance(value, int) and value > 10**15 else short(value)
            raise ConfigError(f"must be an integer in 1..{bound}, got {got}", source=source, field=name)


def _check_finite(cfg: Any, names: tuple[str, ...], source: str | None) -> None:
    """Each field a finite number (NaN and infinity pass every `<` check, and then give NaN scores)."""
    for name in names:
        value = getattr(cfg, name)
        why = why_not_finite(value)
        if why is not None:
            raise ConfigError(f"must be a finite number, got {why if why in ('NaN', 'infinite') else short(value)}",
                              source=source, field=name)


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
                "linear_conv_kernel_dim", "max_position_embeddings",
            ),
            self.source,
        )
        _check_finite(self, ("rms_norm_eps", "rope_theta", "partial_rotary_factor"), self.source)
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
        # the head (transformers refuses or fails on anything else). A negative factor is no
        # proportion of the head: refused, even where int() would truncate it to 0 channels.
        if self.partial_rotary_factor < 0:
            raise ConfigError(f"must not be negative (a proportion of head_dim; 0 means no rotary), got "
                              f"{self.partial_rotary_factor!r}", source=self.source, field="partial_rotary_factor")
        if 2 * ((self.rotary_dim + 1) // 2) > self.head_dim:
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
        _check_finite(self, ("rope_theta",), self.source)
        if self.rope_theta <= 0:
            raise ConfigError(f"must be positive, got {self.rope_theta!r}", source=self.source, field="rope_theta")
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
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("image_token_id", "vision_start_token_id", "vision_end_token_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_VOCAB:
                raise ConfigError(f"must be a token id in 0..{MAX_VOCAB - 1}, got {short(value)}", source=self.source,
                                  field=name)

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


def preset_aliases() -> list[str]:
    """The short names of the public presets (`2b` for `qwen3.5-2b`)."""
    return list(_ALIASES)


def preset(name: str, *, source: str | None = None, field_name: str = "preset") -> ModelConfig:
    """The named preset; an unknown name raises ConfigError listing the known ones."""
    key = _ALIASES.get(name, name)
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})", source=source, field=field_name)
    return PRESETS[key]()
