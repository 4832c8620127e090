"""The backbone on the GPU in BF16: fused against the FP32 reference, pruned to the scored rows,
packed projections, and the shared pass against the prefix-then-suffix reference."""

from __future__ import annotations

import pytest
import torch

from dohnuts import ops
from dohnuts.ops._dispatch import reference as reference_ops  # private: the parity tooling's switch
from dohnuts.runtime.policy import EAGER
from tests.gpu.helpers import BF16_TOL, DEV, _wide_tiny
from tests.reference import relative_error, two_passes

pytestmark = pytest.mark.gpu


def test_backbone_pruned_to_scored_rows_bf16():
    from dataclasses import replace

    from dohnuts.config import preset
    from dohnuts.model.build import build_text_backbone
    from dohnuts.model.blocks import take_rows

    cfg = preset("qwen3.5-2b")
    cfg = replace(cfg, text=replace(cfg.text, num_hidden_layers=4, layer_types=()))
    model, _ = build_text_backbone(cfg, device=DEV, dtype=torch.bfloat16, seed=0)
    ids = torch.randint(0, 20000, (8, 333), device=DEV)
    rows = torch.randint(0, 333, (8, 4), device=DEV)
    with torch.no_grad():
        want = take_rows(model(ids)[0], rows)
        got, _ = model(ids, rows=rows)
    assert relative_error(got.float(), want.float()) < BF16_TOL


def test_backbone_fused_bf16_matches_reference_fp32():
    """A 4-layer model with Qwen3.5-2b widths: the fused BF16 path is as close to the FP32
    reference as the plain-torch path run in BF16 is (kernels keep the mathematics; only
    rounding may differ), and both are within BF16 drift of it."""
    from dataclasses import replace

    from dohnuts.config import preset
    from dohnuts.model.build import build_text_backbone

    cfg = preset("qwen3.5-2b")
    cfg = replace(cfg, text=replace(cfg.text, num_hidden_layers=4, layer_types=()))
    fused, _ = build_text_backbone(cfg, device=DEV, dtype=torch.bfloat16, seed=0)
    ref32, _ = build_text_backbone(cfg, device=DEV, dtype=torch.float32, seed=0)
    ids = torch.randint(0, 20000, (4, 333), device=DEV)
    with torch.no_grad():
        h_fused, _ = fused(ids)
        with reference_ops():
            h_ref16, _ = fused(ids)  # same BF16 weights, plain-torch ops
            h_ref32, _ = ref32(ids)
    err_fused = relative_error(h_fused.float(), h_ref32)
    err_ref16 = relative_error(h_ref16.float(), h_ref32)
    assert err_fused < 6e-2 and err_ref16 < 6e-2
    assert err_fused < 1.5 * err_ref16, f"fused BF16 {err_fused:.3e} vs plain BF16 {err_ref16:.3e}"


def test_packed_backbone_bf16_keeps_the_mathematics():
    """A 4-layer model at Qwen3.5-2b widths (3 Gated DeltaNet layers, 1 attention layer), BF16 on
    the fused ops: packed projections against the same weights unpacked, for one pass and for a
    batch-1 prefix state forked to 3 suffixes. Both are measured against an FP32 reference run of
    the same weights; the packed run may not be further from it than 1.5× the unpacked run (the
    BF16 gate of test_backbone_fused_bf16_matches_reference_fp32: only rounding may differ)."""
    import copy
    from dataclasses import replace

    from dohnuts.config import preset
    from dohnuts.model.build import build_text_backbone
    from dohnuts.model.packing import fuse_projections, packed_weight

    cfg = preset("qwen3.5-2b")
    cfg = replace(cfg, text=replace(cfg.text, num_hidden_layers=4, layer_types=()))
    plain, _ = build_text_backbone(cfg, device=DEV, dtype=torch.bfloat16, seed=0)
    ref32, _ = build_text_backbone(cfg, device=DEV, dtype=torch.float32, seed=0)
    packed = copy.deepcopy(plain)
    assert fuse_projections(packed) == 8
    with torch.no_grad():
        groups = [tuple(getattr(m, n) for n in names) for m in packed.modules()
                  for names in getattr(m, "packed_projections", ())]
        assert all(packed_weight(*g) is not None for g in groups)
    P = 300  # a prefix length that is not a multiple of fla's chunk (64)
    ids = torch.randint(0, 20000, (3, 333 + P), device=DEV)
    ids[1:, :P] = ids[0, :P]  # every row shares the prefix: what forking assumes

    def passes(model):
        full, _ = model(ids)
        head, state = model(ids[:1, :P], return_state=True)
        tail, _ = model(ids[:, P:], state=state.fork(3))
        return full.float(), torch.cat([head.expand(3, -1, -1), tail], 1).float()

    with torch.no_grad():
        got, want = passes(packed), passes(plain)
        with reference_ops():
            truth = passes(ref32)
    for name, g, w, t in zip(("full", "prefix+suffix"), got, want, truth):
        err_packed, err_plain = relative_error(g, t), relative_error(w, t)
        assert err_packed < 6e-2, f"{name}: packed BF16 {err_packed:.3e} from FP32"
        assert err_packed < 1.5 * err_plain, f"{name}: packed {err_packed:.3e} vs unpacked {err_plain:.3e}"
        assert relative_error(g, w) < 6e-2, name


@pytest.mark.parametrize("pruned", [True, False])
def test_shared_pass_equals_prefix_then_suffix(monkeypatch, pruned):
    """On the GPU in BF16 (fused kernels: the prefix group's mixers take fla's split path, the
    suffixes' the fused one from a forked state), the shared pass equals the prefix pass followed by
    the suffix pass from its forked state, within BF16 rounding of the different GEMM shapes;
    2b-sized linear-attention heads, 6 questions sharing a 300-character prefix."""
    import dataclasses

    import dohnuts.api as api
    from dohnuts.train.task import synthetic_requests

    _wide_tiny(monkeypatch)
    session = api.load("tiny", device=DEV, dtype=torch.bfloat16, _policy=EAGER)
    (req,) = synthetic_requests(1, questions=6, shared_prefix=300, seed=11)
    hb = session.prepare(req)
    assert hb.plan.prefix_len > 0
    x = hb.tensors.to(session.device).score_inputs()
    if not pruned:
        x = dataclasses.replace(x, score_rows=None, score_slot=None)
    m = session.model
    with torch.inference_mode():
        merged = m.shared_hidden(x).float()
        split = two_passes(m, x).float()
    assert merged.shape == split.shape
    assert relative_error(merged, split) < BF16_TOL
