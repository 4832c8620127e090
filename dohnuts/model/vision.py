"""The vision tower: ViT blocks over flattened pixel patches, merged 2×2 into the text width.

Parameter names equal transformers' `Qwen3_5VisionModel`, so a checkpoint's `model.visual.*`
tensors (prefix stripped by dohnuts.model.checkpoint) load as they are.

Layout of the input: `patches` (N, C·Tp·P·P) is every image's patches concatenated, each image
in *spatial-merge-block order* — the m×m patches that merge into one text token are adjacent
(Qwen2-VL's image processor emits this order; dohnuts.runtime.images does the same). So the
merger is a plain view of m² consecutive rows, and the merged output is in image order, ready
to be spliced at the image-token positions of the text (`splice_image_features`).

Also here: the (3, T) multimodal RoPE positions of a token sequence with images, matching
transformers' `Qwen3_5Model.get_rope_index`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dohnuts.config import VisionConfig
from dohnuts.model.blocks import Embedding
from dohnuts.model.checkpoint import allocate, assign_weights, init_weights
from dohnuts.ops import add_layer_norm, block_diagonal_attention, linear_gelu_tanh, rotary_qk

# One function for each activation VisionConfig accepts (dohnuts.config.VisionActivation).
_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def image_token_count(grid_thw: tuple[int, int, int] | torch.Tensor, spatial_merge_size: int) -> int:
    """Number of merged tokens (text positions) one image of patch grid (t, h, w) occupies."""
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (spatial_merge_size * spatial_merge_size)


def _check_grids(grid_thw: torch.Tensor, cfg: VisionConfig) -> list[tuple[int, int, int]]:
    if grid_thw.ndim != 2 or grid_thw.shape[1] != 3:
        raise ValueError(f"grid_thw must be (n_images, 3), got {tuple(grid_thw.shape)}")
    grids = [tuple(int(x) for x in g) for g in grid_thw.tolist()]
    m = cfg.spatial_merge_size
    for t, h, w in grids:
        if t <= 0 or h <= 0 or w <= 0 or h % m or w % m:
            raise ValueError(f"grid (t={t}, h={h}, w={w}) must be positive with h and w multiples of {m}")
    return grids


class VisionPatchEmbed(nn.Module):
    """Pixels of one patch → one embedding. HF applies a Conv3d whose kernel equals its stride,
    which is exactly a matrix product with the flattened kernel; we keep the Conv3d-shaped
    parameter (so checkpoints load) and compute the matmul."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # Conv3d weight (D, C, Tp, P, P) flattens in the same (C, Tp, P, P) order as a patch row.
        w = self.proj.weight.flatten(1)  # (D, C·Tp·P·P)
        return F.linear(patches.to(w.dtype), w, self.proj.bias)  # (N, D)


class VisionAttention(nn.Module):
    """Multi-head self-attention with 2D rotary embedding, one block per image frame."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], seqlens: list[int]) -> torch.Tensor:
        N, _ = x.shape
        qkv = self.qkv(x).view(N, 3, self.num_heads, -1)  # (N, 3, H, Dh)
        q, k = rotary_qk(qkv, *rope)  # (N, H, Dh) each, rotated in FP32 (rope: cos, sin (N, 1, Dh))
        o = block_diagonal_attention(q, k, qkv[:, 2], seqlens)  # (N, H, Dh)
        return self.proj(o.reshape(N, -1))  # (N, D)


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.tanh = cfg.hidden_act == "gelu_pytorch_tanh"  # its GELU in the first GEMM's epilogue
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1 = self.linear_fc1
        h = linear_gelu_tanh(x, fc1.weight, fc1.bias) if self.tanh else self.act(fc1(x))
        return self.linear_fc2(h)


def _add_norm(x: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x): the residual update and the LayerNorm after it, one op."""
    return add_layer_norm(x, residual, norm.weight, norm.bias, norm.eps)


class VisionBlock(nn.Module):
    """Pre-LayerNorm transformer block (non-causal): x += attn(norm1(x)); x += mlp(norm2(x)).

    The residual stream's adds are fused into the LayerNorm that follows each (`add_layer_norm`),
    so a block takes its input already normalised (`h` = norm1(x)) and hands on the next norm's
    output with the stream: the tower passes it the next block's norm1 (the merger's norm after
    the last)."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, h: torch.Tensor, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], seqlens: list[int],
                next_norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """h = norm1(x), x the stream (N, D) → (next_norm(x'), x'), x' the block's output."""
        h, x = _add_norm(self.attn(h, rope, seqlens), x, self.norm2)
        return _add_norm(self.mlp(h), x, next_norm)


class VisionPatchMerger(nn.Module):
    """LayerNorm each patch, concatenate each m×m block (adjacent rows), MLP to the text width."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.merged = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged, bias=True)
        self.linear_fc2 = nn.Linear(self.merged, cfg.out_hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(self.norm(x))

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """The merge and its MLP of already normalised patches h (N, D) → (N / m², out_hidden)."""
        h = h.view(-1, self.merged)  # (N, D) → (N / m², m²·D)
        # The merger uses the exact (erf) GELU, unlike the blocks' tanh approximation.
        return self.linear_fc2(F.gelu(self.linear_fc1(h)))


def _bilinear_weights(n_out: int, n_in: int, device: torch.device) -> torch.Tensor:
    """(n_out, n_in) FP32 weights of 1-D linear interpolation with align_corners=True: output i
    sits at i·(n_in − 1)/(n_out − 1) and takes its two neighbours' values by distance (as
    F.interpolate computes its source index and lambdas)."""
    scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    src = torch.arange(n_out, dtype=torch.float32, device=device) * scale
    lo = src.floor().long().clamp(max=n_in - 1)
    hi = (lo + 1).clamp(max=n_in - 1)
    frac = src - lo.float()
    weights = torch.zeros(n_out, n_in, dtype=torch.float32, device=device)
    weights.scatter_add_(1, lo[:, None], (1 - frac)[:, None])
    weights.scatter_add_(1, hi[:, None], frac[:, None])
    return weights


class GridInputs(NamedTuple):
    """The tower's inputs that depend on the grids alone (`VisionTower.grid_inputs`)."""

    positions: torch.Tensor  # (N, D), the learned table resampled to each grid, in the weights' dtype
    cos: torch.Tensor  # (N, 1, Dh) FP32, the 2D rotary
    sin: torch.Tensor


class VisionTower(nn.Module):
    """patches (N, C·Tp·P·P) + grid_thw (n_images, 3) → merged features (N / m², out_hidden_size)."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = VisionPatchEmbed(cfg)
        self.pos_embed = Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = VisionPatchMerger(cfg)

    def _to_merge_order(self, x: torch.Tensor, t: int) -> torch.Tensor:
        """(h, w, ...) raster grid → (t·h·w, ...) in spatial-merge-block order, repeated per frame."""
        m = self.cfg.spatial_merge_size
        h, w = x.shape[:2]
        rest = x.shape[2:]
        x = x.reshape(h // m, m, w // m, m, *rest).transpose(1, 2)  # (h/m, w/m, m, m, ...)
        return x.reshape(h * w, *rest).repeat(t, *([1] * len(rest)))  # (t·h·w, ...)

    def position_embeddings(self, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """The learned square table resampled to each grid: bilinear, align_corners=True (as HF's
        F.interpolate), written as two small matrix products with the interpolation weights —
        torch's bilinear kernel on a (1, D, side, side) table runs one thread per output pixel
        over all D channels, much the slower (docs/history/evolution.md M35)."""
        side = int(round(self.cfg.num_position_embeddings ** 0.5))
        table = self.pos_embed.weight.view(side, side, -1).float()  # (side, side, D)
        out = []
        for t, h, w in grids:
            rows, cols = (_bilinear_weights(n, side, table.device) for n in (h, w))  # (h, side), (w, side)
            grid = torch.einsum("hi,ijd->hjd", rows, table)  # (h, side, D)
            grid = torch.einsum("wj,hjd->hwd", cols, grid)  # (h, w, D)
            out.append(self._to_merge_order(grid, t))  # (t·h·w, D)
        return torch.cat(out).to(self.pos_embed.weight.dtype)  # (N, D)

    def rotary(self, grids: list[tuple[int, int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """2D axial RoPE: the first half of each head's rotary frequencies follow the patch row,
        the second half its column. Returns cos, sin (N, 1, Dh) in FP32."""
        dh = self.cfg.head_dim
        half = dh // 2
        inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32, device=device) / half))
        rows_cols = []
        for t, h, w in grids:
            hw = torch.stack(torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device),
                                            indexing="ij"), dim=-1)  # (h, w, 2)
            rows_cols.append(self._to_merge_order(hw, t))  # (t·h·w, 2)
        pos = torch.cat(rows_cols).float()  # (N, 2)
        freqs = (pos[:, :, None] * inv_freq).flatten(1)  # (N, 2·Dh/4) = [row freqs | col freqs]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (N, 1, Dh)
        return emb.cos(), emb.sin()

    def grid_inputs(self, grid_thw: torch.Tensor) -> GridInputs:
        """What the tower's input depends on only through the grids (not the pixels): the position
        embeddings (N, D) in the weights' dtype and the rotary's cos, sin (N, 1, Dh) in FP32. A
        CUDA graph of one resolution computes them once, before its capture, and its replays read
        them (dohnuts.runtime.graphs) instead of running their small kernels every call."""
        grids = _check_grids(grid_thw, self.cfg)
        return GridInputs(self.position_embeddings(grids), *self.rotary(grids, self.pos_embed.weight.device))

    def forward(self, patches: torch.Tensor, grid_thw: torch.Tensor,
                grid_inputs: GridInputs | None = None) -> torch.Tensor:
        """patches (N, C·Tp·P·P) in the weights' dtype → merged features; `grid_inputs` are
        `self.grid_inputs(grid_thw)` (computed here when not given)."""
        cfg = self.cfg
        grids = _check_grids(grid_thw, cfg)
        n_patches = sum(t * h * w for t, h, w in grids)
        row = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
        if tuple(patches.shape) != (n_patches, row):
            raise ValueError(f"patches must be ({n_patches}, {row}) for grids {grids}, got {tuple(patches.shape)}")
        pos, cos, sin = grid_inputs if grid_inputs is not None else self.grid_inputs(grid_thw)
        x = self.patch_embed(patches)  # (N, D)
        # One attention block per frame: images (and frames) never attend to each other.
        seqlens = [h * w for t, h, w in grids for _ in range(t)]
        norms = [*(b.norm1 for b in self.blocks), self.merger.norm]
        h, x = _add_norm(pos.to(x.dtype), x, norms[0])  # x += positions; h = the first norm's output
        for block, next_norm in zip(self.blocks, norms[1:]):
            h, x = block(h, x, (cos, sin), seqlens, next_norm)
        return self.merger.project(h)  # (N / m², out_hidden)


# --------------------------------------------------------------------------------------------
# Text side: where the merged features go and which positions they take.


def splice_image_features(inputs_embeds: torch.Tensor, input_ids: torch.Tensor, features: torch.Tensor,
                          image_token_id: int) -> torch.Tensor:
    """Replace the embeddings at image-token positions by the merged image features, in order.

    inputs_embeds (B, T, H), input_ids (B, T), features (n_image_tokens, H) → (B, T, H). Image
    tokens are filled row-major (sequence 0 first), as transformers' masked_scatter does, so
    `features` is the tower output of the images in the order they appear in the batch.
    """
    mask = input_ids == image_token_id  # (B, T)
    n = int(mask.sum())
    if n != features.shape[0]:
        raise ValueError(f"{n} image tokens in the input but {features.shape[0]} image feature rows")
    return inputs_embeds.masked_scatter(mask[..., None], features.to(inputs_embeds.dtype))


def mrope_position_ids(input_ids: torch.Tensor, image_grid_thw: torch.Tensor | list, *, image_token_id: int,
                       spatial_merge_size: int) -> torch.Tensor:
    """(3, T) long multimodal RoPE positions of one sequence, as transformers' get_rope_index.

    Text tokens count on one shared position p on all three axes. An image of grid (t, h, w)
    starting at position p takes, for merged token (ti, hi, wi), the positions (p + ti, p + hi,
    p + wi); the text after it resumes at p + max(h, w) / m (HF advances by the larger spatial
    side, not by t — for t = 1 that equals the image's largest position + 1). Each grid in
    `image_grid_thw` consumes the next image_token_count(grid) image tokens.
    """
    if input_ids.ndim != 1:
        raise ValueError(f"input_ids must be one sequence (T,), got {tuple(input_ids.shape)}")
    m = spatial_merge_size
    is_image = (input_ids == image_token_id).tolist()
    T = len(is_image)
    grids = [tuple(int(x) for x in g) for g in (image_grid_thw.tolist() if torch.is_tensor(image_grid_thw)
                                                  else image_grid_thw)]
    chunks = []
    pos, i, g = 0, 0, 0
    while i < T:
        if not is_image[i]:
            j = i
            while j < T and not is_image[j]:
                j += 1
            chunks.append(torch.arange(pos, pos + j - i).expand(3, -1))  # (3, text_len)
            pos += j - i
            i = j
            continue
        if g == len(grids):
            raise ValueError(f"image token at index {i} but only {len(grids)} image grids were given")
        t, h, w = grids[g]
        n = image_token_count((t, h, w), m)
        if i + n > T or not all(is_image[i:i + n]):
            raise ValueError(f"image {g} (grid {t}×{h}×{w}) needs {n} consecutive image tokens at index {i}")
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h // m), torch.arange(w // m), indexing="ij")
        chunks.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)  # (3, t·h/m·w/m)
        pos += max(h, w) // m
        i, g = i + n, g + 1
    if g != len(grids):
        raise ValueError(f"{len(grids)} image grids given but the sequence holds {g} images")
    return torch.cat(chunks, dim=1) if chunks else torch.zeros(3, 0, dtype=torch.long)


def build_vision_tower(cfg: VisionConfig, *, tensors=None, seed: int = 0, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32, source: str = "<vision tower>") -> VisionTower:
    """The tower with a checkpoint's vision tensors (`Tensors`, prefix stripped) or seeded random weights."""
    with torch.device("meta"):
        tower = VisionTower(cfg)
    if tensors is not None:
        assign_weights(tower, tensors, source=source, what="vision")
    else:
        tower = tower.to(dtype=dtype)
        allocate(tower, device)
        init_weights(tower, seed)
    return tower.to(device=device, dtype=dtype)
