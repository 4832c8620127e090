"""The product's model: backbone (+ vision tower) + LoRA + a scalar head over candidates.

`ScoringModel.score(batch)` is one batched model invocation for one request: optionally the
vision tower (through the frozen-feature cache), then either one batched pass, or the shared
prefix once (batch 1) followed by its forked state and the batched suffixes; then the hidden
states at the candidates' SCORE tokens go through the scalar head. No vocabulary projection and
no token generation exist anywhere.
"""

from __future__ import annotations

import torch
from torch import nn

from dohnuts.config import ModelConfig
from dohnuts.model.text import TextBackbone
from dohnuts.runtime.batch import Batch
from dohnuts.runtime.timing import NULL_TIMER


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
    def __init__(self, cfg: ModelConfig, backbone: TextBackbone, *, visual: nn.Module | None = None,
                 tokenizer=None, base_identity: dict | None = None, max_len: int = 8192):
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.visual = visual
        self.head = ScalarHead(cfg.text.hidden_size).to(next(backbone.parameters()).device)
        self.tokenizer = tokenizer
        self.base_identity = base_identity or {"config_hash": cfg.config_hash()}
        self.max_len = max_len
        self.temperature = 1.0  # calibration temperature (fitted after LoRA merge)
        self.lora_config = None
        self.image_cache = None
        if visual is not None:
            from dohnuts.runtime.image_cache import ImageFeatureCache

            self.image_cache = ImageFeatureCache()

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.backbone.embed_tokens.weight.dtype

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def _embed(self, ids: torch.Tensor, features: torch.Tensor | None, start: int) -> torch.Tensor:
        """Token embeddings (B, T, H) with `features` (m, H) in place of tokens start..start+m−1.

        Every row gets the same features (one image per request). The span is known on the
        host, so this is slicing, not a mask: no device synchronisation."""
        x = self.backbone.embed_tokens(ids)  # (B, T, H)
        if features is None or features.shape[0] == 0:
            return x
        B, m = x.shape[0], features.shape[0]
        feats = features.to(x.dtype).unsqueeze(0).expand(B, -1, -1)  # (B, m, H)
        return torch.cat([x[:, :start], feats, x[:, start + m:]], dim=1)

    def score(self, batch: Batch, *, image_features: torch.Tensor | None = None, timer=NULL_TIMER,
              checkpoint_layers: bool = False) -> torch.Tensor:
        """One request's candidate scores (C,) FP32, in the order of `batch.score_index`."""
        B, L = batch.ids.shape
        pos = batch.positions
        n_img = batch.image_tokens if image_features is not None else 0
        if batch.prefix_ids is not None:
            P = batch.prefix_ids.shape[1]
            k = max(0, min(P - 1, n_img))  # image tokens (absolute 1..n_img) that fall in the prefix
            with timer.stage("prefix"):
                x = self._embed(batch.prefix_ids, image_features[:k] if n_img else None, 1)
                prefix_pos = None if pos is None else pos[:, :, :P]
                _, state = self.backbone(inputs_embeds=x, position_ids=prefix_pos, return_state=True,
                                         checkpoint_layers=checkpoint_layers,
                                         next_position=batch.prefix_next_position)
                state = state.fork(B)
            with timer.stage("suffix"):
                x = self._embed(batch.ids, image_features[k:] if n_img else None, 0)
                suffix_pos = None if pos is None else pos[:, :, P:P + L].expand(-1, B, -1)
                h, _ = self.backbone(inputs_embeds=x, position_ids=suffix_pos, state=state,
                                     checkpoint_layers=checkpoint_layers)
        else:
            with timer.stage("forward"):
                x = self._embed(batch.ids, image_features, 1)
                full_pos = None if pos is None else pos[:, :, :L].expand(-1, B, -1)
                h, _ = self.backbone(inputs_embeds=x, position_ids=full_pos, checkpoint_layers=checkpoint_layers)
        with timer.stage("head"):
            rows = h.reshape(B * L, -1).index_select(0, batch.score_index)  # (C, H)
            return self.head(rows)

    def predict(self, requests, *, share_prefix: bool = True):
        """Score requests (dohnuts.runtime.requests.Request) → RequestResult / RequestFailure list."""
        from dohnuts.runtime.predict import predict as _predict

        return _predict(self, requests, share_prefix=share_prefix)

    def merge_lora(self) -> int:
        """Fold the LoRA adapters into the frozen base (deployment); returns how many merged."""
        from dohnuts.model.lora import merge_lora

        n = merge_lora(self.backbone)
        self.lora_config = None
        return n

    def prepare_image(self, req, source=None):
        """CPU side of a request's image: decode + patches under the fixed policy.

        Returns (PreparedImage, True, merged token count, grid). Raises RequestError when the
        model has no vision tower, ImageError (a RequestError) for unusable files."""
        from dohnuts.errors import RequestError
        from dohnuts.runtime.images import prepare_image

        if self.visual is None:
            raise RequestError("this model has no vision tower (a text-only checkpoint)", source=source or req.id,
                               field="image")
        img = prepare_image(req.image, self.cfg.vision)
        return img, True, img.token_count, img.grid_thw

    def sequence_positions(self, plan) -> torch.Tensor:
        """(3, T_max) MRoPE positions of the request's longest sequence (all share the image head)."""
        from dohnuts.model.vision import mrope_position_ids

        longest = max(plan.sequences, key=len)
        return mrope_position_ids(torch.tensor(longest), [plan.image_grid], image_token_id=self.cfg.image_token_id,
                                  spatial_merge_size=self.cfg.vision.spatial_merge_size)

    def image_features_for(self, hb, dev, timer=NULL_TIMER) -> torch.Tensor:
        """The request image's merged features through the frozen-feature cache (stage `vision`).

        On a miss the tower encodes the patches the transfer stream already copied (or copies
        them now if the prefetch guessed a hit that has since been evicted)."""
        img = hb.image
        before = self.image_cache.stats()
        with timer.stage("vision"), torch.no_grad():
            dev_patches = dev.pixel_patches

            def encode(patches, grids):
                p = dev_patches if dev_patches is not None else patches.to(self.device, non_blocking=True)
                return self.visual(p.to(self.compute_dtype), grids.to(self.device))

            (feats,) = self.image_cache.features([img], encode)
        after = self.image_cache.stats()
        encoded = after.misses - before.misses
        timer.mark("image", {"encoded_image_patches": [img.patches.shape[0]] * encoded,
                             "cached_images": 1 - encoded, "cache": after.__dict__})
        return feats


def candidate_logits(scores: torch.Tensor, cand_matrix: torch.Tensor) -> torch.Tensor:
    """scores (C,) → (Q, Kmax) with −inf where a question has fewer candidates."""
    safe = cand_matrix.clamp_min(0)
    return scores[safe].masked_fill(cand_matrix < 0, float("-inf"))


def decide(scores: torch.Tensor, cand_matrix: torch.Tensor, temperature: float = 1.0):
    """Per question: probabilities softmax(s / T) (Q, Kmax) and the chosen index (Q,)."""
    logits = candidate_logits(scores, cand_matrix)
    probs = torch.softmax(logits / temperature, dim=-1)
    return probs, logits.argmax(dim=-1)
