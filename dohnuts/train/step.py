"""One optimizer update = 4 microbatches at one parameter snapshot.

The optimizer sees the average of the 4 microbatch losses (each the mean over its questions):
gradients of all 4 accumulate, the global gradient norm is clipped once, and AdamW steps once.
Only LoRA adapters and the scalar head train (FP32 master weights); on the GPU the forward runs
under BF16 autocast over the BF16 frozen base.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from dohnuts.model.scorer import candidate_logits
from dohnuts.runtime.batch import Batch
from dohnuts.runtime.timing import NULL_TIMER
from dohnuts.train.objective import RLCDConfig, rlcd_loss

MICROBATCHES = 4


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    checkpoint_layers: bool = False  # activation checkpointing (recompute each layer in backward)


def make_optimizer(model, cfg: OptimConfig) -> torch.optim.AdamW:
    params = model.trainable_parameters()
    if not params:
        raise ValueError("the model has no trainable parameters (load it with lora=LoRAConfig(...))")
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def microbatch_loss(model, batch: Batch, objective: RLCDConfig, *, image_features=None, timer=NULL_TIMER,
                    checkpoint_layers: bool = False) -> torch.Tensor:
    if batch.rewards is None:
        raise ValueError("a training batch needs rewards")
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if model.device.type == "cuda" else nullcontext())
    with autocast:
        scores = model.score(batch, image_features=image_features, timer=timer, checkpoint_layers=checkpoint_layers)
    return rlcd_loss(candidate_logits(scores, batch.cand_matrix), batch.rewards, objective)


@dataclass(frozen=True)
class UpdateResult:
    loss: float
    grad_norm: float  # before clipping


def optimizer_update(model, optimizer, microbatches: list, objective: RLCDConfig, cfg: OptimConfig,
                     timer=NULL_TIMER, features_for=None) -> UpdateResult:
    """Average the microbatch losses, clip once, step once. `microbatches` are device `Batch`es."""
    if len(microbatches) != MICROBATCHES:
        raise ValueError(f"an update takes exactly {MICROBATCHES} microbatches, got {len(microbatches)}")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=model.device)
    for i, mb in enumerate(microbatches):
        feats = features_for(i) if features_for is not None else None
        with timer.stage("forward"):
            loss = microbatch_loss(model, mb, objective, image_features=feats,
                                   checkpoint_layers=cfg.checkpoint_layers) / len(microbatches)
        with timer.stage("backward"):
            loss.backward()
        total += loss.detach()
    with timer.stage("optimizer"):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
    model.eval()
    return UpdateResult(loss=float(total), grad_norm=float(norm))
