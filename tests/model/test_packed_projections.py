"""Packed projections (dohnuts.model.packing): a packed model computes what the unpacked one does —
hidden states, state hand-over, shared-prefix and image scores, LoRA training — with the same
state dict; groups with an adapter pack too (the adapters' updates go into their columns)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import dohnuts.runtime.session as session_module
from dohnuts import api
from dohnuts.config import preset
from dohnuts.model.build import build_text_backbone
from dohnuts.model.lora import LoRAConfig, LoRALinear, apply_lora
from dohnuts.model.packing import fuse_projections, packed_weight
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import microbatch_loss
from tests.reference import relative_error, unshared

CFG = preset("tiny")
GROUPS = 2 * CFG.text.num_hidden_layers  # one MLP group per layer + one mixer group per layer


def _groups(backbone):
    """(module, linears) of every group a layer names."""
    return [(m, tuple(getattr(m, n) for n in names))
            for m in backbone.modules() for names in getattr(m, "packed_projections", ())]


def _packed_count(backbone) -> int:
    with torch.no_grad():
        return sum(packed_weight(*linears) is not None for _, linears in _groups(backbone))


def _pair(seed=3):
    plain, _ = build_text_backbone(CFG, seed=seed)
    packed = copy.deepcopy(plain)  # a deep copy gets its own (unpacked) storages
    assert fuse_projections(packed) == GROUPS
    assert _packed_count(packed) == GROUPS and _packed_count(plain) == 0
    return plain.eval(), packed.eval()


def test_packed_hidden_states_and_state_handover_equal_unpacked():
    plain, packed = _pair()
    ids = torch.randint(0, 256, (3, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, _ = plain(ids)
        got, _ = packed(ids)
        # Shared prefix: a batch-1 pass over 83 tokens, its state forked to 3 suffix branches.
        shared = torch.cat([ids[:1, :83].expand(3, -1), ids[:, 83:]], dim=1)
        want_shared, _ = plain(shared)
        head, state = packed(shared[:1, :83], return_state=True)
        tail, _ = packed(shared[:, 83:], state=state.fork(3))
    assert relative_error(got, want) < 1e-5
    assert relative_error(torch.cat([head.expand(3, -1, -1), tail], 1), want_shared) < 1e-5


def test_fusion_is_idempotent_and_keeps_the_state_dict():
    plain, packed = _pair()
    ptrs = [p.data_ptr() for p in packed.parameters()]
    assert fuse_projections(packed) == GROUPS
    assert [p.data_ptr() for p in packed.parameters()] == ptrs  # nothing re-packed
    sd_plain, sd_packed = plain.state_dict(), packed.state_dict()
    assert list(sd_packed) == list(sd_plain)
    for k, v in sd_plain.items():
        assert torch.equal(sd_packed[k], v), k
    for _, linears in _groups(packed):
        for m in linears:  # still Parameters, with their requires_grad flag kept
            assert isinstance(m.weight, nn.Parameter) and m.weight.requires_grad
        assert packed_weight(*linears) is None  # weights being trained run one by one...
        with torch.no_grad():
            assert packed_weight(*linears) is not None  # ...and packed where nothing records

    # Loading other weights copies them into the packed storage: still packed, and consistent.
    other, _ = build_text_backbone(CFG, seed=11)
    packed.load_state_dict(other.state_dict())
    assert _packed_count(packed) == GROUPS
    for k, v in other.state_dict().items():
        assert torch.equal(packed.state_dict()[k], v), k
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative_error(packed(ids)[0], other(ids)[0]) < 1e-5
        for _, linears in _groups(packed):  # the packed tensor is the loaded weights, row block by row block
            assert torch.equal(packed_weight(*linears), torch.cat([m.weight for m in linears]))


def test_depthwise_conv_weights_are_stored_tap_major():
    """Each Gated DeltaNet conv weight is stored as the conv kernels read it, each tap's channels
    contiguous: their tap-major form is a view of the Parameter (no copy a layer and call), with the
    values of the plain model's; a load copies into that storage and keeps it."""
    plain, packed = _pair()
    convs = [(m.conv1d, p.conv1d) for m, p in zip(plain.modules(), packed.modules()) if hasattr(m, "conv1d")]
    assert len(convs) == sum(t == "linear_attention" for t in CFG.text.layer_types)

    def kernels_copy(conv):  # what dohnuts.ops._conv_bwd_kernel does with the weight it is given
        w = conv.weight.squeeze(1)
        return w.t().contiguous().t(), w

    for plain_conv, conv in convs:
        tap, w = kernels_copy(conv)
        assert tap.data_ptr() == w.data_ptr() and torch.equal(conv.weight, plain_conv.weight)
        assert isinstance(conv.weight, nn.Parameter) and conv.weight.requires_grad
        assert kernels_copy(plain_conv)[0].data_ptr() != plain_conv.weight.data_ptr()  # the plain model's is copied
    other, _ = build_text_backbone(CFG, seed=11)
    packed.load_state_dict(other.state_dict())
    for (_, conv), theirs in zip(convs, (m.conv1d for m in other.modules() if hasattr(m, "conv1d"))):
        tap, w = kernels_copy(conv)
        assert tap.data_ptr() == w.data_ptr() and torch.equal(conv.weight, theirs.weight)


def test_replaced_weights_fall_back_to_separate_projections():
    """A load with assign=True re-creates the parameters: the packing is gone, the result is not."""
    _, packed = _pair()
    other, _ = build_text_backbone(CFG, seed=12)
    packed.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, assign=True)
    assert _packed_count(packed) == 0
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert relative_error(packed(ids)[0], other(ids)[0]) < 1e-5
    assert fuse_projections(packed) == GROUPS


def test_groups_with_an_adapter_pack_and_keep_the_mathematics():
    """Adapters on some members of a group (gate_proj of the MLP's gate/up, in_proj_b of the
    mixer's qkv/b/a) and on none of attention's: every group packs, the base weights are the
    packed tensor's row blocks, and the hidden states and every adapter gradient equal the
    unpacked model's, each member run on its own (in float64: the gradients are sums that cancel,
    and FP32 would test rounding)."""
    plain, _ = build_text_backbone(CFG, seed=3)
    plain.double()
    torch.manual_seed(0)
    apply_lora(plain, LoRAConfig(rank=2, targets=("gate_proj", "in_proj_b", "o_proj")))
    with torch.no_grad():
        for m in plain.modules():
            if isinstance(m, LoRALinear):
                m.lora_A.data, m.lora_B.data = m.lora_A.double(), torch.randn_like(m.lora_B, dtype=torch.float64) * 0.1
    packed = copy.deepcopy(plain)
    assert _packed_count(plain) == 0
    assert fuse_projections(packed) == GROUPS and _packed_count(packed) == GROUPS
    for _, linears in _groups(packed):
        assert len({x.weight.untyped_storage().data_ptr() for x in linears}) == 1
    ids = torch.randint(0, 256, (2, 90), generator=torch.Generator().manual_seed(3))
    grads = []
    for model in (packed, plain):
        model.zero_grad()
        h, _ = model(ids)
        (h.square().mean()).backward()
        grads.append((h.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])))
    (h_p, g_p), (h_u, g_u) = grads
    assert relative_error(h_p, h_u) < 1e-10
    assert relative_error(g_p, g_u) < 1e-10 and float(g_u.norm()) > 0


def _png(path, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
    return str(path)


def _scores(session, reqs, share):
    if not share:
        with unshared(session):
            return _scores(session, reqs, True)
    return [torch.tensor([s for q in r.questions for s in q.scores]) for r in session.predict(reqs)]


def _unpacked_session(monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(session_module, "fuse_projections", lambda backbone: 0)
        s = api.load("tiny", **kw)
    assert _packed_count(s.model.backbone) == 0
    return s


def test_session_packs_and_scores_equal_unpacked(monkeypatch, tmp_path):
    """Prediction with a shared prefix, without, and with an image cut by the prefix split."""
    from dohnuts.train.task import synthetic_requests

    packed = api.load("tiny")
    plain = _unpacked_session(monkeypatch)
    assert _packed_count(packed.model.backbone) == GROUPS
    qs = (Question("q1", "what?", ("red", "green")), Question("q2", "how many?", ("one", "two", "three")),
          Question("q3", "where?", ("here", "there")))
    reqs = synthetic_requests(2, questions=5, shared_prefix=300, seed=7)
    reqs += [Request(id="img", questions=qs, prefix="a photo", image=_png(tmp_path / "a.png", 0))]
    assert packed.prepare(reqs[0]).plan.prefix_len > 0 and packed.prepare(reqs[-1]).plan.prefix_len > 0
    for share in (True, False):
        for got, want in zip(_scores(packed, reqs, share), _scores(plain, reqs, share)):
            assert relative_error(got, want) < 1e-5


def _same_adapters(*sessions):
    """The same random, non-zero B in every session (same module order, same seed)."""
    for s in sessions:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for m in s.model.modules():
                if isinstance(m, LoRALinear):
                    m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.05)


def test_prediction_with_unmerged_adapters_equals_unpacked(monkeypatch):
    """Prediction with adapters attached (not merged): the pruned passes' adapted groups — keys
    and values over every token, queries only at the scored rows, each its own packed slice —
    score what the unpacked model does, with and without a shared prefix."""
    from dohnuts.train.task import synthetic_requests

    lora = LoRAConfig(rank=4)
    packed = api.load("tiny", lora=lora)
    plain = _unpacked_session(monkeypatch, lora=lora)
    assert _packed_count(packed.model.backbone) == GROUPS
    _same_adapters(packed, plain)
    reqs = synthetic_requests(2, questions=5, shared_prefix=300, seed=7) + synthetic_requests(1, questions=3, seed=8)
    for share in (True, False):
        got, want = _scores(packed, reqs, share), _scores(plain, reqs, share)
        assert got[0].abs().max() > 0
        for a, b in zip(got, want):
            assert relative_error(a, b) < 1e-5


@pytest.mark.parametrize("targets", [None, ("o_proj", "out_proj", "down_proj")])
def test_lora_training_is_unaffected(monkeypatch, targets):
    """Loss and every trainable gradient with packing equal those without: default targets
    (adapters on members of every group) and targets that leave the q/k/v, qkv/b/a and gate/up
    groups plain. Every group packs either way and runs one GEMM inside the training graph."""
    from dohnuts.train.task import synthetic_requests

    lora = LoRAConfig(rank=4) if targets is None else LoRAConfig(rank=4, targets=targets)
    packed = api.load("tiny", lora=lora)
    plain = _unpacked_session(monkeypatch, lora=lora)
    assert _packed_count(packed.model.backbone) == GROUPS
    _same_adapters(packed, plain)
    (req,) = synthetic_requests(1, questions=5, shared_prefix=300, seed=4)
    out = []
    for s in (packed, plain):
        hb = s.prepare(req, train=True)
        assert hb.plan.prefix_len > 0
        s.model.zero_grad()
        s.model.train()
        loss = microbatch_loss(s.model, hb.tensors, RLCDConfig())
        loss.backward()
        out.append((float(loss.detach()), torch.cat([p.grad.flatten() for p in s.model.trainable_parameters()])))
    (loss_p, grad_p), (loss_u, grad_u) = out
    assert abs(loss_p - loss_u) < 1e-5 * max(1.0, abs(loss_u))
    assert relative_error(grad_p, grad_u) < 1e-5 and float(grad_u.norm()) > 0


def test_merge_packs_the_merged_projections():
    session = api.load("tiny", lora=LoRAConfig(rank=4))
    assert _packed_count(session.model.backbone) == GROUPS  # adapted groups pack their frozen bases
    with torch.no_grad():
        for m in session.model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.05)
    session.merge_lora()  # new plain linears, with weights of their own...
    assert not any(isinstance(m, LoRALinear) for m in session.model.modules())
    assert _packed_count(session.model.backbone) == GROUPS  # ...packed again


def test_attention_gate_sigmoid_needs_no_copy():
    """The premise of Attention's gate order: the sigmoid of the strided gate view (a column slice
    of the packed q/k/v output) comes out contiguous, so reshaping it to (B, T, Hq·D) is a view."""
    B, T, H, D = 2, 5, 4, 8
    out = torch.randn(B, T, H * 2 * D + 2 * 2 * D)  # q/gate interleaved per head, then k and v
    _, gate = out[..., :H * 2 * D].view(B, T, H, 2 * D).chunk(2, dim=-1)
    s = torch.sigmoid(gate)
    assert not gate.is_contiguous() and s.is_contiguous()
    assert s.reshape(B, T, H * D).data_ptr() == s.data_ptr()


def test_adapted_groups_read_their_input_widened_with_the_same_loss_and_gradients(monkeypatch):
    """Training's microbatch (its recomputation included) and a prediction: the groups whose input
    comes from a norm or SwiGLU written with spare columns (MLP gate/up and down, attention's keys
    and values, the mixer's qkv/b/a and then its in_proj_z, each in its own columns) run one GEMM
    over the widened input (dohnuts.ops.spare); out_proj, o_proj and the queries keep two (tiny's
    one attention layer is its last, whose queries run at the scored rows alone, on a gathered
    copy). Scores, loss and every trainable gradient equal the run where no group claims its
    spare columns (in float64: the gradients are sums that cancel, and FP32 would test rounding)."""
    from dohnuts.model import lora as lora_module
    from dohnuts.ops import spare
    from dohnuts.train.task import synthetic_requests

    session = api.load("tiny", lora=LoRAConfig(rank=4), dtype=torch.float64)
    _same_adapters(session)
    for m in session.model.modules():
        if isinstance(m, LoRALinear):  # FP64 masters too: the groups then compute in FP64 throughout
            m.lora_A.data, m.lora_B.data = m.lora_A.data.double(), m.lora_B.data.double()
    (req,) = synthetic_requests(1, questions=5, shared_prefix=300, seed=4)
    hb = session.prepare(req, train=True)
    wide_members: set[str] = set()
    names = {id(m): n for n, m in session.model.named_modules()}
    real_apply = lora_module._LinearGroup.apply

    def spy(x, xd, w, bias, c, ww, *masters):
        if ww is not None:
            wide_members.update(names[id(m)].rsplit(".", 1)[1] for m in c.lora)
        return real_apply(x, xd, w, bias, c, ww, *masters)

    monkeypatch.setattr(lora_module._LinearGroup, "apply", spy)
    out, scores = [], []
    for claims in (True, False):
        if not claims:
            monkeypatch.setattr(spare, "claim", lambda x, n, rows=None: None)
        wide_members.clear()
        session.model.eval()  # prediction (inference mode, where views record no base) claims alike
        with torch.inference_mode():
            scores.append(session.score(hb, hb.tensors)[0])
        if claims:
            assert wide_members == {"gate_proj", "up_proj", "down_proj", "k_proj", "v_proj", "in_proj_qkv",
                                    "in_proj_z"}
        wide_members.clear()
        session.model.zero_grad()
        session.model.train()
        loss = microbatch_loss(session.model, hb.tensors, RLCDConfig())
        loss.backward()
        out.append((float(loss.detach()),
                    torch.cat([p.grad.flatten() for p in session.model.trainable_parameters()])))
        if claims:
            assert wide_members == {"gate_proj", "up_proj", "down_proj", "k_proj", "v_proj", "in_proj_qkv",
                                    "in_proj_z"}
    (loss_w, grad_w), (loss_n, grad_n) = out
    assert relative_error(scores[0], scores[1]) < 1e-12
    assert abs(loss_w - loss_n) < 1e-12 * max(1.0, abs(loss_n))
    assert relative_error(grad_w, grad_n) < 1e-12 and float(grad_n.norm()) > 0


def test_columns_split_views_and_write_the_gradient_once():
    """`packing.columns`: y.split's views; a backward that concatenates the parts' gradients (zeros
    for a part without one), or — where the first part's gradient comes as the first columns of a
    buffer as wide as y (as the conv's backward writes it) — copies the others beside it and hands
    that buffer back as y's gradient, the same values."""
    from dohnuts.model.packing import columns

    class WideGrad(torch.autograd.Function):  # an op whose backward writes its gradient as the conv's does
        @staticmethod
        def forward(ctx, x, width):
            ctx.width = width
            return x * 2.0

        @staticmethod
        def backward(ctx, d):
            buf = torch.full((*d.shape[:-1], ctx.width), float("nan"))
            buf[..., :d.shape[-1]] = d * 2.0
            buffers.append(buf.data_ptr())
            return buf[..., :d.shape[-1]], None

    g = torch.Generator().manual_seed(0)
    y0 = torch.randn(3, 5, 12, generator=g)
    da, dc = torch.randn(3, 5, 7, generator=g), torch.randn(3, 5, 3, generator=g)
    grads, buffers, seen = {}, [], []
    for how in ("split", "columns", "wide"):
        y = y0.clone().requires_grad_()
        y1 = y * 1.0
        y1.register_hook(lambda gr: seen.append(gr.data_ptr()))
        a, b, c = y1.split([7, 2, 3], -1) if how == "split" else columns(y1, [7, 2, 3])
        assert [t.shape[-1] for t in (a, b, c)] == [7, 2, 3] and torch.equal(torch.cat([a, b, c], -1), y1)
        if how == "wide":
            a = WideGrad.apply(a, 12) / 2.0
        ((a * da).sum() + (c * dc).sum()).backward()  # b gets no gradient: its columns are zeros
        grads[how] = y.grad
    want = torch.cat([da, torch.zeros(3, 5, 2), dc], -1)
    assert torch.equal(grads["split"], want) and torch.equal(grads["columns"], want)
    assert torch.allclose(grads["wide"], want) and not grads["wide"].isnan().any()
    assert seen[-1] == buffers[0]  # y's gradient is the buffer the first part's backward wrote: no copy
    with torch.no_grad():  # without autograd: the plain views
        assert all(t._base is y0 for t in columns(y0, [7, 5]))
