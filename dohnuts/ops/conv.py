"""Short causal depthwise convolution with SiLU, with conv state in and out.

The conv state of a sequence is its last W inputs, shape (B, D, W), oldest first; a fresh
sequence starts from zeros. This is the layout of both fla's Triton kernel and transformers'
cache, so a state can be handed from a prefix pass to suffix passes (shared-prefix forking).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import use_fused


def causal_conv1d_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, D = x.shape
    W = weight.shape[-1]
    xt = x.transpose(1, 2)  # (B, D, T)
    if initial_state is None:
        history = xt.new_zeros(B, D, W)
    else:
        history = initial_state.to(xt.dtype)
    full = torch.cat([history, xt], dim=-1)  # (B, D, W + T)
    # Output t sees inputs t-W+1..t: drop the oldest history column, which no output reads.
    y = F.conv1d(full[:, :, 1:].to(weight.dtype), weight.unsqueeze(1), groups=D)  # (B, D, T)
    y = F.silu(y).to(x.dtype).transpose(1, 2)  # (B, T, D)
    final = full[:, :, -W:].contiguous() if output_final_state else None
    return y, final


def causal_conv1d_fused(
    x: torch.Tensor,
    weight: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    from dohnuts.ops._fla import fla

    if initial_state is not None:
        initial_state = initial_state.to(x.dtype).contiguous()  # the kernel indexes it densely
    return fla().causal_conv1d(
        x, weight, None, initial_state=initial_state, output_final_state=output_final_state, activation="silu"
    )


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y = silu(depthwise_causal_conv(x)). x: (B, T, D), weight: (D, W), state: (B, D, W)."""
    fn = causal_conv1d_fused if use_fused(x) else causal_conv1d_reference
    return fn(x, weight, initial_state, output_final_state)
