"""RLCD's gradient equals its analytic form on a hand-built example."""

from __future__ import annotations

import torch

from dohnuts.train.objective import RLCDConfig, rlcd_loss


def test_expected_reward_gradient_is_advantage_weighted():
    s = torch.tensor([[1.0, 2.0, 0.5, float("-inf")]], requires_grad=True)
    r = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    rlcd_loss(s, r, RLCDConfig(margin_weight=0.0)).backward()
    pi = torch.softmax(torch.tensor([1.0, 2.0, 0.5]), 0)
    baseline = pi[1]  # Σ π r
    expected = -pi * (torch.tensor([0.0, 1.0, 0.0]) - baseline)
    assert torch.allclose(s.grad[0, :3], expected, atol=1e-7)
    assert s.grad[0, 3] == 0


def test_margin_term_by_hand():
    lam, m = 0.5, 1.0
    s = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    r = torch.tensor([[0.0, 1.0, 0.0]])
    loss = rlcd_loss(s, r, RLCDConfig(margin_weight=lam, margin=m))
    pi = torch.softmax(s.detach()[0], 0)
    # pairs (correct=1, wrong=0) and (1, 2): mean of softplus(m − (s1 − s_w))
    hinge = 0.5 * (torch.nn.functional.softplus(torch.tensor(m - 1.0)) + torch.nn.functional.softplus(torch.tensor(m - 1.5)))
    assert torch.allclose(loss, -pi[1] + lam * hinge, atol=1e-6)
    loss.backward()
    sig = torch.sigmoid
    g_margin = torch.tensor([sig(torch.tensor(m - 1.0)), -(sig(torch.tensor(m - 1.0)) + sig(torch.tensor(m - 1.5))),
                             sig(torch.tensor(m - 1.5))]) * lam * 0.5
    g_reward = -pi * (torch.tensor([0.0, 1.0, 0.0]) - pi[1])
    assert torch.allclose(s.grad[0], g_reward + g_margin, atol=1e-6)


def test_graded_rewards_and_batch_mean():
    s = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    r = torch.tensor([[0.2, 0.8], [1.0, 0.0]])
    per_q = [rlcd_loss(s[i:i + 1], r[i:i + 1]) for i in range(2)]
    assert torch.allclose(rlcd_loss(s, r), (per_q[0] + per_q[1]) / 2)
