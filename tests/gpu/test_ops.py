"""Fused ops against their plain-torch references on the GPU: forward and gradients at Qwen3.5's
head sizes, BF16 inputs for the fused path against FP32 references.
`test_gated_delta_rule_grad_parity_qwen_sizes` is the proof behind lifting fla's Hopper guard
(docs/known-issues.md KI-1): it runs the exact backward kernels the training path uses and must
pass wherever GPU tests run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dohnuts import ops
from dohnuts.ops._dispatch import reference as reference_ops  # private: the parity tooling's switch
from tests.gpu.helpers import BF16_TOL, DEV, _pair
from tests.reference import relative_error

pytestmark = pytest.mark.gpu


def test_this_gpu_runs_the_fused_kernels():
    """The device probe passes on a GPU we have kernels for, and ops take their fused paths; also
    when the probe first runs under a training step's autocast and autograd."""
    from dohnuts.ops._dispatch import _REFERENCE, kernel_status, use_fused

    from dohnuts.ops._dispatch import probe_fused_kernels

    x = torch.ones(4, device=DEV)
    assert kernel_status(x.device) == "fused"
    # a first fused call under a training step's autocast and autograd: the probe ignores both
    # (a failed probe would put every later op on its reference path)
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.enable_grad():
        probe_fused_kernels(x.device)
    assert not _REFERENCE.get()
    assert use_fused(x)


def test_rms_norm_and_gated_norm():
    from dohnuts.ops.norm import gated_rms_norm_fused, gated_rms_norm_reference, rms_norm_fused, rms_norm_reference

    xb, xf = _pair(4, 77, 2048)
    w = 1.0 + 0.1 * torch.randn(2048, device=DEV)
    yb = rms_norm_fused(xb, w, 1e-6)
    yf = rms_norm_reference(xf, w, 1e-6)
    assert relative_error(yb.float(), yf) < BF16_TOL
    go = torch.randn_like(yf)
    yb.backward(go.bfloat16())
    yf.backward(go)
    assert relative_error(xb.grad.float(), xf.grad) < BF16_TOL

    xb, xf = _pair(4 * 77 * 16, 128, seed=1)
    gb, gf = _pair(4 * 77 * 16, 128, seed=2)
    wn = (1.0 + 0.1 * torch.randn(128, device=DEV))
    yb = gated_rms_norm_fused(xb, gb, wn.bfloat16(), 1e-6)
    yf = gated_rms_norm_reference(xf, gf, wn, 1e-6)
    assert relative_error(yb.float(), yf) < BF16_TOL
    go = torch.randn_like(yf)
    yb.backward(go.bfloat16())
    yf.backward(go)
    assert relative_error(xb.grad.float(), xf.grad) < BF16_TOL
    assert relative_error(gb.grad.float(), gf.grad) < BF16_TOL


def test_swiglu():
    from dohnuts.ops.activation import swiglu_fused, swiglu_reference

    ab, af = _pair(8, 128, 6144, seed=3)
    bb, bf = _pair(8, 128, 6144, seed=4)
    yb, yf = swiglu_fused(ab, bb), swiglu_reference(af, bf)
    assert relative_error(yb.float(), yf) < BF16_TOL
    go = torch.randn_like(yf)
    yb.backward(go.bfloat16())
    yf.backward(go)
    assert relative_error(ab.grad.float(), af.grad) < BF16_TOL
    assert relative_error(bb.grad.float(), bf.grad) < BF16_TOL


def test_causal_conv1d_with_state():
    from dohnuts.ops.conv import causal_conv1d_fused, causal_conv1d_reference

    D = 2 * 16 * 128 + 16 * 128  # Qwen3.5-2b conv width
    xb, xf = _pair(3, 130, D, seed=5)
    wb, wf = _pair(D, 4, scale=0.5, seed=6)
    sb, sf = _pair(3, D, 4, seed=7)
    yb, stb = causal_conv1d_fused(xb, wb, sb, True)
    yf, stf = causal_conv1d_reference(xf, wf, sf, True)
    assert relative_error(yb.float(), yf) < BF16_TOL
    assert relative_error(stb.float(), stf) < BF16_TOL
    go = torch.randn_like(yf)
    yb.backward(go.bfloat16())
    yf.backward(go)
    for a, b in ((xb, xf), (wb, wf), (sb, sf)):
        assert relative_error(a.grad.float(), b.grad) < BF16_TOL


@pytest.mark.parametrize("tk", [300, 300 + 448])  # without and with a cached past (shared prefix)
def test_attention_gqa(tk):
    from dohnuts.ops.attention import causal_attention_fused, causal_attention_reference

    qb, qf = _pair(2, 8, 300, 256, seed=8)
    kb, kf = _pair(2, 2, tk, 256, seed=9)
    vb, vf = _pair(2, 2, tk, 256, seed=10)
    yb = causal_attention_fused(qb, kb, vb, 256 ** -0.5)
    yf = causal_attention_reference(qf, kf, vf, 256 ** -0.5)
    assert relative_error(yb.float(), yf) < BF16_TOL
    go = torch.randn_like(yf)
    yb.backward(go.bfloat16())
    yf.backward(go)
    for a, b in ((qb, qf), (kb, kf), (vb, vf)):
        assert relative_error(a.grad.float(), b.grad) < BF16_TOL


@pytest.mark.parametrize("heads", [(16, 16), (16, 32)])  # (H, HV): 0.8b/2b and 4b/9b
def test_gated_delta_rule_grad_parity_qwen_sizes(heads):
    """The chunked delta rule (BF16; dohnuts' forward kernels, fla's backward kernels) on explicit
    gates vs the chunked FP32 reference: outputs, final state and every input gradient, K = V =
    128, T not a multiple of 64, with an initial state."""
    from dohnuts.ops.delta_rule import gated_delta_rule_fused, gated_delta_rule_reference

    H, HV = heads
    B, T, K = 2, 500, 128
    qb, qf = _pair(B, T, H, K, seed=11)
    kb, kf = _pair(B, T, H, K, seed=12)
    vb, vf = _pair(B, T, HV, K, seed=13)
    g0 = -F.softplus(torch.randn(B, T, HV, device=DEV)) * 0.5
    gb, gf = g0.clone().requires_grad_(), g0.clone().requires_grad_()
    b0 = torch.rand(B, T, HV, device=DEV)
    bb, bf = b0.bfloat16().requires_grad_(), b0.clone().requires_grad_()
    h0 = torch.randn(B, HV, K, K, device=DEV) * 0.1
    hb, hf = h0.clone().requires_grad_(), h0.clone().requires_grad_()
    ob, sb = gated_delta_rule_fused(qb, kb, vb, gb, bb, initial_state=hb, output_final_state=True)
    of, sf = gated_delta_rule_reference(qf, kf, vf, gf, bf, initial_state=hf, output_final_state=True)
    assert relative_error(ob.float(), of) < BF16_TOL
    assert relative_error(sb.float(), sf) < BF16_TOL
    go, gs = torch.randn_like(of), torch.randn_like(sf)
    (ob.float() * go).sum().add_((sb.float() * gs).sum()).backward()
    ((of * go).sum() + (sf * gs).sum()).backward()
    for name, a, b in (("dq", qb, qf), ("dk", kb, kf), ("dv", vb, vf), ("dg", gb, gf), ("dbeta", bb, bf),
                       ("dh0", hb, hf)):
        err = relative_error(a.grad.float(), b.grad)
        assert err < BF16_TOL, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("past", [0, 448])  # a whole pass, and suffix queries over a prefix's keys
def test_attention_at_the_scored_queries(past):
    """The last layer's attention of a few queries per row (2b's heads, BF16, SDPA's masked
    kernel) against the FP32 reference; and the whole backbone pruned to a grid of rows against
    the whole pass picked at those rows."""
    from dohnuts.ops.attention import attention_at_fused, attention_at_reference

    B, Q, T = 32, 4, 512
    qb, qf = _pair(B, 8, Q, 256, seed=11)
    kb, kf = _pair(B, 2, past + T, 256, seed=12)
    vb, vf = _pair(B, 2, past + T, 256, seed=13)
    limit = past + torch.randint(0, T, (B, Q), device=DEV)
    with torch.no_grad():
        yb = attention_at_fused(qb, kb, vb, limit, 256 ** -0.5)
        yf = attention_at_reference(qf, kf, vf, limit, 256 ** -0.5)
    assert relative_error(yb.float(), yf) < BF16_TOL


def test_add_rms_norm():
    """The fused residual add + RMSNorm (Triton, forward and backward) against add-then-norm in FP32: output, new
    residual and the gradients of both inputs and of the weight."""
    from dohnuts.ops.norm import add_rms_norm_fused, add_rms_norm_reference

    xb, xf = _pair(4, 77, 2048, seed=21)
    rb, rf = _pair(4, 77, 2048, seed=22)
    wb = (1.0 + 0.1 * torch.randn(2048, device=DEV)).requires_grad_()
    wf = wb.detach().clone().requires_grad_()
    yb, sb = add_rms_norm_fused(xb, rb, wb, 1e-6)
    yf, sf = add_rms_norm_reference(xf, rf, wf, 1e-6)
    assert sb.dtype == rb.dtype and yb.dtype == xb.dtype
    assert relative_error(yb.float(), yf) < BF16_TOL and relative_error(sb.float(), sf) < BF16_TOL
    gy, gs = torch.randn_like(yf), torch.randn_like(sf)
    ((yb.float() * gy).sum() + (sb.float() * gs).sum()).backward()
    ((yf * gy).sum() + (sf * gs).sum()).backward()
    for a, b in ((xb, xf), (rb, rf), (wb, wf)):
        assert relative_error(a.grad.float(), b.grad) < BF16_TOL


@pytest.mark.parametrize("shape", [(8, 512, 2 * 6144), (3, 77, 2 * 1500)])  # 2b's MLP; partial blocks
def test_swiglu_packed_kernel(shape):
    """The Triton kernel on a packed gate/up tensor (BF16) against the FP32 reference: a plain GEMM
    output, and rows strided like a column slice of a wider one; `reference_ops()` switches the op."""
    from dohnuts.ops._swiglu_kernel import swiglu_packed_triton
    from dohnuts.ops.activation import swiglu_packed, swiglu_packed_fused, swiglu_packed_reference

    g = torch.Generator(device=DEV).manual_seed(31)
    gu = (torch.randn(*shape, device=DEV, generator=g) * 2).bfloat16()
    want = swiglu_packed_reference(gu.float())
    y = swiglu_packed_triton(gu)
    assert y.dtype == torch.bfloat16 and y.shape == want.shape and y.is_contiguous()
    assert relative_error(y.float(), want) < 1e-2  # one BF16 rounding of an FP32 result
    wide = torch.randn(*shape[:-1], shape[-1] + 80, device=DEV, generator=g).bfloat16()
    strided = wide[..., 16:16 + shape[-1]]
    assert relative_error(swiglu_packed_triton(strided).float(), swiglu_packed_reference(strided.float())) < 1e-2
    with torch.no_grad():
        assert torch.equal(swiglu_packed(gu), y)  # the dispatcher takes the kernel on CUDA
        with reference_ops():
            assert torch.equal(swiglu_packed(gu), swiglu_packed_reference(gu))
    # Under autograd (training through a packed MLP) the same kernel, and its backward kernel.
    gb, gf = gu.clone().requires_grad_(), gu.float().requires_grad_()
    yb, yf = swiglu_packed_fused(gb), swiglu_packed_reference(gf)
    go = torch.randn_like(yf)
    yb.backward(go.bfloat16())
    yf.backward(go)
    assert relative_error(yb.float(), yf) < BF16_TOL
    assert relative_error(gb.grad.float(), gf.grad) < BF16_TOL


@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv1d_parts(with_state):
    """The parts of 2b's q/k/v split from one launch of dohnuts' conv kernel on the column slice of a
    wider packed GEMM output: contiguous outputs equal to fla's one conv then split, the state in
    and out in the one-conv layout."""
    from dohnuts.ops.conv import causal_conv1d_fused, causal_conv1d_parts_fused, causal_conv1d_reference

    sizes = [16 * 128, 16 * 128, 16 * 128]
    D = sum(sizes)
    g = torch.Generator(device=DEV).manual_seed(41)
    packed = torch.randn(3, 130, D + 32, device=DEV, generator=g).bfloat16()  # + in_proj_b/a columns
    x = packed[..., :D]
    w = (torch.randn(D, 4, device=DEV, generator=g) * 0.5).bfloat16()
    s0 = torch.randn(3, D, 4, device=DEV, generator=g).bfloat16() if with_state else None
    with torch.no_grad():
        parts, state = causal_conv1d_parts_fused(x, w, sizes, s0, True)
        one, one_state = causal_conv1d_fused(x, w, s0, True)
    ref, ref_state = causal_conv1d_reference(x.float(), w.float(), None if s0 is None else s0.float(), True)
    assert all(p.is_contiguous() for p in parts) and state.shape == (3, D, 4)
    assert relative_error(torch.cat(parts, -1).float(), one.float()) < 1e-3
    assert torch.equal(state, one_state)  # the state is the last W inputs: copied, not computed
    assert relative_error(torch.cat(parts, -1).float(), ref) < BF16_TOL
    assert relative_error(state.float(), ref_state) < BF16_TOL


def test_norm_kernels_forward_and_backward():
    """The Triton kernels at Qwen3.5-2b sizes (BF16) against FP32 references: RMSNorm with the
    (1 + w) offset, with and without the residual add; per-head norm + rotary on q read in place
    from the packed projection (query and gate interleaved) and on k; the attention output gate.
    Under autograd the same forward kernels run (equal bits) and their backward kernels' gradients
    match FP32's."""
    from dohnuts.model.rope import rotary_cos_sin, text_positions
    from dohnuts.config import preset
    from dohnuts.ops.norm import add_rms_norm_reference, rms_norm_reference
    from dohnuts.ops.rope import norm_rope_reference

    g = torch.Generator(device=DEV).manual_seed(41)
    x = torch.randn(8, 333, 2048, device=DEV, generator=g).bfloat16()
    r = torch.randn(8, 333, 2048, device=DEV, generator=g).bfloat16()
    w = (0.1 * torch.randn(2048, device=DEV, generator=g)).bfloat16()
    with torch.no_grad():
        y = ops.rms_norm(x, w, 1e-6, weight_offset=1.0)
        ya, s = ops.add_rms_norm(x, r, w, 1e-6, weight_offset=1.0)
    assert relative_error(y.float(), rms_norm_reference(x.float(), w, 1e-6, 1.0)) < 1e-2
    ya_ref, s_ref = add_rms_norm_reference(x.float(), r.float(), w, 1e-6, 1.0)
    assert s.dtype == torch.bfloat16 and relative_error(s.float(), s_ref) < 1e-2
    assert relative_error(ya.float(), ya_ref) < 1e-2

    cfg = preset("qwen3.5-2b").text
    B, T, hq, hkv, d = 4, 333, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qkv = torch.randn(B, T, hq * 2 * d + 2 * hkv * d, device=DEV, generator=g).bfloat16()
    qg, k, _ = qkv.split([hq * 2 * d, hkv * d, hkv * d], dim=-1)
    q = qg.view(B, T, hq, 2 * d)[..., :d]  # strided: the gate sits between heads
    k = k.view(B, T, hkv, d)
    cos, sin = rotary_cos_sin(cfg, text_positions(B, T, 100, DEV), torch.bfloat16)
    wq = (0.1 * torch.randn(d, device=DEV, generator=g)).bfloat16()
    for t in (q, k):
        with torch.no_grad():
            got = ops.norm_rope(t, wq, 1e-6, 1.0, cos, sin)
        want = norm_rope_reference(t.float(), wq, 1e-6, 1.0, cos.float(), sin.float())
        assert got.shape == want.shape and got.is_contiguous()
        assert relative_error(got.float(), want) < 1e-2
        # Under autograd the same kernel runs: the same bits, and its backward against FP32's.
        tg, tf = t.detach().clone().requires_grad_(), t.detach().float().requires_grad_()
        yg = ops.norm_rope(tg, wq, 1e-6, 1.0, cos, sin)
        assert torch.equal(yg, got)
        go = torch.randn_like(want)
        yg.backward(go.bfloat16())
        norm_rope_reference(tf, wq, 1e-6, 1.0, cos.float(), sin.float()).backward(go)
        assert relative_error(tg.grad.float(), tf.grad) < BF16_TOL
    # The output gate: attention's o (B, Hq, T, D) times sigmoid of the strided gate view.
    from dohnuts.ops.attention import gated_output_reference

    o = torch.randn(B, hq, T, d, device=DEV, generator=g).bfloat16()
    gate = qg.view(B, T, hq, 2 * d)[..., d:]
    with torch.no_grad():
        got = ops.gated_output(o, gate)
    assert got.shape == (B, T, hq * d)
    assert relative_error(got.float(), gated_output_reference(o.float(), gate.float())) < 1e-2
    ob, of = o.clone().requires_grad_(), o.float().requires_grad_()
    gb, gf = gate.detach().clone().requires_grad_(), gate.detach().float().requires_grad_()
    yb = ops.gated_output(ob, gb)
    assert torch.equal(yb, got)
    go = torch.randn(B, T, hq * d, device=DEV, generator=g)
    yb.backward(go.bfloat16())
    gated_output_reference(of, gf).backward(go)
    assert relative_error(ob.grad.float(), of.grad) < BF16_TOL
    assert relative_error(gb.grad.float(), gf.grad) < BF16_TOL


def test_conv_qkv_normalises_q_and_k_in_every_pass():
    """Every pass (stateless; a prefix returning its state; a suffix from a per-row or a forked,
    batch-broadcast state): q and k from one conv + SiLU + L2-norm kernel each equal the conv
    followed by the delta rule's L2 norm (FP32 reference), v equals the plain conv, the final state
    equals the reference's; under autograd the same kernel gives the same tensors, bitwise."""
    from dohnuts.config import preset
    from dohnuts.ops.conv import causal_conv1d_parts_reference, causal_conv1d_qkv
    from dohnuts.ops.delta_rule import _l2norm

    cfg = preset("qwen3.5-2b").text
    sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
    D, hd, W = sum(sizes), cfg.linear_key_head_dim, cfg.linear_conv_kernel_dim
    g = torch.Generator(device=DEV).manual_seed(47)
    for B in (4, 16):
        packed = torch.randn(B, 333, D + 32, device=DEV, generator=g).bfloat16()  # + b and a columns
        x = packed[..., :D]
        w = (0.3 * torch.randn(D, W, device=DEV, generator=g)).bfloat16()
        rows = torch.randn(B, D, W, device=DEV, generator=g).bfloat16()
        forked = torch.randn(1, D, W, device=DEV, generator=g).bfloat16().expand(B, -1, -1)
        for s0, out_state in ((None, False), (None, True), (rows, False), (forked, False), (forked, True)):
            with torch.no_grad():
                (q, k, v), state, normalised = causal_conv1d_qkv(x, w, sizes, hd, s0, out_state)
            assert normalised and (state is None) == (not out_state)
            # one launch: the parts are consecutive blocks of one buffer
            assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
            (qr, kr, vr), sr = causal_conv1d_parts_reference(x.float(), w.float(), sizes,
                                                             None if s0 is None else s0.float(), True)
            for got, want in ((q, qr), (k, kr)):
                want = _l2norm(want.view(B, 333, -1, hd)).view(want.shape)
                assert got.is_contiguous() and relative_error(got.float(), want) < 1e-2
            assert relative_error(v.float(), vr) < 1e-2
            if out_state:
                assert state.shape == (B, D, W) and torch.equal(state.float(), sr)
    xg = x.detach().requires_grad_()
    (qg, kg, vg), state_g, normalised = causal_conv1d_qkv(xg, w, sizes, hd, forked, True)
    with torch.no_grad():
        (q, k, v), state, _ = causal_conv1d_qkv(x, w, sizes, hd, forked, True)
    assert normalised and qg.requires_grad and all(torch.equal(a, b) for a, b in ((qg, q), (kg, k), (vg, v)))
    assert torch.equal(state_g, state)


@pytest.mark.parametrize("state", [None, "rows", "forked"])
def test_conv_qkv_gradients_qwen_sizes(state):
    """The conv kernel's backward (dohnuts' Triton) at Qwen3.5-2b sizes, BF16, against autograd
    through the FP32 reference (conv, then the L2 norm of q and k): the gradients of the packed
    projection (x a column slice of it), the conv weight and the initial state — per row, or a
    forked (stride-0) view of one state in the graph, whose branches' gradients add up — with the
    final state's gradient too."""
    from dohnuts.config import preset
    from dohnuts.ops.conv import causal_conv1d_parts_reference, causal_conv1d_qkv
    from dohnuts.ops.delta_rule import _l2norm

    cfg = preset("qwen3.5-2b").text
    sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
    D, hd, W = sum(sizes), cfg.linear_key_head_dim, cfg.linear_conv_kernel_dim
    B, T = 4, 333
    pb, pf = _pair(B, T, D + 32, seed=48)
    wb, wf = _pair(D, W, scale=0.3, seed=49)
    sb = sf = None
    if state is not None:
        sb, sf = _pair(1 if state == "forked" else B, D, W, seed=50)
    g = torch.Generator(device=DEV).manual_seed(51)
    dys = [torch.randn(B, T, n, device=DEV, generator=g) for n in sizes]
    dst = torch.randn(B, D, W, device=DEV, generator=g)
    (qb, kb, vb), stb, normalised = causal_conv1d_qkv(pb[..., :D], wb, sizes, hd,
                                                      None if sb is None else sb.expand(B, -1, -1), True)
    assert normalised
    parts, stf = causal_conv1d_parts_reference(pf[..., :D], wf, sizes, None if sf is None else sf.expand(B, -1, -1),
                                               True)
    qf, kf, vf = (_l2norm(p.view(B, T, -1, hd)).view(p.shape) if i < 2 else p for i, p in enumerate(parts))
    for got, want in ((qb, qf), (kb, kf), (vb, vf)):
        assert relative_error(got.float(), want) < BF16_TOL
    sum((y.float() * dy).sum() for y, dy in zip((qb, kb, vb), dys)).add((stb.float() * dst).sum()).backward()
    sum((y * dy).sum() for y, dy in zip((qf, kf, vf), dys)).add((stf * dst).sum()).backward()
    for name, a, b in (("dx", pb, pf), ("dweight", wb, wf), ("dstate", sb, sf)):
        if b is not None:
            err = relative_error(a.grad.float(), b.grad)
            assert err < BF16_TOL, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("P, B, L", [(448, 32, 64), (192, 8, 262), (2, 3, 5)])
def test_shared_conv_equals_its_two_calls_qwen_sizes(P, B, L):
    """`causal_conv1d_qkv_shared`'s one launch over a shared pass's rows (each suffix's history the
    prefix's last rows, read in place) at Qwen3.5-2b sizes, BF16: its q, k and v within one BF16
    step of the two calls it replaces (the prefix's, then the suffixes' from its final state,
    forked; bit for bit in the interpreter at one block size — here each launch's tuned config
    orders the L2 norm's sum its own way), and its gradients (the packed projection, x a column slice of it; the conv weight) within BF16
    rounding of theirs and of the FP32 reference's. Shapes: shared-prefix-2b's, image-cache-warm-2b's
    (suffixes not a whole number of blocks), a prefix and suffixes shorter than the conv."""
    from dohnuts.config import preset
    from dohnuts.ops.conv import causal_conv1d_qkv, causal_conv1d_qkv_shared
    from dohnuts.ops.delta_rule import _l2norm

    cfg = preset("qwen3.5-2b").text
    sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
    D, hd = sum(sizes), cfg.linear_key_head_dim
    R = P + B * L
    pb, pf = _pair(R, D + 32, seed=60)
    wb, wf = _pair(D, cfg.linear_conv_kernel_dim, scale=0.3, seed=61)
    g = torch.Generator(device=DEV).manual_seed(62)
    dys = [torch.randn(R, n, device=DEV, generator=g) for n in sizes]

    def two_calls(x, w):
        parts_p, st, normalised = causal_conv1d_qkv(x[:P].view(1, P, D), w, sizes, hd, None, True)
        parts_s, _, _ = causal_conv1d_qkv(x[P:].view(B, L, D), w, sizes, hd, st.expand(B, -1, -1), False)
        ys = [torch.cat([a.reshape(P, -1), b.reshape(B * L, -1)]) for a, b in zip(parts_p, parts_s)]
        return ys if normalised else [_l2norm(y.view(R, -1, hd)).view(y.shape) if i < 2 else y for i, y in enumerate(ys)]

    grads = {}
    for how in ("one launch", "two calls"):
        pb.grad = wb.grad = None
        if how == "one launch":
            parts, normalised = causal_conv1d_qkv_shared(pb[:, :D], wb, sizes, hd, P, L)
            assert normalised and all(y.is_contiguous() and y.shape == (R, n) for y, n in zip(parts, sizes))
            ours = [y.detach() for y in parts]
        else:
            parts = two_calls(pb[:, :D], wb)
            for name, a, b in zip("qkv", ours, parts):  # each output within one BF16 step of theirs
                a, b = a.float(), b.float()
                worst = ((a - b).abs() / b.abs().clamp_min(1e-30)).max().item()
                assert worst <= 2 ** -7, f"{name}: {worst:.2e} from the two calls' (relative, largest)"
        sum((y.float() * dy).sum() for y, dy in zip(parts, dys)).backward()
        grads[how] = (pb.grad.float(), wb.grad.float())
    with reference_ops():
        sum((y.float() * dy).sum() for y, dy in zip(two_calls(pf[:, :D], wf), dys)).backward()
    for i, name in enumerate(("dx", "dweight")):
        err = relative_error(grads["one launch"][i], grads["two calls"][i])
        assert err < BF16_TOL, f"{name} against the two calls: relative error {err:.2e}"
        want = (pf.grad, wf.grad)[i]
        assert relative_error(grads["one launch"][i], want) <= 1.05 * relative_error(grads["two calls"][i], want) + 1e-4, name


def test_fork_and_kv_append_copies_are_exact():
    """Outside autograd a fork is views (no copies: the conv and delta-rule kernels read strides);
    the broadcast-copy kernel behind the append of a forked prefix's keys/values (2b sizes) and a
    dense copy of a recurrent state are exactly torch's copies."""
    from dohnuts.model.state import LinearAttentionState
    from dohnuts.ops.copy import copy4d

    g = torch.Generator(device=DEV).manual_seed(53)
    rec = torch.randn(1, 16, 128, 128, device=DEV, generator=g)
    conv = torch.randn(1, 6144, 4, device=DEV, generator=g).bfloat16()
    with torch.no_grad():
        f = LinearAttentionState(conv, rec).fork(32)
        dense = copy4d(torch.empty(32, 16, 128, 128, device=DEV), f.recurrent)
    assert f.recurrent.stride(0) == 0 and f.conv.stride(0) == 0  # views of the one prefix state
    assert torch.equal(f.recurrent, rec.expand(32, -1, -1, -1)) and torch.equal(f.conv, conv.expand(32, -1, -1))
    assert torch.equal(dense, rec.expand(32, -1, -1, -1))
    past = torch.randn(1, 2, 448, 256, device=DEV, generator=g).bfloat16().expand(32, -1, -1, -1)
    new = torch.randn(32, 64, 2, 256, device=DEV, generator=g).bfloat16().transpose(1, 2)  # values' layout
    out = torch.full((32, 2, 512, 256), float("nan"), device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        copy4d(out[:, :, :448], past)
        copy4d(out[:, :, 448:], new)
    assert torch.equal(out, torch.cat([past, new], dim=2))


def test_vision_rotary_kernel_rounds_like_the_reference():
    """The vision tower's rotary at 2b sizes (784 patches, 16 heads of 64) read from the packed
    projection: the kernel's FP32 arithmetic rounded once to BF16 equals the reference's, up to
    one BF16 step where the GPU contracts a product and a sum into one FMA (a last-bit FP32
    difference that can cross a rounding boundary)."""
    from dohnuts.ops.rope import rotary_qk_fused, rotary_qk_reference

    g = torch.Generator(device=DEV).manual_seed(0)
    N, H, D = 784, 16, 64
    qkv = torch.randn(N, 3, H, D, device=DEV, generator=g).bfloat16()
    ang = torch.randn(N, 1, D // 2, device=DEV, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    for got, want in zip(rotary_qk_fused(qkv, cos, sin), rotary_qk_reference(qkv, cos, sin)):
        diff = (got.float() - want.float()).abs()
        assert (diff <= want.float().abs() * 2.0 ** -7).all()
        assert (diff > 0).float().mean() < 0.01  # rounding differences only, not a different rotation


def test_vision_layer_norm_kernel_rounds_like_the_reference():
    """The tower's residual add + LayerNorm at 2b sizes (784 patches of 1024, BF16): the stream
    equal to torch's add bit for bit, the norm within one BF16 step of F.layer_norm of it (the
    FP32 reduction's order) and few elements apart; the same without a residual."""
    from dohnuts.ops.norm import add_layer_norm, add_layer_norm_reference, layer_norm, layer_norm_reference

    g = torch.Generator(device=DEV).manual_seed(0)
    x = (torch.randn(784, 1024, device=DEV, generator=g) * 3 + 1).bfloat16()
    r = torch.randn(784, 1024, device=DEV, generator=g).bfloat16()
    w = (torch.randn(1024, device=DEV, generator=g) * 0.2 + 1).bfloat16()
    b = (torch.randn(1024, device=DEV, generator=g) * 0.2).bfloat16()
    y, s = add_layer_norm(x, r, w, b, 1e-6)
    y_ref, s_ref = add_layer_norm_reference(x, r, w, b, 1e-6)
    assert torch.equal(s, s_ref)
    for got, want in ((y, y_ref), (layer_norm(x, w, b, 1e-6), layer_norm_reference(x, w, b, 1e-6))):
        diff = (got.float() - want.float()).abs()
        assert (diff <= want.float().abs() * 2.0 ** -7 + 1e-5).all()
        assert (diff > 0).float().mean() < 0.05  # rounding differences only


def test_vision_attention_kernel_against_sdpa():
    """The tower's attention (16 heads of 64, BF16) as the tower calls it — q and k contiguous, v a
    strided view of the packed projection — one 448² image (784 patches, a partial key block), four
    of them and one of 1,024 patches: the Triton kernel as close to the FP32 attention as SDPA's
    (cuDNN) BF16 result, bit for bit the same from launch to launch, and segments of two lengths on
    the reference path."""
    from dohnuts.ops.attention import block_diagonal_attention, block_diagonal_attention_reference

    g = torch.Generator(device=DEV).manual_seed(0)
    for n_seg, length in ((1, 784), (4, 784), (1, 1024)):
        qkv = torch.randn(n_seg * length, 3, 16, 64, device=DEV, generator=g).bfloat16()
        q, k, v = qkv[:, 0].contiguous() * 2, qkv[:, 1].contiguous(), qkv[:, 2]
        seqlens = [length] * n_seg
        exact = block_diagonal_attention_reference(q.float(), k.float(), v.float(), seqlens)
        got, sdpa = block_diagonal_attention(q, k, v, seqlens), block_diagonal_attention_reference(q, k, v, seqlens)
        assert got.dtype == torch.bfloat16 and got.shape == q.shape and got.is_contiguous()
        assert relative_error(got.float(), exact) <= 1.25 * relative_error(sdpa.float(), exact), (n_seg, length)
        assert torch.equal(got, block_diagonal_attention(q, k, v, seqlens))
    mixed = [784, 1024]
    qkv = torch.randn(sum(mixed), 3, 16, 64, device=DEV, generator=g).bfloat16()
    q, k, v = qkv[:, 0].contiguous(), qkv[:, 1].contiguous(), qkv[:, 2]
    assert torch.equal(block_diagonal_attention(q, k, v, mixed), block_diagonal_attention_reference(q, k, v, mixed))


def test_vision_mlp_gelu_in_the_gemm_epilogue():
    """fc1 with its GELU in the GEMM's epilogue: in FP32 within 2e-5 of gelu_tanh(linear) and not
    the exact (erf) GELU (they differ by up to 5e-4); in BF16 at 2b sizes (784 × 1024 → 4096) at
    least as close to the FP32 result as the unfused path, which rounds the product before the
    activation (up to 10 %)."""
    from dohnuts.ops.activation import linear_gelu_tanh, linear_gelu_tanh_reference

    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(784, 1024, device=DEV, generator=g)
    w = torch.randn(4096, 1024, device=DEV, generator=g) / 32
    b = torch.randn(4096, device=DEV, generator=g) * 0.1
    got = linear_gelu_tanh(x, w, b)
    assert (got - linear_gelu_tanh_reference(x, w, b)).abs().max() < 2e-5
    assert (got - F.gelu(F.linear(x, w, b))).abs().max() > 1e-4
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    exact = linear_gelu_tanh_reference(xb.float(), wb.float(), bb.float())
    fused, unfused = linear_gelu_tanh(xb, wb, bb), linear_gelu_tanh_reference(xb, wb, bb)
    assert fused.dtype == torch.bfloat16 and fused.shape == (784, 4096)
    assert relative_error(fused.float(), exact) <= 1.1 * relative_error(unfused.float(), exact)
