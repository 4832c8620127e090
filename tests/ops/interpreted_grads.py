"""Run by tests/ops/test_ops.py in a fresh process with TRITON_INTERPRET=1: the differentiable
Triton ops (RMSNorm with and without the residual, norm + rotary, the output gate, packed SwiGLU)
against torch autograd through their plain-torch references, on strided views, with and without
a trainable weight; the autograd forward equal, bit for bit, to the no-grad kernel's."""
import torch
from dohnuts.ops._norm_kernels import rms_norm_fn, norm_rope_fn, rms_norm_triton, norm_rope_triton
from dohnuts.ops._gate_kernel import gated_output_fn, gated_output_triton
from dohnuts.ops._swiglu_kernel import swiglu_packed_fn, swiglu_packed_triton
from dohnuts.ops.norm import add_rms_norm_reference, rms_norm_reference
from dohnuts.ops.rope import norm_rope_reference
from dohnuts.ops.attention import gated_output_reference
from dohnuts.ops.activation import swiglu_packed_reference

g = torch.Generator().manual_seed(0)


def grads(fn, inputs, weights_out):
    ins = [t.detach().clone().requires_grad_(rg) for t, rg in inputs]
    out = fn(*ins)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() * w).sum() for o, w in zip(outs, weights_out))
    loss.backward()
    return [o.detach() for o in outs], [t.grad for t in ins]


def check(name, fused, ref, inputs, tol=1e-4):
    with torch.no_grad():
        outs = fused(*[t for t, _ in inputs])
    outs = outs if isinstance(outs, tuple) else (outs,)
    ws = [torch.randn(o.shape, generator=g) for o in outs]
    fo, fg = grads(fused, inputs, ws)
    ro, rg = grads(ref, inputs, ws)
    for a, b in zip(fo, ro):
        assert (a.float() - b.float()).abs().max() < tol, (name, "forward")
    for i, (a, b) in enumerate(zip(fg, rg)):
        if b is None:
            assert a is None, (name, i)
            continue
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        assert err <= tol * max(1.0, scale), (name, "grad", i, err, scale)
    for a, b in zip(fo, outs):  # the autograd forward is the no-grad kernel's, bit for bit
        assert torch.equal(a, b), (name, "forward under autograd differs")


w = torch.randn(96, generator=g) * 0.1
wide = torch.randn(5, 7, 3 * 96, generator=g)
for x in (torch.randn(4, 9, 96, generator=g), wide[..., 96:192]):
    for offset in (0.0, 1.0):
        for wgrad in (False, True):
            check("rms", lambda x, w: rms_norm_fn(x, w, 1e-6, offset),
                  lambda x, w: rms_norm_reference(x, w, 1e-6, offset), [(x, True), (w, wgrad)])
            r = torch.randn(x.shape, generator=g)
            check("add_rms", lambda x, r, w: rms_norm_fn(x, w, 1e-6, offset, residual=r),
                  lambda x, r, w: add_rms_norm_reference(x, r, w, 1e-6, offset), [(x, True), (r, True), (w, wgrad)])
# norm + rope on a strided view of a packed projection; 3 heads, D = 40, R = 16
B, T, H, D, R = 2, 5, 3, 40, 16
qg = torch.randn(B, T, H, 2 * D + 6, generator=g)
wq = torch.randn(D, generator=g) * 0.1
ang = torch.randn(B, T, R // 2, generator=g)
cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
for wgrad in (False, True):
    for offset in (0.0, 1.0):
        check("norm_rope", lambda q, w: norm_rope_fn(q[..., :D], w, 1e-6, offset, cos, sin),
              lambda q, w: norm_rope_reference(q[..., :D], w, 1e-6, offset, cos, sin), [(qg, True), (wq, wgrad)])
# output gate: o (B, H, T, D) as a transposed view, gate a strided slice
o = torch.randn(B, T, H, D, generator=g)
check("gate", lambda o, qg: gated_output_fn(o.transpose(1, 2), qg[..., D:2 * D]),
      lambda o, qg: gated_output_reference(o.transpose(1, 2), qg[..., D:2 * D]), [(o, True), (qg, True)])
# SwiGLU on a packed (rows, 2I) view with I not a multiple of the block
gu = torch.randn(3, 4, 2 * 1100 + 10, generator=g)[..., 5:5 + 2 * 1100]
check("swiglu", swiglu_packed_fn, swiglu_packed_reference, [(gu, True)])
# outputs written with spare columns for a LoRA group (dohnuts.ops.spare): the same gradients
check("swiglu spare", lambda gu: swiglu_packed_fn(gu, 24), swiglu_packed_reference, [(gu, True)])
x, r = torch.randn(4, 9, 96, generator=g), torch.randn(4, 9, 96, generator=g)
check("add_rms spare", lambda x, r, w: rms_norm_fn(x, w, 1e-6, 1.0, residual=r, spare=40),
      lambda x, r, w: add_rms_norm_reference(x, r, w, 1e-6, 1.0), [(x, True), (r, True), (w, False)])
# bf16 inputs: gradients in the input dtypes
xb = torch.randn(6, 64, generator=g).bfloat16()
rb = torch.randn(6, 64, generator=g)
xb.requires_grad_(); rb.requires_grad_()
y, s = rms_norm_fn(xb, w[:64], 1e-6, 1.0, residual=rb)
(y.float().sum() + s.sum()).backward()
assert xb.grad.dtype == torch.bfloat16 and rb.grad.dtype == torch.float32
print("ok")
