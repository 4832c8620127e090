"""The product's model: backbone (+ vision tower) + a scalar head over candidates.

`ScoringModel` is tensors in, scores out: a `ScoreInputs` (dohnuts.model.inputs) goes in, one
FP32 score per candidate comes out. It knows nothing of tokenizers, image caches, calibration
temperatures or adapter files — those live in the runtime session (dohnuts.runtime.session).
A pass makes no host reads, so each of its passes can be captured as a CUDA graph.

One request is one invocation, by one of two passes (`choose_pass`): one batched pass over whole
sequences, or the shared pass — the shared prefix once, its state forked into the batched
suffixes, in one pass; then the hidden states at the candidates' SCORE tokens go through the
scalar head. With `ScoreInputs.score_rows` (the runtime always gives them) a pass returns the
hidden states at the SCORE tokens only, and its last layer computes its query side, MLP and
final norm there alone. Training runs the same passes with `recompute=True`. No vocabulary
projection and no token generation exist anywhere.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from dohnuts.config import ModelConfig
from dohnuts.model.inputs import ScoreInputs
from dohnuts.model.text import TextBackbone

FULL, SHARED = "forward", "shared"  # the two passes (and the names of their timed stages)


def choose_pass(x: ScoreInputs) -> str:
    """The one place a request's pass is chosen — for eager execution, graph capture and training
    alike: a request the planner split at a shared prefix runs the shared pass (the prefix once,
    its state forked into the suffix rows, `TextBackbone.forward_shared`); any other runs one
    batched pass over whole sequences. Whether to split is the planner's rule
    (dohnuts.runtime.plan.shared_prefix_split), decided before the request reaches the model."""
    return SHARED if x.prefix_ids is not None else FULL


def no_stage(name: str):
    """The default `stage` hook of `ScoringModel.forward`: brackets nothing."""
    return nullcontext()


class ScalarHead(nn.Module):
    """score = w · h, one scalar per candidate; FP32 master weights.

    No bias: scores are only ever compared within a question (softmax over its candidates), so a
    bias would be a parameter without gradient that Adam drifts on rounding noise."""

    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden).normal_(0.0, hidden ** -0.5))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (C, H) → scores (C,) in FP32."""
        return (h.float() @ self.weight.float().t()).squeeze(-1)


class ScoringModel(nn.Module):
    """backbone + optional vision tower + scalar head. Pure: tensors in, scores out."""

    def __init__(self, cfg: ModelConfig, backbone: TextBackbone, visual: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.visual = visual
        self.head = ScalarHead(cfg.text.hidden_size).to(next(backbone.parameters()).device)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.backbone.embed_tokens.weight.dtype

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def train(self, mode: bool = True) -> ScoringModel:
        """nn.Module.train's result — every submodule's `training` flag — set directly rather than
        through its recursion of Module.__setattr__ calls, which runs at the start of every training
        update while the GPU waits (measured: docs/history/evolution.md M28). A submodule that
        overrides train() still gets its own call."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            if m is self or type(m).train is nn.Module.train:
                m.__dict__["training"] = mode
            else:
                m.train(mode)
        return self

    # -- passes -------------------------------------------------------------------------------

    def encode_images(self, patches: torch.Tensor, grid_thw: torch.Tensor, grid_inputs=None) -> torch.Tensor:
        """The frozen vision tower: patches (N, C·Tp·P·P) + grids (n, 3) → merged features (Σ m_i, H).
        `grid_inputs`: the tower's `grid_inputs(grid_thw)`, computed ahead (a CUDA graph's replays)."""
        if self.visual is None:
            raise RuntimeError("this model has no vision tower")
        return self.visual(patches.to(self.compute_dtype), grid_thw, grid_inputs)

    def embed(self, ids: torch.Tensor, features: torch.Tensor | None, start: int) -> torch.Tensor:
        """Token embeddings (B, T, H) with `features` (m, H) in place of tokens start..start+m−1.

        Every row gets the same features (one image per request). The span is known on the
        host, so this is slicing, not a mask: no device synchronisation."""
        x = self.backbone.embed_tokens(ids)  # (B, T, H)
        if features is None or features.shape[0] == 0:
            return x
        B, m = x.shape[0], features.shape[0]
        feats = features.to(x.dtype).unsqueeze(0).expand(B, -1, -1)  # (B, m, H)
        return torch.cat([x[:, :start], feats, x[:, start + m:]], dim=1)

    def shared_hidden(self, x: ScoreInputs, *, recompute: bool = False) -> torch.Tensor:
        """The shared prefix and its B forked suffix rows in one pass (`TextBackbone.forward_shared`)
        → hidden (B, L, H), or (B, Q, H) at `x.score_rows`."""
        B, L = x.ids.shape
        P, k = x.prefix_len, x.image_tokens_in_prefix
        emb_p = self.embed(x.prefix_ids, x.image_features[:k] if k else None, 1)
        rest = x.image_features[k:] if x.image_features is not None and x.image_tokens else None
        emb_s = self.embed(x.ids, rest, 0)
        pos_p = None if x.positions is None else x.positions[:, :, :P]
        pos_s = None if x.positions is None else x.positions[:, :, P:P + L].expand(-1, B, -1)
        return self.backbone.forward_shared(emb_p, emb_s, prefix_positions=pos_p, suffix_positions=pos_s,
                                            next_position=x.prefix_next_position, rows=x.score_rows,
                                            recompute=recompute)

    def full_hidden(self, x: ScoreInputs, *, recompute: bool = False) -> torch.Tensor:
        """One batched pass over whole sequences → hidden (B, L, H), or (B, Q, H) at `x.score_rows`."""
        B, L = x.ids.shape
        feats = x.image_features if x.image_tokens else None
        emb = self.embed(x.ids, feats, 1)
        pos = None if x.positions is None else x.positions[:, :, :L].expand(-1, B, -1)
        h, _ = self.backbone(inputs_embeds=emb, position_ids=pos, checkpoint_layers=recompute, rows=x.score_rows)
        return h

    def run_pass(self, kind: str, x: ScoreInputs, *, recompute: bool = False) -> torch.Tensor:
        """The hidden states of pass `kind` (`choose_pass`) over `x`. `recompute` (training):
        activation checkpointing — each layer of the whole request, a shared prefix and its forked
        suffixes together, is recomputed in the backward pass from fresh state."""
        if kind == SHARED:
            return self.shared_hidden(x, recompute=recompute)
        return self.full_hidden(x, recompute=recompute)

    def head_scores(self, h: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """hidden (B, L, H) → the scores (C,) FP32 of the flat rows `index` names (a request's
        `head_index` for what `hidden` returned)."""
        return self.head(h.reshape(-1, h.shape[-1]).index_select(0, index))

    def hidden(self, x: ScoreInputs, *, recompute: bool = False, stage=no_stage) -> torch.Tensor:
        """Hidden states (B, L, H) of the request's rows, or (B, Q, H) at `x.score_rows`, by the pass
        `choose_pass` picks; `stage(name)` brackets it (`shared` or `forward`) with a context
        manager — the runtime's stage timer, or nothing."""
        kind = choose_pass(x)
        with stage(kind):
            return self.run_pass(kind, x, recompute=recompute)

    def forward(self, x: ScoreInputs, *, recompute: bool = False, stage=no_stage) -> torch.Tensor:
        """One request's candidate scores (C,) FP32, in the order of `x.score_index`."""
        h = self.hidden(x, recompute=recompute, stage=stage)
        with stage("head"):
            return self.head_scores(h, x.head_index)


def candidate_logits(scores: torch.Tensor, cand_matrix: torch.Tensor) -> torch.Tensor:
    """scores (C,) → (Q, Kmax) with −inf where a question has fewer candidates."""
    safe = cand_matrix.clamp_min(0)
    return scores[safe].masked_fill(cand_matrix < 0, float("-inf"))


def decide(scores: torch.Tensor, cand_matrix: torch.Tensor, temperature: float = 1.0):
    """Per question: probabilities softmax(s / T) (Q, Kmax), the chosen index (Q,) and the scores
    themselves by question (`candidate_logits`: what a result lists, one copy to the host)."""
    logits = candidate_logits(scores, cand_matrix)
    probs = torch.softmax(logits / temperature, dim=-1)
    return probs, logits.argmax(dim=-1), logits
