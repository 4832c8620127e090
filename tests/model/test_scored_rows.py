"""The last layer at the scored positions only (`rows` / `state_only`, ScoreInputs.score_rows).

Nothing after the last layer reads a position the scalar head does not score, so a scoring pass
computes that layer's query side — query projection and attention, or the Gated DeltaNet output
gate — and its MLP and final norm at the (B, Q) grid of SCORE positions alone, and a prefix pass
only the state it hands on. Here, on the CPU in FP32: the pruned pass equals the whole pass
picked at those positions, the state is bit-identical, request scores are unchanged, and a
graph replay reads each request's own positions (a stale static buffer fails).
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import torch

import dohnuts.api as api
from dohnuts.config import preset
from dohnuts.model.build import build_text_backbone
from dohnuts.model.blocks import take_rows
from dohnuts.ops.attention import attention_at_fused, attention_at_reference, causal_attention_reference
from dohnuts.runtime.graphs import PassGraphs
from dohnuts.train.task import synthetic_requests
from tests.reference import relative_error

LAST_FULL = None  # the tiny preset's own pattern: ends with a full-attention layer
LAST_LINEAR = ("linear_attention", "full_attention", "linear_attention", "linear_attention")


def _backbone(layer_types):
    cfg = preset("tiny")
    if layer_types is not None:
        cfg = msgspec.structs.replace(cfg, text=msgspec.structs.replace(cfg.text, layer_types=layer_types,
                                                                        num_hidden_layers=len(layer_types)))
    model, _ = build_text_backbone(cfg, device="cpu", seed=3)
    return model.eval()


def _states_equal(a, b) -> bool:
    return all(torch.equal(x, y) for la, lb in zip(a.layers, b.layers)
               for x, y in zip(vars(la).values(), vars(lb).values()))


@pytest.mark.parametrize("layer_types", [LAST_FULL, LAST_LINEAR], ids=["last-full", "last-linear"])
@torch.no_grad()
def test_rows_equal_the_whole_pass_at_those_positions(layer_types):
    model = _backbone(layer_types)
    assert model.cfg.layer_types[-1] == ("full_attention" if layer_types is None else "linear_attention")
    g = torch.Generator().manual_seed(0)
    B, P, T = 3, 70, 45
    prefix = torch.randint(0, 256, (1, P), generator=g)
    ids = torch.randint(0, 256, (B, T), generator=g)
    rows = torch.tensor([[44, 44, 3], [0, 17, 30], [40, 41, 42]])  # duplicates (grid padding) included

    whole, state = model(prefix, return_state=True)
    none, only = model(prefix, return_state=True, state_only=True)
    assert none is None and _states_equal(state, only)  # the state a prefix hands on is unchanged

    for past in (None, only):  # a whole pass, and suffix rows continuing the forked prefix
        kw = {} if past is None else {"state": past.fork(B)}
        want = take_rows(model(ids, **kw)[0], rows)
        got, _ = model(ids, rows=rows, **kw)
        assert got.shape == (B, 3, model.cfg.hidden_size)
        assert relative_error(got, want) < 1e-5, past is None
    # Positions matter: another grid gives other hidden states.
    assert relative_error(model(ids, rows=rows.flip(1))[0], model(ids, rows=rows)[0]) > 1e-2
    with pytest.raises(ValueError, match="state_only"):
        model(ids, state_only=True)


def test_attention_at_equals_causal_attention_picked_at_the_queries():
    g = torch.Generator().manual_seed(1)
    B, Hq, Hkv, P, T, D = 2, 4, 2, 5, 9, 8
    q_all = torch.randn(B, Hq, T, D, generator=g)
    k = torch.randn(B, Hkv, P + T, D, generator=g)
    v = torch.randn(B, Hkv, P + T, D, generator=g)
    full = causal_attention_reference(q_all, k, v, scale=0.3)  # (B, Hq, T, D), queries at P..P+T−1
    rows = torch.tensor([[8, 0, 4], [2, 2, 7]])  # positions within the T queries
    q = take_rows(q_all.transpose(1, 2), rows).transpose(1, 2).contiguous()
    want = take_rows(full.transpose(1, 2), rows).transpose(1, 2)
    for fn in (attention_at_reference, attention_at_fused):
        got = fn(q, k, v, rows + P, 0.3)
        assert relative_error(got, want) < 1e-5, fn.__name__


def test_requests_score_the_same_with_and_without_the_grid():
    session = api.load("tiny")
    model = session.model
    for share in (True, False):
        (req,) = synthetic_requests(1, questions=4, shared_prefix=200 if share else 0, seed=5)
        hb = session.prepare(req)
        assert (hb.plan.prefix_len > 0) == share
        x = hb.tensors.score_inputs()
        assert x.score_rows is not None and hb.work.scored_rows == x.score_rows.numel()
        with torch.no_grad():
            pruned = model(x)
            whole = model(dataclasses.replace(x, score_rows=None, score_slot=None))
        assert relative_error(pruned, whole) < 1e-5, share
        # The grid names the same positions as the flat indices into the whole pass.
        B, L = x.ids.shape
        flat = (torch.arange(B)[:, None] * L + x.score_rows).flatten()[x.score_slot]
        assert torch.equal(flat, x.score_index)
        assert hb.work.score_keys == sum(p + 1 for pos in hb.plan.score_positions for p in pos)


def test_graph_replay_reads_each_requests_positions():
    """Same tokens, other scored positions: a replay that kept the first request's grid (a stale
    static buffer) would return the first request's hidden states."""
    session = api.load("tiny")
    model = session.model
    graphs = session.graphs = PassGraphs(model, emulate=True)  # prepare pads to the graphs' buckets
    (req,) = synthetic_requests(1, questions=4, shared_prefix=0, seed=9)
    x = session.prepare(req).tensors.score_inputs()
    moved = dataclasses.replace(x, score_rows=(x.score_rows - 1).clamp_min(0))
    with torch.no_grad():
        first = graphs.hidden(x).clone()
        second = graphs.hidden(moved).clone()
        assert graphs.stats().captures == 1 and graphs.stats().replays == 2
        assert relative_error(first, model.hidden(x)) < 1e-6
        assert relative_error(second, model.hidden(moved)) < 1e-6
    assert relative_error(first, second) > 1e-2
