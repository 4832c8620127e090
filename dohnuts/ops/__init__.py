"""Kernels. The ONLY package that imports fla or Triton (lazily, on first CUDA use).

Each op has a fused path (`*_fused`) and a plain-torch reference path (`*_reference`) with the
same signature; the un-suffixed function picks by device — a GPU whose probe shows no working
fused kernels takes the reference paths too (`kernel_status` says which, dohnuts.ops._dispatch).
Tests compare the two; the parity tooling (the tests, the bench's FP32 reference check, the
benchmarks) runs a whole model on the reference paths inside `dohnuts.ops._dispatch.reference()`,
which is private: nothing a user calls switches paths.
"""

from dohnuts.ops._dispatch import kernel_status, recording
from dohnuts.ops.activation import linear_gelu_tanh, swiglu, swiglu_packed
from dohnuts.ops.attention import attention_at, block_diagonal_attention, causal_attention, gated_output
from dohnuts.ops.copy import copy4d
from dohnuts.ops.conv import causal_conv1d, causal_conv1d_parts, causal_conv1d_qkv, causal_conv1d_qkv_shared
from dohnuts.ops.delta_rule import (
    gated_delta_rule, gated_delta_rule_from_logits, gated_delta_rule_shared, prepare_delta_rule_backward, shared_chunk_index,
)
from dohnuts.ops.norm import add_layer_norm, add_rms_norm, gated_rms_norm, layer_norm, rms_norm
from dohnuts.ops.rope import apply_rotary, norm_rope, rotary_qk
from dohnuts.ops.unfilter import png_unfilter

__all__ = ["add_layer_norm", "add_rms_norm", "apply_rotary", "attention_at", "block_diagonal_attention",
           "causal_attention", "causal_conv1d", "causal_conv1d_parts", "causal_conv1d_qkv", "causal_conv1d_qkv_shared", "copy4d", "gated_delta_rule",
           "gated_delta_rule_from_logits", "gated_delta_rule_shared", "gated_output", "gated_rms_norm",
           "kernel_status", "layer_norm", "linear_gelu_tanh", "norm_rope", "png_unfilter",
           "prepare_delta_rule_backward", "recording", "rms_norm", "rotary_qk", "shared_chunk_index", "swiglu",
           "swiglu_packed"]
