"""Short causal depthwise convolution with SiLU, with conv state in and out.

The conv state of a sequence is its last W inputs, shape (B, D, W), oldest first; a fresh
sequence starts from zeros. This is the layout of both fla's Triton kernel and transformers'
cache, so a state can be handed from a prefix pass to suffix passes (shared-prefix forking).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dohnuts.errors import ConfigError
from dohnuts.ops._dispatch import recording, use_fused


def conv_in_delta() -> bool:
    """`DOHNUTS_CONV_IN_DELTA` (1, the default, or 0): whether an inference pass may leave Gated
    DeltaNet's q and v convs to the fused delta-rule kernel (`DeferredConv`). 0 runs the conv
    kernel for every part, as before (A/B measurements). A prediction session checks it when it
    starts, so a wrong value stops the run before any request (ConfigError)."""
    choice = os.environ.get("DOHNUTS_CONV_IN_DELTA", "").strip() or "1"
    if choice not in ("0", "1"):
        raise ConfigError(f"{choice!r} is not a conv placement: expected 1 (q and v convs in the delta-rule "
                          "kernel) or 0 (the conv kernel for every part)", source="environment",
                          field="DOHNUTS_CONV_IN_DELTA")
    return choice == "1"


@dataclass(frozen=True)
class DeferredConv:
    """One part of the packed q/k/v projection whose conv has not run: its channels
    [start, start + size) of `x` (B, T, D), with the (tap-major) weight and the initial conv state
    of the whole projection. The fused delta-rule kernel computes it on load
    (dohnuts.ops._delta_h_kernel, CONV_QV), so the conv output is never written; anything else
    calls `materialize()` and gets exactly what `causal_conv1d_qkv` would have returned.

    `heads`, `head_dim`: the (B, T, heads, head_dim) view the delta rule takes (`with_heads`);
    `block`: the conv kernel's channel block (the key head dim: also the L2 norm's group)."""

    x: torch.Tensor
    weight: torch.Tensor
    state: torch.Tensor | None
    start: int
    size: int
    block: int
    normalize: bool
    heads: int = 0
    head_dim: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        B, T = self.x.shape[:2]
        return (B, T, self.heads, self.head_dim) if self.heads else (B, T, self.size)

    def with_heads(self, heads: int, head_dim: int) -> DeferredConv:
        if heads * head_dim != self.size:
            raise ValueError(f"a conv part of {self.size} channels viewed as {heads} × {head_dim}")
        return DeferredConv(self.x, self.weight, self.state, self.start, self.size, self.block, self.normalize,
                            heads, head_dim)

    def materialize(self) -> torch.Tensor:
        from dohnuts.ops._conv_kernel import conv_silu_triton

        part = slice(self.start, self.start + self.size)
        y = conv_silu_triton(self.x[..., part], self.weight[part], self.block, normalize=self.normalize,
                             initial_state=None if self.state is None else self.state[:, part])
        return y.view(self.shape)


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


def causal_conv1d_parts_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    y, final = causal_conv1d_reference(x, weight, initial_state, output_final_state)
    return y.split(sizes, dim=-1), final


def causal_conv1d_parts_fused(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    if recording(x, weight, initial_state):  # training keeps its one conv (and its backward) exactly as before
        y, final = causal_conv1d_fused(x, weight, initial_state, output_final_state)
        return y.split(sizes, dim=-1), final
    outs, finals, start = [], [], 0
    for n in sizes:
        part = slice(start, start + n)
        # fla reads the strided column slice in place and writes a contiguous (B, T, n) output.
        y, final = causal_conv1d_fused(x[..., part], weight[part],
                                       None if initial_state is None else initial_state[:, part], output_final_state)
        outs.append(y)
        finals.append(final)
        start += n
    return tuple(outs), torch.cat(finals, dim=1) if output_final_state else None  # (B, D, W)


def causal_conv1d_parts(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """`causal_conv1d` with its output split into channel groups of `sizes`: (outputs, state).

    The numbers are those of one conv then `split` (a depthwise conv treats channels apart), and
    the state keeps the one-conv layout (B, D, W). Without autograd recording, the fused path runs
    one conv per group, so each output comes out contiguous: Gated DeltaNet's q, k and v then
    reach fla's delta rule without the copies its input guard makes of strided views."""
    fn = causal_conv1d_parts_fused if use_fused(x) else causal_conv1d_parts_reference
    return fn(x, weight, sizes, initial_state, output_final_state)


def causal_conv1d_qkv(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int],
    key_head_dim: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    defer_qv: bool = False,
) -> tuple[tuple[torch.Tensor | DeferredConv, ...], torch.Tensor | None, bool]:
    """Gated DeltaNet's conv over its packed q/k/v projection: `causal_conv1d_parts` with sizes
    [q, k, v], plus whether q and k came out already L2-normalised per head of `key_head_dim`.

    Fused and without autograd (every inference pass: stateless, a prefix that returns its state,
    a suffix that starts from a forked one), each part takes one Triton kernel: conv + SiLU, plus
    the L2 norm for q and k, reading the state through its strides (a forked state may be a
    batch-broadcast view) and writing its channels of the (B, D, W) final state. The caller then
    skips the delta rule's own normalisation (normalised = True). Under autograd, and on the
    reference path, this is `causal_conv1d_parts` and the delta rule normalises (normalised =
    False): training keeps fla's conv and fused L2-norm backward.

    `defer_qv` (on that fused path, when no final state is asked): q and v come back as
    `DeferredConv` parts — only k's conv runs here (fla's kkt_solve reads k) — and the fused
    delta-rule kernel computes q and v on load. In a 2b 32 × 512 pass each of their conv outputs is
    64 MiB a layer written and read back."""
    if (use_fused(x) and not recording(x, weight, initial_state) and len(sizes) == 3
            and key_head_dim & (key_head_dim - 1) == 0 and all(n % key_head_dim == 0 for n in sizes)):
        from dohnuts.ops._conv_kernel import conv_silu_triton

        B, _, D = x.shape
        final = x.new_empty(B, D, weight.shape[-1]) if output_final_state else None
        # Tap-major weight (one small copy a layer): each tap's channels are then contiguous.
        weight = weight.t().contiguous().t()  # (D, W) with strides (1, D)
        outs, start = [], 0
        defer = defer_qv and final is None
        for i, n in enumerate(sizes):
            part = slice(start, start + n)
            if defer and i != 1:
                outs.append(DeferredConv(x, weight, initial_state, start, n, key_head_dim, normalize=i < 2))
                start += n
                continue
            outs.append(conv_silu_triton(
                x[..., part], weight[part], key_head_dim, normalize=i < 2,
                initial_state=None if initial_state is None else initial_state[:, part],
                final_state=None if final is None else final[:, part]))
            start += n
        return tuple(outs), final, True
    parts, state = causal_conv1d_parts(x, weight, sizes, initial_state, output_final_state)
    return parts, state, False
