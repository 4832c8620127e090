"""The text backbone equals transformers' Qwen3_5TextModel on the same weights (CPU, FP32)."""

from __future__ import annotations

import pytest
import torch

from dohnuts.config import preset
from dohnuts.model.build import build_text_backbone, resolve_source
from tests.reference import relative_error, save_text_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_tiny")
    ref = save_text_checkpoint(preset("tiny"), path)
    return path, ref


@pytest.mark.parametrize("lengths", [(37, 37, 37), (70, 45, 129)])
def test_hidden_states_match_transformers(checkpoint, lengths):
    path, ref = checkpoint
    cfg, ckpt = resolve_source(str(path))
    model, _ = build_text_backbone(cfg, checkpoint_dir=ckpt)
    model.eval()
    torch.manual_seed(1)
    T = max(lengths)
    ids = torch.randint(0, 256, (len(lengths), T))
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    with torch.no_grad():
        ours, _ = model(ids)
        theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    for i, n in enumerate(lengths):  # right padding: real positions must match exactly
        err = relative_error(ours[i, :n], theirs[i, :n])
        assert err < 1e-4, f"sequence {i} (length {n}): relative error {err:.2e}"


def test_multimodal_rotary_positions_match_transformers(checkpoint):
    """Distinct T/H/W position axes (as image tokens have) rotate like transformers' interleaved MRoPE."""
    path, ref = checkpoint
    cfg, ckpt = resolve_source(str(path))
    model, _ = build_text_backbone(cfg, checkpoint_dir=ckpt)
    T = 90
    ids = torch.randint(0, 256, (2, T))
    t = torch.arange(T)
    pos = torch.stack([t, (t * 2) % 37, (t * 3) % 41]).view(3, 1, T).expand(3, 2, T)
    with torch.no_grad():
        ours, _ = model(ids, position_ids=pos)
        theirs = ref(input_ids=ids, position_ids=pos).last_hidden_state
        plain, _ = model(ids)
    assert relative_error(ours, theirs) < 1e-4
    assert relative_error(ours, plain) > 1e-3  # the axes really changed something


def test_state_continuation_equals_one_pass():
    """prefix pass → state → suffix pass gives the hidden states of one pass over everything."""
    cfg = preset("tiny")
    model, _ = build_text_backbone(cfg, seed=3)
    ids = torch.randint(0, 256, (2, 150))
    with torch.no_grad():
        full, _ = model(ids)
        head, state = model(ids[:, :83], return_state=True)
        tail, _ = model(ids[:, 83:], state=state)
    assert state.length == 83 and state.next_position == 83
    assert relative_error(torch.cat([head, tail], 1), full) < 1e-5
