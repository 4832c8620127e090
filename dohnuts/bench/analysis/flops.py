"""Counting rules: the FLOPs and parameter bytes of the model's pieces, by component.

These are the model-facing half of the cost model (cost.py turns a call's WorkCounts into
stages). Everything is a closed formula of the config, so a record can be re-analysed later.

Components and the kind of ceiling each meets (COMPONENT_KIND):

- `linear`: every nn.Linear of the backbone/tower, 2·fan_in·fan_out per row (a multiply-add
  is 2 FLOPs). Embeddings are lookups (bytes, never FLOPs); no vocabulary projection exists.
  → matrix.
- `adapter`: unmerged LoRA, 2·r·(fan_in + fan_out) per row and adapted projection → matrix.
- `head`: the scalar head, 2·hidden per candidate → matrix.
- `attention_matmul`: QKᵀ and PV, 4·D per (query, key) pair and head → attention.
- `scan_matmul`, `scan_solve`: the chunked gated delta rule exactly as dohnuts' reference
  (dohnuts/ops/delta_rule.py, chunk C = 64) computes it, per value head and token:
  kkᵀ, qkᵀ (2·C·K each), A·v_new (2·C·V), w·S, q·S, kᵀ·v_new (2·K·V each) = 4CK + 2CV + 6KV;
  the unit-lower-triangular solve of the UT transform, (C−1)·(K+V). fla's kernels compute the
  same quantities with an explicit 64×64 inverse (more FLOPs); that surplus is kernel
  overhead, counted nowhere. → scan (whose ceiling the hwspec chooses: fla runs it on the
  matrix units, so the built-in specs map scan to the BF16 matrix ceiling).
- `conv`: the depthwise causal convolution, 2·W per channel and token → vector.
- `elementwise`, `softmax`: norms, activations, gates, rotary, residual adds, the delta rule's
  decay/scaling, softmax over attention scores. Approximate per-element counts (the constants
  below); they are small next to the matrix work and meet the vector ceiling. → vector.
"""

from __future__ import annotations

from dataclasses import dataclass

from dohnuts.config import TextConfig, VisionConfig

SCAN_CHUNK = 64  # == dohnuts.ops.delta_rule.CHUNK and fla's chunk size (a test keeps them equal)

COMPONENT_KIND = {
    "linear": "matrix", "adapter": "matrix", "head": "matrix",
    "attention_matmul": "attention",
    "scan_matmul": "scan", "scan_solve": "scan",
    "conv": "vector", "elementwise": "vector", "softmax": "vector",
}
FLOP_KINDS = ("matrix", "attention", "scan", "vector")

# Approximate FLOPs per element of the element-wise ops (exp, division and friends count as 1).
RMSNORM = 4  # square, sum, scale, weight
LAYERNORM = 7  # mean, centre, square, sum, scale, weight, bias
SIGMOID = 3  # exp, add, reciprocal
SILU = SIGMOID + 1
GELU_TANH = 8
SOFTPLUS = 3
ROTARY = 3  # x·cos + rot(x)·sin
L2NORM = 3
SOFTMAX = 5  # max, subtract, exp, sum, divide — per attention score
RESIDUAL = 1

# The text layers' input projections: they read the normalised residual stream directly.
INPUT_PROJECTIONS = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
                     "linear_attn.in_proj_a", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")


@dataclass(frozen=True)
class Linear:
    """One nn.Linear of the text backbone: `module` is its name inside a decoder layer."""

    layer: int
    module: str  # e.g. "linear_attn.in_proj_qkv", "mlp.down_proj"
    fan_in: int
    fan_out: int

    @property
    def params(self) -> int:
        return self.fan_in * self.fan_out


def text_linears(cfg: TextConfig) -> tuple[Linear, ...]:
    """Every projection of the backbone, layer by layer (the names of dohnuts.model.text)."""
    h, hv = cfg.hidden_size, cfg.linear_num_value_heads
    q_out = cfg.num_attention_heads * cfg.head_dim
    kv_out = cfg.num_key_value_heads * cfg.head_dim
    out = []
    for i, kind in enumerate(cfg.layer_types):
        if kind == "linear_attention":
            mixer = [("linear_attn.in_proj_qkv", h, cfg.linear_conv_dim),
                     ("linear_attn.in_proj_z", h, cfg.linear_value_dim),
                     ("linear_attn.in_proj_b", h, hv), ("linear_attn.in_proj_a", h, hv),
                     ("linear_attn.out_proj", cfg.linear_value_dim, h)]
        else:  # q_proj emits the query and its sigmoid gate: twice the attention width
            mixer = [("self_attn.q_proj", h, 2 * q_out), ("self_attn.k_proj", h, kv_out),
                     ("self_attn.v_proj", h, kv_out), ("self_attn.o_proj", q_out, h)]
        mlp = [("mlp.gate_proj", h, cfg.intermediate_size), ("mlp.up_proj", h, cfg.intermediate_size),
               ("mlp.down_proj", cfg.intermediate_size, h)]
        out += [Linear(i, name, fi, fo) for name, fi, fo in mixer + mlp]
    return tuple(out)


def _count(cfg: TextConfig, kind: str) -> int:
    return sum(1 for t in cfg.layer_types if t == kind)


def scan_flops_per_token(cfg: TextConfig) -> dict[str, float]:
    """The chunked delta rule of one Gated DeltaNet layer, per token (all value heads)."""
    C, K, V, HV = SCAN_CHUNK, cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_num_value_heads
    return {"scan_matmul": HV * (4 * C * K + 2 * C * V + 6 * K * V),
            "scan_solve": HV * (C - 1) * (K + V)}


def text_token_flops(cfg: TextConfig) -> dict[str, float]:
    """Forward FLOPs of one token through the whole backbone, excluding attention pairs."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    n_lin, n_full = _count(cfg, "linear_attention"), _count(cfg, "full_attention")
    C, K, V = SCAN_CHUNK, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    hv, hq, hkv, d = cfg.linear_num_value_heads, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    scan = scan_flops_per_token(cfg)
    common = 2 * RMSNORM * h + 2 * RESIDUAL * h + (SILU + 1) * inter  # two norms, two adds, SwiGLU
    delta_net = (SILU * cfg.linear_conv_dim  # conv output activation
                 + (SIGMOID + SOFTPLUS + 3) * hv  # beta = sigmoid(b), g = -exp(A)·softplus(a + dt)
                 + L2NORM * 2 * cfg.linear_key_dim  # q, k L2 normalisation
                 + hv * (3 * C + 4 * K + 2 * V)  # decay matrix, beta/decay scaling inside the scan
                 + (RMSNORM + SILU + 1) * cfg.linear_value_dim)  # gated RMSNorm
    full = (RMSNORM * (hq + hkv) * d  # q/k norm
            + ROTARY * cfg.rotary_dim * (hq + hkv)  # partial rotary
            + (SIGMOID + 1) * hq * d)  # sigmoid output gate
    return {
        "linear": float(sum(2 * lin.params for lin in text_linears(cfg))),
        "conv": float(n_lin * 2 * cfg.linear_conv_kernel_dim * cfg.linear_conv_dim),
        "scan_matmul": float(n_lin * scan["scan_matmul"]),
        "scan_solve": float(n_lin * scan["scan_solve"]),
        "elementwise": float(cfg.num_hidden_layers * common + n_lin * delta_net + n_full * full + RMSNORM * h),
    }


# The last layer's query side: what a position needs only when its own hidden state is read (the
# scalar head's SCORE positions). Keys and values — or, in a Gated DeltaNet layer, the recurrence —
# are needed for every position (the scored queries read them); the rest is per scored position.
LAST_LAYER_QUERY_LINEARS = {
    "full_attention": ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "linear_attention": ("linear_attn.in_proj_z", "linear_attn.out_proj", "mlp.gate_proj", "mlp.up_proj",
                         "mlp.down_proj"),
}


def last_layer_query_linears(cfg: TextConfig) -> tuple[Linear, ...]:
    last = cfg.num_hidden_layers - 1
    names = LAST_LAYER_QUERY_LINEARS[cfg.layer_types[last]]
    return tuple(lin for lin in text_linears(cfg) if lin.layer == last and lin.module in names)


def last_layer_query_flops(cfg: TextConfig, lora: LoraShape | None = None) -> dict[str, float]:
    """Forward FLOPs per position of the last layer's query side (a part of `text_token_flops`):
    its query-side projections and MLP, the post-mixer norm and its residual add, SwiGLU and
    the final norm; in a full-attention layer also the query's norm, rotary and output gate; in a
    Gated DeltaNet layer the output gate's norm (the recurrence's own output reads, q·S and
    q·kᵀ, stay with every position: dohnuts' kernels compute them for all). With `lora`
    (unmerged), the adapters of those projections."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    elementwise = 2 * RMSNORM * h + RESIDUAL * h + (SILU + 1) * inter  # post and final norm, the add, SwiGLU
    if cfg.layer_types[-1] == "full_attention":
        hq, d = cfg.num_attention_heads, cfg.head_dim
        elementwise += RMSNORM * hq * d + ROTARY * cfg.rotary_dim * hq + (SIGMOID + 1) * hq * d
    else:
        elementwise += (RMSNORM + SILU + 1) * cfg.linear_value_dim
    linears = last_layer_query_linears(cfg)
    out = {"linear": float(sum(2 * lin.params for lin in linears)), "elementwise": float(elementwise)}
    if lora is not None and not lora.merged and lora.rank:
        adapted = {lin.module for lin in lora.adapted(cfg) if lin.layer == cfg.num_hidden_layers - 1}
        out["adapter"] = float(sum(2 * lora.rank * (lin.fan_in + lin.fan_out) for lin in linears
                                   if lin.module in adapted))
    return out


def last_layer_pair_flops(cfg: TextConfig) -> dict[str, float]:
    """FLOPs of one (query, key) pair in the last layer ({} when it is a Gated DeltaNet layer):
    only the scored positions' queries are needed there."""
    if cfg.layer_types[-1] != "full_attention":
        return {}
    hq, d = cfg.num_attention_heads, cfg.head_dim
    return {"attention_matmul": float(4 * hq * d), "softmax": float(SOFTMAX * hq)}


def text_pair_flops(cfg: TextConfig) -> dict[str, float]:
    """FLOPs of one attended (query, key) pair, summed over the full-attention layers."""
    n_full = _count(cfg, "full_attention")
    hq, d = cfg.num_attention_heads, cfg.head_dim
    return {"attention_matmul": float(n_full * 4 * hq * d), "softmax": float(n_full * SOFTMAX * hq)}


def attention_pairs(start: int, length: int, *, causal: bool = True) -> int:
    """(query, key) pairs for queries at positions start..start+length−1 of one sequence.

    Causal: query p sees keys 0..p, Σ (p + 1). Dense (`causal=False`): every query against all
    start + length keys, what a masked dense implementation multiplies (the CPU reference)."""
    if length <= 0:
        return 0
    if not causal:
        return length * (start + length)
    return length * start + length * (length + 1) // 2


def text_params(cfg: TextConfig) -> int:
    """Parameters a pass reads, embeddings excluded (a pass reads only the rows it looks up)."""
    n_lin = _count(cfg, "linear_attention")
    n_full = _count(cfg, "full_attention")
    small = (n_lin * (cfg.linear_conv_dim * cfg.linear_conv_kernel_dim  # conv weight
                      + 2 * cfg.linear_num_value_heads + cfg.linear_value_head_dim)  # A_log, dt_bias, norm
             + n_full * 2 * cfg.head_dim  # q/k norms
             + cfg.num_hidden_layers * 2 * cfg.hidden_size + cfg.hidden_size)  # layer norms, final norm
    return sum(lin.params for lin in text_linears(cfg)) + small


def text_state_bytes(cfg: TextConfig, dtype_bytes: int) -> int:
    """The Gated DeltaNet state of one sequence: recurrent (HV, K, V) in FP32 + conv history."""
    n_lin = _count(cfg, "linear_attention")
    rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv = cfg.linear_conv_dim * cfg.linear_conv_kernel_dim * dtype_bytes
    return n_lin * (rec + conv)


def text_kv_bytes_per_token(cfg: TextConfig, dtype_bytes: int) -> int:
    """Keys + values one token leaves in the full-attention layers."""
    return _count(cfg, "full_attention") * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes


# --------------------------------------------------------------------------------------------
# LoRA


# == dohnuts.model.lora.DEFAULT_TARGETS (a test keeps them equal; this module does not import torch).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj",
                        "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraShape:
    """What the cost model needs of the adapters: rank, targets, and whether they are merged.
    rank 0 (or no matching target) means head-only training."""

    rank: int
    targets: tuple[str, ...] = DEFAULT_LORA_TARGETS  # module leaf names
    merged: bool = False  # merged into the base weights: no adapter FLOPs at all

    def adapted(self, cfg: TextConfig) -> tuple[Linear, ...]:
        if self.rank == 0:
            return ()
        leaves = set(self.targets)
        return tuple(lin for lin in text_linears(cfg) if lin.module.rsplit(".", 1)[-1] in leaves)


def lora_token_flops(cfg: TextConfig, lora: LoraShape | None) -> float:
    """Forward FLOPs of the unmerged adapters per token: x·A then ·B, 2·r·(in + out)."""
    if lora is None or lora.merged:
        return 0.0
    return float(sum(2 * lora.rank * (lin.fan_in + lin.fan_out) for lin in lora.adapted(cfg)))


def lora_params(cfg: TextConfig, lora: LoraShape | None) -> int:
    return 0 if lora is None else sum(lora.rank * (lin.fan_in + lin.fan_out) for lin in lora.adapted(cfg))


# --------------------------------------------------------------------------------------------
# Vision tower (Qwen3.5 = Qwen3-VL's ViT without deepstack mergers)


def patch_values(vcfg: VisionConfig) -> int:
    """Input values of one patch: channels × temporal × patch × patch (3·2·16·16 = 1536)."""
    return vcfg.in_channels * vcfg.temporal_patch_size * vcfg.patch_size ** 2


def vision_image_flops(vcfg: VisionConfig, patches: int) -> dict[str, float]:
    """Forward FLOPs of encoding one image of `patches` patches (bidirectional attention within it)."""
    n, h, inter, m2 = patches, vcfg.hidden_size, vcfg.intermediate_size, vcfg.spatial_merge_size ** 2
    merged, wide = n / m2, m2 * h
    linear = (2 * n * patch_values(vcfg) * h  # patch projection (the Conv3d with kernel == stride)
              + vcfg.depth * 2 * n * (3 * h * h + h * h + 2 * h * inter)  # qkv, proj, fc1, fc2
              + 2 * merged * (wide * wide + wide * vcfg.out_hidden_size))  # merger fc1, fc2
    per_block = (2 * LAYERNORM * h + ROTARY * 2 * h + GELU_TANH * inter + 2 * RESIDUAL * h
                 + 5 * h + inter)  # + biases of qkv, proj, fc1, fc2
    elementwise = (n * (8 * h + h)  # bilinear position-embedding interpolation, patch bias
                   + vcfg.depth * n * per_block
                   + n * LAYERNORM * h + merged * (GELU_TANH * wide + wide + vcfg.out_hidden_size))
    return {
        "linear": float(linear),
        "attention_matmul": float(vcfg.depth * 4 * n * n * h),
        "softmax": float(vcfg.depth * SOFTMAX * n * n * vcfg.num_heads),
        "elementwise": float(elementwise),
    }


def vision_params(vcfg: VisionConfig) -> int:
    h, inter, wide = vcfg.hidden_size, vcfg.intermediate_size, vcfg.spatial_merge_size ** 2 * vcfg.hidden_size
    block = 4 * h * h + 2 * h * inter + 5 * h + inter + 4 * h  # weights, biases, two LayerNorms
    return (patch_values(vcfg) * h + h + vcfg.num_position_embeddings * h + vcfg.depth * block
            + 2 * h + wide * wide + wide + wide * vcfg.out_hidden_size + vcfg.out_hidden_size)


def by_kind(flops: dict[str, float]) -> dict[str, float]:
    """Component FLOPs → kind FLOPs (every kind present, zeros included)."""
    out = dict.fromkeys(FLOP_KINDS, 0.0)
    for comp, value in flops.items():
        out[COMPONENT_KIND[comp]] += value
    return out
