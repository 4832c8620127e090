"""Shared causal prefix: computing it once and forking equals computing it per question —
scores and gradients — and no state outlives its request or a weight update."""

from __future__ import annotations

import pytest
import torch

from dohnuts.runtime.plan import PREFIX_ALIGN, longest_common_prefix, shared_prefix_split
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import microbatch_loss
from tests.reference import adapted_tiny, relative_error


def _model(seed=0):
    return adapted_tiny(seed=seed)


def _request(prefix: str, texts=("alpha", "beta", "gamma"), cands=("one", "two", "three")) -> Request:
    qs = tuple(Question(f"q{i}", t, cands, rewards=tuple(float(j == i % len(cands)) for j in range(len(cands))))
               for i, t in enumerate(texts))
    return Request(id="r", questions=qs, prefix=prefix)


def _scores_and_grads(session, req, share):
    hb = session.prepare(req, share_prefix=share, train=True)
    model = session.model
    model.zero_grad()
    model.train()
    loss = microbatch_loss(model, hb.tensors, RLCDConfig())
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.trainable_parameters()])
    model.eval()
    with torch.no_grad():
        scores = model(hb.tensors.score_inputs())
    return hb.plan, scores, grads


@pytest.mark.parametrize("prefix_chars", [300, 255, 129])  # splits 304, 264, 136: none a multiple of the chunk (64)
def test_sharing_equals_not_sharing(prefix_chars):
    """Equal to FP32 rounding. The split is not on a delta-rule chunk boundary, so the chunked
    FP32 recurrence sums in another order than the one pass (a split at 296 of 300 tokens moves
    the reference's output by 2e-8): scores differ by < 1e-6 and gradients by ≈ 2e-5 (≈ 2e-6 when
    the split was a multiple of 64, 2026-12-01). A real defect — a state read from the wrong row
    or position — moves them by orders of magnitude more."""
    model = _model()
    req = _request("x" * prefix_chars)
    plan_s, s_shared, g_shared = _scores_and_grads(model, req, True)
    plan_u, s_plain, g_plain = _scores_and_grads(model, req, False)
    assert plan_u.prefix_len == 0
    lcp = longest_common_prefix(plan_s.sequences)
    assert plan_s.prefix_len == lcp - lcp % PREFIX_ALIGN and plan_s.prefix_len >= 128
    assert relative_error(s_shared, s_plain) < 1e-5
    assert relative_error(g_shared, g_plain) < 5e-5


def test_prefix_shorter_than_threshold_takes_one_pass():
    model = _model()
    req = _request("short")
    plan, _, _ = _scores_and_grads(model, req, True)
    assert plan.prefix_len == 0


def test_candidate_right_after_the_split():
    """The first candidate starts exactly at the split: every scored position is in the suffix."""
    model = _model()
    # "Question: q\n" is 12 bytes; a prefix of 243 chars + "\n" puts the question end at 256, and
    # "Answer: a" the first SCORE token at 265: the split (on the 8-token grid) lands one token before it.
    req = _request("y" * 243, texts=("q", "q", "q"), cands=("a", "b", "c"))
    plan = model.prepare(req, share_prefix=True).plan
    assert plan.prefix_len == 264 and plan.score_positions[0][0] == 265
    assert min(p[0] for p in plan.score_positions) >= plan.prefix_len
    assert any(len(s) > plan.prefix_len and plan.score_positions[0][0] - plan.prefix_len < 10 for s in plan.sequences)
    shared = torch.tensor([s for q in model.predict([req], share_prefix=True)[0].questions for s in q.scores])
    plain = torch.tensor([s for q in model.predict([req], share_prefix=False)[0].questions for s in q.scores])
    assert relative_error(shared, plain) < 1e-5


def test_split_rules():
    seqs = ((1,) * 200 + (2, 3), (1,) * 200 + (4, 5), (1,) * 150 + (9,) * 52)
    pos = ((201,), (201,), (201,))
    assert shared_prefix_split(seqs, pos) == 144  # LCP 150 → aligned down to 144 (PREFIX_ALIGN 8)
    assert shared_prefix_split(seqs, pos, align=64) == 128
    assert shared_prefix_split(seqs, ((100,), (201,), (201,))) == 0  # a candidate at 100 caps it below 128
    assert shared_prefix_split(seqs[:1], pos[:1]) == 0  # one question: nothing to share


@pytest.mark.parametrize("shared_pass", ["merged", "split"])
def test_no_state_survives_a_request(monkeypatch, shared_pass):
    """Poison every prefix state the pass made — each attention layer's keys and values when they
    are forked, each Gated DeltaNet layer's conv history and recurrent state when they are returned
    (inside the merged pass, or between the two passes): the next request is unaffected."""
    from dohnuts.model.state import KVState
    from dohnuts.model.text import GatedDeltaNet

    monkeypatch.setenv("DOHNUTS_SHARED_PASS", shared_pass)
    model = _model()
    a, b = _request("a" * 300), _request("b" * 300, texts=("delta", "eps", "zeta"))
    expected = model.predict([b], share_prefix=True)[0]
    states = []

    def kv_fork(self, n, real=KVState.fork):
        states.extend([self.key, self.value])
        return real(self, n)

    def conv(self, mixed, conv_state, return_state, real=GatedDeltaNet._conv):
        out = real(self, mixed, conv_state, return_state)
        if return_state:
            states.append(out[1])
        return out

    def delta(self, qkv, b, a, recurrent, return_state, *args, real=GatedDeltaNet._delta, **kw):
        out = real(self, qkv, b, a, recurrent, return_state, *args, **kw)
        if return_state:
            states.append(out[1])
        return out

    monkeypatch.setattr(KVState, "fork", kv_fork)
    monkeypatch.setattr(GatedDeltaNet, "_conv", conv)
    monkeypatch.setattr(GatedDeltaNet, "_delta", delta)
    model.predict([a], share_prefix=True)
    assert len(states) == 2 * len(model.model.backbone.layers)  # each layer's prefix state: two tensors
    with torch.inference_mode():  # the states were made under inference mode
        for t in states:
            t.fill_(float("nan"))
    again = model.predict([b], share_prefix=True)[0]
    assert again.questions == expected.questions


def test_no_state_survives_an_optimizer_step():
    """After an update, shared scores equal unshared scores of the *new* weights."""
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer

    model = _model()
    req = _request("z" * 300)
    before = torch.tensor([s for q in model.predict([req])[0].questions for s in q.scores])
    opt = make_optimizer(model, OptimConfig(lr=1e-2))
    Updater(model, opt, RLCDConfig(), OptimConfig(lr=1e-2)).update([req] * 4)
    shared = torch.tensor([s for q in model.predict([req], share_prefix=True)[0].questions for s in q.scores])
    plain = torch.tensor([s for q in model.predict([req], share_prefix=False)[0].questions for s in q.scores])
    assert relative_error(shared, plain) < 1e-5
    assert relative_error(shared, before) > 1e-4  # the weights really changed


def test_activation_checkpointing_recomputes_the_shared_request():
    model = _model()
    req = _request("c" * 300)
    hb = model.prepare(req, share_prefix=True, train=True)
    assert hb.plan.prefix_len > 0
    grads = []
    for ckpt in (False, True):
        model.model.zero_grad()
        model.model.train()
        microbatch_loss(model.model, hb.tensors, RLCDConfig(), checkpoint_layers=ckpt).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.trainable_parameters()]))
    assert relative_error(grads[1], grads[0]) < 1e-6


def test_longest_common_prefix_equals_the_plain_definition():
    """The bisecting version against the element-by-element definition, on random sequences
    that share prefixes of every length (including none, all, and one sequence a prefix of another)."""
    import random

    from dohnuts.runtime.plan import longest_common_prefix

    def plain(seqs):
        n = min(len(s) for s in seqs)
        return next((i for i in range(n) if any(s[i] != seqs[0][i] for s in seqs)), n)

    rng = random.Random(0)
    for _ in range(2000):
        base = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        seqs = tuple(tuple(base[: rng.randrange(len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(5))])
                     for _ in range(rng.randrange(1, 6)))
        assert longest_common_prefix(seqs) == plain(seqs), seqs
        known = rng.randrange(plain(seqs) + 1)  # what the planner knows every sequence shares
        assert longest_common_prefix(seqs, known=known) == plain(seqs), (seqs, known)


def test_a_fork_is_views_outside_autograd_and_copies_under_it():
    """Outside autograd a forked prefix state costs no memory: the conv history and the recurrent
    state of each branch are stride-0 views of the prefix's (the kernels read them through their
    strides). Under autograd the branches are dense copies whose gradients add up in the prefix."""
    from dohnuts.model.state import LinearAttentionState

    conv, rec = torch.randn(1, 12, 4), torch.randn(1, 2, 3, 5)
    with torch.no_grad():
        f = LinearAttentionState(conv, rec).fork(6)
    assert f.conv.stride(0) == 0 and f.recurrent.stride(0) == 0
    assert f.conv.data_ptr() == conv.data_ptr() and f.recurrent.data_ptr() == rec.data_ptr()
    assert torch.equal(f.recurrent, rec.expand(6, -1, -1, -1)) and torch.equal(f.conv, conv.expand(6, -1, -1))
    conv_g, rec_g = conv.clone().requires_grad_(), rec.clone().requires_grad_()
    f = LinearAttentionState(conv_g, rec_g).fork(6)
    assert f.conv.is_contiguous() and f.recurrent.is_contiguous() and f.recurrent.data_ptr() != rec_g.data_ptr()
    (f.conv.sum() + 2 * f.recurrent.sum()).backward()
    assert torch.equal(conv_g.grad, torch.full_like(conv, 6.0)) and torch.equal(rec_g.grad, torch.full_like(rec, 12.0))


def _image_request(tmp_path, seed=0) -> Request:
    import numpy as np
    from PIL import Image

    path = tmp_path / f"{seed}.png"
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
    qs = (Question("q1", "what?", ("red", "green")), Question("q2", "how many?", ("one", "two", "three")))
    return Request(id="img", questions=qs, prefix="a photo", image=str(path))


@pytest.mark.parametrize("pruned", [True, False])
@pytest.mark.parametrize("kind", ["text 300", "text 129", "image", "image cut"])
def test_merged_pass_equals_prefix_then_suffix(kind, pruned, tmp_path, monkeypatch):
    """`shared_hidden` (the prefix's rows in the suffixes' token-parallel ops, one pass) equals the
    prefix pass and the suffix pass from its forked state, to FP32 rounding: text prefixes on and
    off the 64-token chunk grid, an image prefix, and one whose split cuts the image (the rest of
    its features in the suffix rows, MRoPE positions); at the scored positions and at every one."""
    import dataclasses

    import dohnuts.runtime.plan as plan_mod

    if kind == "image cut":
        monkeypatch.setattr(plan_mod, "PREFIX_ALIGN", 64)  # the split falls inside the 196 image tokens
    session = _model()
    req = _image_request(tmp_path) if kind.startswith("image") else _request("x" * int(kind.split()[1]))
    hb = session.prepare(req, share_prefix=True)
    assert hb.plan.prefix_len > 0
    x = hb.tensors.score_inputs()
    if x.image_tokens:
        (use,) = session.image_features([(hb, None)])
        x = dataclasses.replace(x, image_features=use.features)
        assert (x.image_tokens_in_prefix < x.image_tokens) == (kind == "image cut")
    if not pruned:
        x = dataclasses.replace(x, score_rows=None, score_slot=None)
    m = session.model
    with torch.no_grad():
        merged = m.shared_hidden(x)
        split = m.suffix_hidden(x, m.prefix_state(x))
    assert merged.shape == split.shape == ((*x.score_rows.shape, split.shape[-1]) if pruned else (*x.ids.shape, split.shape[-1]))
    assert relative_error(merged, split) < 1e-5


def test_shared_pass_setting_is_checked(monkeypatch):
    from dohnuts.errors import ConfigError
    from dohnuts.model.scorer import shared_pass

    monkeypatch.setenv("DOHNUTS_SHARED_PASS", "fused")
    with pytest.raises(ConfigError, match="DOHNUTS_SHARED_PASS|shared-prefix pass"):
        shared_pass()
    monkeypatch.setenv("DOHNUTS_SHARED_PASS", "")
    assert shared_pass() == "merged"
