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

# The BF16 gates below are set from the measured distribution of BF16 drift, not from one run:
# `benchmarks/maintainers/bf16_drift.py` on the H200 (2026-12-04,
# `results/h200/2026-12-04-s20-cold-prepare/bf16_drift.json` at commit d37d1f2; the ledger's M33), a
# 4-layer backbone at 2b widths over 8 weight seeds × 4 shapes (B × L: 4 × 333, 8 × 128, 2 × 1000,
# 16 × 64), relative error of the hidden states against FP32:
#   fused BF16 2.85e-2 … 2.93e-2 (median 2.88e-2, n = 32); plain-torch ops in BF16 3.08e-2 … 3.16e-2;
#   fused / plain 0.915 … 0.934;
#   packed projections (8 seeds × the full and the prefix-then-suffix pass, n = 16): 2.83e-2 … 2.92e-2
#   against FP32, exactly the unpacked run's (packed / unpacked 1.000, their difference 0.0).
# These replace an absolute gate that had been widened to twice its first value after one run
# measured just above it (commit 41255c7). Never widen them to get green: measure the distribution.
BF16_DRIFT = 3.5e-2  # above every run's drift against FP32 (max 3.16e-2, the plain ops)
ONLY_ROUNDING = 1.05  # fused (or packed) within this factor of the plain BF16 run (max 0.934; packed 1.000)
PACKING_IS_EXACT = 1e-3  # packed against unpacked, both fused BF16 (measured 0.0 in 16 of 16)


def test_backbone_pruned_to_scored_rows_bf16():
    from msgspec.structs import replace

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
    from msgspec.structs import replace

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
    assert err_fused < BF16_DRIFT and err_ref16 < BF16_DRIFT, (err_fused, err_ref16)
    assert err_fused < ONLY_ROUNDING * err_ref16, f"fused BF16 {err_fused:.3e} vs plain BF16 {err_ref16:.3e}"


def test_packed_backbone_bf16_keeps_the_mathematics():
    """A 4-layer model at Qwen3.5-2b widths (3 Gated DeltaNet layers, 1 attention layer), BF16 on
    the fused ops: packed projections against the same weights unpacked, for one pass and for a
    batch-1 prefix state forked to 3 suffixes. Both are measured against an FP32 reference run of
    the same weights; the packed run may not be further from it than the unpacked run by more than
    the gates above allow (only rounding may differ; measured: not at all)."""
    import copy
    from msgspec.structs import replace

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
        assert err_packed < BF16_DRIFT, f"{name}: packed BF16 {err_packed:.3e} from FP32"
        assert err_packed < ONLY_ROUNDING * err_plain, f"{name}: packed {err_packed:.3e} vs unpacked {err_plain:.3e}"
        assert relative_error(g, w) < PACKING_IS_EXACT, name


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
