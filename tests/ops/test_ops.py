"""Reference ops on the CPU: each against an independent formulation, and state hand-over."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dohnuts.ops.attention import causal_attention_reference
from dohnuts.ops.conv import causal_conv1d_reference
from dohnuts.ops.delta_rule import gated_delta_rule_recurrent, gated_delta_rule_reference
from dohnuts.ops.norm import gated_rms_norm_reference, rms_norm_reference
from tests.reference import relative_error


def _gdr_inputs(B=2, T=150, H=2, HV=4, K=16, V=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g)
    k = torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, HV, V, generator=g)
    gate = -F.softplus(torch.randn(B, T, HV, generator=g))  # log decay <= 0
    beta = torch.rand(B, T, HV, generator=g)
    h0 = torch.randn(B, HV, K, V, generator=g) * 0.1
    return q, k, v, gate, beta, h0


@pytest.mark.parametrize("T", [1, 63, 64, 150])
def test_chunked_delta_rule_equals_recurrence(T):
    q, k, v, g, beta, h0 = _gdr_inputs(T=T)
    o1, s1 = gated_delta_rule_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o2, s2 = gated_delta_rule_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert relative_error(o1, o2) < 1e-5
    assert relative_error(s1, s2) < 1e-5


def test_delta_rule_state_handover():
    q, k, v, g, beta, _ = _gdr_inputs(T=200)
    o, s = gated_delta_rule_reference(q, k, v, g, beta, output_final_state=True)
    o_a, s_a = gated_delta_rule_reference(q[:, :77], k[:, :77], v[:, :77], g[:, :77], beta[:, :77],
                                          output_final_state=True)
    o_b, s_b = gated_delta_rule_reference(q[:, 77:], k[:, 77:], v[:, 77:], g[:, 77:], beta[:, 77:],
                                          initial_state=s_a, output_final_state=True)
    assert relative_error(torch.cat([o_a, o_b], 1), o) < 1e-5
    assert relative_error(s_b, s) < 1e-5


def test_delta_rule_single_token_by_hand():
    """One token from a zero state: S = beta · k̂ vᵀ, o = (scale · q̂)ᵀ S."""
    q, k, v, g, beta, _ = _gdr_inputs(B=1, T=1, H=1, HV=1, K=4, V=3)
    o, s = gated_delta_rule_reference(q, k, v, g, beta, output_final_state=True)
    qn, kn = F.normalize(q[0, 0, 0], dim=0), F.normalize(k[0, 0, 0], dim=0)
    S = beta[0, 0, 0] * torch.outer(kn, v[0, 0, 0])
    assert torch.allclose(s[0, 0], S, atol=1e-5)
    assert torch.allclose(o[0, 0, 0], (qn * 4 ** -0.5) @ S, atol=1e-5)


def test_conv_matches_padded_conv1d_and_hands_over_state():
    B, T, D, W = 2, 40, 12, 4
    x = torch.randn(B, T, D)
    w = torch.randn(D, W)
    y, state = causal_conv1d_reference(x, w, output_final_state=True)
    expect = F.silu(F.conv1d(x.transpose(1, 2), w.unsqueeze(1), padding=W - 1, groups=D)[..., :T]).transpose(1, 2)
    assert torch.allclose(y, expect, atol=1e-6)
    assert torch.equal(state, x[:, -W:].transpose(1, 2))
    ya, sa = causal_conv1d_reference(x[:, :13], w, output_final_state=True)
    yb, sb = causal_conv1d_reference(x[:, 13:], w, initial_state=sa, output_final_state=True)
    assert torch.allclose(torch.cat([ya, yb], 1), y, atol=1e-6)
    assert torch.equal(sb, state)


def test_attention_with_cached_past_equals_full():
    B, Hq, Hkv, T, D = 2, 4, 2, 30, 8
    q, k, v = torch.randn(B, Hq, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    full = causal_attention_reference(q, k, v, D ** -0.5)
    sdpa = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    assert torch.allclose(full, sdpa, atol=1e-5)
    tail = causal_attention_reference(q[:, :, 11:], k, v, D ** -0.5)
    assert torch.allclose(tail, full[:, :, 11:], atol=1e-6)


def test_norms_by_hand():
    x = torch.tensor([[3.0, 4.0]])
    w = torch.tensor([2.0, 0.5])
    rms = (12.5 + 1e-6) ** 0.5
    assert torch.allclose(rms_norm_reference(x, w, 1e-6), torch.tensor([[6 / rms, 2 / rms]]))
    gate = torch.tensor([[0.0, 1.0]])
    y = gated_rms_norm_reference(x, gate, w, 1e-6)
    assert torch.allclose(y, torch.tensor([[0.0, 2 / rms * F.silu(torch.tensor(1.0))]]))


class _FakeCuda:
    """Stands in for a CUDA tensor: the dispatch asks `is_cuda` and its device's kernel verdict."""

    is_cuda = True
    device = torch.device("cuda", 0)


def test_reference_switch_is_explicit_scoped_and_per_thread(monkeypatch):
    import threading

    from dohnuts.ops import _dispatch
    from dohnuts.ops._dispatch import reference as reference_ops
    from dohnuts.ops._dispatch import use_fused

    monkeypatch.setattr(_dispatch, "_KERNELS", _dispatch.DeviceKernels(probe=lambda device: None))  # a GPU with kernels
    monkeypatch.setattr(_dispatch, "seed", lambda: 0)

    x = _FakeCuda()
    assert use_fused(x)  # a CUDA tensor takes the fused path by default
    seen_in_thread = []
    with reference_ops():
        assert not use_fused(x)
        with reference_ops():  # nests
            assert not use_fused(x)
        assert not use_fused(x)
        t = threading.Thread(target=lambda: seen_in_thread.append(use_fused(x)))
        t.start()
        t.join()
    assert use_fused(x)
    assert seen_in_thread == [True]  # another thread is not switched
    with pytest.raises(RuntimeError), reference_ops():
        raise RuntimeError("boom")
    assert use_fused(x)  # restored after an exception
    assert not use_fused(torch.zeros(1))  # CPU tensors always take the reference path


def test_swiglu_packed_reference_by_hand():
    from dohnuts.ops.activation import swiglu_packed_reference

    gu = torch.tensor([[1.0, -2.0, 3.0, 0.5]])  # gate (1, -2), up (3, 0.5)
    want = torch.tensor([[1.0 / (1 + math.exp(-1.0)) * 3.0, -2.0 / (1 + math.exp(2.0)) * 0.5]])
    assert torch.allclose(swiglu_packed_reference(gu), want, atol=1e-6)
    with pytest.raises(ValueError, match="even last dim"):
        swiglu_packed_reference(torch.zeros(2, 5))


_INTERPRETED_SWIGLU = """
import torch
from dohnuts.ops._swiglu_kernel import BLOCK, swiglu_packed_triton
from dohnuts.ops.activation import swiglu_packed_reference

g = torch.Generator().manual_seed(0)
big = torch.randn(3, 7, 2 * BLOCK + 2 * 300 + 10, generator=g)
cases = [torch.randn(2, 5, 2 * 96, generator=g),  # one partial block per row
         torch.randn(9, 2 * (BLOCK + 300), generator=g),  # a full block and a partial one
         big[..., 4:4 + 2 * (BLOCK + 300)],  # rows strided like a column slice of a wider output
         torch.randn(0, 8, generator=g)]
for gu in cases:
    y = swiglu_packed_triton(gu)
    assert y.shape == gu.shape[:-1] + (gu.shape[-1] // 2,) and y.is_contiguous(), y.shape
    err = (y - swiglu_packed_reference(gu)).abs().max() if y.numel() else 0.0
    assert err < 1e-5, err
y = swiglu_packed_triton(cases[1].bfloat16())
assert y.dtype == torch.bfloat16
assert ((y.float() - swiglu_packed_reference(cases[1].bfloat16().float())).abs().max()) < 0.05
# with spare columns for a LoRA group (dohnuts.ops.spare): the same values, rows 16 columns wider
for gu in cases[:3]:
    y = swiglu_packed_triton(gu, spare=5)
    I = gu.shape[-1] // 2
    assert torch.equal(y, swiglu_packed_triton(gu)) and y.stride(-2) == I + 16
    assert y.untyped_storage().nbytes() == y.numel() // I * (I + 16) * 4
print("ok")
"""


@pytest.mark.slow
def test_swiglu_packed_triton_kernel_in_the_interpreter():
    """The Triton kernel's indexing (partial blocks, strided rows, empty input) on the CPU, run by
    Triton's interpreter in a fresh process (the variable must be set before the kernel is made)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _INTERPRETED_SWIGLU], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


_INTERPRETED_NORMS = """
import torch
from tests.ops.interpreted_autograd import patch_interpreter_device_calls
patch_interpreter_device_calls()  # speed alone (its docstring)
from dohnuts.ops._norm_kernels import norm_rope_triton, rms_norm_triton
from dohnuts.ops.norm import add_rms_norm_reference, rms_norm_reference
from dohnuts.ops.rope import norm_rope_reference

g = torch.Generator().manual_seed(0)
w = torch.randn(96, generator=g) * 0.1
wide = torch.randn(5, 7, 3 * 96, generator=g)
for x in (torch.randn(4, 9, 96, generator=g), wide[..., 96:192]):  # contiguous, and strided rows
    for offset in (0.0, 1.0):
        err = (rms_norm_triton(x, w, 1e-6, offset) - rms_norm_reference(x, w, 1e-6, offset)).abs().max()
        assert err < 1e-5, ("norm", offset, err)
        r = torch.randn(x.shape, generator=g)
        y, s = rms_norm_triton(x, w, 1e-6, offset, residual=r)
        y_ref, s_ref = add_rms_norm_reference(x, r, w, 1e-6, offset)
        assert (s - s_ref).abs().max() < 1e-6 and (y - y_ref).abs().max() < 1e-5, "add norm"
y, s = rms_norm_triton(wide[..., :96].bfloat16(), w, 1e-6, 1.0, residual=wide[..., :96].float())
assert y.dtype == torch.bfloat16 and s.dtype == torch.float32  # the sum keeps the residual's dtype
assert rms_norm_triton(torch.zeros(0, 96), w, 1e-6).shape == (0, 96)
# with spare columns for a LoRA group (dohnuts.ops.spare): the same values, rows 32 columns wider
x, r = wide[..., 96:192], torch.randn(5, 7, 96, generator=g)
y = rms_norm_triton(x, w, 1e-6, 1.0, spare=17)
assert torch.equal(y, rms_norm_triton(x, w, 1e-6, 1.0)) and y.stride(-2) == 96 + 32
assert y.untyped_storage().nbytes() == 5 * 7 * 128 * 4
(y, s), (y0, s0) = rms_norm_triton(x, w, 1e-6, 1.0, residual=r, spare=8), rms_norm_triton(x, w, 1e-6, 1.0, residual=r)
assert torch.equal(y, y0) and torch.equal(s, s0) and y.stride(-2) == 96 + 16 and s.is_contiguous()

# norm + rope: q read in place from a packed (B, T, H, 2D) projection (query and gate interleaved
# per head), 3 heads (not a power of two), D = 40 channels of which R = 16 rotate.
B, T, H, D, R = 2, 5, 3, 40, 16
qg = torch.randn(B, T, H, 2 * D + 6, generator=g)
x = qg[..., :D]
wq = torch.randn(D, generator=g) * 0.1
ang = torch.randn(B, T, R // 2, generator=g)
cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
y = norm_rope_triton(x, wq, 1e-6, 1.0, cos, sin)
assert y.shape == (B, H, T, D) and y.is_contiguous()
err = (y - norm_rope_reference(x, wq, 1e-6, 1.0, cos, sin)).abs().max()
assert err < 1e-5, ("norm_rope", err)
cb = cos[:1].expand(B, T, R)  # a batch-broadcast table (stride 0) reads the same rows
assert (norm_rope_triton(x, wq, 1e-6, 1.0, cb, sin[:1].expand(B, T, R))
        - norm_rope_reference(x, wq, 1e-6, 1.0, cb, sin[:1].expand(B, T, R))).abs().max() < 1e-5
try:
    norm_rope_triton(x, wq, 1e-6, 1.0, cos[..., :3], sin[..., :3])
except ValueError as e:
    assert "R even" in str(e)
else:
    raise AssertionError("odd R accepted")

# The vision tower's rotary: q and k read in place from a packed (N, 3, H, D) projection with a
# padded row (a strided view), 3 heads (not a power of two), every channel rotated; equal to the
# FP32 reference in FP32, and within one BF16 step of it in BF16 (the interpreter's cast to BF16
# truncates where the GPU's rounds to nearest: tests/gpu/test_ops.py checks the GPU's rounding).
from dohnuts.ops._rope_kernel import rotary_qk_triton
from dohnuts.ops.rope import rotary_qk_reference

N, Hv, Dv = 7, 3, 12
qkv = torch.randn(N, 3 * Hv * Dv + 5, generator=g)[:, :3 * Hv * Dv].view(N, 3, Hv, Dv)
angv = torch.randn(N, 1, Dv // 2, generator=g)
cv, sv = torch.cat([angv.cos()] * 2, -1), torch.cat([angv.sin()] * 2, -1)
for dt in (torch.float32, torch.bfloat16):
    got, want = rotary_qk_triton(qkv.to(dt), cv, sv), rotary_qk_reference(qkv.to(dt), cv, sv)
    for u, v_ in zip(got, want):
        assert u.shape == (N, Hv, Dv) and u.dtype == dt and u.is_contiguous()
        step = 1e-6 if dt == torch.float32 else v_.float().abs() * 2.0 ** -7
        assert ((u.float() - v_.float()).abs() <= step).all(), ("rotary_qk", dt)

# The vision tower's LayerNorm with its residual add: a row width that is not a power of two,
# strided rows, FP32 equal to the reference (F.layer_norm of the sum), BF16 within one step of it
# (the interpreter's cast to BF16 truncates the sum where the GPU's rounds it to nearest, as torch's
# add does: tests/gpu/test_ops.py checks the stream bit for bit there), no residual, an empty
# input, and a residual of another dtype refused.
from dohnuts.ops._layer_norm_kernel import layer_norm_triton
from dohnuts.ops.norm import add_layer_norm_reference, layer_norm_reference

wl, bl = torch.randn(40, generator=g), torch.randn(40, generator=g)
rowsl = torch.randn(6, 3 * 40, generator=g) * 3 + 1  # a mean and scale far from 0 and 1
for dt in (torch.float32, torch.bfloat16):
    x, r, wd, bd = rowsl[:, 40:80].to(dt), rowsl[:, :40].to(dt), wl.to(dt), bl.to(dt)  # strided rows
    y, s = layer_norm_triton(x, wd, bd, 1e-6, residual=r)
    y_ref, s_ref = add_layer_norm_reference(x, r, wd, bd, 1e-6)
    sum_step = 0 if dt == torch.float32 else s_ref.float().abs() * 2.0 ** -7
    assert y.dtype == s.dtype == dt and ((s.float() - s_ref.float()).abs() <= sum_step).all(), ("sum", dt)
    y_ref = layer_norm_reference(s, wd, bd, 1e-6)  # the norm of the sum the kernel stored
    step = 1e-5 if dt == torch.float32 else y_ref.float().abs() * 2.0 ** -7 + 1e-6
    assert ((y.float() - y_ref.float()).abs() <= step).all(), ("add_layer_norm", dt)
    y1, y1_ref = layer_norm_triton(x, wd, bd, 1e-6), layer_norm_reference(x, wd, bd, 1e-6)
    step = 1e-5 if dt == torch.float32 else y1_ref.float().abs() * 2.0 ** -7 + 1e-6
    assert ((y1.float() - y1_ref.float()).abs() <= step).all(), ("layer_norm", dt)
assert layer_norm_triton(torch.zeros(0, 40), wl, bl, 1e-6).shape == (0, 40)
try:
    layer_norm_triton(rowsl[:, :40], wl, bl, 1e-6, residual=rowsl[:, :40].bfloat16())
except ValueError as e:
    assert "residual" in str(e)
else:
    raise AssertionError("a residual of another dtype accepted")

# The vision tower's attention within equal segments: q and k contiguous as the rotary writes
# them, v a strided view of a packed (N, 3, H, D) projection; segments of 40 rows (a partial key
# block of the kernel's 64) and of 128 (whole blocks only); in FP32 within 1e-5 of the reference
# (SDPA per segment) — the interpreter's `tl.dot` of BF16 operands is wrong (Triton 3.9 here), so
# BF16 is the GPU test's (tests/gpu/test_ops.py); rows that are not whole segments, and a head of
# 40 values, refused.
from dohnuts.ops._segment_attention_kernel import segment_attention_triton
from dohnuts.ops.attention import block_diagonal_attention_reference

for n_seg, length in ((3, 40), (2, 128)):
    qkv = torch.randn(n_seg * length, 3, 2, 16, generator=g)
    q, k, v = qkv[:, 0].contiguous() * 2, qkv[:, 1].contiguous(), qkv[:, 2]
    got = segment_attention_triton(q, k, v, length)
    want = block_diagonal_attention_reference(q, k, v, [length] * n_seg)
    assert got.shape == q.shape and got.is_contiguous()
    assert (got - want).abs().max() < 1e-5, ("segment_attention", n_seg, length)
for bad in ((q[:-1], k[:-1], v[:-1], 128), (torch.randn(8, 2, 40), torch.randn(8, 2, 40), torch.randn(8, 2, 40), 8)):
    try:
        segment_attention_triton(*bad)
    except ValueError as e:
        assert "segment_attention" in str(e)
    else:
        raise AssertionError("segment_attention accepted a bad shape")

# The attention output gate: o (B, H, T, D) as attention returns it, the gate a strided view.
from dohnuts.ops._gate_kernel import gated_output_triton
from dohnuts.ops.attention import gated_output_reference

o = torch.randn(B, H, T, D, generator=g)
gate = qg[..., D:2 * D]
y = gated_output_triton(o, gate)
assert y.shape == (B, T, H * D) and y.is_contiguous()
assert (y - gated_output_reference(o, gate)).abs().max() < 1e-6, "gate"
o_t = torch.randn(B, T, H, D, generator=g).transpose(1, 2)  # (B, H, T, D) in a (B, T, H, D) layout
assert (gated_output_triton(o_t, gate) - gated_output_reference(o_t, gate)).abs().max() < 1e-6, "gate layout"

# Conv + SiLU (+ per-head L2 norm: q and k) against fla's order of operations: the reference
# conv, then the delta rule's L2 norm; from zeros, from a per-row state and from a batch-broadcast
# (forked) state, writing the final state into a channel slice of a wider (B, D, W) buffer.
from dohnuts.ops._conv_kernel import conv_silu_triton
from dohnuts.ops.conv import causal_conv1d_reference
from dohnuts.ops.delta_rule import _l2norm

Bc, Cc, Dc, Wc = 2, 3 * 16, 16, 4
wc = torch.randn(Cc, Wc, generator=g)
case = 0  # FULL (the `full` lane): every token block for every case; else each case one block, in turn
for Tc in (45, 2):  # a partial block of the kernel's 32; fewer tokens than the conv width
    packed = torch.randn(Bc, Tc, Cc + 20, generator=g)
    xc = packed[..., 5:5 + Cc]  # a strided column slice, as the packed projection gives
    rows = torch.randn(Bc, Cc, Wc, generator=g)
    forked = torch.randn(1, Cc, Wc, generator=g).expand(Bc, -1, -1)  # stride 0 in the batch
    for s0 in (None, rows, forked, forked[:1]):
        ref, ref_state = causal_conv1d_reference(xc, wc, None if s0 is None else s0.expand(Bc, -1, -1), True)
        for normalize in (True, False):
            want = _l2norm(ref.view(Bc, Tc, Cc // Dc, Dc)).view(Bc, Tc, Cc) if normalize else ref
            # the tuner's token blocks: partial, and larger than the sequence
            for bt in (32, 64, 128) if FULL else ((32, 64, 128)[case % 3],):
                wide = torch.full((Bc, Cc + 8, Wc), float("nan"))
                got = conv_silu_triton(xc, wc, Dc, normalize=normalize, initial_state=s0,
                                       final_state=wide[:, 8:], cpu_block_t=bt)
                err = (got - want).abs().max()
                assert got.is_contiguous() and err < 1e-5, ("conv", Tc, normalize, bt, err)
                assert torch.equal(wide[:, 8:], ref_state) and wide[:, :8].isnan().all(), ("conv state", Tc, bt)
            # without a final state, and from the tap-major weight the runtime passes (strides (1, C)):
            # the same output — both in the `full` lane; else one each in turn, so every length and
            # state meets both (each launch in the interpreter is seconds of the test's time)
            if FULL or case % 2 == 0:
                assert torch.equal(conv_silu_triton(xc, wc, Dc, normalize=normalize, initial_state=s0,
                                                    cpu_block_t=32), got), "no state out"
            if FULL or case % 2 == 1:
                tap_major = wc.t().contiguous().t()
                assert torch.equal(conv_silu_triton(xc, tap_major, Dc, normalize=normalize, initial_state=s0,
                                                    cpu_block_t=32), got), "tap-major weight"
            case += 1
# The q, k and v parts in one launch (q and k normalised): each part, a contiguous block of one
# buffer, equals the part's own launch on its channels, and the final state the one-conv state.
from dohnuts.ops._conv_kernel import conv_silu_parts_triton

sizes_c = [16, 16, 32]
xp = torch.randn(Bc, 45, 64 + 8, generator=g)[..., 4:68]
wp, rows_p = torch.randn(64, Wc, generator=g), torch.randn(Bc, 64, Wc, generator=g)
for s0 in (None, rows_p, rows_p[:1].expand(Bc, -1, -1)):
    for bt in (32, 64):
        wide = torch.full((Bc, 64, Wc), float("nan"))
        parts = conv_silu_parts_triton(xp, wp, Dc, sizes_c, normalized_parts=2, initial_state=s0, final_state=wide,
                                       cpu_block_t=bt)
        start = 0
        for i, (n, y) in enumerate(zip(sizes_c, parts)):
            ch = slice(start, start + n)
            own = conv_silu_triton(xp[..., ch], wp[ch], Dc, normalize=i < 2,
                                   initial_state=None if s0 is None else s0[:, ch], cpu_block_t=bt)
            assert y.shape == (Bc, 45, n) and y.is_contiguous() and torch.equal(y, own), ("conv parts", i, bt)
            start += n
        assert torch.equal(wide, causal_conv1d_reference(xp, wp, s0, True)[1]), "conv parts: state"
        assert parts[1].data_ptr() == parts[0].data_ptr() + parts[0].numel() * parts[0].element_size()
for bad in ([16, 16], [16, 16, 16, 16], [24, 8, 32], [16, 16, 32, 0]):
    try:
        conv_silu_parts_triton(xp, wp, Dc, bad, normalized_parts=1)
    except ValueError as e:
        assert "parts" in str(e)
    else:
        raise AssertionError(("parts accepted", bad))
# The 4-D copy: a batch-broadcast source (a forked state), a slice of a wider buffer as the
# destination (the past part of an appended KV), a transposed-view source (attention's values),
# a last dimension that is not a power of two, and both dtypes of the states; exact.
from dohnuts.ops._copy_kernel import copy4d_triton

for dtype in (torch.float32, torch.bfloat16):
    one = torch.randn(1, 3, 37, 24, generator=g).to(dtype)
    wide = torch.zeros(5, 3, 37 + 6, 24, dtype=dtype)
    copy4d_triton(wide[:, :, :37], one.expand(5, -1, -1, -1))
    assert torch.equal(wide[:, :, :37], one.expand(5, -1, -1, -1)) and not wide[:, :, 37:].any(), "copy4d broadcast"
    rows = torch.randn(5, 6, 3, 24, generator=g).to(dtype).transpose(1, 2)  # (5, 3, 6, 24), strided rows
    copy4d_triton(wide[:, :, 37:], rows)
    assert torch.equal(wide[:, :, 37:], rows), "copy4d strided rows"
# The chunk-state recurrence of the delta rule (fla's algorithm, one change: the initial state's
# batch stride) against the recurrence written in torch: 2 chunks (the second partial), grouped
# value heads, K and V that are not multiples of the blocks, a dense and a forked (stride 0) state;
# 2 sequences (a forked state needs two; every kernel below launches a program a sequence and head).
from dohnuts.ops._delta_h_kernel import delta_h_triton

def _delta_h_torch(k, w, u, g, s0, BT=64):
    N, T, H, K = k.shape
    HV, V = u.shape[2:]
    kk = k.repeat_interleave(HV // H, dim=2)
    S = torch.zeros(N, HV, K, V) if s0 is None else s0.expand(N, -1, -1, -1).clone()
    hs, vn = [], torch.empty_like(u)
    for c in range(-(-T // BT)):
        sl = slice(c * BT, min((c + 1) * BT, T))
        hs.append(S.clone())
        vnew = u[:, sl].permute(0, 2, 1, 3) - w[:, sl].permute(0, 2, 1, 3) @ S  # (N, HV, t, V)
        vn[:, sl] = vnew.permute(0, 2, 1, 3)
        gc = g[:, sl].permute(0, 2, 1)  # (N, HV, t), log2, cumulated within the chunk
        glast = gc[..., -1:]
        S = S * torch.exp2(glast)[..., None] + kk[:, sl].permute(0, 2, 3, 1) @ (vnew * torch.exp2(glast - gc)[..., None])
    return torch.stack(hs, 1), vn, S

N, T, H, HV, K, V = 2, 100, 2, 4, 96, 48
kd = torch.randn(N, T, H, K, generator=g) / K ** 0.5
wd = torch.randn(N, T, HV, K, generator=g) / K ** 0.5
ud = torch.randn(N, T, HV, V, generator=g)
gd = torch.cat([(-torch.rand(N, 64, HV, generator=g)).cumsum(1),  # log2 gates, cumulated per 64-token chunk
                (-torch.rand(N, T - 64, HV, generator=g)).cumsum(1)], 1)
one = torch.randn(1, HV, K, V, generator=g)
for s0 in (None, torch.randn(N, HV, K, V, generator=g), one.expand(N, -1, -1, -1), one):
    want = _delta_h_torch(kd, wd, ud, gd, s0)
    got = delta_h_triton(kd, wd, ud, gd, s0, True, cpu_block_v=32)
    for name, a_, b_ in zip(("h", "v_new", "final"), got, want):
        assert a_.shape == b_.shape and (a_ - b_).abs().max() < 1e-4, ("delta_h", name, (a_ - b_).abs().max())
assert delta_h_triton(kd, wd, ud, gd, one, False, cpu_block_v=32)[2] is None
# The same kernel with each chunk's output computed inside it (FUSE_O) against the torch
# recurrence's states and new values put through fla's output formula (chunk_fwd_o) in torch:
# o = scale · (q·h[t]·2^g + tril(q·kᵀ·2^(g_i − g_j))·v_new); every state, three value blocks.
from dohnuts.ops._delta_h_kernel import delta_rule_output_triton

def _chunk_o_torch(q, k, vn, hs, g, scale, BT=64):
    HV = vn.shape[2]
    qq, kk = (x.repeat_interleave(HV // x.shape[2], dim=2).permute(0, 2, 1, 3) for x in (q, k))  # (N, HV, T, K)
    o = torch.empty(vn.shape)
    for c in range(hs.shape[1]):
        sl = slice(c * BT, (c + 1) * BT)
        gc = g[:, sl].permute(0, 2, 1)
        A = (qq[:, :, sl] @ kk[:, :, sl].transpose(-1, -2) * torch.exp2(gc[..., :, None] - gc[..., None, :])).tril()
        oc = qq[:, :, sl] @ hs[:, c] * torch.exp2(gc)[..., None] + A @ vn[:, sl].permute(0, 2, 1, 3)
        o[:, sl] = (oc * scale).permute(0, 2, 1, 3)
    return o

qd = torch.randn(N, T, H, K, generator=g) / K ** 0.5
for i, s0 in enumerate((None, torch.randn(N, HV, K, V, generator=g), one.expand(N, -1, -1, -1), one)):
    hs, vn, final = _delta_h_torch(kd, wd, ud, gd, s0)
    want = _chunk_o_torch(qd, kd, vn, hs, gd, 0.3)
    for bv in (16, 32, 64) if FULL else ((16, 32, 64)[i % 3],):  # every value block, or each state one in turn
        o, got_final = delta_rule_output_triton(qd, kd, wd, ud, gd, 0.3, s0, True, cpu_block_v=bv)
        assert o.shape == want.shape and (o - want).abs().max() < 1e-4, ("fused o", bv, (o - want).abs().max())
        assert (got_final - final).abs().max() < 1e-4, ("fused final state", bv)
assert delta_rule_output_triton(qd, kd, wd, ud, gd, 0.3, None, False, cpu_block_v=32)[1] is None
# With fla's recompute_w_u folded in (FUSE_WU): from v, β and the solved intra-chunk matrix
# A = (I + tril(β·k·kᵀ·2^(g_i − g_j), −1))⁻¹ instead of w = A·(β·2^g·k) and u = A·(β·v), the same
# outputs and final state as the kernel given w and u (and so as the torch recurrence above).
from dohnuts.ops._delta_h_kernel import delta_rule_output_wy_triton

def _wy_torch(k, v, beta, g, BT=64):
    N, T, HV = beta.shape
    kk = k.repeat_interleave(HV // k.shape[2], dim=2).permute(0, 2, 1, 3)  # (N, HV, T, K)
    vv, bb, gg = v.permute(0, 2, 1, 3), beta.permute(0, 2, 1), g.permute(0, 2, 1)
    A, w, u = torch.zeros(N, T, HV, BT), torch.empty(N, T, HV, k.shape[3]), torch.empty(v.shape)
    for c in range(-(-T // BT)):
        sl = slice(c * BT, min((c + 1) * BT, T))
        t = sl.stop - sl.start
        kc, bc, gc = kk[:, :, sl], bb[:, :, sl], gg[:, :, sl]
        m = (bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * torch.exp2(gc[..., :, None] - gc[..., None, :])).tril(-1)
        inv = torch.linalg.inv(torch.eye(t) + m)  # (N, HV, t, t)
        A[:, sl, :, :t] = inv.permute(0, 2, 1, 3)
        w[:, sl] = (inv @ (kc * (bc * torch.exp2(gc))[..., None])).permute(0, 2, 1, 3)
        u[:, sl] = (inv @ (vv[:, :, sl] * bc[..., None])).permute(0, 2, 1, 3)
    return A, w, u

vd = torch.randn(N, T, HV, V, generator=g)
betad = torch.rand(N, T, HV, generator=g)
Ad, wy_w, wy_u = _wy_torch(kd, vd, betad, gd)
# fla's kkt_solve kernel writes A's lower blocks only (dohnuts allocates it uninitialised): the
# kernel must ignore the upper triangle, here NaN
Ad = Ad.masked_fill(torch.arange(64)[None, :] > (torch.arange(T) % 64)[:, None, None], float("nan"))
for i, s0 in enumerate((None, torch.randn(N, HV, K, V, generator=g), one.expand(N, -1, -1, -1))):
    want_o, want_final = delta_rule_output_triton(qd, kd, wy_w, wy_u, gd, 0.3, s0, True, cpu_block_v=32)
    for bv in (16, 64) if FULL else ((16, 64)[i % 2],):
        o, got_final = delta_rule_output_wy_triton(qd, kd, vd, betad, Ad, gd, 0.3, s0, True, cpu_block_v=bv)
        assert (o - want_o).abs().max() < 1e-4 * want_o.abs().max(), ("fused w/u: o", bv, (o - want_o).abs().max())
        assert (got_final - want_final).abs().max() < 1e-4 * want_final.abs().max(), ("fused w/u: final", bv)
# fla's kkt_solve kernel as dohnuts launches it (`_kkt_solve`: one config, outside fla's
# autotuner and heuristics) gives the lower blocks of that A.
from dohnuts.ops.delta_rule import _kkt_solve

got_A = _kkt_solve(None, kd, gd, betad, zero_upper=True)
lower = ~Ad.isnan()
assert got_A.shape == Ad.shape and not got_A[~lower].any(), "kkt_solve: upper blocks not left zero"
assert (got_A[lower] - Ad[lower]).abs().max() < 1e-4, ("kkt_solve: A", (got_A[lower] - Ad[lower]).abs().max())
try:
    delta_rule_output_wy_triton(qd, kd, vd, betad[:, :50], Ad, gd, 0.3)
except ValueError as e:
    assert "beta" in str(e)
else:
    raise AssertionError("a beta shaped unlike the gates accepted")
try:
    delta_rule_output_triton(qd[:, :50], kd, wd, ud, gd, 0.3)
except ValueError as e:
    assert "q" in str(e)
else:
    raise AssertionError("a q shaped unlike k accepted")
# The Gated DeltaNet gates read in place: a and b as column slices of a packed projection (token
# stride of the whole row), 2 chunks (the second partial), a head count that is not a power of two.
from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton

RCP_LN2 = 1.4426950408889634
for Hg in (16, 12):
    packed = torch.randn(3, 100, 40 + 2 * Hg, generator=g).bfloat16()
    bg, ag = packed[..., 40:40 + Hg], packed[..., 40 + Hg:]
    A_log, dt_bias = torch.rand(Hg, generator=g).mul(15).add(1).log(), torch.randn(Hg, generator=g)
    decay = -A_log.exp() * torch.nn.functional.softplus(ag.float() + dt_bias)
    want = torch.cat([decay[:, :64].cumsum(1), decay[:, 64:].cumsum(1)], 1) * RCP_LN2
    got_g, got_beta = gdn_gates_triton(ag, bg, A_log, dt_bias, chunk_size=64, scale=RCP_LN2)
    assert got_g.dtype == got_beta.dtype == torch.float32 and got_g.is_contiguous() and got_g.shape == (3, 100, Hg)
    assert (got_g - want).abs().max() < 1e-4 * want.abs().max(), ("gdn gates: g", (got_g - want).abs().max())
    assert (got_beta - torch.sigmoid(bg.float())).abs().max() < 1e-6, "gdn gates: beta"
try:
    conv_silu_triton(xc, wc, Dc, normalize=True, initial_state=torch.zeros(Bc, Cc, Wc - 1))
except ValueError as e:
    assert "initial_state" in str(e)
else:
    raise AssertionError("a state of the wrong width accepted")
print("ok")
"""


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("full", [pytest.param(False, id="covering"), pytest.param(True, id="every-case",
                                                                                   marks=pytest.mark.full)])
def test_norm_triton_kernels_in_the_interpreter(full):
    """The RMSNorm, norm+rotary and output-gate Triton kernels against the torch references on the
    CPU, in Triton's interpreter: offsets, a residual, strided rows, heads that are not a power of
    two, a partial rotary dimension, a broadcast table, two attention-output layouts and an empty
    input; and the conv, copy, delta-rule state and output, and gate kernels. Every token and value
    block for every case in the `full` lane; each case one block, in turn, in the test command (every
    block and every case still run), and the conv's no-state-out and tap-major-weight equalities on
    alternate cases (every length and state meets both)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", f"FULL = {full!r}\n" + _INTERPRETED_NORMS], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.slow
def test_differentiable_kernels_in_the_interpreter():
    """The norm, norm + rotary, output-gate and packed-SwiGLU kernels are autograd ops whose Triton
    backward kernels give torch autograd's gradients through the references (tests/ops/interpreted_grads.py,
    run in Triton's interpreter)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    script = Path(__file__).with_name("interpreted_grads.py")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                         check=False, cwd=Path(__file__).parents[2])
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_delta_rule_output_is_fused_when_the_batch_fills_the_gpu(monkeypatch):
    """The fused state + output kernel runs when its programs (sequences × value heads × 64-value
    blocks) reach half the multiprocessor count, fla's two kernels otherwise; K > 128 (beyond the
    kernel's two blocks) never fuses. A rule of the device, with no switch."""
    from dohnuts.ops import delta_rule

    monkeypatch.setattr(delta_rule, "_multiprocessors", lambda device: 132)
    dev = torch.device("cpu")
    assert delta_rule._fused_output(32, 16, 128, 128, dev)  # text-2b: 1,024 programs
    assert delta_rule._fused_output(4, 16, 128, 128, dev)  # 128 programs ≥ 66
    assert delta_rule._fused_output(3, 12, 128, 100, dev)  # V = 100: two blocks of 64, 72 programs
    assert not delta_rule._fused_output(3, 12, 128, 64, dev)  # V = 64: one block, 36 programs
    assert not delta_rule._fused_output(2, 16, 128, 128, dev)  # 64 programs < 66
    assert not delta_rule._fused_output(1, 16, 128, 128, dev)  # a lone prefix: 32 programs
    assert not delta_rule._fused_output(64, 16, 256, 128, dev)  # K > 128


def test_gdn_gates_from_logits_equal_the_explicit_gates():
    """gated_delta_rule_from_logits on the reference path = gated_delta_rule on g and beta computed
    by hand from a, b, A_log and dt_bias."""
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits, gated_delta_rule_reference

    g = torch.Generator().manual_seed(3)
    B, T, H, HV, K, V = 2, 70, 2, 4, 8, 6
    q, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, HV, V, generator=g)
    a, b = torch.randn(B, T, HV, generator=g), torch.randn(B, T, HV, generator=g)
    A_log, dt_bias = torch.rand(HV, generator=g).log1p(), torch.randn(HV, generator=g)
    s0 = torch.randn(B, HV, K, V, generator=g)
    decay = -A_log.exp() * torch.log1p(torch.exp(a + dt_bias))  # softplus by hand
    o, s = gated_delta_rule_from_logits(q, k, v, a, b, A_log, dt_bias, initial_state=s0, output_final_state=True)
    o_ref, s_ref = gated_delta_rule_reference(q, k, v, decay, torch.sigmoid(b), initial_state=s0,
                                              output_final_state=True)
    assert torch.allclose(o, o_ref, atol=1e-5) and torch.allclose(s, s_ref, atol=1e-5)


def test_conv_parts_equal_one_conv_per_part_with_state():
    """The parts of one conv equal a conv per part on its channels (weight rows and state slices),
    and the final state keeps the one-conv layout (B, D, W)."""
    from dohnuts.ops.conv import causal_conv1d_parts_reference

    B, T, W, sizes = 2, 33, 4, [6, 6, 10]
    D = sum(sizes)
    g = torch.Generator().manual_seed(5)
    x, w, s0 = torch.randn(B, T, D, generator=g), torch.randn(D, W, generator=g), torch.randn(B, D, W, generator=g)
    parts, state = causal_conv1d_parts_reference(x, w, sizes, s0, True)
    _, full_state = causal_conv1d_reference(x, w, s0, True)
    assert torch.equal(state, full_state) and state.shape == (B, D, W)
    start = 0
    for n, y in zip(sizes, parts):
        ch = slice(start, start + n)
        want, want_state = causal_conv1d_reference(x[..., ch].contiguous(), w[ch], s0[:, ch], True)
        assert y.shape == (B, T, n) and torch.allclose(y, want, atol=1e-6)
        assert torch.equal(state[:, ch], want_state)
        start += n


_INTERPRETED_FMA = """
import torch
from dohnuts.ops._fma_kernel import fma_chain_triton
from dohnuts.ops.fma import fma_chain_flops, fma_chain_reference

x = torch.randn(3000, generator=torch.Generator().manual_seed(0))  # 3 blocks of 1024, the last partial
for iters in (1, 7, 256):
    y, ref = fma_chain_triton(x, iters), fma_chain_reference(x, iters)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert ((y - ref).abs() / ref.abs().clamp_min(1.0)).max() < 2e-5, (iters, (y - ref).abs().max())
assert fma_chain_triton(torch.zeros(0), 4).shape == (0,)
assert fma_chain_flops(3000, 256) == 2 * 4 * 256 * 3000
print("ok")
"""


@pytest.mark.slow
def test_fma_chain_kernel_in_the_interpreter():
    """The FP32 vector microbenchmark's kernel (dohnuts.ops.fma) against its torch reference, in
    Triton's interpreter: the chains' values, a partial last block, an empty input."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _INTERPRETED_FMA], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_fma_chain_is_the_reference_on_the_cpu():
    from dohnuts.ops.fma import fma_chain, fma_chain_reference

    x = torch.linspace(-2, 2, 50)
    assert torch.equal(fma_chain(x, 5), fma_chain_reference(x, 5))
    # one step by hand: (x·k + c) + ((x+1)·k + c) + ((x+2)·k + c) + ((x+3)·k + c)
    assert torch.allclose(fma_chain_reference(x, 1), (4 * x + 6) * 0.9999 + 4 * 0.0001, rtol=1e-6, atol=1e-6)
