"""Per-layer sequence state of the text backbone: explicit objects, never hidden caches.

A full-attention layer's state is its keys and values (KV cache); a Gated DeltaNet layer's is
its short-conv history and its recurrent matrix. A `BackboneState` is what a pass over a token
prefix leaves behind; `fork(n)` turns a batch-1 prefix state into n independent branches.

Lifetime (the execution policy, dohnuts.runtime.policy): a state belongs to one request and one
weight snapshot. It is created by a forward pass and passed explicitly to the next; nothing in the
model keeps a reference to it, so nothing survives an optimizer update or another request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dohnuts.ops import shared_chunk_index


@dataclass(frozen=True)
class KVState:
    """Keys and values of a full-attention layer, (B, Hkv, T, D) each, after rotary embedding."""

    key: torch.Tensor
    value: torch.Tensor

    def fork(self, n: int) -> KVState:
        # Attention only reads past keys (the suffix pass concatenates, creating new tensors), so
        # expanded views are safe and cost no memory.
        return KVState(self.key.expand(n, -1, -1, -1), self.value.expand(n, -1, -1, -1))


@dataclass(frozen=True)
class LinearAttentionState:
    """A Gated DeltaNet layer: conv history (B, D_conv, W) and recurrent state (B, HV, K, V) FP32."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    def fork(self, n: int) -> LinearAttentionState:
        # Batch-broadcast views, with or without autograd: the conv kernel and the delta rule read
        # them through their strides (dohnuts.ops._conv_kernel, _delta_h_kernel), and their
        # backward gives each branch its gradient, which `expand` sums into the prefix's state.
        return LinearAttentionState(self.conv.expand(n, -1, -1), self.recurrent.expand(n, -1, -1, -1))


LayerState = KVState | LinearAttentionState


@dataclass(frozen=True)
class BackboneState:
    """The state of every layer after `length` tokens (text positions 0..length-1 consumed)."""

    layers: tuple[LayerState, ...]
    length: int
    next_position: int  # the rotary position the next token takes (differs from length with images)

    @property
    def batch_size(self) -> int:
        first = self.layers[0]
        return (first.key if isinstance(first, KVState) else first.conv).shape[0]

    def fork(self, n: int) -> BackboneState:
        if self.batch_size != 1:
            raise ValueError(f"only a batch-1 prefix state can be forked, this one has batch {self.batch_size}")
        return BackboneState(tuple(s.fork(n) for s in self.layers), self.length, self.next_position)


class SharedRows(tuple):
    """The groups of a shared pass's rows (`TextBackbone.forward_shared`): ((1, P, prefix rope),
    (B, L, suffix rope)) — the prefix's P rows, then its B forked suffixes of L — and, made on first
    use and kept for the pass (every Gated DeltaNet layer reads it), the delta rule's chunk index
    of those rows (`dohnuts.ops.shared_chunk_index`)."""

    _chunks: tuple[torch.Tensor, torch.Tensor] | None = None

    def chunk_index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._chunks is None:
            (_, P, _), (B, L, _) = self
            self._chunks = shared_chunk_index(P, B, L, device)
        return self._chunks
