"""The gated delta rule on the GPU: the gates in one kernel, a forked state read in place, the fused
state-and-output kernel — each against fla's kernels and the FP32 reference — and the backward of
the same forward (the gates' own kernel, fla's delta-rule kernels) against autograd through the
FP32 reference and fla's own autograd op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.gpu.helpers import (
    BF16_TOL,
    DEV,
    WU_TOL,
    _assert_matches_fp32_reference,
    _assert_no_less_accurate,
    _fp32_reference,
    _gdn_logit_inputs,
)
from tests.reference import relative_error

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_gates_in_kernel(with_state):
    """fla's in-kernel gates (decay from a, A_log, dt_bias; sigmoid of b) against the gates computed
    in torch and the FP32 reference, at Qwen3.5-2b head sizes, with and without a recurrent state."""
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits

    g, (q, k, v, a, b, A_log, dt_bias) = _gdn_logit_inputs(3, 200, seed=43)
    s0 = torch.randn(3, 16, 128, 128, device=DEV, generator=g) * 0.1 if with_state else None
    with torch.no_grad():
        o, s = gated_delta_rule_from_logits(q, k, v, a, b, A_log, dt_bias, initial_state=s0, output_final_state=True)
    _assert_matches_fp32_reference(o, s, (q, k, v, a, b, A_log, dt_bias), s0)


def test_inference_delta_rule_reads_a_forked_state_as_fla_does_dense():
    """The inference delta rule (fla's forward steps, dohnuts' state kernel with a batch stride)
    from a forked state — an expanded view of one state, never copied — equals fla's own
    chunk_gated_delta_rule on the dense copies (same kernels elsewhere: to BF16 rounding of the
    autotuned blocks), and the FP32 reference; 2b head sizes, 32 branches of 64 tokens."""
    from dohnuts.ops._fla import fla
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits

    B = 32
    g, (q, k, v, a, b, A_log, dt_bias) = _gdn_logit_inputs(B, 64, seed=59)
    one = torch.randn(1, 16, 128, 128, device=DEV, generator=g) * 0.1
    forked = one.expand(B, -1, -1, -1)
    with torch.no_grad():
        o, s = gated_delta_rule_from_logits(q, k, v, a, b, A_log, dt_bias, initial_state=forked,
                                            output_final_state=True)
        o_fla, s_fla = fla().chunk_gated_delta_rule(
            q, k, v, a, b, initial_state=forked.contiguous(), output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
    assert relative_error(o.float(), o_fla.float()) < WU_TOL and relative_error(s, s_fla) < WU_TOL
    _assert_matches_fp32_reference(o, s, (q, k, v, a, b, A_log, dt_bias), forked)
    o_ref, s_ref = _fp32_reference((q, k, v, a, b, A_log, dt_bias), forked)
    _assert_no_less_accurate(o, o_fla, o_ref, "o")
    _assert_no_less_accurate(s, s_fla, s_ref, "state")


def test_inference_delta_rule_without_a_fork_equals_fla():
    """Without a forked state (no state: a full or prefix pass; a dense per-row state) the
    inference delta rule equals fla's chunk_gated_delta_rule. At 4 × 200 (256 programs, so the fused
    path with FUSE_WU) to BF16 rounding of fla's w and u (`WU_TOL`), and no less accurate than fla
    against the FP32 reference; a forked state of the same values (a stride-0 read) equals the
    dense state's result."""
    from dohnuts.ops._fla import fla
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits

    B = 4
    g, (q, k, v, a, b, A_log, dt_bias) = _gdn_logit_inputs(B, 200, seed=61)
    dense = torch.randn(1, 16, 128, 128, device=DEV, generator=g).expand(B, -1, -1, -1).contiguous() * 0.1
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
              use_beta_sigmoid_in_kernel=True)
    with torch.no_grad():
        for s0 in (None, dense):
            o, s = gated_delta_rule_from_logits(q, k, v, a, b, A_log, dt_bias, initial_state=s0,
                                                output_final_state=True)
            o_fla, s_fla = fla().chunk_gated_delta_rule(q, k, v, a, b, initial_state=s0, output_final_state=True, **kw)
            what = "dense" if s0 is not None else "none"
            assert relative_error(o.float(), o_fla.float()) < WU_TOL and relative_error(s, s_fla) < WU_TOL, what
            o_ref, s_ref = _fp32_reference((q, k, v, a, b, A_log, dt_bias), s0)
            _assert_no_less_accurate(o, o_fla, o_ref, f"o, {what}")
            _assert_no_less_accurate(s, s_fla, s_ref, f"state, {what}")
        o_fork, s_fork = gated_delta_rule_from_logits(q, k, v, a, b, A_log, dt_bias,
                                                      initial_state=dense[:1].expand(B, -1, -1, -1),
                                                      output_final_state=True)
    assert relative_error(o_fork.float(), o.float()) < 1e-3 and relative_error(s_fork, s) < 1e-3


@pytest.mark.parametrize("shape", [(32, 512, None), (3, 200, "dense"), (32, 64, "forked"), (1, 452, "forked")])
def test_fused_state_output_kernel_equals_fla_s_two_kernels(shape):
    """The state recurrence with each chunk's output computed inside it (dohnuts' FUSE_O kernel)
    equals fla's state kernel followed by its output kernel (chunk_gated_delta_rule_fwd_h, then
    chunk_fwd_o reading the states back), at 2b head sizes: the text pass, a partial last chunk with
    a dense state per sequence, forked suffix passes (stride-0 state) and a lone sequence; and so
    does the kernel that also folds in fla's recompute_w_u (FUSE_WU, from fla's A, v and β)."""
    from dohnuts.ops._delta_h_kernel import delta_rule_output_triton
    from dohnuts.ops._fla import fla
    from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton

    B, T, state = shape
    f = fla()
    g, (q, k, v, a, b, A_log, dt_bias) = _gdn_logit_inputs(B, T, seed=71)
    q, k = (torch.nn.functional.normalize(x.float(), dim=-1).bfloat16() for x in (q, k))
    gg, beta = gdn_gates_triton(a, b, A_log, dt_bias, chunk_size=64, scale=f.RCP_LN2)
    w, u, _ = f.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=gg, beta=beta, chunk_size=64)
    s0 = None
    if state is not None:
        s0 = torch.randn(1 if state == "forked" else B, 16, 128, 128, device=DEV, generator=g) * 0.1
        s0 = s0.expand(B, -1, -1, -1)
    with torch.no_grad():
        o, final = delta_rule_output_triton(q, k, w, u, gg, 128 ** -0.5, s0, True)
        h, v_new, final_fla = f.chunk_gated_delta_rule_fwd_h(
            k=k, w=w, u=u, g=gg, initial_state=None if s0 is None else s0.contiguous(), output_final_state=True,
            chunk_size=64)
        o_fla = f.chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=gg, scale=128 ** -0.5, chunk_size=64)
    assert o.dtype == o_fla.dtype and o.shape == o_fla.shape
    assert relative_error(o.float(), o_fla.float()) < 2e-3 and relative_error(final, final_fla) < 1e-4
    # fla's recompute_w_u folded in too (FUSE_WU): from v, β and the kkt_solve kernel's A alone
    from dohnuts.ops._delta_h_kernel import delta_rule_output_wy_triton
    from dohnuts.ops.delta_rule import _kkt_solve

    with torch.no_grad():
        A = _kkt_solve(f, k, gg, beta)
        o_wy, final_wy = delta_rule_output_wy_triton(q, k, v, beta, A, gg, 128 ** -0.5, s0, True)
    assert o_wy.dtype == o_fla.dtype and o_wy.shape == o_fla.shape
    assert relative_error(o_wy.float(), o_fla.float()) < WU_TOL and relative_error(final_wy, final_fla) < WU_TOL
    o_ref, s_ref = _fp32_reference((q, k, v, a, b, A_log, dt_bias), s0)
    _assert_no_less_accurate(o_wy, o_fla, o_ref, "o")
    _assert_no_less_accurate(final_wy, final_fla, s_ref, "state")


@pytest.mark.parametrize("state", [None, "forked"])
def test_inference_delta_rule_fused_and_split_outputs_agree(monkeypatch, state):
    """`gated_delta_rule_from_logits` with the outputs computed in the state kernel (fused) and with
    fla's output kernel (split) — the rule `_fused_output` forced each way — agree, and both equal
    the FP32 reference."""
    from dohnuts.ops import delta_rule
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits

    B = 8
    g, (q, k, v, a, b, A_log, dt_bias) = _gdn_logit_inputs(B, 130, seed=73)
    s0 = None if state is None else (torch.randn(1, 16, 128, 128, device=DEV, generator=g) * 0.1).expand(B, -1, -1, -1)
    outs = []
    with torch.no_grad():
        for choice in ("fused", "split"):
            monkeypatch.setattr(delta_rule, "_fused_output", lambda *args, fused=choice == "fused": fused)
            outs.append(gated_delta_rule_from_logits(q, k, v, a, b, A_log, dt_bias, initial_state=s0,
                                                     output_final_state=True))
    (o_f, s_f), (o_s, s_s) = outs
    assert relative_error(o_f.float(), o_s.float()) < 2e-3 and relative_error(s_f, s_s) < 1e-3
    _assert_matches_fp32_reference(o_f, s_f, (q, k, v, a, b, A_log, dt_bias), s0)


def test_gdn_gates_kernel_equals_fla_s_gate_kernels():
    """One launch reading a and b in place (column slices of a packed projection) equals fla's
    fused_beta_sigmoid_fwd and gdn_gate_chunk_cumsum on contiguous copies: β exactly, the decay to
    float rounding (fla evaluates softplus with inline PTX); 2b head count, 3 chunks."""
    from fla.ops.common.gate import fused_beta_sigmoid_fwd
    from fla.ops.gated_delta_rule.gate import gdn_gate_chunk_cumsum

    from dohnuts.ops._fla import fla
    from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton

    f = fla()
    g = torch.Generator(device=DEV).manual_seed(67)
    HV = 16
    packed = torch.randn(4, 150, 64 + 2 * HV, device=DEV, generator=g).bfloat16()
    b, a = packed[..., 64:64 + HV], packed[..., 64 + HV:]
    A_log = torch.empty(HV, device=DEV).uniform_(1, 16, generator=g).log().bfloat16()
    dt_bias = torch.randn(HV, device=DEV, generator=g).bfloat16()
    got_g, got_beta = gdn_gates_triton(a, b, A_log, dt_bias, chunk_size=64, scale=f.RCP_LN2)
    want_g = gdn_gate_chunk_cumsum(a.contiguous(), A_log, chunk_size=64, scale=f.RCP_LN2, dt_bias=dt_bias)
    want_beta = fused_beta_sigmoid_fwd(b.contiguous())
    assert torch.equal(got_beta, want_beta)
    assert relative_error(got_g, want_g) < 1e-5 and (got_g - want_g).abs().max() < 1e-4 * want_g.abs().max()


def test_gdn_gates_gradients():
    """The gates' backward kernel (dohnuts' Triton) against autograd through the torch gates in FP32
    (chunk cumsum in torch): the gradients of a and b — BF16 column slices of a packed projection —
    and of A_log and dt_bias, 2b's head count, 3 chunks (the last partial)."""
    import torch.nn.functional as F

    from dohnuts.ops._fla import fla
    from dohnuts.ops._gdn_gates_kernel import gdn_gates

    f = fla()
    g = torch.Generator(device=DEV).manual_seed(79)
    HV, B, T = 16, 4, 150
    p0 = torch.randn(B, T, 64 + 2 * HV, device=DEV, generator=g)
    A0 = torch.empty(HV, device=DEV).uniform_(1, 16, generator=g).log()
    d0 = torch.randn(HV, device=DEV, generator=g)
    pb, Ab, db = (t.bfloat16().requires_grad_() for t in (p0, A0, d0))
    pf, Af, df = (t.bfloat16().float().requires_grad_() for t in (p0, A0, d0))
    gb, betab = gdn_gates(pb[..., 64 + HV:], pb[..., 64:64 + HV], Ab, db, chunk_size=64, scale=f.RCP_LN2)
    decay = -Af.exp() * F.softplus(pf[..., 64 + HV:] + df)
    gf = F.pad(decay, (0, 0, 0, (-T) % 64)).view(B, -1, 64, HV).cumsum(2).flatten(1, 2)[:, :T] * f.RCP_LN2
    betaf = pf[..., 64:64 + HV].sigmoid()
    assert relative_error(gb, gf) < 1e-4 and relative_error(betab, betaf) < 1e-5
    dg, dbeta = torch.randn(B, T, HV, device=DEV, generator=g), torch.randn(B, T, HV, device=DEV, generator=g)
    ((gb * dg).sum() + (betab * dbeta).sum()).backward()
    ((gf * dg).sum() + (betaf * dbeta).sum()).backward()
    for name, a, b in (("da, db", pb, pf), ("dA_log", Ab, Af), ("ddt_bias", db, df)):
        err = relative_error(a.grad.float(), b.grad)
        assert err < BF16_TOL, f"{name}: relative error {err:.2e}"


# (batch, tokens, (H, HV), initial state, q and k already normalised (by the conv kernel)): with
# 132 multiprocessors, 4 × 16 or more programs of 64 values take the fused output kernel, a lone
# sequence and 2 × 16 the split one
_GRAD_CASES = [(4, 200, (16, 16), None, True), (4, 200, (16, 32), "dense", False), (8, 130, (16, 16), "forked", True),
               (1, 300, (16, 16), None, False), (2, 130, (16, 16), "forked", True)]


@pytest.mark.parametrize("case", _GRAD_CASES)
def test_delta_rule_gradients_qwen_sizes(case):
    """The delta rule from the gate logits (`gated_delta_rule_from_logits`: dohnuts' gate kernel and
    forward kernels, fla's backward kernels) at Qwen3.5 head sizes, BF16: every gradient — q, k,
    v, a, b, A_log, dt_bias and the initial state, also a forked (stride-0) view of one state in the
    graph — against autograd through the FP32 reference, and no less accurate than fla's own
    autograd op; the forward under autograd is bitwise the forward without it."""
    from dohnuts.ops._fla import fla
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits, gated_delta_rule_reference, gdn_gates_reference

    B, T, (H, HV), state, normalised = case
    K = V = 128
    g = torch.Generator(device=DEV).manual_seed(83)
    raw = [torch.randn(B, T, H, K, device=DEV, generator=g), torch.randn(B, T, H, K, device=DEV, generator=g),
           torch.randn(B, T, HV, V, device=DEV, generator=g), torch.randn(B, T, 2 * HV, device=DEV, generator=g),
           torch.empty(HV, device=DEV).uniform_(1, 16, generator=g).log(), torch.randn(HV, device=DEV, generator=g)]
    if normalised:
        raw[0], raw[1] = (F.normalize(t, dim=-1) for t in raw[:2])
    raw = [t.bfloat16() for t in raw]
    s0 = None
    if state is not None:
        s0 = torch.randn(1 if state == "forked" else B, HV, K, V, device=DEV, generator=g) * 0.1
    do = torch.randn(B, T, HV, V, device=DEV, generator=g)
    dst = torch.randn(B, HV, K, V, device=DEV, generator=g)

    def leaves(dtype):
        # copies, always: `raw` is BF16 already, so `.to(torch.bfloat16)` would hand back raw itself —
        # ours and fla's leaves one tensor, and the FP32 copies non-leaves without a .grad
        return [t.detach().to(dtype, copy=True).requires_grad_() for t in raw] + \
            [None if s0 is None else s0.clone().requires_grad_()]

    def forked(s):
        return None if s is None else s.expand(B, -1, -1, -1)

    ours = leaves(torch.bfloat16)
    q, k, v, ab, A_log, dt_bias, s = ours
    o, st = gated_delta_rule_from_logits(q, k, v, ab[..., HV:], ab[..., :HV], A_log, dt_bias, forked(s), True,
                                         use_qk_l2norm=not normalised)
    ((o.float() * do).sum() + (st * dst).sum()).backward()
    with torch.no_grad():
        o_ng, st_ng = gated_delta_rule_from_logits(q, k, v, ab[..., HV:], ab[..., :HV], A_log, dt_bias, forked(s),
                                                   True, use_qk_l2norm=not normalised)
    assert torch.equal(o, o_ng) and torch.equal(st, st_ng), "the forward under autograd differs"

    ref, theirs = leaves(torch.float32), leaves(torch.bfloat16)
    assert all(x is None or (x.is_leaf and x.grad is None) for x in ref + theirs), "the leaves must be fresh"
    q, k, v, ab, A_log, dt_bias, s = ref
    gf, bf = gdn_gates_reference(ab[..., HV:], ab[..., :HV], A_log, dt_bias)
    o_r, st_r = gated_delta_rule_reference(q, k, v, gf, bf, None, forked(s), True, use_qk_l2norm=not normalised)
    ((o_r * do).sum() + (st_r * dst).sum()).backward()

    q, k, v, ab, A_log, dt_bias, s = theirs
    o_f, st_f = fla().chunk_gated_delta_rule(
        q, k, v, ab[..., HV:], ab[..., :HV], initial_state=None if s is None else forked(s).contiguous(),
        output_final_state=True, use_qk_l2norm_in_kernel=not normalised, use_gate_in_kernel=True, A_log=A_log,
        dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
    ((o_f.float() * do).sum() + (st_f * dst).sum()).backward()

    assert relative_error(o.float(), o_r) < BF16_TOL and relative_error(st, st_r) < BF16_TOL
    for name, a, b, c in zip(("dq", "dk", "dv", "da, db", "dA_log", "ddt_bias", "dstate"), ours, ref, theirs):
        if a is None:
            continue
        # A_log's and dt_bias' gradients are sums over every token of terms of both signs: their
        # relative error is that of the terms times how much the sum cancels (fla's the same)
        # (and between two correct sums that amplification differs with the order of summation, so
        # "no less accurate than fla" gets a wider slack for them: the ledger's M27 has the case)
        cancels = name in ("dA_log", "ddt_bias")
        err = relative_error(a.grad.float(), b.grad)
        assert err < (5e-2 if cancels else BF16_TOL), f"{name}: relative error {err:.2e}"
        _assert_no_less_accurate(a.grad, c.grad, b.grad, name, slack=2.0 if cancels else 1.25)


@pytest.mark.parametrize("P, B, L", [(448, 32, 64), (192, 8, 262), (64, 2, 100)])
def test_shared_delta_rule_equals_its_two_calls(P, B, L):
    """`gated_delta_rule_shared`'s fused op (one kkt_solve launch over the prefix's and the suffixes'
    chunks, one output buffer) against the two `ChunkedDeltaRule` calls it replaces — the prefix from
    no state, the suffixes from its final state, forked — at Qwen3.5-2b head sizes, q and k
    normalised as the conv leaves them: the output within BF16 rounding of theirs (the prefix's
    chunks are solved at another kernel config: fla's tuner picks it for a lone prefix) and no less
    accurate against the FP32 reference; every gradient (q, k, v of both groups, the gate logits,
    A_log, dt_bias) within BF16 rounding of theirs. Shapes: shared-prefix-2b's, image-cache-warm-2b's
    (suffixes not a whole number of chunks), and two suffixes (the fused output kernel left for
    fla's split path). Without gradients (a prediction session's frozen parameters: A's upper blocks
    zeroed only for a group on the split path) the output is bit for bit the same."""
    from dohnuts.ops._dispatch import reference as reference_ops  # private: the parity tooling's switch
    from dohnuts.ops.delta_rule import _l2norm, gated_delta_rule_from_logits, gated_delta_rule_shared, shared_chunk_index

    g = torch.Generator(device=DEV).manual_seed(5)
    H, K = 16, 128
    R = P + B * L

    def leaf(*shape):
        return torch.randn(*shape, device=DEV, generator=g).bfloat16().requires_grad_()

    qp, kp, vp = (leaf(1, P, H, K) for _ in range(3))
    qs, ks, vs = (leaf(B, L, H, K) for _ in range(3))
    ab = leaf(R, 2 * H)
    A_log = torch.rand(H, device=DEV, generator=g).mul(15).add(1).log().requires_grad_()
    dt_bias = torch.randn(H, device=DEV, generator=g).requires_grad_()
    do = torch.randn(R, H, K, device=DEV, generator=g).bfloat16()
    leaves = (qp, kp, vp, qs, ks, vs, ab, A_log, dt_bias)

    def run(how: str, dtype=torch.bfloat16):
        for t in leaves:
            t.grad = None
        qpn, kpn, qsn, ksn = (_l2norm(t.float()).to(dtype) for t in (qp, kp, qs, ks))
        vpn, vsn, abn = (t.to(dtype) for t in (vp, vs, ab))
        a, b = abn[:, :H], abn[:, H:]
        if how != "two calls":
            q, k, v = (torch.cat([tp.view(P, H, K), ts.view(B * L, H, K)]) for tp, ts in
                       ((qpn, qsn), (kpn, ksn), (vpn, vsn)))
            frozen = how == "frozen"  # a prediction session's: no input needs a gradient
            o = gated_delta_rule_shared(*(t.detach() if frozen else t for t in (q, k, v, a, b, A_log, dt_bias)), P, L,
                                        shared_chunk_index(P, B, L, DEV), True)
            if frozen:
                return o, None
        else:
            o_p, st = gated_delta_rule_from_logits(qpn, kpn, vpn, a[:P].view(1, P, H), b[:P].view(1, P, H), A_log,
                                                   dt_bias, None, True, use_qk_l2norm=False)
            o_s, _ = gated_delta_rule_from_logits(qsn, ksn, vsn, a[P:].view(B, L, H), b[P:].view(B, L, H), A_log,
                                                  dt_bias, st.expand(B, -1, -1, -1), False, use_qk_l2norm=False)
            o = torch.cat([o_p.view(P, H, K), o_s.view(B * L, H, K)])
        if how == "reference":
            return o.detach().float(), None
        o.backward(do)
        return o.detach(), [t.grad.float() for t in leaves]

    theirs, their_grads = run("two calls")
    ours, our_grads = run("one op")
    frozen, _ = run("frozen")  # the upper blocks of A zeroed only where a split group reads them: the same numbers
    assert torch.equal(frozen, ours), "the op without gradients differs from the op with them"
    with torch.no_grad(), reference_ops():
        ref, _ = run("reference", torch.float32)
    assert relative_error(ours.float(), theirs.float()) < BF16_TOL
    _assert_no_less_accurate(ours, theirs, ref, "shared delta rule output")
    names = ("dq prefix", "dk prefix", "dv prefix", "dq suffixes", "dk suffixes", "dv suffixes", "da, db", "dA_log",
             "ddt_bias")
    for name, x, y in zip(names, our_grads, their_grads, strict=True):
        assert relative_error(x, y) < BF16_TOL, (name, relative_error(x, y))
