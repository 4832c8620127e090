"""Short causal depthwise convolution with SiLU, with conv state in and out.

The conv state of a sequence is its last W inputs, shape (B, D, W), oldest first; a fresh
sequence starts from zeros. This is the layout of both fla's Triton kernel and transformers'
cache, so a state can be handed from a prefix pass to suffix passes (shared-prefix forking).

Gated DeltaNet's conv (`causal_conv1d_qkv`, and `causal_conv1d_parts`) runs dohnuts' Triton
kernel on CUDA, with and without autograd (dohnuts.ops._conv_kernel: one forward kernel;
dohnuts.ops._conv_bwd_kernel: its own backward, and the autograd Function), reading a forked
state in place; a shared pass's rows take one launch of its shared kernel
(`causal_conv1d_qkv_shared`: each suffix's history read from the prefix's last rows);
`causal_conv1d` is fla's conv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dohnuts.ops._dispatch import use_fused
from dohnuts.ops._fla import fla


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


def causal_conv1d_parts_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    y, final = causal_conv1d_reference(x, weight, initial_state, output_final_state)
    return y.split(sizes, dim=-1), final


def _tile(sizes: list[int]) -> int:
    """The kernel's channels a program for parts of `sizes`: the largest power of two up to 128
    that divides every part (0 if under 16, or more than three parts: fla's conv then)."""
    tile = 128
    while tile >= 16 and any(n % tile for n in sizes):
        tile //= 2
    return tile if tile >= 16 and 1 <= len(sizes) <= 3 else 0


def causal_conv1d_parts_fused(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    tile = _tile(sizes)
    if not tile:
        y, final = causal_conv1d_fused(x, weight, initial_state, output_final_state)
        return y.split(sizes, dim=-1), final
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._conv_bwd_kernel import conv_silu_parts

    return conv_silu_parts(x, weight, tile, list(sizes), normalized_parts=0, initial_state=initial_state,
                           output_final_state=output_final_state)


def causal_conv1d_parts(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """`causal_conv1d` with its output split into channel groups of `sizes`: (outputs, state).

    The numbers are those of one conv then `split` (a depthwise conv treats channels apart), and
    the state keeps the one-conv layout (B, D, W). The fused path (up to three parts that are
    multiples of 16) is one launch of dohnuts' conv kernel that writes each output contiguous:
    Gated DeltaNet's q, k and v then reach the delta rule without copies of strided views."""
    fn = causal_conv1d_parts_fused if use_fused(x) else causal_conv1d_parts_reference
    return fn(x, weight, sizes, initial_state, output_final_state)


def _qkv_fused(x: torch.Tensor, sizes: list[int], key_head_dim: int) -> bool:
    """Whether q, k and v go through one fused launch: a GPU that runs the kernels, three parts, a
    power-of-two key head dim that divides every part."""
    return (use_fused(x) and len(sizes) == 3 and key_head_dim & (key_head_dim - 1) == 0
            and all(n % key_head_dim == 0 for n in sizes))


def causal_conv1d_qkv(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    key_head_dim: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None, bool]:
    """Gated DeltaNet's conv over its packed q/k/v projection: `causal_conv1d_parts` with sizes
    [q, k, v], plus whether q and k came out already L2-normalised per head of `key_head_dim`.

    Fused (every pass, inference and training alike: stateless, a prefix that returns its state, a
    suffix that starts from a forked one), one Triton kernel computes the three parts: conv + SiLU,
    plus the L2 norm for q and k, reading the state through its strides (a forked state may be a
    batch-broadcast view) and writing the (B, D, W) final state; its backward gives x, the weight
    and the state their gradients (dohnuts.ops._conv_bwd_kernel). The caller then skips the delta
    rule's own normalisation (normalised = True). On the reference path this is
    `causal_conv1d_parts` and the delta rule normalises (normalised = False)."""
    if _qkv_fused(x, sizes, key_head_dim):
        # Triton and fla: on a GPU only (the CPU runs the reference path without them)
        from dohnuts.ops._conv_bwd_kernel import conv_silu_parts

        # q, k and v in one launch, each a contiguous block of one buffer: faster than a launch a
        # part at every measured size (`kernel_lab.py conv_parts`, docs/history/evolution.md M21)
        outs, final = conv_silu_parts(x, weight, key_head_dim, list(sizes), normalized_parts=2,
                                      initial_state=initial_state, output_final_state=output_final_state)
        return outs, final, True
    parts, state = causal_conv1d_parts(x, weight, sizes, initial_state, output_final_state)
    return parts, state, False


def causal_conv1d_qkv_shared(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    key_head_dim: int,
    prefix: int,
    suffix_len: int,
) -> tuple[tuple[torch.Tensor, ...], bool]:
    """`causal_conv1d_qkv` over the rows x (R, C) of a shared pass: a prefix of `prefix` rows from
    no state, then suffixes of `suffix_len` rows each from the prefix's final state, forked →
    ((q, k, v) of (R, ·) each, whether q and k came out normalised).

    Fused, one launch of dohnuts' shared conv kernel over every row (each suffix's history read from
    the prefix's last rows in place), each part one contiguous buffer of all rows — the delta rule
    then takes k for both groups without a concatenation; the numbers and gradients are those of
    the prefix's call and the suffixes' it replaces. On the reference path those two calls and a
    concatenation per part."""
    R, C = x.shape
    if _qkv_fused(x, sizes, key_head_dim):
        # Triton and fla: on a GPU only (the CPU runs the reference path without them)
        from dohnuts.ops._conv_bwd_kernel import conv_silu_shared

        return conv_silu_shared(x, weight, key_head_dim, list(sizes), prefix, suffix_len, normalized_parts=2), True
    B = (R - prefix) // suffix_len
    prefix_parts, state, normalised = causal_conv1d_qkv(x[:prefix].view(1, prefix, C), weight, sizes, key_head_dim,
                                                        None, True)
    suffix_parts, _, _ = causal_conv1d_qkv(x[prefix:].view(B, suffix_len, C), weight, sizes, key_head_dim,
                                           state.expand(B, -1, -1), False)
    return tuple(torch.cat([p.reshape(prefix, -1), s.reshape(R - prefix, -1)])
                 for p, s in zip(prefix_parts, suffix_parts)), normalised
