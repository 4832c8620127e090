"""Gradient parity of dohnuts' differentiable kernels, run on the CPU in Triton's interpreter.

Run by tests/ops/test_autograd_kernels.py in a fresh process with TRITON_INTERPRET=1 (the variable
must be set before any kernel is made, and the test session hides fla on a CPU machine):
`python -c "from tests.ops.interpreted_autograd import main; main('conv')"` prints "ok".

Each check compares an autograd Function (the forward kernels that serve prediction, with their
backward) against torch.autograd through the plain-torch reference ops in FP64, at tiny sizes, and
checks that the forward under autograd is bitwise the forward without it (the same kernels).
"""

from __future__ import annotations

import ast
import contextlib
import sys

import torch


def patch_interpreter_for_fla() -> None:
    """Two gaps between Triton's interpreter and compiled Triton that fla's kernels (not dohnuts')
    fall into; both patches make the interpreter behave as the compiler does.

    1. Autotuning times each config on the device: the interpreter has no device driver. Here
       every config "measures" its index, so the first config runs (nothing is timed).
    2. In compiled Triton the variable of a `for i in range(n)` loop is a tensor (fla calls
       `i_t.to(tl.int64)` on it); the interpreter runs Python's range and hands out ints. Here each
       such loop's variable is converted to a tensor at the top of its body, as the interpreter
       already does for every assignment."""
    import triton.runtime.autotuner as autotuner
    import triton.runtime.interpreter as interpreter

    def bench(self, *args, config, **meta):
        return [float(self.configs.index(config)), 0.0, 0.0]

    autotuner.Autotuner._bench = bench

    class LoopVariablesAreTensors(interpreter.ASTTransformer):
        def visit_For(self, node):
            node = self.generic_visit(node)
            it, var = node.iter, node.target
            if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                    and isinstance(var, ast.Name)):
                to_tensor = ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                          ctx=ast.Load())
                node.body.insert(0, ast.Assign(
                    targets=[ast.Name(id=var.id, ctx=ast.Store())],
                    value=ast.Call(func=to_tensor, args=[ast.Name(id=var.id, ctx=ast.Load()), ast.Constant(False)],
                                   keywords=[])))
            return node

    interpreter.FunctionRewriter.ast_transformer = LoopVariablesAreTensors()


def patch_interpreter_device_calls() -> None:
    """Speed alone: the interpreter's calls of one jitted function from another run as before,
    without listing the language's modules again at every call.

    At every such call (fla's kernels make about 22,000 in the delta-rule check, dohnuts' norm
    and rotary kernels thousands) Triton's interpreter patches the language's builtins again, and
    to find them it lists every member of `triton.language`, its `core`, `math`, `tensor` and
    `tensor_descriptor_base` with `inspect.getmembers` (the CPU it cost: docs/history/evolution.md
    M56). The builtins are the same at every call: listed once here, before any kernel runs (none
    patched yet), each call patches those of them that are still builtins, as the interpreter's
    own loop does — the same attributes patched with the same wrappers, in the same scope. Any
    other object is listed by the interpreter's own function; a Triton without those internals is
    left as it is."""
    import inspect

    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    listed = getattr(interpreter, "_patch_builtin", None)
    if listed is None or not hasattr(interpreter, "_patch_attr") or not hasattr(tl.core, "tensor_descriptor_base"):
        return  # another Triton: speed only
    builtins = {id(pkg): (pkg, [name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)])
                for pkg in (tl, tl.core, tl.math, tl.tensor, tl.core.tensor_descriptor_base)}

    def patch_builtin(pkg, builder, scope):
        known = builtins.get(id(pkg))
        if known is None or known[0] is not pkg:
            return listed(pkg, builder, scope)
        for name in known[1]:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """Norm-wise relative error of `got` against the FP64 `want`."""
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def _leaves(tensors, dtype=None):
    return [None if t is None else t.to(dtype or t.dtype).clone().requires_grad_() for t in tensors]


def _backward(outputs, grads):
    torch.autograd.backward([o for o, g in zip(outputs, grads) if o is not None and g is not None],
                            [g.to(o.dtype) for o, g in zip(outputs, grads) if o is not None and g is not None])


# ---- the conv (dohnuts.ops._conv_bwd_kernel.ConvSiluParts) -------------------------------------------

def check_conv(full: bool) -> None:
    import torch.nn.functional as F

    from dohnuts.ops._conv_bwd_kernel import conv_silu_parts
    from dohnuts.ops.conv import causal_conv1d_parts_fused, causal_conv1d_parts_reference
    from dohnuts.ops.delta_rule import _l2norm

    g = torch.Generator().manual_seed(0)
    B, W, hd, sizes = 2, 4, 16, [16, 16, 32]
    C = sum(sizes)

    def reference(packed, w, s0, normalized_parts, out_state):
        x = packed[..., 4:4 + C]
        parts, st = causal_conv1d_parts_reference(x, w, sizes, None if s0 is None else s0.expand(B, -1, -1),
                                                  out_state)
        parts = [_l2norm(p.view(B, -1, p.shape[-1] // hd, hd)).view(p.shape) if i < normalized_parts else p
                 for i, p in enumerate(parts)]
        return parts, st

    # T: partial blocks, fewer tokens than the conv width, three blocks; states: none, one per row,
    # a forked (batch-broadcast, stride 0) view of a state in the graph, and one (1, C, W) state
    # read by every row
    # a partial block and fewer tokens than the conv's width; the `full` lane adds two blocks of 32
    # and one of 64 over 70 tokens
    for T, bt in ((45, 32), (2, 32)) + (((70, 32), (70, 64)) if full else ()):
        for kind in ("none", "rows", "forked", "one"):
            packed0 = torch.randn(B, T, C + 8, generator=g)  # x is a column slice of it, strided
            w0 = torch.randn(C, W, generator=g) * 0.5
            s00 = {"none": None, "rows": torch.randn(B, C, W, generator=g)}.get(kind, torch.randn(1, C, W, generator=g))
            for normalized_parts, out_state in ((2, True), (0, kind != "rows")):
                dys = [torch.randn(B, T, n, generator=g) for n in sizes]
                dst = torch.randn(B, C, W, generator=g) if out_state else None
                pr, wr, sr = _leaves([packed0, w0, s00], torch.float64)
                parts_r, st_r = reference(pr, wr, sr, normalized_parts, out_state)
                _backward([*parts_r, st_r], [*dys, dst])
                pk, w, s0 = _leaves([packed0, w0, s00])
                x = pk[..., 4:4 + C]
                s0v = s0.expand(B, -1, -1) if kind == "forked" else s0
                parts, st = conv_silu_parts(x, w, hd, sizes, normalized_parts=normalized_parts, initial_state=s0v,
                                            output_final_state=out_state, cpu_block_t=bt)
                _backward([*parts, st], [*dys, dst])
                what = (T, bt, kind, normalized_parts, out_state)
                assert all(p.is_contiguous() for p in parts), what
                for name, got, want in (("y", torch.cat(parts, -1), torch.cat(parts_r, -1)), ("dx", pk.grad, pr.grad),
                                        ("dw", w.grad, wr.grad)):
                    assert rel(got, want) < 1e-5, (*what, name, rel(got, want))
                if out_state:
                    assert torch.equal(st.double(), st_r), (*what, "final state")  # a copy of inputs
                if s0 is not None:
                    assert s0.grad.shape == s0.shape and rel(s0.grad, sr.grad) < 1e-5, (*what, "ds0")
                # the forward under autograd is the forward without it, bitwise
                with torch.no_grad():
                    parts_ng, st_ng = conv_silu_parts(x, w, hd, sizes, normalized_parts=normalized_parts,
                                                      initial_state=s0v, output_final_state=out_state, cpu_block_t=bt)
                assert all(torch.equal(a, b) for a, b in zip(parts, parts_ng)), (*what, "no-grad forward")
                assert st is st_ng is None or torch.equal(st, st_ng)
    # x the first C columns of a packed projection split by `columns` (Gated DeltaNet's qkv/b/a): dx
    # is written as the first columns of a buffer as wide as the projection, the other part's
    # gradient copied beside it, and that buffer is the projection's gradient — the same values
    from dohnuts.model.packing import _Columns, columns

    packed0, w0 = torch.randn(B, 45, C + 8, generator=g), torch.randn(C, W, generator=g) * 0.5
    dys, d8 = [torch.randn(B, 45, n, generator=g) for n in sizes], torch.randn(B, 45, 8, generator=g)
    pr, wr = _leaves([packed0, w0], torch.float64)
    parts_r, _ = reference(F.pad(pr[..., :C], (4, 4)), wr, None, 2, False)
    _backward([*parts_r, pr[..., C:] * 3.0], [*dys, d8])
    pk, w = _leaves([packed0, w0])
    seen = {}
    real_bwd = _Columns.backward

    def spy(ctx, *grads):
        seen["first_is_wide"] = grads[0]._base is not None and grads[0]._base.shape[-1] == C + 8
        out = real_bwd(ctx, *grads)
        seen["written_once"] = out[0].data_ptr() == grads[0].data_ptr()
        return out

    _Columns.backward = staticmethod(spy)
    try:
        x, rest = columns(pk * 1.0, [C, 8])
        parts, _ = conv_silu_parts(x, w, hd, sizes, normalized_parts=2, cpu_block_t=32)
        _backward([*parts, rest * 3.0], [*dys, d8])
    finally:
        _Columns.backward = staticmethod(real_bwd)
    assert seen == {"first_is_wide": True, "written_once": True}, seen
    assert rel(pk.grad, pr.grad) < 1e-5 and rel(w.grad, wr.grad) < 1e-5, "packed projection's gradient"
    # causal_conv1d_parts' fused path (no norm, 16 channels a program) is the same Function
    x0, w0, s00 = torch.randn(B, 45, C, generator=g), torch.randn(C, W, generator=g), torch.randn(B, C, W, generator=g)
    dys = [torch.randn(B, 45, n, generator=g) for n in sizes]
    xr, wr, sr = _leaves([x0, w0, s00], torch.float64)
    _backward(causal_conv1d_parts_reference(xr, wr, sizes, sr, False)[0], dys)
    x, w, s0 = _leaves([x0, w0, s00])
    _backward(causal_conv1d_parts_fused(x, w, sizes, s0, False)[0], dys)
    for name, a, b in (("dx", x, xr), ("dw", w, wr), ("ds0", s0, sr)):
        assert rel(a.grad, b.grad) < 1e-5, ("conv parts", name)
    # a frozen weight (LoRA training: no weight gradient is computed) and a forked state
    x, s0 = _leaves([x0, s00[:1]])
    _backward(conv_silu_parts(x, w0, hd, sizes, normalized_parts=2, initial_state=s0.expand(B, -1, -1))[0], dys)
    xr, sr = _leaves([x0, s00[:1]], torch.float64)
    _backward(reference(F.pad(xr, (4, 4)), w0.double(), sr, 2, False)[0], dys)
    assert rel(x.grad, xr.grad) < 1e-5 and rel(s0.grad, sr.grad) < 1e-5, "frozen weight"
    # a shared pass's rows in one launch (conv_silu_shared): x a strided column slice of (R, ·) rows,
    # the reference the prefix's call then the suffixes' from its final state, forked; blocks that
    # straddle groups, a prefix and suffixes shorter than the conv's width (the `full` lane adds more)
    from dohnuts.ops._conv_bwd_kernel import conv_silu_shared

    def reference_rows(x, w, s0, rows, out_state):  # x (rows, T, C)
        parts, st = causal_conv1d_parts_reference(x, w, sizes, None if s0 is None else s0.expand(rows, -1, -1),
                                                  out_state)
        return [_l2norm(p.view(rows, -1, p.shape[-1] // hd, hd)).view(p.shape) if i < 2 else p
                for i, p in enumerate(parts)], st

    for P, n, L, bt, frozen in ((45, 3, 7, 8, False), (2, 2, 3, 8, True)) + (((70, 3, 20, 32, False), (64, 2, 64, 16, False), (9, 4, 1, 8, False)) if full else ()):
        R = P + n * L
        packed0, w0 = torch.randn(R, C + 8, generator=g), torch.randn(C, W, generator=g) * 0.5
        dys = [torch.randn(R, m, generator=g) for m in sizes]
        pr, wr = _leaves([packed0, w0], torch.float64)
        xr = pr[:, 4:4 + C]
        ref_p, st = reference_rows(xr[:P].view(1, P, C), wr, None, 1, True)
        ref_s, _ = reference_rows(xr[P:].view(n, L, C), wr, st, n, False)
        _backward([torch.cat([a.reshape(P, -1), b.reshape(n * L, -1)]) for a, b in zip(ref_p, ref_s)], dys)
        pk, w = _leaves([packed0, w0])
        w = w0 if frozen else w
        parts = conv_silu_shared(pk[:, 4:4 + C], w, hd, sizes, P, L, normalized_parts=2, cpu_block_t=bt)
        _backward(parts, dys)
        what = ("shared", P, n, L, bt)
        assert all(q.is_contiguous() and q.shape == (R, m) for q, m in zip(parts, sizes)), what
        assert rel(torch.cat(parts, -1), torch.cat([torch.cat([a.reshape(P, -1), b.reshape(n * L, -1)])
                                                    for a, b in zip(ref_p, ref_s)], -1)) < 1e-5, (*what, "y")
        assert rel(pk.grad, pr.grad) < 1e-5, (*what, "dx", rel(pk.grad, pr.grad))
        assert frozen or rel(w.grad, wr.grad) < 1e-5, (*what, "dw")
        with torch.no_grad():
            parts_ng = conv_silu_shared(pk[:, 4:4 + C], w, hd, sizes, P, L, normalized_parts=2, cpu_block_t=bt)
            x = pk[:, 4:4 + C]  # and bit for bit the two calls it replaces
            two_p, st = conv_silu_parts(x[:P].view(1, P, C), w, hd, sizes, normalized_parts=2, output_final_state=True,
                                        cpu_block_t=bt)
            two_s, _ = conv_silu_parts(x[P:].view(n, L, C), w, hd, sizes, normalized_parts=2,
                                       initial_state=st.expand(n, -1, -1), cpu_block_t=bt)
        assert all(torch.equal(a, b) for a, b in zip(parts, parts_ng)), (*what, "no-grad forward")
        assert all(torch.equal(a, torch.cat([b.reshape(P, -1), c.reshape(n * L, -1)]))
                   for a, b, c in zip(parts, two_p, two_s)), (*what, "the two calls")


# ---- the gates (dohnuts.ops._gdn_gates_kernel.GdnGates) ------------------------------------------

def check_gates(full: bool) -> None:
    import torch.nn.functional as F

    from dohnuts.ops._gdn_gates_kernel import gdn_gates

    g = torch.Generator().manual_seed(1)
    scale = 1.4426950216  # fla's RCP_LN2

    def reference(a, b, A_log, dt_bias, T):
        decay = -A_log.exp() * F.softplus(a + dt_bias)
        pad = (-T) % 64
        gc = F.pad(decay, (0, 0, 0, pad)).view(a.shape[0], -1, 64, a.shape[-1]).cumsum(2).flatten(1, 2)[:, :T]
        return gc * scale, b.sigmoid()

    for H, T in ((4, 100), (3, 64), (16, 150)):  # 2 chunks (the second partial), one whole chunk, 2b's heads
        packed0 = torch.randn(3, T, 5 + 2 * H, generator=g) * 2
        packed0[:, 7, 5:5 + H] = 25.0  # a logit past softplus' threshold (20): softplus(x) = x
        A_log0, dt0 = torch.rand(H, generator=g).mul(15).add(1).log(), torch.randn(H, generator=g)
        for with_dg, with_dbeta in ((True, True), (True, False), (False, True)):
            dg = torch.randn(3, T, H, generator=g) if with_dg else None
            dbeta = torch.randn(3, T, H, generator=g) if with_dbeta else None
            pr, Ar, dr = _leaves([packed0, A_log0, dt0], torch.float64)
            _backward(reference(pr[..., 5:5 + H], pr[..., 5 + H:], Ar, dr, T), [dg, dbeta])
            pk, A_log, dt = _leaves([packed0, A_log0, dt0])
            gg, beta = gdn_gates(pk[..., 5:5 + H], pk[..., 5 + H:], A_log, dt, chunk_size=64, scale=scale)
            _backward([gg, beta], [dg, dbeta])
            for name, got, want in (("da, db", pk.grad, pr.grad), ("dA_log", A_log.grad, Ar.grad),
                                    ("ddt_bias", dt.grad, dr.grad)):
                if want is None:
                    assert got is None or not got.any(), (H, T, name)
                    continue
                assert rel(got, want) < 1e-5, (H, T, with_dg, with_dbeta, name, rel(got, want))
            with torch.no_grad():
                g_ng, beta_ng = gdn_gates(pk[..., 5:5 + H], pk[..., 5 + H:], A_log, dt, chunk_size=64, scale=scale)
            assert torch.equal(gg, g_ng) and torch.equal(beta, beta_ng), "no-grad forward"

    # one launch over a shared pass's rows (a prefix of P, then B suffixes of L, each chunked from its
    # own start: varlen) against a launch per group, bitwise; rows read through a packed row stride
    from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton, gdn_gates_varlen_triton
    from dohnuts.ops.delta_rule import shared_chunk_index

    for P, B, L in ((70, 3, 20), (128, 2, 64), (64, 2, 150)):
        H, R = 16, P + B * L
        packed = torch.randn(R, 5 + 2 * H, generator=g) * 2
        a, b = packed[:, 5:5 + H], packed[:, 5 + H:]
        A_log, dt = torch.rand(H, generator=g).mul(15).add(1).log(), torch.randn(H, generator=g)
        one = gdn_gates_varlen_triton(a, b, A_log, dt, shared_chunk_index(P, B, L, a.device), 64, scale)
        for rows, shape in ((slice(0, P), (1, P, H)), (slice(P, R), (B, L, H))):
            per = gdn_gates_triton(a[rows].view(shape), b[rows].view(shape), A_log, dt, 64, scale)
            for x, y in zip(one, per):
                assert torch.equal(x[rows], y.reshape(-1, H)), ("varlen gates", P, B, L)


# ---- the delta rule (dohnuts.ops.delta_rule.ChunkedDeltaRule) ------------------------------------

def _delta_inputs(g, B, T, H, HV, K, V, state):
    packed = torch.randn(B, T, 3 * HV, generator=g)  # a and b as column slices of a packed projection
    s0 = {"none": None, "rows": torch.randn(B, HV, K, V, generator=g) * 0.3}.get(
        state, torch.randn(1, HV, K, V, generator=g) * 0.3)
    return [torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g),
            torch.randn(B, T, HV, V, generator=g), packed, torch.rand(HV, generator=g).mul(15).add(1).log(),
            torch.randn(HV, generator=g), s0]


def check_delta_rule(full: bool) -> None:
    from dohnuts.ops import delta_rule
    from dohnuts.ops._fla import fla
    from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton
    from dohnuts.ops.delta_rule import (
        _l2norm, gated_delta_rule_from_logits, gated_delta_rule_fused, gated_delta_rule_reference, gdn_gates_reference,
    )

    g = torch.Generator().manual_seed(2)
    # 3 chunks of 64 in the `full` lane, 2 in the test command (the last partial in both: a state
    # carried over a chunk boundary either way); grouped value heads
    B, T, H, HV, K, V = 2, 130 if full else 70, 2, 4, 16, 32
    delta_rule.use_fused = lambda x: True  # the fused path on CPU tensors (the kernels: interpreted)
    tight, gates = 1e-4, 5e-3

    def split(p):
        return p[..., :HV], p[..., HV:2 * HV]

    # (the output kernel, the state, whether q and k arrive normalised as from the conv kernel)
    # the test command: each output kernel, each state and both arrivals of q and k once; the `full`
    # lane: five combinations
    cases = (("fused", "rows", False), ("fused", "forked", True), ("split", "none", True))
    for path, state, normalised in cases + ((("fused", "none", False), ("split", "forked", False)) if full else ()):
        delta_rule._multiprocessors = lambda device, mp=1 if path == "fused" else 10 ** 9: mp
        inputs = _delta_inputs(g, B, T, H, HV, K, V, state)
        if normalised:
            inputs[0], inputs[1] = _l2norm(inputs[0]), _l2norm(inputs[1])
        do, dst = torch.randn(B, T, HV, V, generator=g), torch.randn(B, HV, K, V, generator=g)
        qr, kr, vr, pr, Ar, dr, sr = _leaves(inputs, torch.float64)
        a, b = split(pr)
        gr, betar = gdn_gates_reference(a, b, Ar, dr)
        o_r, st_r = gated_delta_rule_reference(qr, kr, vr, gr, betar, None,
                                               None if sr is None else sr.expand(B, -1, -1, -1), True,
                                               use_qk_l2norm=not normalised)
        _backward([o_r, st_r], [do, dst])
        q, k, v, pk, A_log, dt, s0 = leaves = _leaves(inputs)
        s0v = None if s0 is None else s0.expand(B, -1, -1, -1) if state == "forked" else s0
        o, st = gated_delta_rule_from_logits(q, k, v, *split(pk), A_log, dt, s0v, True,
                                             use_qk_l2norm=not normalised)
        _backward([o, st], [do, dst])
        # fla's own autograd op (its forward kernels and gate kernels, the same backward kernels) on
        # the same inputs, a forked state made dense
        fla_leaves = _leaves(inputs)
        qf, kf, vf, pf, Af, df, sf = fla_leaves
        o_f, st_f = fla().chunk_gated_delta_rule(
            qf, kf, vf, *split(pf), initial_state=None if sf is None else sf.expand(B, -1, -1, -1).contiguous(),
            output_final_state=True, use_qk_l2norm_in_kernel=not normalised, use_gate_in_kernel=True, A_log=Af,
            dt_bias=df, use_beta_sigmoid_in_kernel=True)
        _backward([o_f, st_f], [do, dst])
        what = (path, state, normalised)
        assert rel(o, o_r.detach()) < tight and rel(st, st_r.detach()) < tight, (*what, "forward")
        names = ("dq", "dk", "dv", "da, db", "dA_log", "ddt_bias", "ds0")
        for name, x, xr, xf in zip(names, leaves, (qr, kr, vr, pr, Ar, dr, sr), fla_leaves):
            if x is None:
                continue
            # A_log's and dt_bias' gradients sum terms of both signs over the tokens, and fla's dg
            # (differences of products, the same in both) has an absolute error floor: looser
            tol = gates if name in ("dA_log", "ddt_bias") else tight
            assert x.grad is not None and rel(x.grad, xr.grad) < tol, (*what, name, rel(x.grad, xr.grad))
            # Against fla's op: the same backward kernels, so the same gradients up to the forward's
            # rounding — which the cancelling sums amplify as much as they amplify the error against
            # FP64, differently from one CPU to another (docs/history/evolution.md M28): for those,
            # a tenth of fla's own distance from the reference.
            against = max(1e-5, 0.1 * rel(xf.grad.double(), xr.grad)) if name in ("dA_log", "ddt_bias") else 1e-5
            assert rel(x.grad, xf.grad.double()) < against, (*what, name, "against fla", rel(x.grad, xf.grad.double()))
        with torch.no_grad():  # the same kernels with and without autograd: bitwise
            o_ng, st_ng = gated_delta_rule_from_logits(*leaves[:3], *split(pk), A_log, dt, s0v, True,
                                                       use_qk_l2norm=not normalised)
        assert torch.equal(o, o_ng) and torch.equal(st, st_ng), (*what, "no-grad forward")
        del leaves

    # the split path's state and output steps, launched by dohnuts (the final state left
    # uninitialised, the output into a given buffer), against fla's wrappers that zero-fill and copy:
    # bitwise, every fresh float allocation NaN
    f = fla()
    q0, k0, v0, packed0, A_log0, dt0, _ = _delta_inputs(g, B, T, H, HV, K, V, "none")
    gg, bb = gdn_gates_triton(*split(packed0), A_log0, dt0, chunk_size=64, scale=f.RCP_LN2)
    with torch.no_grad(), _nan_empty():
        w, u, _ = f.chunk_gated_delta_rule_fwd_intra(k=k0, v=v0, g=gg, beta=bb, chunk_size=64)
        for h0 in (None, torch.randn(B, HV, K, V, generator=g) * 0.3):  # from no state, from a state a row
            want = f.chunk_gated_delta_rule_fwd_h(k=k0, w=w, u=u, g=gg, initial_state=h0, output_final_state=True,
                                                  chunk_size=64)
            got = delta_rule._fla_state_step(k=k0, w=w, u=u, g=gg, initial_state=h0, output_final_state=True,
                                             chunk_size=64)
            assert all(torch.equal(x, y) for x, y in zip(got, want)), ("state step", h0 is None)
        buf = torch.empty_like(v0)
        o = delta_rule._fla_output(f, q0, k0, got[1], got[0], gg, K ** -0.5, out=buf)
        assert o is buf and torch.equal(o, f.chunk_fwd_o(q=q0, k=k0, v=got[1], h=got[0], g=gg, scale=K ** -0.5,
                                                          chunk_size=64)), "output step"

    # explicit gates (gated_delta_rule's fused path): g per token in natural log, β given; its
    # chunk cumsum is torch, so g's gradient is the Function's taken back through it
    delta_rule._multiprocessors = lambda device: 1
    q0, k0, v0, packed0, A_log0, dt0, s00 = _delta_inputs(g, B, T, H, HV, K, V, "rows")
    g0, beta0 = (t.detach() for t in gdn_gates_reference(*split(packed0), A_log0, dt0))
    do, dst = torch.randn(B, T, HV, V, generator=g), torch.randn(B, HV, K, V, generator=g)
    ref = _leaves([q0, k0, v0, g0, beta0, s00], torch.float64)
    _backward(gated_delta_rule_reference(*ref[:5], None, ref[5], True), [do, dst])
    got = _leaves([q0, k0, v0, g0, beta0, s00])
    _backward(gated_delta_rule_fused(*got[:5], None, got[5], True), [do, dst])
    for name, x, xr in zip(("dq", "dk", "dv", "dg", "dbeta", "ds0"), got, ref):
        assert rel(x.grad, xr.grad) < (gates if name == "dg" else tight), ("explicit gates", name, rel(x.grad, xr.grad))


# ---- Gated DeltaNet's shared pass: the forked conv and recurrent states in the graph ------------

@contextlib.contextmanager
def _nan_empty():
    """torch.empty and empty_like fill floating tensors with NaN while active (on the CPU fresh
    memory is often zeros, which hides a read of what no kernel wrote)."""
    real, real_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *a, **kw: poison(real(*a, **kw))
    torch.empty_like = lambda *a, **kw: poison(real_like(*a, **kw))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real, real_like


def check_shared_mixer(full: bool) -> None:
    """`GatedDeltaNet.forward_shared` (a prefix, then its suffixes from its conv state — its last rows,
    read in place by the shared conv — and its recurrent state, an expanded view) with the fused conv and delta rule against the same module on the
    reference ops: output and every gradient, so gradients of all branches reach the prefix — with
    the prefix and the suffixes each on the fused output kernel or the split path (the GPU's
    multiprocessor count draws the line), a prefix that is not a whole number of chunks. And the
    shared conv (one launch over both groups' rows) and the fused `SharedDeltaRule` (one kkt_solve
    launch over both groups' chunks) equal the two calls each replaces, bitwise."""
    from dohnuts.config import preset
    from dohnuts.model.deltanet import GatedDeltaNet
    from dohnuts.model.state import SharedRows
    from dohnuts.ops import conv, delta_rule

    torch.manual_seed(3)
    cfg = preset("tiny").text
    mixer = GatedDeltaNet(cfg)
    P, n, t = 70, 3, 20
    x0 = torch.randn(P + n * t, cfg.hidden_size)
    dy = torch.randn(P + n * t, cfg.hidden_size)
    # multiprocessors: both groups on the fused output kernel; the prefix split, the suffixes fused
    # (a GPU's case); both split
    runs = []
    for fused, mp in ((False, 1), (True, 1), (True, 20), (True, 10 ** 9)):
        conv.use_fused = delta_rule.use_fused = lambda x, fused=fused: fused
        delta_rule._multiprocessors = lambda device, mp=mp: mp
        mixer.zero_grad()
        x = x0.clone().requires_grad_()
        y = mixer.forward_shared(x, SharedRows(((1, P, None), (n, t, None))))
        y.backward(dy)
        runs.append((y.detach(), x.grad, {k: p.grad.clone() for k, p in mixer.named_parameters()}))
        if fused:  # the one op against the two calls it replaces, on the same inputs; every
            # uninitialised float allocation NaN, so a read of memory no kernel wrote shows
            with torch.no_grad(), _nan_empty():
                mixed, b, a = mixer.project(x0)
                qkv_p, conv_p, _ = mixer._conv(mixed[:P].view(1, P, -1), None, True)
                qkv_s, _, _ = mixer._conv(mixed[P:].view(n, t, -1), conv_p.expand(n, -1, -1), False)
                o_p, state = mixer._delta(qkv_p, b[:P].view(1, P, -1), a[:P].view(1, P, -1), None, True, True)
                o_s, _ = mixer._delta(qkv_s, b[P:].view(n, t, -1), a[P:].view(n, t, -1), state.expand(n, -1, -1, -1),
                                      False, True)
                (q, k, v), _ = conv.causal_conv1d_qkv_shared(
                    mixed, mixer.conv1d.weight.squeeze(1), [cfg.linear_key_dim, cfg.linear_key_dim,
                                                            cfg.linear_value_dim], cfg.linear_key_head_dim, P, t)
                for one_part, part_p, part_s in zip((q, k, v), qkv_p, qkv_s):
                    assert torch.equal(one_part, torch.cat([part_p.reshape(P, -1), part_s.reshape(n * t, -1)])), mp
                R, K = P + n * t, cfg.linear_key_head_dim
                one = delta_rule.gated_delta_rule_shared(  # frozen parameters, as a prediction session's
                    q.view(R, -1, K), k.view(R, -1, K), v.view(R, -1, cfg.linear_value_head_dim), a, b,
                    mixer.A_log.detach(), mixer.dt_bias.detach(), P, t,
                    delta_rule.shared_chunk_index(P, n, t, x0.device), True)
            assert torch.equal(one, torch.cat([o_p.reshape(P, *o_p.shape[2:]), o_s.reshape(n * t, *o_s.shape[2:])])), mp
    (y_r, dx_r, grads_r), *fused_runs = runs
    for mp, (y_f, dx_f, grads_f) in zip((1, 20, 10 ** 9), fused_runs):
        assert rel(y_f, y_r.double()) < 1e-4 and rel(dx_f, dx_r.double()) < 1e-4, (mp, rel(y_f, y_r.double()),
                                                                                   rel(dx_f, dx_r.double()))
        for name, grad in grads_r.items():
            assert rel(grads_f[name], grad.double()) < 1e-3, (mp, name, rel(grads_f[name], grad.double()))


CHECKS = {"conv": check_conv, "gates": check_gates, "delta_rule": check_delta_rule, "shared_mixer": check_shared_mixer}


def main(name: str, full: bool = True) -> None:
    """`full`: every combination a check has (the `full` lane); else the covering subset the test
    command runs."""
    patch_interpreter_for_fla()
    patch_interpreter_device_calls()
    CHECKS[name](full)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
