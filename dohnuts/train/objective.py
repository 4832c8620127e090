"""RLCD: the training objective of the scoring model.

For one question with candidate scores s (K,) and rewards r (K,) — 1 for a correct candidate,
0 otherwise, or graded values — the policy is π = softmax(s) and

    RLCD(s, r) = −Σ_k π_k r_k                                              (1) expected reward
               + λ · mean_{(i, j): r_i > r_j} softplus(m − (s_i − s_j))     (2) decision margin

(1) is the exact expected reward of the policy: candidates are few, so no sampling is needed.
Its gradient, ∂(1)/∂s_k = −π_k (r_k − Σ_j π_j r_j), is the advantage-weighted policy gradient
with the policy's own mean reward as baseline. (2) is a contrastive margin between every
better/worse pair (correct/wrong for 0/1 rewards); it keeps pushing after π has saturated on a
question, where (1)'s gradient vanishes. λ (`margin_weight`) and m (`margin`) are config values.
A batch's loss is the mean over its questions.
"""

from __future__ import annotations

import msgspec
import torch
import torch.nn.functional as F

from dohnuts.schema import Finite, NonNegative


class RLCDConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    margin_weight: NonNegative = 0.5  # λ, finite
    margin: Finite = 1.0  # m


def rlcd_loss(logits: torch.Tensor, rewards: torch.Tensor, cfg: RLCDConfig = RLCDConfig()) -> torch.Tensor:
    """logits (Q, K) with −inf where a question has no candidate; rewards (Q, K) → scalar loss."""
    valid = torch.isfinite(logits)  # (Q, K)
    policy = torch.softmax(logits.float(), dim=-1)  # (Q, K); 0 on padding
    expected = (policy * rewards).sum(-1)  # (Q,)
    loss = -expected
    if cfg.margin_weight:
        s = logits.float().masked_fill(~valid, 0.0)
        diff = s[:, :, None] - s[:, None, :]  # (Q, K, K): s_i − s_j
        pairs = valid[:, :, None] & valid[:, None, :] & (rewards[:, :, None] > rewards[:, None, :])
        hinge = F.softplus(cfg.margin - diff) * pairs
        n_pairs = pairs.sum((-1, -2))
        margin_term = hinge.sum((-1, -2)) / n_pairs.clamp_min(1)
        loss = loss + cfg.margin_weight * margin_term
    return loss.mean()
