"""Gated DeltaNet, the linear-attention token mixer of Qwen3.5: short conv → gated delta rule →
gated RMSNorm → out_proj, with its conv history and recurrent state in and out
(dohnuts.model.state), which is how a shared prefix is computed once and forked."""

from __future__ import annotations

import torch
from torch import nn

from dohnuts import ops
from dohnuts.config import TextConfig
from dohnuts.model.blocks import ALL_ROWS, GatedRMSNorm, take_rows
from dohnuts.model.lora import input_spare, linear_group
from dohnuts.model.packing import columns, packed_weight
from dohnuts.model.state import LinearAttentionState, SharedRows


class GatedDeltaNet(nn.Module):
    """Linear-attention token mixer: short conv → gated delta rule → gated RMSNorm → out_proj."""

    # in_proj_z stays alone: as a column slice of a packed output it would be strided, and the
    # gated norm's fla wrapper would copy it (a full read + write), more than its GEMM saves.
    packed_projections = (("in_proj_qkv", "in_proj_b", "in_proj_a"),)

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, cfg.linear_conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, cfg.linear_value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, hv, bias=False)
        # Depthwise conv weight in transformers' nn.Conv1d layout (D, 1, W); only its weight is used.
        self.conv1d = nn.Conv1d(cfg.linear_conv_dim, cfg.linear_conv_dim, cfg.linear_conv_kernel_dim,
                                groups=cfg.linear_conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.A_log = nn.Parameter(torch.empty(hv).uniform_(1, 16))
        if not self.A_log.is_meta:  # log U(1, 16); a meta tensor has no values to take the log of
            with torch.no_grad():   # (and torch's meta log imports torch._dynamo: blocks.Embedding)
                self.A_log.log_()
        self.norm = GatedRMSNorm(dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(cfg.linear_value_dim, cfg.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, state: LinearAttentionState | None, return_state: bool, rows=ALL_ROWS
    ) -> tuple[torch.Tensor | None, LinearAttentionState | None]:
        """x (B, T, H) → (output (B, T, H), state). `rows` (B, Q): the output only at those
        positions, (B, Q, H); None: no output (the state alone). The recurrence runs over every
        token either way; the output gate, norm and projection only where an output is asked."""
        o, new_state = self.mix(*self.project(x), state, return_state)
        if rows is None:
            return None, new_state
        if rows is not ALL_ROWS:
            x, o = take_rows(x, rows), take_rows(o, rows)  # (B, Q, H), (B, Q, HV, V)
        return self.finish(x, o), new_state

    def forward_shared(self, x: torch.Tensor, groups: SharedRows) -> torch.Tensor:
        """x (R, H): the rows of a shared pass (`TextBackbone.forward_shared`), the prefix's
        (1 × P) first, then its B × L forked suffixes → output (R, H). Every op runs over all rows
        at once: the projections, the conv (`ops.causal_conv1d_qkv_shared`: the suffixes from the
        prefix's conv state), the delta rule (`ops.gated_delta_rule_shared`: the prefix from no
        state, the suffixes from its state), the output gate, norm and projection."""
        cfg = self.cfg
        (_, p, _), (_, t, _) = groups
        mixed, b, a = self.project(x)  # (R, ·) each
        (q, k, v), normalised = ops.causal_conv1d_qkv_shared(
            mixed, self.conv1d.weight.squeeze(1), self._qkv_sizes(), cfg.linear_key_head_dim, p, t)
        R = x.shape[0]
        o = ops.gated_delta_rule_shared(
            q.view(R, cfg.linear_num_key_heads, cfg.linear_key_head_dim),
            k.view(R, cfg.linear_num_key_heads, cfg.linear_key_head_dim),
            v.view(R, cfg.linear_num_value_heads, cfg.linear_value_head_dim), a, b, self.A_log, self.dt_bias, p, t,
            groups.chunk_index(x.device), normalised)
        return self.finish(x, o)

    def input_spare(self, rows=ALL_ROWS) -> int:
        """The spare columns for this layer's input (`dohnuts.model.lora.input_spare`): the packed
        qkv/b/a group's, which reads it first, then in_proj_z's (at every row only when `rows` is
        ALL_ROWS; at a gathered copy of them otherwise)."""
        linears = (self.in_proj_qkv, self.in_proj_b, self.in_proj_a)
        n = input_spare(linears, lambda: packed_weight(*linears))
        return n + input_spare((self.in_proj_z,), lambda: self.in_proj_z.weight) if rows is ALL_ROWS else n

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., H) → (mixed (..., 2·H·K + HV·V), b (..., HV), a (..., HV)): one GEMM when the
        weights are packed (the parts are column views of its output)."""
        cfg = self.cfg
        hv = cfg.linear_num_value_heads
        w = packed_weight(self.in_proj_qkv, self.in_proj_b, self.in_proj_a)
        if w is None:
            return self.in_proj_qkv(x), self.in_proj_b(x), self.in_proj_a(x)
        # the parts as column views, y's gradient written once (the conv's backward writes its columns)
        return columns(linear_group(x, (self.in_proj_qkv, self.in_proj_b, self.in_proj_a), w),
                       [cfg.linear_conv_dim, hv, hv])

    def mix(
        self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, state: LinearAttentionState | None,
        return_state: bool,
    ) -> tuple[torch.Tensor, LinearAttentionState | None]:
        """The sequence mixing of (B, T, ·) projections: short conv, then the gated delta rule →
        (o (B, T, HV, V), state)."""
        qkv, conv_state, normalised = self._conv(mixed, None if state is None else state.conv, return_state)
        o, recurrent = self._delta(qkv, b, a, None if state is None else state.recurrent, return_state, normalised)
        return o, LinearAttentionState(conv_state, recurrent) if return_state else None

    def _conv(self, mixed: torch.Tensor, conv_state: torch.Tensor | None, return_state: bool):
        """The short conv of (B, T, ·): ((q, k, v), conv state, whether q and k come out normalised).
        On the GPU (training and inference alike) one kernel for the three parts: q, k and v come
        out contiguous, q and k L2-normalised."""
        return ops.causal_conv1d_qkv(mixed, self.conv1d.weight.squeeze(1), self._qkv_sizes(),
                                     self.cfg.linear_key_head_dim, conv_state, return_state)

    def _qkv_sizes(self) -> list[int]:
        """The conv's three parts of the packed projection: q, k and v channels."""
        cfg = self.cfg
        return [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]

    def _heads(self, qkv):
        """The conv's outputs (B, T, ·) → q, k (B, T, H, K) and v (B, T, HV, V)."""
        cfg = self.cfg
        q, k, v = qkv
        B, T, _ = v.shape
        return (q.reshape(B, T, cfg.linear_num_key_heads, cfg.linear_key_head_dim),
                k.reshape(B, T, cfg.linear_num_key_heads, cfg.linear_key_head_dim),
                v.reshape(B, T, cfg.linear_num_value_heads, cfg.linear_value_head_dim))

    def _delta(self, qkv, b, a, recurrent, return_state: bool, qk_normalised: bool):
        """The gated delta rule over conv outputs (B, T, ·) → (o (B, T, HV, V), final state or None)."""
        q, k, v = self._heads(qkv)
        # The gates stay raw: beta = sigmoid(b) and the log-space decay g = -exp(A_log) ·
        # softplus(a + dt_bias) <= 0 (FP32) are computed in one kernel on the GPU (dohnuts.ops).
        return ops.gated_delta_rule_from_logits(
            q, k, v, a, b, self.A_log, self.dt_bias, initial_state=recurrent, output_final_state=return_state,
            use_qk_l2norm=not qk_normalised,
        )  # (B, T, HV, V)

    def finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The output gate (from x (..., H)), the gated norm and out_proj of o (..., HV, V) → (..., H)."""
        z = self.in_proj_z(x).view(*o.shape)  # the output gate, only where an output is asked
        o = self.norm(o, z).reshape(*o.shape[:-2], self.cfg.linear_value_dim)
        return self.out_proj(o)
