"""Shared causal prefix: the sharing rule (64-token split, enough work saved), and computing the
prefix once and forking equals computing it per question — scores, and gradients through the
training pass that recomputes the whole shared request — with no state outliving its request or a
weight update."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dohnuts.runtime.plan import MIN_SAVED_TOKENS, PREFIX_ALIGN, longest_common_prefix, shared_prefix_split
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import microbatch_loss
from tests.reference import adapted_tiny, relative_error, scores_of, two_passes, unshared

# The byte tokenizer's layout (dohnuts.runtime.plan): prefix, "\n", "Question: ", text, "\n", then
# "Answer: " + candidate + SCORE per candidate. Questions whose texts differ in their first
# character share exactly len(prefix) + 11 tokens.
HEAD = 11


def _model(seed=0):
    return adapted_tiny(seed=seed)


def _request(prefix: str, texts=("alpha", "beta", "gamma"), cands=("one", "two", "three")) -> Request:
    qs = tuple(Question(f"q{i}", t, cands, rewards=tuple(float(j == i % len(cands)) for j in range(len(cands))))
               for i, t in enumerate(texts))
    return Request(id="r", questions=qs, prefix=prefix)


def _scores_and_grads(session, req):
    """The training pass's loss gradients (recomputing, as training always does) and the scores."""
    hb = session.prepare(req, train=True)
    model = session.model
    model.zero_grad()
    model.train()
    microbatch_loss(model, hb.tensors, RLCDConfig()).backward()
    grads = torch.cat([p.grad.flatten() for p in model.trainable_parameters()])
    model.eval()
    with torch.no_grad():
        scores = model(hb.tensors.score_inputs())
    return hb.plan, scores, grads


@pytest.mark.parametrize("prefix_chars", [300, 245, 117])  # 311, 256 and 128 shared tokens: splits 256, 256, 128
def test_sharing_equals_not_sharing(prefix_chars):
    """Scores and LoRA/head gradients (the training pass, every layer recomputed in the backward
    pass) with the prefix computed once equal those of one batched pass, to FP32 rounding."""
    model = _model()
    req = _request("x" * prefix_chars)
    plan_s, s_shared, g_shared = _scores_and_grads(model, req)
    with unshared(model):
        plan_u, s_plain, g_plain = _scores_and_grads(model, req)
    assert plan_u.prefix_len == 0
    common = prefix_chars + HEAD
    assert plan_s.prefix_len == common - common % PREFIX_ALIGN > 0
    assert relative_error(s_shared, s_plain) < 1e-5
    assert relative_error(g_shared, g_plain) < 5e-5 and float(g_plain.norm()) > 0


@pytest.mark.parametrize(("shared", "split"), [(63, 0), (64, 64), (65, 64), (127, 64), (128, 128), (129, 128)])
def test_the_split_is_on_the_64_token_grid(shared, split):
    """Requests whose questions share exactly `shared` tokens split at the multiple of 64 below
    (none under 64), and score as one batched pass does."""
    model = _model()
    texts = tuple(f"{c} question" for c in "abcdefgh")  # 8 questions: 7 × 64 tokens saved ≥ MIN_SAVED_TOKENS
    req = _request("p" * (shared - HEAD), texts=texts)
    plan = model.prepare(req).plan
    assert plan.common_prefix() == shared and plan.prefix_len == split
    if split:
        assert plan.sequences[0][:split] == plan.sequences[-1][:split]
        with unshared(model):
            plain = scores_of(model.predict([req]))
        assert relative_error(scores_of(model.predict([req])), plain) < 1e-5


@pytest.mark.parametrize(("first_score", "split"), [(256, 256), (255, 192)])
def test_a_candidate_just_after_the_split(first_score, split):
    """Identical questions share everything up to their first candidate's SCORE token: the split
    stops at that position (every scored position stays in the suffix), on the grid — a SCORE token
    at 256 is the first suffix token; at 255 the split falls back to 192."""
    model = _model()
    # "y" * c + "\n" + "Question: q\n" (12) + "Answer: a" (9): the first SCORE token at c + 22
    req = _request("y" * (first_score - 22), texts=("q", "q", "q"), cands=("a", "b", "c"))
    plan = model.prepare(req).plan
    assert plan.score_positions[0][0] == first_score and plan.prefix_len == split
    assert min(p[0] for p in plan.score_positions) >= plan.prefix_len
    with unshared(model):
        plain = scores_of(model.predict([req]))
    assert relative_error(scores_of(model.predict([req])), plain) < 1e-5


def test_split_rules():
    """By hand: the split is the common prefix capped at the first candidate, aligned down to 64;
    one question never shares; too little saved work, (B − 1) · P < MIN_SAVED_TOKENS, does not."""
    assert PREFIX_ALIGN == 64 and MIN_SAVED_TOKENS == 256
    seqs = ((1,) * 200 + (2, 3), (1,) * 200 + (4, 5), (1,) * 150 + (9,) * 52)
    pos = ((201,), (201,), (201,))
    assert shared_prefix_split(seqs, pos) == 128  # LCP 150 → 128; 2 × 128 = 256 saved
    assert shared_prefix_split(seqs, ((100,), (201,), (201,))) == 0  # a candidate at 100 caps it at 64: 128 saved
    assert shared_prefix_split(seqs[:1], pos[:1]) == 0  # one question: nothing to share
    assert shared_prefix_split(seqs[:2], pos[:2]) == 0  # LCP 200 → 192, but 1 × 192 < 256 saved
    four = seqs + ((1,) * 70,)
    assert shared_prefix_split(four, pos + ((69,),)) == 0  # capped at 69 → 64: 3 × 64 < 256
    five = four + ((1,) * 70,)
    assert shared_prefix_split(five, pos + ((69,), (69,))) == 64  # 4 × 64 = 256


def test_no_state_survives_a_request(monkeypatch):
    """Poison every prefix state the shared pass made — each attention layer's keys and values when
    they are forked, each Gated DeltaNet layer's conv history and recurrent state when they are
    returned — after a request: the next request is unaffected."""
    from dohnuts.model.state import KVState
    from dohnuts.ops import conv, delta_rule

    model = _model()
    a, b = _request("a" * 300), _request("b" * 300, texts=("delta", "eps", "zeta"))
    expected = model.predict([b])[0]
    states = []

    def kv_fork(self, n, real=KVState.fork):
        states.extend([self.key, self.value])
        return real(self, n)

    def conv_qkv(*args, real=conv.causal_conv1d_qkv, **kw):  # the shared conv's prefix state (CPU)
        out = real(*args, **kw)
        if out[1] is not None:
            states.append(out[1])
        return out

    def delta(*args, real=delta_rule.gated_delta_rule_from_logits, **kw):  # the shared op's prefix state (CPU)
        out = real(*args, **kw)
        if out[1] is not None:
            states.append(out[1])
        return out

    monkeypatch.setattr(KVState, "fork", kv_fork)
    monkeypatch.setattr(conv, "causal_conv1d_qkv", conv_qkv)
    monkeypatch.setattr(delta_rule, "gated_delta_rule_from_logits", delta)
    model.predict([a])
    assert len(states) == 2 * len(model.model.backbone.layers)  # each layer's prefix state: two tensors
    with torch.inference_mode():  # the states were made under inference mode
        for t in states:
            t.fill_(float("nan"))
    again = model.predict([b])[0]
    assert again.questions == expected.questions


def test_no_state_survives_an_optimizer_step():
    """After an update, shared scores equal unshared scores of the *new* weights."""
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer

    model = _model()
    req = _request("z" * 300)
    before = scores_of(model.predict([req]))
    opt = make_optimizer(model, OptimConfig(lr=1e-2))
    Updater(model, opt, RLCDConfig(), OptimConfig(lr=1e-2)).update([req] * 4)
    shared = scores_of(model.predict([req]))
    with unshared(model):
        plain = scores_of(model.predict([req]))
    assert relative_error(shared, plain) < 1e-5
    assert relative_error(shared, before) > 1e-4  # the weights really changed


def test_training_recomputes_the_complete_shared_request(monkeypatch):
    """The training pass of a shared request is the shared pass with every layer — the prefix's
    rows, its state forked, the suffixes — an activation-checkpointing region: the backward pass
    runs each layer's shared forward again and builds the prefix's state afresh (counted here), and
    the gradients equal those of the same pass without recomputation."""
    from dohnuts.model.text import DecoderLayer, TextBackbone

    model = _model()
    req = _request("c" * 300)
    hb = model.prepare(req, train=True)
    assert hb.plan.prefix_len > 0
    calls = {"layer": 0, "last": 0}

    def layer_shared(self, *args, real=DecoderLayer.forward_shared):
        calls["layer"] += 1
        return real(self, *args)

    def last_shared(self, *args, real=TextBackbone._last_shared):  # the last layer: prefix state, fork, suffixes
        calls["last"] += 1
        return real(self, *args)

    monkeypatch.setattr(DecoderLayer, "forward_shared", layer_shared)
    monkeypatch.setattr(TextBackbone, "_last_shared", last_shared)
    m = model.model
    grads, counts = [], []
    for recompute in (False, True):
        calls.update(layer=0, last=0)
        m.zero_grad()
        m.train()
        loss = microbatch_loss(m, hb.tensors, RLCDConfig()) if recompute else \
            _loss_without_recompute(m, hb.tensors)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.trainable_parameters()]))
        counts.append(dict(calls))
    n = len(m.backbone.layers) - 1
    assert counts[0] == {"layer": n, "last": 1}
    assert counts[1] == {"layer": 2 * n, "last": 2}  # the whole shared request, again, in the backward
    assert relative_error(grads[1], grads[0]) < 1e-6 and float(grads[0].norm()) > 0


def _loss_without_recompute(model, batch):
    from dohnuts.model.scorer import candidate_logits
    from dohnuts.train.objective import rlcd_loss

    scores = model(batch.score_inputs(), recompute=False)
    return rlcd_loss(candidate_logits(scores, batch.cand_matrix), batch.rewards, RLCDConfig())


def test_longest_common_prefix_equals_the_plain_definition():
    """The bisecting version against the element-by-element definition, on random sequences
    that share prefixes of every length (including none, all, and one sequence a prefix of another)."""
    import random

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


def test_a_fork_is_views_with_and_without_autograd():
    """A forked prefix state costs no memory: the conv history and the recurrent state of each
    branch are stride-0 views of the prefix's (the kernels read them through their strides). Under
    autograd the branches' gradients add up in the prefix."""
    from dohnuts.model.state import LinearAttentionState

    conv, rec = torch.randn(1, 12, 4), torch.randn(1, 2, 3, 5)
    with torch.no_grad():
        f = LinearAttentionState(conv, rec).fork(6)
    assert f.conv.stride(0) == 0 and f.recurrent.stride(0) == 0
    assert f.conv.data_ptr() == conv.data_ptr() and f.recurrent.data_ptr() == rec.data_ptr()
    assert torch.equal(f.recurrent, rec.expand(6, -1, -1, -1)) and torch.equal(f.conv, conv.expand(6, -1, -1))
    conv_g, rec_g = conv.clone().requires_grad_(), rec.clone().requires_grad_()
    f = LinearAttentionState(conv_g, rec_g).fork(6)
    assert f.conv.stride(0) == 0 and f.recurrent.stride(0) == 0 and f.recurrent.data_ptr() == rec_g.data_ptr()
    (f.conv.sum() + 2 * f.recurrent.sum()).backward()
    assert torch.equal(conv_g.grad, torch.full_like(conv, 6.0)) and torch.equal(rec_g.grad, torch.full_like(rec, 12.0))


def _image_request(tmp_path, prefix="a photo", seed=0) -> Request:
    import numpy as np
    from PIL import Image

    path = tmp_path / f"{seed}.png"
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
    qs = (Question("q1", "what?", ("red", "green")), Question("q2", "how many?", ("one", "two", "three")),
          Question("q3", "where?", ("here", "there")))
    return Request(id="img", questions=qs, prefix=prefix, image=str(path))


@pytest.mark.parametrize("pruned", [True, False])
@pytest.mark.parametrize("kind", ["text 300", "text 117", "image", "image cut"])
def test_shared_pass_equals_prefix_then_suffix(kind, pruned, tmp_path):
    """`shared_hidden` (the prefix's rows in the suffixes' token-parallel ops, one pass) equals the
    prefix pass and the suffix pass from its forked state, to FP32 rounding: text prefixes on and
    off the chunk grid, an image prefix, and one whose split cuts the image (the rest of its
    features in the suffix rows, MRoPE positions); at the scored positions and at every one."""
    session = _model()
    if kind.startswith("image"):
        # 196 image tokens + 2 at 0..197: "a photo" splits at 192 (inside the image), a longer prefix at 256
        req = _image_request(tmp_path, prefix="a photo" if kind == "image cut" else "a photo " + "z" * 60)
    else:
        req = _request("x" * int(kind.split()[1]))
    hb = session.prepare(req)
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
        shared = m.shared_hidden(x)
        split = two_passes(m, x)
    assert shared.shape == split.shape == ((*x.score_rows.shape, split.shape[-1]) if pruned
                                           else (*x.ids.shape, split.shape[-1]))
    assert relative_error(shared, split) < 1e-5
