"""Helpers that build transformers' Qwen3.5 (the reference implementation) beside dohnuts."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from dohnuts.config import ModelConfig
from dohnuts.hf_config import to_hf_text_config, to_hf_vision_config


def hf_text_model(cfg: ModelConfig, seed: int = 0):
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    torch.manual_seed(seed)
    model = Qwen3_5TextModel(Qwen3_5TextConfig(**to_hf_text_config(cfg.text)))
    # transformers initialises norms at exactly 0/1 and A_log uniformly; perturb every parameter
    # so that parity cannot hide behind a symmetric or zero weight.
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.05 if p.ndim == 1 else 0.01))
    return model.eval()


def hf_full_config(cfg: ModelConfig):
    from transformers import Qwen3_5Config

    return Qwen3_5Config(
        text_config=to_hf_text_config(cfg.text),
        vision_config=to_hf_vision_config(cfg.vision),
        image_token_id=cfg.image_token_id,
        vision_start_token_id=cfg.vision_start_token_id,
        vision_end_token_id=cfg.vision_end_token_id,
    )


def save_text_checkpoint(cfg: ModelConfig, path: Path, seed: int = 0, **save_kwargs):
    model = hf_text_model(cfg, seed)
    model.save_pretrained(path, **save_kwargs)
    return model


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def adapted_tiny(rank: int = 4, seed: int = 0):
    """The tiny preset with LoRA adapters whose B is random (so the adapters change the scores)."""
    import dohnuts.api as api
    from dohnuts.model.lora import LoRAConfig, LoRALinear

    session = api.load("tiny", lora=LoRAConfig(rank=rank))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in session.model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.05)
    return session


@contextmanager
def unshared(session):
    """The session planning without a shared prefix inside the block: the measurement-only
    `UNSHARED` variant (dohnuts.runtime.policy) on the same model, for shared-vs-unshared parity."""
    from dohnuts.runtime.policy import UNSHARED

    saved = session._policy
    session._policy = UNSHARED
    try:
        yield session
    finally:
        session._policy = saved


def scores_of(results) -> torch.Tensor:
    """Every candidate score of prediction results, flat, in order."""
    return torch.tensor([s for r in results for q in r.questions for s in q.scores])


def two_passes(m, x):
    """The reference for the shared pass: the prefix through `TextBackbone.forward` (returning its
    state), then the suffixes from that state, forked — two passes, as a KV cache is used."""
    B, L = x.ids.shape
    P, k = x.prefix_len, x.image_tokens_in_prefix
    emb_p = m.embed(x.prefix_ids, x.image_features[:k] if k else None, 1)
    pos_p = None if x.positions is None else x.positions[:, :, :P]
    _, state = m.backbone(inputs_embeds=emb_p, position_ids=pos_p, return_state=True,
                          next_position=x.prefix_next_position)
    rest = x.image_features[k:] if x.image_features is not None and x.image_tokens else None
    emb_s = m.embed(x.ids, rest, 0)
    pos_s = None if x.positions is None else x.positions[:, :, P:P + L].expand(-1, B, -1)
    h, _ = m.backbone(inputs_embeds=emb_s, position_ids=pos_s, state=state.fork(B), rows=x.score_rows)
    return h
