"""The Qwen3.5 text backbone: Gated DeltaNet and gated full-attention layers with SwiGLU MLPs.

Parameter names equal transformers' `Qwen3_5TextModel` (model_type `qwen3_5_text`), so its
checkpoints load as they are. Every layer takes an optional incoming state and can return its
outgoing state (dohnuts.model.state), which is how a shared prefix is computed once and forked.
The backbone ends at the final norm: no vocabulary projection exists in dohnuts.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from dohnuts import ops
from dohnuts.config import TextConfig
from dohnuts.model.packing import packed_weight
from dohnuts.model.rope import rotary_cos_sin, rotary_tables, text_positions
from dohnuts.model.state import BackboneState, KVState, LinearAttentionState


class _AllRows:
    """The default `rows` of a layer: every position (an explicit None means none: state only)."""

    def __repr__(self) -> str:
        return "ALL_ROWS"


ALL_ROWS = _AllRows()


def side_stream(x: torch.Tensor) -> torch.cuda.Stream | None:
    """The second CUDA stream of x's device on which the shared pass runs the prefix's delta rule
    (`GatedDeltaNet.forward_shared`); None off CUDA and under autograd (training keeps one stream:
    its backward would otherwise run on streams of their own). A CUDA graph captures the fork and
    join as graph edges."""
    device = x.device
    if device.type != "cuda" or ops.recording(x):
        return None
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x (B, T, ...) at the positions rows (B, Q) of each batch row → (B, Q, ...)."""
    index = rows.view(*rows.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index)


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: y = x / rms(x) · (1 + w), w initialised to 0."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, weight_offset=1.0)

    def add(self, delta: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + delta), residual + delta), fused on the GPU."""
        return ops.add_rms_norm(delta, residual, self.weight, self.eps, weight_offset=1.0)

    def rope(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Per-head norm then the rotary embedding: x (B, T, H, D) → (B, H, T, D), one kernel on the GPU."""
        return ops.norm_rope(x, self.weight, self.eps, 1.0, *rope)


class GatedRMSNorm(nn.Module):
    """RMSNorm with a SiLU output gate (Gated DeltaNet's output norm); plain scale w, init 1."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)


class MLP(nn.Module):
    # Linears that read the same input and may run as one GEMM (dohnuts.model.packing).
    packed_projections = (("gate_proj", "up_proj"),)

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = packed_weight(self.gate_proj, self.up_proj)
        if w is None:
            return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(ops.swiglu_packed(F.linear(x, w)))  # one (..., 2I) GEMM output, read in place


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
        self.A_log = nn.Parameter(torch.empty(hv).uniform_(1, 16).log())
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

    def forward_shared(self, x: torch.Tensor, groups: tuple[tuple[int, int, object], ...]) -> torch.Tensor:
        """x (R, H): the rows of a shared pass (`TextBackbone.forward_shared`), the prefix's
        (1 × P) first, then its B × L forked suffixes → output (R, H). The projections, the output
        gate, norm and projection run over all rows at once; the recurrence per group: the
        prefix from no state, the suffixes from its state, forked.

        On a GPU (`side_stream`) the prefix's delta rule runs on a second stream while the
        suffixes' conv, gates and intra-chunk solve run on this one — they need only the prefix's
        conv history — so the prefix's latency-bound chain (one sequence: a few dozen programs a
        kernel) hides behind the suffixes' work; the suffixes' recurrence waits for its state."""
        (_, p, _), (n, t, _) = groups
        mixed, b, a = self.project(x)  # (R, ·) each
        qkv_p, conv_p, normalised_p = self._conv(mixed[:p].view(1, p, -1), None, True)
        side = side_stream(x)
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side) if side is not None else nullcontext():
            o_p, rec_p = self._delta(qkv_p, b[:p].view(1, p, -1), a[:p].view(1, p, -1), None, True, normalised_p)
        qkv_s, _, normalised_s = self._conv(mixed[p:].view(n, t, -1), conv_p.expand(n, -1, -1), False)
        join = None if side is None else (lambda: torch.cuda.current_stream(x.device).wait_stream(side))
        o_s, _ = self._delta(qkv_s, b[p:].view(n, t, -1), a[p:].view(n, t, -1),
                             rec_p.expand(n, -1, -1, -1), False, normalised_s, before_state=join)
        o = torch.cat([o_p.reshape(p, *o_p.shape[2:]), o_s.reshape(n * t, *o_s.shape[2:])])
        return self.finish(x, o)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., H) → (mixed (..., 2·H·K + HV·V), b (..., HV), a (..., HV)): one GEMM when the
        weights are packed (the parts are column views of its output)."""
        cfg = self.cfg
        hv = cfg.linear_num_value_heads
        w = packed_weight(self.in_proj_qkv, self.in_proj_b, self.in_proj_a)
        if w is None:
            return self.in_proj_qkv(x), self.in_proj_b(x), self.in_proj_a(x)
        return F.linear(x, w).split([cfg.linear_conv_dim, hv, hv], dim=-1)

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
        One conv per part (on the GPU, outside training): q, k and v come out contiguous; in a
        stateless inference pass q and k also come out L2-normalised."""
        cfg = self.cfg
        return ops.causal_conv1d_qkv(
            mixed, self.conv1d.weight.squeeze(1), [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim],
            cfg.linear_key_head_dim, conv_state, return_state,
        )

    def _delta(self, qkv, b, a, recurrent, return_state: bool, qk_normalised: bool, before_state=None):
        """The gated delta rule over conv outputs (B, T, ·) → (o (B, T, HV, V), final state or None)."""
        cfg = self.cfg
        q, k, v = qkv
        B, T, _ = b.shape
        q = q.reshape(B, T, cfg.linear_num_key_heads, cfg.linear_key_head_dim)  # (B, T, H, K)
        k = k.reshape(B, T, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        v = v.reshape(B, T, cfg.linear_num_value_heads, cfg.linear_value_head_dim)  # (B, T, HV, V)
        # The gates stay raw: beta = sigmoid(b) and the log-space decay g = -exp(A_log) ·
        # softplus(a + dt_bias) <= 0 (FP32) are computed inside fla's kernels on the GPU.
        return ops.gated_delta_rule_from_logits(
            q, k, v, a, b, self.A_log, self.dt_bias, initial_state=recurrent, output_final_state=return_state,
            use_qk_l2norm=not qk_normalised, before_state=before_state,
        )  # (B, T, HV, V)

    def finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The output gate (from x (..., H)), the gated norm and out_proj of o (..., HV, V) → (..., H)."""
        z = self.in_proj_z(x).view(*o.shape)  # the output gate, only where an output is asked
        o = self.norm(o, z).reshape(*o.shape[:-2], self.cfg.linear_value_dim)
        return self.out_proj(o)


def _append_kv(past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """cat([past, new], dim=2). Without autograd, two copies into one new tensor: a forked prefix's
    keys are a batch-broadcast view (stride 0), which torch.cat's kernel reads at ≈ 1 TB/s on the
    H200 (44 µs a layer for 32 × 448 keys, 2026-11-30 profile); `ops.copy4d` reads it once, with
    vectorised tiles on the GPU."""
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
            k, v = F.linear(x, w[nq:]).chunk(2, dim=-1)
            qg = None if xq is None else F.linear(xq, w[:nq])
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

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., H) → (query and gate (..., Hq·2·D), keys (..., Hkv·D), values (..., Hkv·D)):
        one GEMM when the weights are packed (the parts are column views of its output)."""
        cfg = self.cfg
        d, hkv = cfg.head_dim, cfg.num_key_value_heads
        w = packed_weight(self.q_proj, self.k_proj, self.v_proj)
        if w is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return F.linear(x, w).split([cfg.num_attention_heads * 2 * d, hkv * d, hkv * d], dim=-1)

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
        h = self.input_layernorm(x) if delta is None else None
        if delta is not None:
            h, x = self.input_layernorm.add(delta, x)
        if self.layer_type == "linear_attention":
            h, new_state = self.linear_attn(h, state, return_state, rows)
        else:
            h, new_state = self.self_attn(h, rope, state, return_state, rows)
        if h is None:
            return None, None, new_state
        if rows is not ALL_ROWS:
            x = take_rows(x, rows)
        h, x = self.post_attention_layernorm.add(h, x)
        return x, self.mlp(h), new_state

    def forward_shared(self, x, delta, groups):
        """The layer over the rows (R, H) of a shared pass (`TextBackbone.forward_shared`): norms,
        projections and the MLP once over all rows, the token mixer per group. Returns (residual
        stream, MLP output); the prefix's state lives only inside the layer."""
        h = self.input_layernorm(x) if delta is None else None
        if delta is not None:
            h, x = self.input_layernorm.add(delta, x)
        mixer = self.linear_attn if self.layer_type == "linear_attention" else self.self_attn
        h, x = self.post_attention_layernorm.add(mixer.forward_shared(h, groups), x)
        return x, self.mlp(h)


class TextBackbone(nn.Module):
    """Token embeddings → decoder layers → final norm. Hidden states only, never logits."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
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
        state (dohnuts.model.state, forked as views). A lone prefix pass is latency-bound (a
        ~200-token image prefix: ~430 kernels, 2.93 ms against a 0.70 ms bound, docs/evolution.md
        M19); here it adds only its mixers' kernels to the suffix pass. Measured on the H200 (M20):
        0.3–0.6 ms less device time a call than the two passes, not more — the prefix's rows make
        the GEMMs tile worse, and its mixers (kkt_solve alone 18 µs a layer) remain. The last layer
        runs per group: the prefix's state alone, the suffixes at `rows`.

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
        groups = ((1, P, rope_p), (B, L, rope_s))
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


def recomputed(fn, *args):
    """fn(*args) under activation checkpointing: what it saves for the backward pass is dropped
    and recomputed there (non-reentrant). The RNG state is kept for the recomputation (LoRA dropout
    draws masks) except while a CUDA graph is being captured, where it cannot be read — the graphs
    never run dropout (dohnuts.train.step)."""
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=not capturing)
