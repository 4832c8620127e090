"""`linear_group` (dohnuts.model.lora): one GEMM for a group's frozen bases, each adapter's update
added into its own columns, with a backward of its own — against the plain composition autograd
differentiates (x Wᵢᵀ + sᵢ · (xd Aᵢᵀ) Bᵢᵀ per member, concatenated), and by finite differences."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dohnuts.model.lora import LoRAConfig, LoRALinear, _LinearGroup, linear_group
from tests.reference import relative_error


def _group(dtype=torch.float64, outs=(12, 5, 7), lora=(True, False, True), rank=3, bias=False, dropout=0.0):
    """Sibling linears over one input (in = 10), some LoRA-wrapped with non-zero B, and the
    packed weight (their bases' rows, in order)."""
    g = torch.Generator().manual_seed(0)
    cfg = LoRAConfig(rank=rank, alpha=2.0 * rank + 1, dropout=dropout)
    members = []
    for n, adapted in zip(outs, lora):
        base = nn.Linear(10, n, bias=bias).to(dtype)
        with torch.no_grad():
            base.weight.copy_(torch.randn(n, 10, generator=g, dtype=dtype))
        m = LoRALinear(base, cfg, g) if adapted else base.requires_grad_(False)
        if adapted:
            with torch.no_grad():
                m.lora_A.data = m.lora_A.data.to(dtype)
                m.lora_B.data = torch.randn(n, rank, generator=g, dtype=dtype)
        members.append(m)
    return tuple(members), torch.cat([m.weight for m in members]).detach()


def _composition(x, members):
    """What the group computes, written the plain way (each member its own GEMMs)."""
    parts = []
    for m in members:
        y = x @ m.weight.t()
        if isinstance(m, LoRALinear):
            y = y + m.scaling * (x @ m.lora_A.t()) @ m.lora_B.t()
        parts.append(y)
    return torch.cat(parts, dim=-1)


def _adapter_params(members):
    return [p for m in members if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]


@pytest.mark.parametrize("lora", [(True, False, True), (True, True, True), (False, False, True)])
def test_group_output_and_gradients_equal_the_composition(lora):
    members, w = _group(lora=lora)
    x = torch.randn(2, 9, 10, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 9, sum(m.weight.shape[0] for m in members), dtype=torch.float64)
    got = []
    for fn in (lambda: linear_group(x, members, w), lambda: _composition(x, members)):
        x.grad = None
        for p in _adapter_params(members):
            p.grad = None
        y = fn()
        (y * dy).sum().backward()
        got.append([y.detach(), x.grad.clone()] + [p.grad.clone() for p in _adapter_params(members)])
    for a, b in zip(*got):
        assert a.shape == b.shape and relative_error(a, b) < 1e-12


def test_group_gradients_by_finite_differences():
    """torch.autograd.gradcheck on the function itself: x, the adapters' input after dropout (a
    separate tensor), a bias and every A and B, in float64."""
    g = torch.Generator().manual_seed(1)

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    x, xd, w, bias = t(6, 10), t(6, 10), t(11, 10), t(11)
    a1, b1, a2, b2 = t(3, 10), t(4, 3), t(2, 10), t(5, 2)
    spans, scales = ((0, 4), (6, 11)), (1.5, 0.5)
    assert torch.autograd.gradcheck(lambda *z: _LinearGroup.apply(z[0], z[1], z[2], z[3], spans, scales, *z[4:]),
                                    (x, xd, w, bias, a1, b1, a2, b2))
    assert torch.autograd.gradcheck(lambda *z: _LinearGroup.apply(z[0], None, z[1], None, spans, scales, *z[2:]),
                                    (x, w, a1, b1, a2, b2))


def test_a_single_adapted_linear_with_a_bias_and_dropout():
    """LoRALinear.forward is the group of one: its bias is added, and its dropout masks only the
    adapters' input (eval: no dropout)."""
    (m,), w = _group(outs=(7,), lora=(True,), bias=True, dropout=0.5)
    x = torch.randn(4, 10, dtype=torch.float64)
    m.eval()
    want = x @ m.weight.t() + m.bias + m.scaling * (x @ m.lora_A.t()) @ m.lora_B.t()
    assert relative_error(m(x).detach(), want.detach()) < 1e-12
    m.train()
    torch.manual_seed(5)
    got = m(x)
    torch.manual_seed(5)
    xd = torch.nn.functional.dropout(x, 0.5, True)
    want = x @ m.weight.t() + m.bias + m.scaling * (xd @ m.lora_A.t()) @ m.lora_B.t()
    assert relative_error(got.detach(), want.detach()) < 1e-12


def test_autocast_runs_the_group_in_bf16_with_fp32_adapter_gradients():
    """Under CPU autocast (BF16) the group computes in BF16, as autocast's own linear would, and
    the FP32 master adapters get FP32 gradients close to the FP32 computation's."""
    members, w = _group(dtype=torch.float32, lora=(True, True, False))
    x = torch.randn(16, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear_group(x, members, w.bfloat16())
    assert y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    got = [p.grad.clone() for p in _adapter_params(members)]
    for p in _adapter_params(members):
        p.grad = None
    _composition(x, members).square().sum().backward()
    for a, p in zip(got, _adapter_params(members)):
        assert a.dtype == torch.float32 and relative_error(a, p.grad) < 3e-2
