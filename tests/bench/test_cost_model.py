"""The analytic cost model against torch's FLOP counter, hand counts and the counting rules.

FLOP-counter agreement: FlopCounterMode runs the backbone's plain-torch reference path. It sees
every matmul/conv but not the triangular solve, and the reference attention multiplies the
dense (masked) score rectangle where the cost model counts causal pairs. So the comparison is
made per part, apples to apples: nn.Linear matmuls vs `linear`, the delta rule's batched
matmuls vs `scan_matmul`, the attention's vs `attention_matmul` over dense pairs, conv vs
`conv`, and the counter's total vs their sum. The 2b preset is counted on the meta device:
FLOP counts depend on shapes only, and meta tensors carry shapes without storage, so the whole
24-layer model runs at real widths in about a second without allocating 8 GB of FP32 weights.
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dohnuts.bench.analysis.cost import stage_costs, token_counts
from dohnuts.bench.analysis.flops import (
    SCAN_CHUNK, LoraShape, attention_pairs, last_layer_query_linears, text_linears, text_pair_flops,
    text_token_flops,
)
from dohnuts.config import preset
from dohnuts.model.build import build_text_backbone
from dohnuts.model.state import BackboneState, KVState, LinearAttentionState
from dohnuts.model.text import TextBackbone
from dohnuts.runtime.work import WorkCounts


def test_scan_chunk_is_the_kernels_chunk():
    from dohnuts.ops.delta_rule import CHUNK

    assert SCAN_CHUNK == CHUNK


def _backbone(name: str):
    cfg = preset(name)
    if name == "tiny":
        model, _ = build_text_backbone(cfg, device="cpu")
        return cfg, model, "cpu"
    with torch.device("meta"):
        model = TextBackbone(cfg.text)
    return cfg, model, "meta"


def _count(fn) -> dict[str, float]:
    """Run fn under FlopCounterMode; FLOPs split by where they happen."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn()
    parts = {"linear": 0, "scan_matmul": 0, "attention_matmul": 0, "conv": 0}
    for module, ops in counter.get_flop_counts().items():
        leaf = module.rsplit(".", 1)[-1]
        for op, n in ops.items():
            op = str(op)
            if leaf.endswith("_proj") or leaf.startswith("in_proj"):
                parts["linear"] += n if "mm" in op else 0
            elif leaf == "linear_attn":
                parts["scan_matmul"] += n if "bmm" in op else 0
                parts["conv"] += n if "convolution" in op else 0
            elif leaf == "self_attn":
                parts["attention_matmul"] += n if "bmm" in op else 0
    parts["total"] = counter.get_total_flops()
    return parts


def _agree(counted: dict, expected: dict, tol: float = 0.01) -> dict[str, float]:
    gaps = {}
    for key, value in expected.items():
        gaps[key] = abs(counted[key] - value) / counted[key] if counted[key] else abs(value)  # 0 vs 0 agrees
        assert gaps[key] <= tol, f"{key}: counter {counted[key]:.6g} vs cost model {value:.6g} ({gaps[key]:.3%})"
    return gaps


@pytest.mark.parametrize("name", ["tiny", "qwen3.5-2b"])
def test_forward_flops_agree_with_torch_flop_counter(name):
    cfg, model, device = _backbone(name)
    B, T = 3, 2 * SCAN_CHUNK  # whole chunks: the reference pads the delta rule to multiples of 64
    ids = torch.randint(0, 256, (B, T), device=device)
    counted = _count(lambda: model(ids))
    work = WorkCounts(sequences=B, seq_lens=(T, T - 5, T - 40), padded_len=T, candidates=4)
    fwd = stage_costs(cfg, work)["forward"]
    computed = (fwd.useful + fwd.padded).flops  # the batched pass runs the padding too
    dense = B * attention_pairs(0, T, causal=False) * text_pair_flops(cfg.text)["attention_matmul"]
    expected = {k: computed[k] for k in ("linear", "scan_matmul", "conv")}
    expected["attention_matmul"] = dense
    expected["total"] = sum(expected.values())
    _agree(counted, expected)
    assert counted["linear"] == computed["linear"]  # projections are exact, not merely within 1%
    # The cost model's causal count is what a causal kernel needs: less than the dense rectangle.
    assert computed["attention_matmul"] < dense


def _meta_state(cfg, batch: int, length: int) -> BackboneState:
    """A forked prefix state of the right shapes on the meta device (values are never read)."""
    t = cfg.text
    layers = []
    for kind in t.layer_types:
        if kind == "full_attention":
            kv = torch.empty(batch, t.num_key_value_heads, length, t.head_dim, device="meta")
            layers.append(KVState(kv, kv))
        else:
            layers.append(LinearAttentionState(
                torch.empty(batch, t.linear_conv_dim, t.linear_conv_kernel_dim, device="meta"),
                torch.empty(batch, t.linear_num_value_heads, t.linear_key_head_dim, t.linear_value_head_dim,
                            device="meta")))
    return BackboneState(tuple(layers), length, length)


@pytest.mark.parametrize("name", ["tiny", "qwen3.5-2b"])
def test_prefix_and_suffix_passes_agree_with_torch_flop_counter(name):
    cfg, model, device = _backbone(name)
    P, B, T = SCAN_CHUNK, 2, SCAN_CHUNK
    prefix_ids = torch.randint(0, 256, (1, P), device=device)
    suffix_ids = torch.randint(0, 256, (B, T), device=device)
    if device == "meta":  # meta tensors hold no positions to read back: build the forked state
        counted_prefix = _count(lambda: model(prefix_ids))
        forked = _meta_state(cfg, B, P)
    else:
        out = {}
        counted_prefix = _count(lambda: out.setdefault("state", model(prefix_ids, return_state=True)[1]))
        forked = out["state"].fork(B)
    work = WorkCounts(sequences=B, seq_lens=(P + T, P + T - 7), padded_len=T, prefix_len=P, candidates=2)
    costs = stage_costs(cfg, work)
    pair = text_pair_flops(cfg.text)["attention_matmul"]
    # A pass that computes its last layer everywhere (scored_rows = 0): what no head reads is padded.
    prefix = (costs["prefix"].useful + costs["prefix"].padded).flops
    expected = {k: prefix[k] for k in ("linear", "scan_matmul", "conv")}
    expected["attention_matmul"] = attention_pairs(0, P, causal=False) * pair
    expected["total"] = sum(expected.values())
    _agree(counted_prefix, expected)
    # The suffix pass: B rows, queries at positions P..P+T−1 attending to the prefix keys too.
    counted = _count(lambda: model(suffix_ids, state=forked))
    computed = (costs["suffix"].useful + costs["suffix"].padded).flops
    expected = {k: computed[k] for k in ("linear", "scan_matmul", "conv")}
    expected["attention_matmul"] = B * attention_pairs(P, T, causal=False) * pair
    expected["total"] = sum(expected.values())
    _agree(counted, expected)


@pytest.mark.parametrize("name", ["tiny", "qwen3.5-2b"])
def test_passes_that_prune_the_last_layer_agree_with_torch_flop_counter(name):
    """The prefix pass computing only its state, the suffix its last layer at a (B, Q) grid of
    scored positions: counted FLOPs = the cost model's useful + padded work, and the useful
    part is what the scored positions need (hand count of the last layer's query side)."""
    cfg, model, device = _backbone(name)
    t = cfg.text
    P, B, T, Q = SCAN_CHUNK, 2, SCAN_CHUNK, 2
    prefix_ids = torch.randint(0, 256, (1, P), device=device)
    suffix_ids = torch.randint(0, 256, (B, T), device=device)
    out = {}
    counted_prefix = _count(lambda: out.setdefault("s", model(prefix_ids, return_state=True, state_only=True)))
    assert out["s"][0] is None
    forked = _meta_state(cfg, B, P) if device == "meta" else out["s"][1].fork(B)
    rows = torch.tensor([[T - 1, T - 1], [T - 8, T - 20]], device=device)  # row 0: one candidate, padded
    counted = _count(lambda: out.setdefault("h", model(suffix_ids, state=forked, rows=rows)[0]))
    assert tuple(out["h"].shape) == (B, Q, t.hidden_size)
    work = WorkCounts(sequences=B, seq_lens=(P + T, P + T - 7), padded_len=T, prefix_len=P, candidates=3,
                      scored_rows=B * Q, score_keys=(P + T) + (P + T - 7) + (P + T - 19))
    costs = stage_costs(cfg, work)
    pair = text_pair_flops(cfg.text)["attention_matmul"]
    last_pair = pair / t.layer_types.count("full_attention")
    query = 2 * (t.hidden_size * 2 * t.num_attention_heads * t.head_dim + t.num_attention_heads * t.head_dim
                 * t.hidden_size + 3 * t.hidden_size * t.intermediate_size)  # q (+ gate), o, MLP
    assert t.layer_types[-1] == "full_attention"
    prefix = costs["prefix"].useful.flops
    assert not costs["prefix"].padded.flops.get("linear")
    assert prefix["linear"] == P * (text_token_flops(t)["linear"] - query)
    expected = {k: prefix[k] for k in ("linear", "scan_matmul", "conv")}
    expected["attention_matmul"] = attention_pairs(0, P, causal=False) * (pair - last_pair)
    expected["total"] = sum(expected.values())
    _agree(counted_prefix, expected)
    suffix = costs["suffix"]
    computed = (suffix.useful + suffix.padded).flops
    expected = {k: computed[k] for k in ("linear", "scan_matmul", "conv")}
    # Dense pairs in every full-attention layer but the last; there, Q queries a row over P + T keys.
    expected["attention_matmul"] = B * (attention_pairs(P, T, causal=False) * (pair - last_pair)
                                        + Q * (P + T) * last_pair)
    expected["total"] = sum(expected.values())
    _agree(counted, expected)
    assert counted["linear"] == computed["linear"]
    useful_tokens = 2 * T - 7
    assert suffix.useful.flops["linear"] == useful_tokens * text_token_flops(t)["linear"] - (useful_tokens - 3) * query
    assert suffix.padded.flops["linear"] == 7 * (text_token_flops(t)["linear"] - query) + 1 * query


def test_2b_forward_flops_per_token_by_hand():
    """Projection FLOPs per token of qwen3.5-2b from the DESIGN.md widths, counted by hand."""
    cfg = preset("qwen3.5-2b").text
    h, inter = 2048, 6144
    delta_net = h * (2 * 16 * 128 + 16 * 128) + h * (16 * 128) + 2 * h * 16 + (16 * 128) * h  # qkv, z, b, a, out
    attention = h * (2 * 8 * 256) + 2 * h * (2 * 256) + (8 * 256) * h  # q (+gate), k, v, o
    mlp = 3 * h * inter
    params = 18 * delta_net + 6 * attention + 24 * mlp
    assert params == 1_372_717_056
    assert text_token_flops(cfg)["linear"] == 2 * params
    # Embeddings are lookups and there is no vocabulary projection: the vocabulary changes nothing.
    wide = msgspec.structs.replace(cfg, vocab_size=10 * cfg.vocab_size)
    assert text_token_flops(wide) == text_token_flops(cfg)


def test_useful_tokens_credit_the_shared_prefix_and_padding_is_separate():
    cfg = preset("tiny")
    lens, P = (200, 230, 250), 128
    shared = WorkCounts(sequences=3, seq_lens=lens, padded_len=130, prefix_len=P, candidates=6)
    plain = WorkCounts(sequences=3, seq_lens=lens, padded_len=250, candidates=6,
                       common_prefix_len=P)  # same questions, prefix not shared
    per_token = text_token_flops(cfg.text)["linear"]
    query = sum(2 * lin.params for lin in last_layer_query_linears(cfg.text))  # needed at the 6 candidates only
    useful = P + sum(n - P for n in lens)
    assert token_counts(shared) == {"useful": useful, "padded": 3 * 130 - sum(n - P for n in lens), "repeated": 0}
    assert token_counts(plain)["useful"] == useful and token_counts(plain)["repeated"] == 2 * P
    for work in (shared, plain):
        c = stage_costs(cfg, work)
        text = [s for s in ("prefix", "suffix", "forward") if s in c]
        assert sum(c[s].useful.flops["linear"] for s in text) == useful * per_token - (useful - 6) * query
        total = sum(c[s].useful.tokens + c[s].padded.tokens + c[s].repeated.tokens for s in text)
        assert total == work.computed_tokens  # nothing lost, nothing double counted
    # Repeated prefix work is counted, but never as useful work.
    assert stage_costs(cfg, plain)["forward"].repeated.flops["linear"] == 2 * P * per_token
    assert shared.useful_tokens == useful


def test_attention_pairs_are_causal():
    assert attention_pairs(0, 4) == 1 + 2 + 3 + 4
    assert attention_pairs(10, 2) == 11 + 12
    assert attention_pairs(10, 2, causal=False) == 2 * 12
    assert attention_pairs(5, 0) == 0


def test_image_work_only_when_images_were_encoded():
    cfg = preset("tiny")
    text = WorkCounts(sequences=1, seq_lens=(50,), padded_len=50, candidates=2)
    assert "vision" not in stage_costs(cfg, text)
    cached = dataclasses.replace(text, image_tokens=16, cached_images=1)
    vision = stage_costs(cfg, cached)["vision"]
    assert vision.useful.total_flops == 0 and "cache" in vision.notes[0]
    encoded = dataclasses.replace(text, image_tokens=16, encoded_image_patches=(64,))
    assert stage_costs(cfg, encoded)["vision"].useful.flops["linear"] > 0
    # h2d: ids, candidate indices, the patches (64 × 3·2·16·16 values, BF16) and, with images, one
    # (3, max L) position layout that every row shares.
    two = dataclasses.replace(encoded, sequences=2, seq_lens=(50, 40), candidates=4)
    h2d = stage_costs(cfg, two)["h2d"].useful
    assert h2d.link_bytes == 90 * 4 + 4 * 4 + 3 * 4 * 50 + 64 * 1536 * 2
    assert stage_costs(cfg, dataclasses.replace(two, image_tokens=0))["h2d"].useful.link_bytes == h2d.link_bytes - 600


def test_training_backward_counts_only_what_frozen_weights_need():
    cfg = preset("tiny")
    work = WorkCounts(sequences=2, seq_lens=(64, 64), padded_len=64, candidates=4, train=True)
    lora = LoraShape(rank=4)
    costs = stage_costs(cfg, work, lora=lora)
    tokens = 128
    first_inputs = sum(2 * lin.params for lin in text_linears(cfg.text)
                       if lin.layer == 0 and lin.module.startswith("linear_attn.in_proj"))
    query = sum(2 * lin.params for lin in last_layer_query_linears(cfg.text))  # needed at the 4 candidates only
    # Input gradients only (= forward projection FLOPs), minus layer 0's input projections.
    assert costs["backward"].useful.flops["linear"] == (tokens * (text_token_flops(cfg.text)["linear"] - first_inputs)
                                                        - (tokens - 4) * query)
    assert costs["backward"].useful.flops["adapter"] == 2 * costs["forward"].useful.flops["adapter"]
    assert costs["backward"].useful.flops["head"] == 2 * costs["head"].useful.flops["head"]
    assert "optimizer" in costs
    head_only = stage_costs(cfg, work, lora=LoraShape(rank=0))["backward"].useful.flops
    assert set(head_only) == {"head"}
    recomputed = stage_costs(cfg, dataclasses.replace(work, recomputed_tokens=64), lora=lora)
    fwd = recomputed["forward"]
    forward = (fwd.useful + fwd.padded).total_flops  # the forward as run: its last layer everywhere
    assert recomputed["backward"].repeated.total_flops == pytest.approx(forward / 2)
    assert recomputed["backward"].useful.total_flops == costs["backward"].useful.total_flops


def test_inconsistent_counts_are_rejected():
    cfg = preset("tiny")
    with pytest.raises(ValueError, match="padded_len"):
        stage_costs(cfg, WorkCounts(sequences=2, seq_lens=(10, 20), padded_len=15))
    with pytest.raises(ValueError, match="seq_lens"):
        stage_costs(cfg, WorkCounts(sequences=3, seq_lens=(10, 20), padded_len=20))
    with pytest.raises(ValueError, match="prefix_len"):
        stage_costs(cfg, WorkCounts(sequences=2, seq_lens=(10, 20), padded_len=20, prefix_len=10))


def test_lora_default_targets_are_the_runtimes():
    from dohnuts.model.lora import DEFAULT_TARGETS

    assert LoraShape(rank=8).targets == DEFAULT_TARGETS


def test_a_training_call_is_costed_microbatch_by_microbatch():
    cfg = preset("tiny")
    micro = [WorkCounts(sequences=2, seq_lens=(100 + i, 90), padded_len=100 + i - 64 * (i % 2),
                        prefix_len=64 * (i % 2), candidates=4) for i in range(4)]
    # The merged record keeps the first microbatch's padded_len: wrong for the others on purpose.
    call = WorkCounts(sequences=8, seq_lens=tuple(n for w in micro for n in w.seq_lens), padded_len=100,
                      candidates=16, train=True, microbatches=tuple(micro))
    lora = LoraShape(rank=4)
    costs = stage_costs(cfg, call, lora=lora)
    alone = [stage_costs(cfg, dataclasses.replace(w, train=True), lora=lora) for w in micro]
    for stage in ("h2d", "prefix", "suffix", "forward", "head", "backward", "d2h"):
        want = sum(c[stage].useful.total_flops + c[stage].useful.link_bytes for c in alone if stage in c)
        assert costs[stage].useful.total_flops + costs[stage].useful.link_bytes == pytest.approx(want, rel=1e-12)
    assert costs["optimizer"] == alone[0]["optimizer"]  # one update per call, not per microbatch
    assert list(costs)[-1] == "d2h"
    assert token_counts(call)["useful"] == sum(token_counts(w)["useful"] for w in micro)
