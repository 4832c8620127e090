"""The Qwen3.5 text backbone: Gated DeltaNet and gated full-attention layers with SwiGLU MLPs.

Parameter names equal transformers' `Qwen3_5TextModel` (model_type `qwen3_5_text`), so its
checkpoints load as they are. Every layer takes an optional incoming state and can return its
outgoing state (dohnuts.model.state), which is how a shared prefix is computed once and forked.
The backbone ends at the final norm: no vocabulary projection exists in dohnuts. The layers' parts
live beside it: dohnuts.model.blocks (norms, MLP), .deltanet (Gated DeltaNet), .attention.
"""

from __future__ import annotations

import torch
from torch import nn

from dohnuts.config import TextConfig
from dohnuts.model.attention import Attention
from dohnuts.model.blocks import ALL_ROWS, MLP, Embedding, RMSNorm, recomputed, take_rows
from dohnuts.model.deltanet import GatedDeltaNet
from dohnuts.model.rope import rotary_cos_sin, rotary_tables, text_positions
from dohnuts.model.state import BackboneState, SharedRows


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, delta, rope, state, return_state, rows=ALL_ROWS):
        """x: the residual stream (B, T, H); delta: the previous layer's MLP output, not yet added
        (None before the first layer). Returns (residual stream, this layer's MLP output, state):
        each residual add is fused into the norm that follows it.

        `rows` (B, Q) (the last layer of a scoring pass): everything after the token mixer runs
        only at those positions, and the residual stream and MLP output come back as (B, Q, H);
        None: the mixer's state alone (returns None, None, state)."""
        mixer = self.linear_attn if self.layer_type == "linear_attention" else self.self_attn
        spare = mixer.input_spare(rows)
        h = self.input_layernorm(x, spare) if delta is None else None
        if delta is not None:
            h, x = self.input_layernorm.add(delta, x, spare)
        if self.layer_type == "linear_attention":
            h, new_state = self.linear_attn(h, state, return_state, rows)
        else:
            h, new_state = self.self_attn(h, rope, state, return_state, rows)
        if h is None:
            return None, None, new_state
        if rows is not ALL_ROWS:
            x = take_rows(x, rows)
        h, x = self.post_attention_layernorm.add(h, x, self.mlp.input_spare())
        return x, self.mlp(h), new_state

    def forward_shared(self, x, delta, groups):
        """The layer over the rows (R, H) of a shared pass (`TextBackbone.forward_shared`): norms,
        projections and the MLP once over all rows, the token mixer per group. Returns (residual
        stream, MLP output); the prefix's state lives only inside the layer."""
        mixer = self.linear_attn if self.layer_type == "linear_attention" else self.self_attn
        spare = mixer.input_spare(ALL_ROWS)
        h = self.input_layernorm(x, spare) if delta is None else None
        if delta is not None:
            h, x = self.input_layernorm.add(delta, x, spare)
        h, x = self.post_attention_layernorm.add(mixer.forward_shared(h, groups), x, self.mlp.input_spare())
        return x, self.mlp(h)


class TextBackbone(nn.Module):
    """Token embeddings → decoder layers → final norm. Hidden states only, never logits."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Rotary tables per device, built on first use (not parameters, not in the state dict):
        # a pass then reads them from the device instead of copying them from the host.
        self._rotary_tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def rotary(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        dev = position_ids.device
        if dev not in self._rotary_tables:
            self._rotary_tables[dev] = rotary_tables(self.cfg, dev)
        return rotary_cos_sin(self.cfg, position_ids, dtype, self._rotary_tables[dev])

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        state: BackboneState | None = None,
        return_state: bool = False,
        checkpoint_layers: bool = False,
        next_position: int | None = None,
        rows: torch.Tensor | None = None,
        state_only: bool = False,
    ) -> tuple[torch.Tensor | None, BackboneState | None]:
        """input_ids (B, T) or inputs_embeds (B, T, H) → hidden (B, T, H) [, state after them].

        `rows` (B, Q) long: return the hidden states at those positions only, (B, Q, H). The
        last layer then computes its keys/values (or recurrence) for every token but its query
        side — the query projection and attention of those queries, or the output gate and
        projection — and its MLP and the final norm at the Q positions alone: nothing after the
        last layer reads the other positions. `state_only` (with `return_state`): no hidden state
        at all, (None, state): the last layer computes what the state needs and nothing else.

        `position_ids` (3, B, T) default to text positions continuing from `state`. Sequences
        of unequal length are right-padded: every op is causal, so padding never reaches a real
        token's output (it does reach the returned state, which is only asked for unpadded).
        `checkpoint_layers` recomputes each layer in the backward pass (activation checkpointing).
        `next_position` (with `return_state` and explicit `position_ids`): the rotary position
        after these tokens, when the caller knows it on the host; otherwise it is read from the
        device, which synchronises (text positions never need that).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if state_only and (rows is not None or not return_state):
            raise ValueError("state_only needs return_state and no rows")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T, _ = x.shape
        start = 0 if state is None else state.next_position
        rope_positions_default = None
        if position_ids is None:
            position_ids = rope_positions_default = text_positions(B, T, start, x.device)
        rope = self.rotary(position_ids, x.dtype)
        new_states = []
        delta = None  # the last MLP output, added to the residual stream by the next norm
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            layer_state = None if state is None else state.layers[i]
            layer_rows = ALL_ROWS if i < last or (rows is None and not state_only) else rows
            if checkpoint_layers and torch.is_grad_enabled():
                x, delta, s = recomputed(layer, x, delta, rope, layer_state, return_state, layer_rows)
            else:
                x, delta, s = layer(x, delta, rope, layer_state, return_state, layer_rows)
            new_states.append(s)
        if x is not None:
            x = self.norm(x) if delta is None else self.norm.add(delta, x)[0]
        if not return_state:
            return x, None
        length = T + (0 if state is None else state.length)
        if next_position is None:
            explicit = position_ids is not None and position_ids is not rope_positions_default
            next_position = int(position_ids.max()) + 1 if explicit else start + T
        return x, BackboneState(tuple(new_states), length, next_position)

    def forward_shared(
        self,
        prefix_embeds: torch.Tensor,
        suffix_embeds: torch.Tensor,
        *,
        prefix_positions: torch.Tensor | None = None,
        suffix_positions: torch.Tensor | None = None,
        next_position: int | None = None,
        rows: torch.Tensor | None = None,
        recompute: bool = False,
    ) -> torch.Tensor:
        """A shared prefix (1, P, H) and its B forked suffixes (B, L, H) in ONE pass → the suffixes'
        hidden states (B, L, H), or (B, Q, H) at `rows` — equal to `forward` over the prefix
        (returning its state) and then over the suffixes from that state, forked.

        The prefix's P rows join the suffixes' B·L rows in every token-parallel op — norms,
        projections, the MLP: one GEMM each instead of two, and none of them launched for P rows
        alone — while each layer's token mixer runs the prefix first and the suffixes from its
        state (dohnuts.model.state, forked as views). A lone prefix pass is latency-bound (one
        sequence: hundreds of small kernels); here the prefix adds only its token mixers' kernels
        to the suffix pass (measured against two passes: docs/history/evolution.md M20). The last
        layer runs per group: the prefix's state alone, the suffixes at `rows`.

        Positions: `prefix_positions` (3, 1, P) default to text positions 0..P−1, `suffix_positions`
        (3, B, L) to text positions from `next_position` (default: after the prefix's positions).

        `recompute` (training): each layer — the prefix's rows, their state forked, the suffixes' —
        is one activation-checkpointing region: the backward pass recomputes the whole shared
        request layer by layer from fresh state, and the gradients of every branch flow back into
        the prefix's rows through the fork. Under autograd the prefix's delta rule stays on the
        compute stream."""
        _, P, H = prefix_embeds.shape
        B, L, _ = suffix_embeds.shape
        dev, dtype = suffix_embeds.device, suffix_embeds.dtype
        if prefix_positions is None:
            prefix_positions = text_positions(1, P, 0, dev)
            next_position = P if next_position is None else next_position
        elif next_position is None:
            next_position = int(prefix_positions.max()) + 1  # reads the device: callers pass it
        if suffix_positions is None:
            suffix_positions = text_positions(B, L, next_position, dev)
        rope_p, rope_s = self.rotary(prefix_positions, dtype), self.rotary(suffix_positions, dtype)
        groups = SharedRows(((1, P, rope_p), (B, L, rope_s)))
        x = torch.cat([prefix_embeds.reshape(P, H), suffix_embeds.reshape(B * L, H)])  # (P + B·L, H)
        delta = None
        recompute = recompute and torch.is_grad_enabled()
        for layer in self.layers[:-1]:
            if recompute:
                x, delta = recomputed(layer.forward_shared, x, delta, groups)
            else:
                x, delta = layer.forward_shared(x, delta, groups)
        rows = ALL_ROWS if rows is None else rows
        if recompute:
            return recomputed(self._last_shared, x, delta, groups, rows)
        return self._last_shared(x, delta, groups, rows)

    def _last_shared(self, x, delta, groups, rows) -> torch.Tensor:
        """The last layer of a shared pass, per group: the prefix's state alone, then the suffixes
        from it, forked, at `rows`; and the final norm."""
        (_, P, rope_p), (B, L, rope_s) = groups
        H = x.shape[-1]
        last = self.layers[-1]

        def part(t, a, n, length):
            return None if t is None else t[a:a + n * length].view(n, length, H)

        _, _, state = last(part(x, 0, 1, P), part(delta, 0, 1, P), rope_p, None, True, None)
        x, delta, _ = last(part(x, P, B, L), part(delta, P, B, L), rope_s, state.fork(B), False, rows)
        return self.norm.add(delta, x)[0]
