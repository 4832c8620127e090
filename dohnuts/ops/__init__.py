"""Kernels. The ONLY package that imports fla or Triton (lazily, on first CUDA use).

Each op has a fused path (`*_fused`) and a plain-torch reference path (`*_reference`) with the
same signature; the un-suffixed function picks by device. Tests compare the two.
"""

from dohnuts.ops.activation import swiglu
from dohnuts.ops.attention import causal_attention
from dohnuts.ops.conv import causal_conv1d
from dohnuts.ops.delta_rule import gated_delta_rule
from dohnuts.ops.norm import gated_rms_norm, rms_norm

__all__ = ["causal_attention", "causal_conv1d", "gated_delta_rule", "gated_rms_norm", "rms_norm", "swiglu"]
