"""One update = 4 microbatches at one snapshot: equals the concatenated batch; one clip."""

from __future__ import annotations

import pytest
import torch

from dohnuts.runtime.requests import Request
from dohnuts.train.objective import RLCDConfig
from dohnuts.train.step import OptimConfig, Updater, make_optimizer, microbatch_loss, requests_per_microbatch
from dohnuts.train.task import synthetic_requests
from tests.reference import adapted_tiny, relative_error


def _model():
    return adapted_tiny()


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.trainable_parameters()])


def _one_batch(merged, objective, cfg):
    """A fresh model's loss over every question as one batch, its gradients accumulated."""
    b = _model()
    opt_b = make_optimizer(b, cfg)
    b.model.train()
    loss_b = microbatch_loss(b.model, b.prepare(merged, train=True).tensors, objective)
    loss_b.backward()
    return b, opt_b, loss_b


def test_four_microbatches_equal_concatenated_batch():
    reqs = synthetic_requests(4, questions=3, seed=11)
    merged = Request(id="all", questions=tuple(q for r in reqs for q in r.questions))
    objective, cfg = RLCDConfig(), OptimConfig(lr=1e-2, max_grad_norm=1e9)

    a = _model()
    mbs = [a.prepare(r, train=True).tensors for r in reqs]
    opt_a = make_optimizer(a, cfg)
    res = Updater(a, opt_a, objective, cfg).update(reqs)

    b, opt_b, loss_b = _one_batch(merged, objective, cfg)
    assert abs(res.loss - float(loss_b.detach())) < 1e-6
    # gradients were consumed by step(); recompute a's on the same snapshot to compare
    a2 = _model()
    a2.model.train()
    for mb in mbs:
        (microbatch_loss(a2.model, mb, objective) / 4).backward()
    assert relative_error(_grads(a2), _grads(b)) < 1e-5
    opt_b.step()
    pa = torch.cat([p.detach().flatten() for p in a.trainable_parameters()])
    pb = torch.cat([p.detach().flatten() for p in b.trainable_parameters()])
    assert relative_error(pa, pb) < 1e-5


def test_clip_applies_once_to_averaged_gradient():
    reqs = synthetic_requests(4, questions=2, seed=12)
    objective = RLCDConfig()
    ref = _model()
    ref.model.train()
    for r in reqs:
        (microbatch_loss(ref.model, ref.prepare(r, train=True).tensors, objective) / 4).backward()
    g = _grads(ref)
    max_norm = float(g.norm()) / 3  # force clipping
    cfg = OptimConfig(lr=0.0, max_grad_norm=max_norm)  # lr 0: only the gradients matter
    model = _model()
    opt = make_optimizer(model, cfg)
    grads_seen = []
    orig_step = opt.step

    def spy(*args, **kwargs):
        grads_seen.append(_grads(model).clone())
        return orig_step(*args, **kwargs)

    opt.step = spy
    res = Updater(model, opt, objective, cfg).update(reqs)
    assert len(grads_seen) == 1  # one step per update
    assert abs(res.grad_norm - float(g.norm())) / float(g.norm()) < 1e-5
    assert relative_error(grads_seen[0], g * (max_norm / float(g.norm()))) < 1e-5


def test_requests_per_microbatch_reaches_32_questions_an_update():
    assert requests_per_microbatch(synthetic_requests(3, questions=8, seed=1)) == 1  # the synthetic task
    assert requests_per_microbatch(synthetic_requests(3, questions=1, seed=1)) == 8  # the digits task
    assert requests_per_microbatch(synthetic_requests(3, questions=3, seed=1)) == 3  # ceil(8 / 3)
    assert requests_per_microbatch(synthetic_requests(3, questions=20, seed=1)) == 1


def test_microbatches_of_two_requests_equal_concatenated_batch():
    reqs = synthetic_requests(8, questions=2, seed=13)  # 4 microbatches of 2 requests, equal question counts
    merged = Request(id="all", questions=tuple(q for r in reqs for q in r.questions))
    objective, cfg = RLCDConfig(), OptimConfig(lr=1e-2, max_grad_norm=1e9)
    a = _model()
    res = Updater(a, make_optimizer(a, cfg), objective, cfg, requests_per_microbatch=2).update(reqs)
    b, opt_b, loss_b = _one_batch(merged, objective, cfg)
    assert abs(res.loss - float(loss_b.detach())) < 1e-6
    opt_b.step()
    pa = torch.cat([p.detach().flatten() for p in a.trainable_parameters()])
    pb = torch.cat([p.detach().flatten() for p in b.trainable_parameters()])
    assert relative_error(pa, pb) < 1e-5
    with pytest.raises(ValueError, match="8 requests, got 4"):
        Updater(a, make_optimizer(a, cfg), objective, cfg, requests_per_microbatch=2).update(reqs[:4])


def test_an_update_leaves_the_adapters_copies_fresh():
    """The update refreshes the adapters' compute copies after its optimizer step (so the next
    update's first pass, or graph replay, finds them made): every copy matches the stepped weights."""
    from dohnuts.model.lora import _LIVE

    reqs = synthetic_requests(4, questions=2, seed=13)
    objective, cfg = RLCDConfig(), OptimConfig(lr=1e-2)
    a = _model()
    opt = make_optimizer(a, cfg)
    Updater(a, opt, objective, cfg).update(reqs)
    mine = [c for c in list(_LIVE) if any(m.lora_A is p for m in c.lora for p in a.trainable_parameters())]
    assert mine
    for c in mine:
        assert c.key == c._key()
        assert torch.equal(c.a, torch.cat([m.lora_A for m in c.lora]).to(c.a.dtype))


def test_run_pipelines_the_updates_update_computes_and_traces_each():
    """`Updater.run` (the loop `dohnuts train` runs: the next update's requests prepared while one
    computes) gives exactly the updates `update` gives one by one, and its trace says each update's
    requests were given to the workers before the update before it started, then started, then done;
    `timer_for(u)` times update u's stages."""
    from dohnuts.runtime.timing import StageTimer

    reqs = synthetic_requests(12, questions=2, seed=13)
    updates = [reqs[4 * u:4 * u + 4] for u in range(3)]
    cfg = OptimConfig(lr=1e-2)
    one = _model()
    by_one = Updater(one, make_optimizer(one, cfg), RLCDConfig(), cfg)
    want = [by_one.update(u) for u in updates]
    by_one.close()
    two = _model()
    piped = Updater(two, make_optimizer(two, cfg), RLCDConfig(), cfg)
    trace, timers = {}, {}
    got = list(piped.run(iter(updates), timer_for=lambda u: timers.setdefault(u, StageTimer(torch.device("cpu"))),
                         trace=trace))
    piped.close()
    assert [(r.loss, r.grad_norm) for r in got] == [(r.loss, r.grad_norm) for r in want]
    assert [r.work for r in got] == [r.work for r in want]
    for a, b in zip(one.trainable_parameters(), two.trainable_parameters()):
        assert torch.equal(a, b)
    assert sorted(trace) == [0, 1, 2] and sorted(timers) == [0, 1, 2]
    for u in range(3):
        t = trace[u]
        assert t["submitted"] <= t["started"] <= t["done"]
        assert {"forward", "backward", "optimizer"} <= set(timers[u].result())
        if u:
            assert t["submitted"] <= trace[u - 1]["started"]  # prepared while the update before ran
            assert trace[u - 1]["done"] <= t["started"]
