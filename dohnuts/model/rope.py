"""Rotary position embeddings of the text backbone (Qwen3.5's interleaved multimodal RoPE).

Positions are (3, B, T): temporal, height and width indices. For text all three are the token
index; image tokens get their grid coordinates (see dohnuts.model.vision). `rotary_dim` =
int(head_dim × partial_rotary_factor) gives (rotary_dim + 1) // 2 frequencies, and the first
twice that many channels of each head rotate. Frequency j takes its angle from axis T, H or W in
an interleaved pattern: j % 3 == 1 → H (for j < 3·mrope_section[1]), j % 3 == 2 → W (for
j < 3·mrope_section[2]), otherwise T — exactly transformers' `Qwen3_5TextRotaryEmbedding`
(`recomposition_frequencies`), which slices `offset : 3·section : 3` over the frequencies: a
section longer than the frequencies is cut, a shorter one leaves the rest on T, mrope_section[0]
and entries past [2] are never read, and the sections need not sum to anything.
"""

from __future__ import annotations

import torch

from dohnuts.config import TextConfig
from dohnuts.ops.rope import apply_rotary  # noqa: F401  (the rotation itself lives with the ops)


def inverse_frequencies(cfg: TextConfig, device: torch.device | None = None) -> torch.Tensor:
    dim = cfg.rotary_dim
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def axis_of_frequency(cfg: TextConfig) -> torch.Tensor:
    """((rotary_dim + 1) // 2,) long: which position axis (0=T, 1=H, 2=W) drives each frequency.

    The same slices as transformers' `recomposition_frequencies` (H at `1 : 3·s[1] : 3`, W at
    `2 : 3·s[2] : 3`, Python slice rules: stops past the end are cut, negative stops count from
    the end), over the same number of frequencies as `inverse_frequencies`."""
    n = len(range(0, cfg.rotary_dim, 2))  # = inverse_frequencies(cfg).numel()
    axis = torch.zeros(n, dtype=torch.long)
    for a, offset in ((1, 1), (2, 2)):
        axis[slice(offset, cfg.mrope_section[a] * 3, 3)] = a
    return axis


def rotary_tables(cfg: TextConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inverse frequencies (F,) FP32, axis of each frequency (F,) long), both on `device`.

    Building them copies the axis table from the host; a backbone builds them once per device
    (TextBackbone caches them), so a pass copies nothing from the host and can be captured."""
    return inverse_frequencies(cfg, device), axis_of_frequency(cfg).to(device)


def rotary_cos_sin(cfg: TextConfig, position_ids: torch.Tensor, dtype: torch.dtype,
                   tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids (3, B, T) → cos, sin (B, T, 2 × frequencies), computed in FP32 then cast.

    `tables`: `rotary_tables(cfg, position_ids.device)`, built now when not given."""
    inv, axis = tables if tables is not None else rotary_tables(cfg, position_ids.device)  # (F,), (F,)
    pos = position_ids.float()  # (3, B, T)
    # Select, per frequency, the position of its axis: (B, T, F).
    pos_f = pos.permute(1, 2, 0)[..., axis]
    freqs = pos_f * inv
    emb = torch.cat([freqs, freqs], dim=-1)  # (B, T, rotary_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def text_positions(batch: int, length: int, start: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """(3, B, T) positions of plain text: every axis counts tokens from `start`."""
    return torch.arange(start, start + length, device=device).view(1, 1, -1).expand(3, batch, -1)
