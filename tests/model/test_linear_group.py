"""`linear_group` (dohnuts.model.lora): one GEMM for a group's frozen bases, each adapter's update
added into its own columns, with a backward of its own — against the plain composition autograd
differentiates (x Wᵢᵀ + sᵢ · (xd Aᵢᵀ) Bᵢᵀ per member, concatenated), and by finite differences."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dohnuts.ops import spare
from dohnuts.model.lora import LoRAConfig, LoRALinear, _LinearGroup, linear_group, refresh_adapter_copies
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


def _copies_of(spans, scales, width, *ab):
    """What `_Copies` holds, built from the given A's and B's (outside autograd, as the model's)."""
    a_parts, bs = ab[0::2], ab[1::2]
    ranks = [t.shape[0] for t in a_parts]
    with torch.no_grad():
        bd = a_parts[0].new_zeros(width, sum(ranks))
        bd_s = bd.clone()
        r0 = 0
        for (c0, c1), s, b, r in zip(spans, scales, bs, ranks):
            bd[c0:c1, r0:r0 + r] = b
            bd_s[c0:c1, r0:r0 + r] = s * b
            r0 += r
        return SimpleNamespace(a=torch.cat(a_parts), a_s=torch.cat([s * a for s, a in zip(scales, a_parts)]),
                               bd=bd, bd_s=bd_s, spans=list(spans), ranks=ranks, scales=list(scales))


def test_group_gradients_by_finite_differences():
    """torch.autograd.gradcheck on the function itself: x, the adapters' input after dropout (a
    separate tensor), a bias and every A and B (their compute copies made from them on each
    evaluation), in float64."""
    g = torch.Generator().manual_seed(1)

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    x, xd, w, bias = t(6, 10), t(6, 10), t(11, 10), t(11)
    a1, b1, a2, b2 = t(3, 10), t(4, 3), t(2, 10), t(5, 2)
    spans, scales = ((0, 4), (6, 11)), (1.5, 0.5)
    assert torch.autograd.gradcheck(
        lambda *z: _LinearGroup.apply(z[0], z[1], z[2], z[3], _copies_of(spans, scales, 11, *z[4:]), None, *z[4:]),
        (x, xd, w, bias, a1, b1, a2, b2))
    assert torch.autograd.gradcheck(
        lambda *z: _LinearGroup.apply(z[0], None, z[1], None, _copies_of(spans, scales, 11, *z[2:]), None, *z[2:]),
        (x, w, a1, b1, a2, b2))

    def wide(x, w, bias, *ab):
        """The one-GEMM forward: x's rows in a buffer with spare columns, [W | bd] beside."""
        c = _copies_of(spans, scales, 11, *ab)
        xs = spare.widen(x, c.a.shape[0])
        assert spare.claim(xs, c.a.shape[0]) == 0
        return _LinearGroup.apply(xs, None, w, bias, c, torch.cat([w, c.bd], 1).detach(), *ab)

    assert torch.autograd.gradcheck(wide, (x, w, bias, a1, b1, a2, b2))


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


def _copies_entry(members):
    (entry,) = next(m for m in members if isinstance(m, LoRALinear))._copies.values()
    return entry


@pytest.mark.parametrize("fused", [True, False])
def test_compute_copies_follow_every_change_of_the_adapters(fused):
    """The adapters' compute copies are made once and reused until an adapter changes: after an
    optimizer step (fused AdamW bumps no version counter), an in-place load and a replaced tensor,
    the group still equals the plain composition of the current weights."""
    members, w = _group(dtype=torch.float32, lora=(True, True, False))
    x = torch.randn(8, 10)
    params = _adapter_params(members)
    opt = torch.optim.AdamW(params, lr=0.5, fused=fused)

    def check():
        assert relative_error(linear_group(x, members, w).detach(), _composition(x, members).detach()) < 1e-6

    check()
    entry = _copies_entry(members)
    linear_group(x, members, w).square().sum().backward()
    opt.step()
    check()
    with torch.no_grad():
        members[0].lora_B.copy_(torch.randn_like(members[0].lora_B))
    check()
    members[1].lora_A.data = torch.randn_like(members[1].lora_A)
    check()
    assert _copies_entry(members) is entry  # one entry, refreshed


def test_refresh_rebuilds_stale_copies_in_place():
    """`refresh_adapter_copies` (what a CUDA graph replay calls first) brings the copies up to date
    at their old addresses — a captured graph reads them there."""
    members, w = _group(dtype=torch.float32, lora=(True, False, True))
    x = torch.randn(8, 10)
    linear_group(x, members, w)
    entry = _copies_entry(members)
    ptrs = [t.data_ptr() for t in (entry.a, entry.a_s, entry.bd, entry.bd_s)]
    opt = torch.optim.AdamW(_adapter_params(members), lr=0.5, fused=True)
    for p in _adapter_params(members):
        p.grad = torch.randn_like(p)
    opt.step()
    refresh_adapter_copies()
    want = _copies_of([(0, 12), (17, 24)], [m.scaling for m in members if isinstance(m, LoRALinear)], 24,
                      *_adapter_params(members))
    for name in ("a", "a_s", "bd", "bd_s"):
        assert torch.equal(getattr(entry, name), getattr(want, name)), name
    assert [t.data_ptr() for t in (entry.a, entry.a_s, entry.bd, entry.bd_s)] == ptrs


def test_copies_made_in_inference_mode_serve_training():
    """Prediction (inference mode) makes the copies first; training's autograd then uses them."""
    members, w = _group(dtype=torch.float32)
    x = torch.randn(8, 10)
    with torch.inference_mode():
        linear_group(x, members, w)
    linear_group(x, members, w).square().sum().backward()
    got = [p.grad.clone() for p in _adapter_params(members)]
    for p in _adapter_params(members):
        p.grad = None
    _composition(x, members).square().sum().backward()
    for a, p in zip(got, _adapter_params(members)):
        assert relative_error(a, p.grad) < 1e-5


def test_an_input_with_spare_columns_is_claimed_once_and_hidden_from_autograd():
    """A group reading rows written with its Σr spare columns (dohnuts.ops.spare) writes u there and
    gives the composition's output and gradients; an op that saved the rows before it (a product)
    is undisturbed (the spare columns are an alias with a version counter of their own); a second
    group on the same rows finds no columns left and runs the two-GEMM path, equal too."""
    members, w = _group(lora=(True, True, False))
    r = sum(m.lora_A.shape[0] for m in members if isinstance(m, LoRALinear))
    x = torch.randn(2, 9, 10, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 9, w.shape[0], dtype=torch.float64)
    got = []
    for widened in (True, False):
        x.grad = None
        for p in _adapter_params(members):
            p.grad = None
        rows = spare.widen(x * 1.5, r) if widened else x * 1.5
        early = (rows * rows).sum()  # saves the rows before any group writes
        y1 = linear_group(rows, members, w)
        y2 = linear_group(rows, members, w)
        if widened:
            u = torch.as_strided(rows.detach(), (18, r), (rows.stride(-2), 1), rows.storage_offset() + 10)
            a_s = torch.cat([m.scaling * m.lora_A for m in members if isinstance(m, LoRALinear)]).detach()
            assert relative_error(u, rows.detach().reshape(18, 10) @ a_s.t()) < 1e-12  # u written there
            assert spare.claim(rows.reshape(18, 10), r) is None  # no columns left
        (early + (y1 * dy).sum() + (y2 * dy).sum()).backward()
        got.append([y1.detach(), y2.detach(), x.grad.clone()] + [p.grad.clone() for p in _adapter_params(members)])
    want = _composition(x.detach() * 1.5, members).detach()
    assert relative_error(got[0][0], want) < 1e-12 and relative_error(got[0][1], want) < 1e-12
    for a, b in zip(*got):
        assert relative_error(a, b) < 1e-12


def test_the_wide_weight_follows_the_base_weight_and_the_adapters():
    """`_Copies.wide` ([W | 0 | bd], one a claim offset j) is made once and refreshed in place: after
    an optimizer step on the adapters and an in-place load of the base weight, widened calls (a
    first claimant at j = 0 and a second at j = Σr) still equal the plain composition, and the
    wide copies keep their addresses (CUDA graphs read them)."""
    members, w = _group(dtype=torch.float32, lora=(True, True, False))
    r = sum(m.lora_A.shape[0] for m in members if isinstance(m, LoRALinear))
    opt = torch.optim.SGD(_adapter_params(members), lr=0.1)

    def check():
        rows = spare.widen(torch.randn(8, 10), 2 * r)
        want = _composition(rows.detach().clone(), members).detach()
        for _ in range(2):  # the first claims columns 0 … Σr − 1, the second Σr … 2Σr − 1
            assert relative_error(linear_group(rows, members, w).detach(), want) < 1e-5

    check()
    entry = _copies_entry(members)
    ptrs = {j: t.data_ptr() for j, t in entry.ww.items()}
    assert sorted(ptrs) == [0, r]
    linear_group(torch.randn(3, 10), members, w).square().sum().backward()
    opt.step()
    check()
    with torch.no_grad():
        w.mul_(0.5)
        for m in members:  # the composition reads each member's weight: keep them w's rows
            m.weight.copy_(w[sum(x.weight.shape[0] for x in members[:members.index(m)]):][:m.weight.shape[0]])
    check()
    assert {j: t.data_ptr() for j, t in entry.ww.items()} == ptrs
