"""Gated full attention of Qwen3.5: GQA with per-head q/k RMSNorm, partial rotary embedding and
a sigmoid output gate, with its keys and values in and out (dohnuts.model.state)."""

from __future__ import annotations

import torch
from torch import nn

from dohnuts import ops
from dohnuts.config import TextConfig
from dohnuts.model.blocks import ALL_ROWS, RMSNorm, take_rows
from dohnuts.model.lora import input_spare, linear_group
from dohnuts.model.packing import packed_weight
from dohnuts.model.state import KVState


def _append_kv(past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """cat([past, new], dim=2). Without autograd, two copies into one new tensor: a forked prefix's
    keys are a batch-broadcast view (stride 0), which torch.cat's kernel reads at a fraction of the
    memory bandwidth; `ops.copy4d` reads it once, with vectorised tiles on the GPU."""
    if ops.recording(past, new):
        return torch.cat([past, new], dim=2)
    B, H, P, D = past.shape
    out = torch.empty(B, H, P + new.shape[2], D, dtype=new.dtype, device=new.device)
    ops.copy4d(out[:, :, :P], past)
    ops.copy4d(out[:, :, P:], new)
    return out


class Attention(nn.Module):
    """Gated GQA attention: q/k RMSNorm per head, partial RoPE, sigmoid output gate."""

    packed_projections = (("q_proj", "k_proj", "v_proj"),)

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        # q_proj emits the query and its output gate interleaved per head: (Hq, 2·D).
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * d * 2, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], state: KVState | None, return_state: bool,
        rows=ALL_ROWS,
    ) -> tuple[torch.Tensor | None, KVState | None]:
        """x (B, T, H) → (output (B, T, H), state). `rows` (B, Q): queries only at those positions,
        output (B, Q, H); None: no queries at all (keys and values for the state alone)."""
        cfg = self.cfg
        B = x.shape[0]
        d = cfg.head_dim
        nq = cfg.num_attention_heads * 2 * d
        if rows is ALL_ROWS:
            o, new_state = self.mix(*self.project(x), rope, state, return_state)
            return self.o_proj(o), new_state
        # keys and values of every token; the query side only at `rows`
        w = packed_weight(self.q_proj, self.k_proj, self.v_proj)
        xq = None if rows is None else take_rows(x, rows)
        if w is None:
            k, v = self.k_proj(x), self.v_proj(x)
            qg = None if xq is None else self.q_proj(xq)
        else:  # row slices of the packed weight: two GEMMs
            k, v = linear_group(x, (self.k_proj, self.v_proj), w[nq:]).chunk(2, dim=-1)
            qg = None if xq is None else linear_group(xq, (self.q_proj,), w[:nq])
        k, v = self._keys_values(k, v, rope, state)
        new_state = KVState(k, v) if return_state else None
        if qg is None:
            return None, new_state
        Q = qg.shape[1]
        q, gate = qg.view(B, Q, cfg.num_attention_heads, 2 * d).chunk(2, dim=-1)  # strided views (B, Q, Hq, D)
        q = self.q_norm.rope(q, (take_rows(rope[0], rows), take_rows(rope[1], rows)))  # (B, Hq, Q, D)
        past = 0 if state is None else state.key.shape[2]
        o = ops.attention_at(q, k, v, rows + past, scale=d ** -0.5)  # (B, Hq, Q, D)
        return self.o_proj(ops.gated_output(o, gate)), new_state  # o · sigmoid(gate) as (B, Q, Hq·D)

    def forward_shared(self, x: torch.Tensor, groups: tuple[tuple[int, int, object], ...]) -> torch.Tensor:
        """x (R, H): the rows of a shared pass (`TextBackbone.forward_shared`) → output (R, H). The
        projections run over all rows at once; the attention per group: the prefix's causally, each
        suffix over the prefix's keys (forked) and its own."""
        parts = self.project(x)  # (R, ·) each
        outs, state, start = [], None, 0
        for n, t, rope in groups:
            rows = slice(start, start + n * t)
            start += n * t
            o, new = self.mix(*(p[rows].view(n, t, -1) for p in parts), rope,
                              None if state is None else state.fork(n), return_state=state is None)
            state = state if state is not None else new
            outs.append(o.reshape(n * t, -1))
        return self.o_proj(torch.cat(outs))

    def input_spare(self, rows=ALL_ROWS) -> int:
        """The spare columns for this layer's input (`dohnuts.model.lora.input_spare`): the packed
        q/k/v group's, or with `rows` the keys and values' (the queries read a gathered copy)."""
        linears = (self.q_proj, self.k_proj, self.v_proj) if rows is ALL_ROWS else (self.k_proj, self.v_proj)
        return input_spare(linears, lambda: packed_weight(self.q_proj, self.k_proj, self.v_proj))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., H) → (query and gate (..., Hq·2·D), keys (..., Hkv·D), values (..., Hkv·D)):
        one GEMM when the weights are packed (the parts are column views of its output)."""
        cfg = self.cfg
        d, hkv = cfg.head_dim, cfg.num_key_value_heads
        w = packed_weight(self.q_proj, self.k_proj, self.v_proj)
        if w is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return linear_group(x, (self.q_proj, self.k_proj, self.v_proj), w).split(
            [cfg.num_attention_heads * 2 * d, hkv * d, hkv * d], dim=-1)

    def _keys_values(self, k, v, rope, state):
        """Projected keys and values (B, T, ·) → normalised, rotated keys and values (B, Hkv, P + T, D),
        after the state's P past ones."""
        cfg = self.cfg
        B, T, _ = k.shape
        d, hkv = cfg.head_dim, cfg.num_key_value_heads
        k = self.k_norm.rope(k.view(B, T, hkv, d), rope)  # (B, Hkv, T, D), normalised and rotated
        v = v.view(B, T, hkv, d).transpose(1, 2)
        if state is not None:
            k, v = _append_kv(state.key, k), _append_kv(state.value, v)  # (B, Hkv, P + T, D)
        return k, v

    def mix(self, qg, k, v, rope, state: KVState | None, return_state: bool) -> tuple[torch.Tensor, KVState | None]:
        """Causal attention of (B, T, ·) projections at every position, after the state's keys →
        (gated output (B, T, Hq·D), state)."""
        cfg = self.cfg
        B, T, _ = qg.shape
        d = cfg.head_dim
        k, v = self._keys_values(k, v, rope, state)
        q, gate = qg.view(B, T, cfg.num_attention_heads, 2 * d).chunk(2, dim=-1)  # strided views (B, T, Hq, D)
        q = self.q_norm.rope(q, rope)  # (B, Hq, T, D)
        o = ops.causal_attention(q, k, v, scale=d ** -0.5)  # (B, Hq, T, D)
        return ops.gated_output(o, gate), KVState(k, v) if return_state else None  # o · sigmoid(gate), (B, T, Hq·D)
