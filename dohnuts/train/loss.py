"""A microbatch's loss: the pure model's pass over one request's batch, scored by RLCD
(dohnuts.train.objective). The training step (dohnuts.train.step) and its CUDA graphs
(dohnuts.train.graphs) run this one function."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from dohnuts.model.scorer import candidate_logits
from dohnuts.runtime.batch import Batch
from dohnuts.train.objective import RLCDConfig, rlcd_loss


def microbatch_loss(model, batch: Batch, objective: RLCDConfig, *, image_features: torch.Tensor | None = None,
                    autocast_cache: bool = True) -> torch.Tensor:
    """RLCD loss (mean over the microbatch's questions) of the pure model on one request's batch
    (on the model's device) with its image's features: the pass prediction runs (`choose_pass`),
    with every layer recomputed in the backward pass (the execution policy's activation
    checkpointing). `autocast_cache=False` inside CUDA graph capture (the cache would hold tensors
    made outside the graph)."""
    if batch.rewards is None:
        raise ValueError("a training batch needs rewards")
    cuda = model.device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=autocast_cache) if cuda else nullcontext()
    with autocast:
        scores = model(batch.score_inputs(image_features), recompute=True)
    return rlcd_loss(candidate_logits(scores, batch.cand_matrix), batch.rewards, objective)
