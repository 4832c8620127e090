"""Training on the GPU in BF16: the shared request's gradients (the shared pass, every layer
recomputed) against one batched pass, and the training microbatch graphs against eager updates."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.helpers import DEV, _wide_tiny, busy_preparing_thread
from tests.reference import relative_error, unshared

pytestmark = pytest.mark.gpu


def _lora_session(monkeypatch):
    """A BF16 session of the tiny preset with Qwen3.5's linear-attention head dims and rank-4
    adapters whose B is not zero (so the adapters change the scores and take gradients), drawn from
    their own generator: the same adapters whichever tests ran before."""
    import dohnuts.api as api
    from dohnuts.model.lora import LoRAConfig, LoRALinear

    _wide_tiny(monkeypatch)
    session = api.load("tiny", device=DEV, dtype=torch.bfloat16, lora=LoRAConfig(rank=4))
    g = torch.Generator(device=DEV).manual_seed(0)
    with torch.no_grad():
        for m in session.model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.05, generator=g)
    return session


def _replayed_equals_eager(session, opt, params, dev, loss_g) -> None:
    """A microbatch's replayed loss `loss_g` and the gradients it left in `.grad` are the eager
    microbatch's on the same batch (run here, from zeroed gradients)."""
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import MICROBATCHES, microbatch_loss

    assert loss_g is not None
    grads_g = torch.cat([p.grad.flatten().float() for p in params]).clone()
    opt.zero_grad(set_to_none=False)
    loss_e = microbatch_loss(session.model, dev, RLCDConfig()) / MICROBATCHES
    loss_e.backward()
    grads_e = torch.cat([p.grad.flatten().float() for p in params])
    assert abs(float(loss_g) - float(loss_e)) < 1e-2 * max(1.0, abs(float(loss_e)))
    assert relative_error(grads_g, grads_e) < 2e-2 and float(grads_e.norm()) > 0


def test_shared_prefix_equals_unshared_bf16(monkeypatch):
    """Scores and LoRA/head gradients with sharing equal those without, in BF16 on the GPU: the
    training pass of the shared request (the shared pass, every layer recomputed in the backward)
    against one batched pass.

    The tiny preset's key head dim (16) is one fla's backward must not run at on Hopper (KI-1),
    so this test widens the linear-attention heads to Qwen3.5's 128."""
    from msgspec.structs import replace  # configs are msgspec Structs

    import dohnuts.api as api
    import dohnuts.config as config

    tiny = config.preset("tiny")
    wide = replace(tiny, text=replace(tiny.text, linear_key_head_dim=128, linear_value_head_dim=128))
    monkeypatch.setitem(config.PRESETS, "tiny", lambda: wide)
    from dohnuts.model.lora import LoRAConfig, LoRALinear
    from dohnuts.runtime.pipeline import Pipeline
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import microbatch_loss
    from dohnuts.train.task import synthetic_requests

    session = api.load("tiny", device=DEV, dtype=torch.bfloat16, lora=LoRAConfig(rank=4))
    model = session.model
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.05)
    (req,) = synthetic_requests(1, questions=6, shared_prefix=300, seed=4)
    grads, losses = [], []
    pipe = Pipeline(session.device)
    for share in (True, False):
        if share:
            hb = session.prepare(req, train=True)
        else:
            with unshared(session):
                hb = session.prepare(req, train=True)
        assert (hb.plan.prefix_len > 0) == share
        model.zero_grad()
        model.train()
        loss = microbatch_loss(model, pipe.wait(*pipe.transfer(hb)), RLCDConfig())
        loss.backward()
        losses.append(float(loss))
        grads.append(torch.cat([p.grad.flatten().float() for p in model.trainable_parameters()]))
    assert abs(losses[0] - losses[1]) < 2e-2 * max(1.0, abs(losses[1]))
    assert relative_error(grads[0], grads[1]) < 5e-2


def test_training_graph_replay_equals_eager_gradients(monkeypatch):
    """A microbatch's forward/backward by CUDA-graph replay against the eager forward/backward on the
    same (bucketed) batch: loss and every LoRA/head gradient, request after request of one shape —
    a shared request, whose backward graph holds the recomputation of every layer — with an
    optimizer step after each, so the replays read the adapters' refreshed BF16 copies."""
    from dohnuts.runtime.pipeline import Pipeline
    from dohnuts.runtime.timing import NULL_TIMER
    from dohnuts.train.graphs import MicrobatchGraphs
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import MICROBATCHES, OptimConfig, make_optimizer, microbatch_loss
    from dohnuts.train.task import synthetic_requests

    session = _lora_session(monkeypatch)
    opt = make_optimizer(session, OptimConfig())
    params = [p for g in opt.param_groups for p in g["params"]]
    graphs = MicrobatchGraphs(session.model, RLCDConfig(), params, divisor=MICROBATCHES)
    pipe = Pipeline(session.device)
    reqs = synthetic_requests(2, questions=6, shared_prefix=300, seed=9)
    session.model.train()
    for req in (reqs[0], reqs[1], reqs[0]):
        hb = session.prepare(req, train=True, bucket=True)
        assert hb.plan.prefix_len > 0
        dev = pipe.wait(*pipe.transfer(hb))
        opt.zero_grad(set_to_none=False)
        loss_g = float(graphs.step(dev, None, NULL_TIMER))
        grads_g = torch.cat([p.grad.flatten().float() for p in params]).clone()
        opt.zero_grad(set_to_none=False)
        loss_e = microbatch_loss(session.model, dev, RLCDConfig()) / MICROBATCHES
        loss_e.backward()
        grads_e = torch.cat([p.grad.flatten().float() for p in params])
        assert abs(loss_g - float(loss_e)) < 1e-2 * max(1.0, abs(float(loss_e)))
        assert relative_error(grads_g, grads_e) < 2e-2 and float(grads_e.norm()) > 0
        opt.step()
    stats = graphs.stats()
    assert stats.captures == 1 and stats.replays == 3 and not stats.eager


def test_training_and_prediction_score_a_request_alike(monkeypatch):
    """One execution policy: a shared request scored by prediction (inference mode, the serving
    path) and by training's forward (autograd recording, every layer a checkpointing region) runs
    the same kernels; the scores agree to BF16 rounding (the measured gap is printed)."""
    from dohnuts.runtime.pipeline import Pipeline
    from dohnuts.train.task import synthetic_requests

    session = _lora_session(monkeypatch)
    (req,) = synthetic_requests(1, questions=6, shared_prefix=300, seed=4)
    hb = session.prepare(req, train=True)
    assert hb.plan.prefix_len > 0
    pipe = Pipeline(session.device)
    dev = pipe.wait(*pipe.transfer(hb))
    session.model.eval()
    with torch.inference_mode():
        served = session.score(hb, dev)[0].float()
    session.model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        trained = session.model(dev.score_inputs(None), recompute=True).float()
    assert trained.requires_grad
    gap = (served - trained.detach()).abs().max().item()
    print(f"train vs predict: max |score gap| {gap:.3e} over {served.numel()} scores (scale {served.abs().max():.3f})")
    assert relative_error(trained.detach(), served) < 2e-2


def test_pipelined_updates_equal_updates_one_by_one(monkeypatch):
    """`Updater.run` (the next update's requests prepared while one computes: `dohnuts train`'s loop
    and train-step's stream row) against `update` called one by one, both replaying the microbatch
    graphs from the same weights: every loss and, after three updates, every trainable parameter
    alike within BF16's reach; the trace in order (each update's requests given to the workers
    before the update before it started)."""
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer
    from dohnuts.train.task import synthetic_requests

    reqs = synthetic_requests(12, questions=4, shared_prefix=200, seed=21)
    updates = [reqs[4 * u:4 * u + 4] for u in range(3)]
    runs = []
    for piped in (False, True):
        torch.manual_seed(0)
        session = _lora_session(monkeypatch)
        updater = Updater(session, make_optimizer(session, OptimConfig()), RLCDConfig(), OptimConfig())
        assert updater.graphs is not None
        trace = {}
        results = list(updater.run(iter(updates), trace=trace)) if piped else [updater.update(u) for u in updates]
        updater.close()
        params = torch.cat([p.detach().flatten().float() for p in session.trainable_parameters()])
        runs.append(([r.loss for r in results], params, trace))
    (losses_a, params_a, _), (losses_b, params_b, trace) = runs
    for a, b in zip(losses_a, losses_b):
        assert abs(a - b) < 1e-2 * max(1.0, abs(a))
    assert relative_error(params_b, params_a) < 2e-2
    for u in range(1, 3):
        assert trace[u]["submitted"] <= trace[u - 1]["started"] <= trace[u - 1]["done"] <= trace[u]["started"]


def test_a_training_capture_survives_another_thread_s_device_work(monkeypatch, tmp_path):
    """A microbatch's forward and backward graphs captured while a worker thread prepares new images
    on the same session, as the next update's preparation does (tests.gpu.helpers.
    busy_preparing_thread): captured, not run eagerly for good, and their gradients the eager
    microbatch's."""
    from dohnuts.runtime.pipeline import Pipeline
    from dohnuts.runtime.timing import NULL_TIMER
    from dohnuts.train.graphs import MicrobatchGraphs
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import MICROBATCHES, OptimConfig, make_optimizer
    from dohnuts.train.task import synthetic_requests

    session = _lora_session(monkeypatch)
    opt = make_optimizer(session, OptimConfig())
    params = [p for g in opt.param_groups for p in g["params"]]
    graphs = MicrobatchGraphs(session.model, RLCDConfig(), params, divisor=MICROBATCHES)
    (req,) = synthetic_requests(1, questions=6, shared_prefix=300, seed=9)
    session.model.train()
    pipe = Pipeline(session.device)
    dev = pipe.wait(*pipe.transfer(session.prepare(req, train=True, bucket=True)))
    opt.zero_grad(set_to_none=False)
    with busy_preparing_thread(session, tmp_path):  # a preparation before, during and after the capture
        loss_g = graphs.step(dev, None, NULL_TIMER)
    _replayed_equals_eager(session, opt, params, dev, loss_g)
    stats = graphs.stats()
    assert stats.captures == 1 and not stats.eager, stats


def test_a_training_capture_after_a_failed_one_is_captured(monkeypatch):
    """A microbatch whose capture fails (its forward made to synchronise the device, which no
    capture allows) runs eagerly; a microbatch of another shape after it is captured, into a fresh
    pool, and its gradients are the eager microbatch's."""
    from dohnuts.runtime.pipeline import Pipeline
    from dohnuts.runtime.timing import NULL_TIMER
    from dohnuts.train.graphs import MicrobatchGraphs
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import MICROBATCHES, OptimConfig, make_optimizer
    from dohnuts.train.task import synthetic_requests

    session = _lora_session(monkeypatch)
    opt = make_optimizer(session, OptimConfig())
    params = [p for g in opt.param_groups for p in g["params"]]
    graphs = MicrobatchGraphs(session.model, RLCDConfig(), params, divisor=MICROBATCHES)
    (first,) = synthetic_requests(1, questions=6, shared_prefix=300, seed=9)
    (second,) = synthetic_requests(1, questions=3, shared_prefix=100, seed=11)
    session.model.train()
    pipe = Pipeline(session.device)
    dev1 = pipe.wait(*pipe.transfer(session.prepare(first, train=True, bucket=True)))
    dev2 = pipe.wait(*pipe.transfer(session.prepare(second, train=True, bucket=True)))
    assert dev1.ids.shape != dev2.ids.shape  # two keys
    real = graphs._loss_fn

    def uncapturable(batch, features):
        forward = real(batch, features)

        def synchronising():
            loss = forward()
            torch.cuda.synchronize()  # refused inside a capture: this capture fails
            return loss

        return synchronising

    opt.zero_grad(set_to_none=False)
    with monkeypatch.context() as m:
        m.setattr(graphs, "_loss_fn", uncapturable)
        stream = torch.cuda.current_stream()
        assert graphs.step(dev1, None, NULL_TIMER) is None
        assert torch.cuda.current_stream() == stream  # not the failed capture's stream
    opt.zero_grad(set_to_none=False)
    loss_g = graphs.step(dev2, None, NULL_TIMER)
    _replayed_equals_eager(session, opt, params, dev2, loss_g)
    stats = graphs.stats()
    assert stats.captures == 1 and stats.eager == {"graph budget or capture failure": 1}, stats


def test_an_update_after_a_prediction_encodes_a_new_image_of_the_grid_it_captured(monkeypatch, tmp_path):
    """`dohnuts train` evaluates its dev partition before the first update: the prediction captures
    the tower's graph of one image of the dev images' grid in inference mode. An update whose one new
    image has that grid (its four requests share it: one miss, the same graph) encodes it with
    autograd on — the graph's static input was an inference tensor, which that write raised on —
    and its loss is the one a session that never predicted computes from the same weights."""
    import numpy as np
    from PIL import Image

    from dohnuts.runtime.requests import Question, Request
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import OptimConfig, Updater, make_optimizer

    def request(i, image):
        path = tmp_path / f"{image}.png"
        Image.fromarray(np.random.default_rng(image).integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
        qs = (Question("a", f"what {i}?", ("red", "green"), (1.0, 0.0)),
              Question("b", "how many?", ("one", "two"), (0.0, 1.0)))
        return Request(id=f"r{i}", questions=qs, prefix="a photo", image=str(path))

    dev, update = [request(0, image=0)], [request(i, image=1) for i in range(1, 5)]
    losses = []
    for predicted in (True, False):
        torch.manual_seed(0)
        session = _lora_session(monkeypatch)
        if predicted:
            session.predict(dev)
            assert session.graphs.stats().captures >= 2  # the text pass and the tower
        updater = Updater(session, make_optimizer(session, OptimConfig()), RLCDConfig(), OptimConfig())
        losses.append(updater.update(update).loss)
        updater.close()
    assert abs(losses[0] - losses[1]) < 1e-2 * max(1.0, abs(losses[1]))
