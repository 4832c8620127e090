"""Model configurations and named presets.

Field names follow Hugging Face `transformers`' `Qwen3_5TextConfig` / `Qwen3_5VisionConfig` so a
real checkpoint's `config.json` maps onto them one to one (dohnuts.hf_config reads it). Configs are
frozen msgspec Structs, and their declarations are the rules: each field's type and bounds
(`msgspec.Meta`, through the aliases below) and, in `__post_init__`, what relates fields
(`layer_types` one per layer, heads grouped evenly, the rotated channels inside a head). Both hold
however a config is made — decoded (`dohnuts.schema.convert`, which names the file and the field's
path) or built in code (`check_fields`); an invalid value raises `ConfigError` naming the field.

Presets build seeded random weights (performance does not depend on weight values, and we
never time on zeros). `tiny` runs in seconds on a CPU; the others are the public Qwen3.5 sizes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import Meta

from dohnuts.errors import ConfigError
from dohnuts.schema.decode import Invalid, check_fields, integer_in, number_in

LayerType = Literal["linear_attention", "full_attention"]
LAYER_TYPES: tuple[str, ...] = get_args(LayerType)
VisionActivation = Literal["gelu_pytorch_tanh", "gelu"]  # dohnuts.model.vision implements each


# Upper bounds of a config's sizes: far above any real model (Qwen3.5 9B: 32 layers, width 4096,
# vocabulary 248320), low enough that a hostile config.json cannot make the model builder run for
# hours or allocate without end before any weight is checked.
MAX_LAYERS = 1024
MAX_WIDTH = 1 << 18  # hidden, intermediate and projection sizes
MAX_HEADS = 4096  # head counts and head sizes, patch and merge sizes, channels
MAX_VOCAB = 1 << 23
MAX_POSITIONS = 1 << 26
MAX_CONV_KERNEL = 64

Layers = integer_in(1, MAX_LAYERS)
Width = integer_in(1, MAX_WIDTH)
Heads = integer_in(1, MAX_HEADS)
Vocab = integer_in(1, MAX_VOCAB)
Positions = integer_in(1, MAX_POSITIONS)
ConvKernel = integer_in(1, MAX_CONV_KERNEL)
TokenId = integer_in(0, MAX_VOCAB - 1)
# A float read from a file must be finite: NaN and infinity pass every `<` check, and then give NaN scores.
Epsilon = number_in("a finite number >= 0", ge=0.0)
Theta = number_in("a finite number > 0", gt=0.0)
# int(head_dim × factor) channels rotate; 0 means no rotary. A negative factor is no proportion of a
# head, refused even where int() would truncate it to 0 channels.
RotaryFactor = number_in("a finite number >= 0", ge=0.0, description="a proportion of head_dim; 0: no rotary")
# Only entries 1 (H) and 2 (W) are read, as slice stops 3·s over the frequencies (longer sections
# are cut at the rotary half-dimension, shorter ones leave the rest on T; entry 0 and any entry past
# 2 are not read, and transformers never checks the sum).
MropeSection = Annotated[tuple[int, ...], Meta(min_length=3, description="T, H, W sections")]


def default_layer_types(num_layers: int, interval: int = 4) -> tuple[str, ...]:
    """Qwen3.5's pattern: every `interval`-th layer is full attention, the rest Gated DeltaNet."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))


class _Checked(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A config checked however it is made. `source` names the file a config built in code came
    from in its errors (decoding names it itself, and leaves `source` None); it is no part of the
    architecture (`ModelConfig.to_dict` leaves it out)."""

    source: str | None = None

    def __post_init__(self) -> None:
        try:
            check_fields(self)
            self.check()
        except Invalid as exc:
            if self.source is None:
                raise
            raise ConfigError(exc.message, source=self.source, field=exc.field) from None

    def check(self) -> None:
        """What relates the fields (each one is within its declared bounds already); raises Invalid."""


class TextConfig(_Checked, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The language backbone (Gated DeltaNet + gated attention + SwiGLU)."""

    vocab_size: Vocab
    hidden_size: Width
    intermediate_size: Width
    num_hidden_layers: Layers
    num_attention_heads: Heads
    num_key_value_heads: Heads
    head_dim: Heads = 256
    linear_num_key_heads: Heads = 16
    linear_num_value_heads: Heads = 16
    linear_key_head_dim: Heads = 128
    linear_value_head_dim: Heads = 128
    linear_conv_kernel_dim: ConvKernel = 4
    layer_types: tuple[LayerType, ...] = ()  # () → Qwen3.5's pattern (default_layer_types)
    rms_norm_eps: Epsilon = 1e-6
    rope_theta: Theta = 1e7
    partial_rotary_factor: RotaryFactor = 0.25
    mrope_section: MropeSection = (11, 11, 10)
    max_position_embeddings: Positions = 262144

    def check(self) -> None:
        if not self.layer_types:
            msgspec.structs.force_setattr(self, "layer_types", default_layer_types(self.num_hidden_layers))
        if len(self.layer_types) != self.num_hidden_layers:
            raise Invalid(f"has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}",
                          field="layer_types")
        if self.num_attention_heads % self.num_key_value_heads:
            raise Invalid(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                          f"{self.num_key_value_heads}", field="num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise Invalid(f"linear_num_value_heads {self.linear_num_value_heads} is not a multiple of "
                          f"linear_num_key_heads {self.linear_num_key_heads}", field="linear_num_value_heads")
        # What transformers' Qwen3_5TextRotaryEmbedding can run: an odd rotary_dim has
        # (rotary_dim + 1) // 2 frequencies and rotates rotary_dim + 1 channels, which must fit in
        # the head (transformers refuses or fails on anything else).
        if 2 * ((self.rotary_dim + 1) // 2) > self.head_dim:
            raise Invalid(f"head_dim {self.head_dim} × partial_rotary_factor {self.partial_rotary_factor} gives "
                          f"{self.rotary_dim} rotary channels, outside [0, head_dim] once rounded up to even",
                          field="partial_rotary_factor")

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


class VisionConfig(_Checked, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The vision tower: ViT blocks over 16×16×2 patches, merged 2×2 into the text width."""

    depth: Layers
    hidden_size: Width
    intermediate_size: Width
    num_heads: Heads
    out_hidden_size: Width
    patch_size: Heads = 16
    temporal_patch_size: Heads = 2
    spatial_merge_size: Heads = 2
    in_channels: Heads = 3
    num_position_embeddings: Positions = 2304
    hidden_act: VisionActivation = "gelu_pytorch_tanh"
    rope_theta: Theta = 10000.0

    def check(self) -> None:
        if self.hidden_size % self.num_heads:
            raise Invalid(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}",
                          field="num_heads")
        side = int(round(self.num_position_embeddings ** 0.5))
        if side * side != self.num_position_embeddings:
            raise Invalid("must be a square number (a square grid of learned positions)",
                          field="num_position_embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class ModelConfig(_Checked, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole model: text backbone, optional vision tower, and the special token ids they share."""

    name: str
    text: TextConfig
    vision: VisionConfig | None = None
    image_token_id: TokenId = 248056
    vision_start_token_id: TokenId = 248053
    vision_end_token_id: TokenId = 248054

    def to_dict(self) -> dict[str, Any]:
        """The architecture as plain values (what records hold and `config_hash` hashes): every
        field but `source`, tuples kept as tuples."""
        def plain(obj: Any) -> Any:
            if isinstance(obj, _Checked):
                return {k: plain(v) for k, v in msgspec.structs.asdict(obj).items() if k != "source"}
            return obj

        return plain(self)

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
