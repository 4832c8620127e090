"""The vision tower and image positions equal transformers' Qwen3.5 on the same weights (CPU, FP32)."""

from __future__ import annotations

import typing

import pytest
import torch
import torch.nn.functional as F

from dohnuts.config import VisionActivation, preset
from dohnuts.model.checkpoint import Tensors, assign_weights
from dohnuts.model.text import TextBackbone
from dohnuts.model.vision import (
    VisionTower,
    build_vision_tower,
    image_token_count,
    mrope_position_ids,
    splice_image_features,
)
from dohnuts.ops import block_diagonal_attention
from tests.reference import hf_full_config, relative_error

CFG = preset("tiny")
M = CFG.vision.spatial_merge_size
ROW = 3 * CFG.vision.temporal_patch_size * CFG.vision.patch_size ** 2


def _perturbed(model):
    # transformers initialises LayerNorms at exactly 1/0: perturb everything so parity cannot hide
    # behind a symmetric or zero weight.
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.05 if p.ndim == 1 else 0.02))
    return model.eval()


def _tensors(state_dict) -> Tensors:
    t = Tensors()
    for k, v in state_dict.items():
        t.put(k, v, "hf")
    return t


@pytest.fixture(scope="module")
def hf_vision():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    torch.manual_seed(0)
    return _perturbed(Qwen3_5VisionModel(hf_full_config(CFG).vision_config))


@pytest.fixture(scope="module")
def hf_full():
    from transformers import Qwen3_5Model

    torch.manual_seed(0)
    return _perturbed(Qwen3_5Model(hf_full_config(CFG)))


def _patches(grids: list[list[int]], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.tensor(grids, dtype=torch.long)
    return torch.randn(int(g.prod(-1).sum()), ROW, generator=torch.Generator().manual_seed(seed)), g


@pytest.mark.parametrize("grids", [
    [[1, 4, 6], [1, 12, 10]],  # two sizes: one below, one above the 8×8 learned position grid
    [[1, 6, 4], [1, 4, 6], [2, 4, 4], [1, 6, 4]],  # equal-length segments batched, and a 2-frame grid
])
def test_tower_matches_transformers(hf_vision, grids):
    tower = build_vision_tower(CFG.vision, tensors=_tensors(hf_vision.state_dict())).eval()
    x, g = _patches(grids)
    with torch.no_grad():
        ours = tower(x, g)
        theirs = hf_vision(x, grid_thw=g).pooler_output
    assert ours.shape == (x.shape[0] // M ** 2, CFG.vision.out_hidden_size)
    # FP32 lands near 1e-6; 1e-5 (tighter than the 1e-4 bar) also catches a tanh-approximated merger
    # GELU, which would pass at 1e-4 (it measures ≈ 9e-5 here).
    err = relative_error(ours, theirs)
    assert err < 1e-5, f"relative error {err:.2e}"


def test_images_in_one_call_do_not_interact(hf_vision):
    """Each image's features equal those of the image encoded alone (block-diagonal attention)."""
    tower = build_vision_tower(CFG.vision, tensors=_tensors(hf_vision.state_dict())).eval()
    grids = [[1, 4, 6], [1, 8, 8], [1, 4, 6]]
    x, g = _patches(grids, seed=2)
    with torch.no_grad():
        together = tower(x, g).split([image_token_count(r, M) for r in grids])
        rows = torch.tensor([t * h * w for t, h, w in grids]).cumsum(0).tolist()
        for i, (start, end) in enumerate(zip([0] + rows[:-1], rows)):
            alone = tower(x[start:end], g[i:i + 1])
            assert relative_error(together[i], alone) < 1e-5
        # Same-sized images 0 and 2 with different pixels must give different features.
        assert relative_error(together[0], together[2]) > 1e-2


@pytest.mark.parametrize("name", typing.get_args(VisionActivation))
def test_each_activation_the_config_accepts_is_transformers(name):
    """VisionConfig's `hidden_act` declares what the tower runs; each is transformers' function."""
    from transformers.activations import ACT2FN

    from dohnuts.model.vision import _ACTIVATIONS

    x = torch.linspace(-6, 6, 101)
    assert torch.equal(_ACTIVATIONS[name](x), ACT2FN[name](x))


@pytest.mark.parametrize("seqlens", [[5, 9, 5, 3], [6, 6, 6]])  # grouped by length; all equal (plain view)
def test_block_diagonal_attention_equals_masked_dense(seqlens):
    torch.manual_seed(0)
    q, k, v = (torch.randn(sum(seqlens), 2, 8) for _ in range(3))
    seg = torch.repeat_interleave(torch.arange(len(seqlens)), torch.tensor(seqlens))
    mask = seg[:, None] == seg[None, :]  # (N, N) block diagonal
    dense = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                           attn_mask=mask).transpose(0, 1)
    ours = block_diagonal_attention(q, k, v, seqlens)
    assert relative_error(ours, dense) < 1e-6
    unmasked = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
    assert relative_error(ours, unmasked) > 1e-2


def test_parameter_names_are_transformers_names(hf_vision):
    with torch.device("meta"):
        tower = VisionTower(CFG.vision)
    assert set(tower.state_dict()) == set(hf_vision.state_dict())
    random = build_vision_tower(CFG.vision, seed=0)
    assert torch.equal(random.blocks[0].norm1.weight, torch.ones(CFG.vision.hidden_size))
    assert torch.equal(random.merger.norm.bias, torch.zeros(CFG.vision.hidden_size))
    x, g = _patches([[1, 4, 4]])
    with torch.no_grad():
        assert torch.isfinite(random(x, g)).all()


def _image_span(n: int) -> list[int]:
    return [CFG.vision_start_token_id] + [CFG.image_token_id] * n + [CFG.vision_end_token_id]


def _sequence(parts: list, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for p in parts:
        out += torch.randint(0, 256, (p,), generator=gen).tolist() if isinstance(p, int) else p
    return out


def test_positions_match_get_rope_index(hf_full):
    grids = torch.tensor([[1, 4, 6], [1, 8, 4], [2, 4, 4], [1, 2, 2]])
    spans = [_image_span(image_token_count(g, M)) for g in grids.tolist()]
    ids = torch.tensor([_sequence([3, spans[0], 5, spans[1], spans[2], 4, spans[3], 2], seed=0)])
    mm = (ids == CFG.image_token_id).int()
    theirs, _ = hf_full.get_rope_index(ids, mm, grids)
    ours = mrope_position_ids(ids[0], grids, image_token_id=CFG.image_token_id, spatial_merge_size=M)
    assert torch.equal(ours, theirs[:, 0])
    # Not plain text positions: images really use grid coordinates.
    assert not torch.equal(ours, torch.arange(ids.shape[1]).expand(3, -1))


def test_positions_reject_mismatched_grids():
    ids = torch.tensor(_sequence([2, _image_span(6), 2], seed=0))
    with pytest.raises(ValueError, match="needs 24 consecutive"):
        mrope_position_ids(ids, [[1, 8, 12]], image_token_id=CFG.image_token_id, spatial_merge_size=M)
    with pytest.raises(ValueError, match="2 image grids given"):
        mrope_position_ids(ids, [[1, 4, 6], [1, 4, 6]], image_token_id=CFG.image_token_id, spatial_merge_size=M)
    with pytest.raises(ValueError, match="image feature rows"):
        splice_image_features(torch.zeros(1, len(ids), 64), ids[None], torch.zeros(5, 64), CFG.image_token_id)


def test_image_and_text_match_transformers(hf_full):
    """HF Qwen3_5Model on ids + pixel_values equals our tower → splice → positions → backbone."""
    tower = build_vision_tower(CFG.vision, tensors=_tensors(hf_full.visual.state_dict())).eval()
    with torch.device("meta"):
        text = TextBackbone(CFG.text)
    assign_weights(text, _tensors(hf_full.language_model.state_dict()), source="hf", what="text")
    text.eval()

    grids = [[1, 4, 6], [1, 6, 4], [1, 8, 8]]  # images 0, 1 in sequence 0; image 2 in sequence 1
    n = [image_token_count(g, M) for g in grids]
    s0 = _sequence([5, _image_span(n[0]), 7, _image_span(n[1]), 3], seed=3)
    s1 = _sequence([4, _image_span(n[2]), len(s0) - 4 - n[2] - 2], seed=4)
    ids = torch.tensor([s0, s1])
    x, g = _patches(grids, seed=5)
    with torch.no_grad():
        theirs = hf_full(input_ids=ids, pixel_values=x, image_grid_thw=g,
                         mm_token_type_ids=(ids == CFG.image_token_id).int()).last_hidden_state
        embeds = splice_image_features(text.embed_tokens(ids), ids, tower(x, g), CFG.image_token_id)
        pos = torch.stack([
            mrope_position_ids(ids[0], g[:2], image_token_id=CFG.image_token_id, spatial_merge_size=M),
            mrope_position_ids(ids[1], g[2:], image_token_id=CFG.image_token_id, spatial_merge_size=M),
        ], dim=1)  # (3, B, T)
        ours, _ = text(inputs_embeds=embeds, position_ids=pos)
        text_only_positions, _ = text(inputs_embeds=embeds)
    err = relative_error(ours, theirs)
    assert err < 1e-4, f"relative error {err:.2e}"
    assert relative_error(text_only_positions, theirs) > 1e-4  # the image positions matter
