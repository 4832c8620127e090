"""Graph-replayed inference (dohnuts.runtime.graphs) on the CPU, in emulation: the same static
buffers and shape buckets as on the GPU, with each "replay" recomputing its pass from the static
buffers into the static outputs. Scores equal the eager path's for changing inputs (a stale
buffer fails), bucket padding is counted as padded work, and the budget and LoRA changes are
honoured. The CUDA replay itself is tested in tests/gpu/test_runtime.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import dohnuts.api as api
from dohnuts.bench.analysis.cost import token_counts
from dohnuts.model.lora import LoRAConfig, LoRALinear
from dohnuts.runtime.graphs import PassGraphs, ShapeBuckets
from dohnuts.runtime.requests import Question, Request
from dohnuts.train.task import synthetic_requests
from tests.reference import adapted_tiny, relative_error, unshared


def _graphed(session, **kw):
    session.graphs = PassGraphs(session.model, emulate=True, **kw)
    return session


def _scores(session, reqs, share=True):
    if not share:
        with unshared(session):
            return _scores(session, reqs)
    return [torch.tensor([s for q in r.questions for s in q.scores]) for r in session.predict(reqs)]


def _png(path, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_buckets():
    b = ShapeBuckets(rows=(1, 2, 4, 8), length_step=64, max_length=256)
    assert b.fit(3, 70) == (4, 128)
    assert b.fit(8, 64) == (8, 64)
    assert b.fit(1, 1) == (1, 64)
    assert b.fit(9, 64) is None  # more rows than the largest bucket
    assert b.fit(2, 257) is None  # longer than the longest bucket
    d = ShapeBuckets()  # the default grid: 16 tokens up to 512, then 1/32 of the octave
    assert [d.fit(8, n)[1] for n in (1, 16, 17, 262, 512, 513, 1000, 1025, 4000)] == \
        [16, 16, 32, 272, 512, 544, 1024, 1088, 4096]
    for n in range(1, 4097):  # padding: under 16 tokens, or under 1/16 of the row
        pad = d.fit(1, n)[1] - n
        assert 0 <= pad < max(16, n / 16), n


@pytest.mark.parametrize("share", [True, False])
def test_replay_equals_eager_for_changing_inputs(share):
    """Shared requests replay the graph of the shared pass, unshared ones that of one full pass."""
    eager = api.load("tiny")
    graphed = _graphed(api.load("tiny"))
    # Same shape bucket, different tokens: each replay must see its own request's inputs.
    reqs = synthetic_requests(3, questions=5, shared_prefix=300, seed=7)
    reqs = [reqs[0], reqs[1], reqs[0], reqs[2]]
    want = _scores(eager, reqs, share)
    got = _scores(graphed, reqs, share)
    for w, g in zip(want, got):
        assert relative_error(g, w) < 1e-5
    assert relative_error(got[0], got[1]) > 1e-3  # the requests really differ
    stats = graphed.graphs.stats()
    assert stats.captures == 1 and stats.replays == 4 and not stats.eager


def test_image_requests_replay_with_the_prefix_cutting_the_image(tmp_path):
    # The 64-token grid puts the split inside the image (positions 1..196) here.
    eager, graphed = api.load("tiny"), _graphed(api.load("tiny"))
    qs = (Question("q1", "what?", ("red", "green")), Question("q2", "how many?", ("one", "two", "three")),
          Question("q3", "where?", ("here", "there")))
    reqs = [Request(id=f"r{i}", questions=qs, prefix="a photo", image=_png(tmp_path / f"{i}.png", i)) for i in range(2)]
    assert graphed.prepare(reqs[0]).plan.prefix_len == 192  # 196 image tokens: the split cuts the image
    for share in (True, False):
        for w, g in zip(_scores(eager, reqs, share), _scores(graphed, reqs, share)):
            assert relative_error(g, w) < 1e-5
    # the vision tower (one resolution), the shared pass and one full pass
    assert graphed.graphs.stats().captures == 3


def test_vision_graph_encodes_each_image_and_hands_out_its_own_tensor(tmp_path):
    """The tower's graph reads uint8 patches from its static buffer: a second image of the same
    size gets its own features (a stale buffer fails), and the first result stays intact (the cache
    keeps it, so it must not be the graph's static output). The grids' positions and rotary are
    computed once, at the graph's first call, and read by every replay."""
    from dohnuts.runtime.images import pixel_values, prepare_image

    graphed = _graphed(api.load("tiny"))
    vision = graphed.cfg.vision
    tower = graphed.model.visual
    made = []
    tower.grid_inputs = lambda grid_thw: made.append(1) or type(tower).grid_inputs(tower, grid_thw)
    imgs = [prepare_image(_png(tmp_path / f"{i}.png", i), vision) for i in range(2)]
    grids = torch.tensor([imgs[0].grid_thw])
    with torch.no_grad():
        eager = [graphed.model.encode_images(pixel_values(img.patches, vision.temporal_patch_size), grids)
                 for img in imgs]
        first = graphed.graphs.encode(imgs[0].patches, grids)
        kept = first.clone()
        second = graphed.graphs.encode(imgs[1].patches, grids)
    assert torch.equal(first, eager[0]) and torch.equal(second, eager[1])
    assert torch.equal(first, kept)  # not overwritten by the second replay
    assert not torch.equal(first, second)
    assert graphed.graphs.stats().captures == 1 and graphed.graphs.stats().replays == 2
    assert len(made) == 1 + 2  # the graph's once; each eager call above its own


def test_training_encodes_an_image_of_a_grid_prediction_captured(tmp_path):
    """The trainer evaluates its dev partition (prediction, inference mode) before the first update:
    the tower's graph for a grid is then captured with inference tensors for its static buffer and
    output. Training's next new image of that grid is encoded by the same graph with autograd on
    (under no_grad) — it wrote into that buffer outside inference mode and raised — and gets
    ordinary tensors equal to the eager tower's."""
    from dohnuts.runtime.images import pixel_values

    eager, graphed = api.load("tiny"), _graphed(api.load("tiny"))
    qs = (Question("q1", "what?", ("red", "green"), (1.0, 0.0)),)
    reqs = [Request(id=f"r{i}", questions=qs, prefix="a photo", image=_png(tmp_path / f"{i}.png", i)) for i in range(2)]
    _scores(graphed, reqs[:1])  # the dev evaluation: the 448² tower captured in inference mode
    hb = graphed.prepare(reqs[1], train=True)
    assert torch.is_grad_enabled()
    (use,) = graphed.image_features([(hb, None)])
    grids = torch.tensor([hb.image.grid_thw])
    with torch.no_grad():
        want = eager.model.encode_images(pixel_values(hb.image.patches, graphed.cfg.vision.temporal_patch_size), grids)
    assert torch.equal(use.features, want) and not use.features.is_inference()
    assert graphed.graphs.stats().captures == 2 and use.encoded_patches == hb.image.patch_count  # (text, tower)


def test_bucket_padding_is_counted_as_padded_work():
    session = _graphed(api.load("tiny"))
    (req,) = synthetic_requests(1, questions=3, seed=1)
    hb = session.prepare(req)
    assert hb.plan.prefix_len == 0
    real = max(hb.plan.lengths)
    step = session.graphs.buckets.step(real)
    assert hb.tensors.ids.shape == (4, step * -(-real // step))  # 3 questions → 4 rows, length → the grid
    assert hb.work.padded_rows == 1 and hb.work.padded_len % step == 0
    counts = token_counts(hb.work)
    assert counts["useful"] + counts["repeated"] == sum(hb.plan.lengths)  # (the shared question head repeats)
    assert counts["padded"] == 4 * hb.work.padded_len - sum(hb.plan.lengths)
    plain = api.load("tiny").prepare(req).work
    assert token_counts(plain)["useful"] == counts["useful"] and token_counts(plain)["padded"] < counts["padded"]


def test_budget_and_unbucketed_shapes_run_eagerly():
    eager = api.load("tiny")
    session = _graphed(api.load("tiny"), max_graphs=1)
    a = synthetic_requests(1, questions=2, seed=2)[0]
    b = synthetic_requests(1, questions=6, seed=3)[0]  # another row bucket: over the budget of one graph
    for w, g in zip(_scores(eager, [a, b], False), _scores(session, [a, b], False)):
        assert relative_error(g, w) < 1e-5
    stats = session.graphs.stats()
    assert stats.graphs == 1 and stats.eager == {"graph budget or capture failure": 1}
    wide = _graphed(api.load("tiny"), buckets=ShapeBuckets(rows=(1, 2)))
    for w, g in zip(_scores(eager, [b], False), _scores(wide, [b], False)):
        assert relative_error(g, w) < 1e-5
    assert wide.graphs.stats().eager == {"no bucket": 1} and wide.prepare(b).work.padded_rows == 0


def test_weight_updates_are_seen_and_module_changes_recapture():
    session = _graphed(api.load("tiny", lora=LoRAConfig(rank=4)))
    reqs = synthetic_requests(1, questions=3, shared_prefix=200, seed=4)
    before = _scores(session, reqs)[0]
    with torch.no_grad():  # an optimizer step: parameters change in place
        for m in session.model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.05)
    after = _scores(session, reqs)[0]
    assert relative_error(after, before) > 1e-3
    plain = api.load("tiny", lora=LoRAConfig(rank=4))
    plain.model.load_state_dict(session.model.state_dict())
    assert relative_error(after, _scores(plain, reqs)[0]) < 1e-5
    captures = session.graphs.stats().captures
    session.merge_lora()  # modules replaced: the graphs are dropped and captured again
    assert session.graphs.stats().graphs == 0
    merged = _scores(session, reqs)[0]
    assert relative_error(merged, after) < 1e-5 and session.graphs.stats().captures == captures + 1  # the merged pass


@pytest.mark.slow
def test_training_microbatch_graphs_equal_eager_updates(tmp_path):
    """Three updates through captured (emulated) forward/backward graphs — bucket-padded rows, a
    shared prefix, an image, changing inputs of one shape — leave the same adapters and losses as
    eager updates."""
    from dohnuts.train.graphs import MicrobatchGraphs
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import MICROBATCHES, OptimConfig, Updater, make_optimizer

    texts = synthetic_requests(6, questions=3, shared_prefix=200, seed=8)  # 3 questions → 4 bucket rows
    img = Request(id="img", questions=(Question("q", "what?", ("red", "green"), rewards=(0.0, 1.0)),),
                  prefix="a photo", image=_png(tmp_path / "a.png", 3))
    updates = [texts[:4], [texts[4], img, texts[5], texts[0]], texts[2:6]]
    cfg, obj = OptimConfig(lr=1e-2), RLCDConfig()
    results = []
    for graphed in (False, True):
        s = adapted_tiny()
        opt = make_optimizer(s, cfg)
        params = [p for g in opt.param_groups for p in g["params"]]
        graphs = MicrobatchGraphs(s.model, obj, params, divisor=MICROBATCHES, emulate=True) if graphed else None
        up = Updater(s, opt, obj, cfg, _graphs=graphs)
        losses = [r.loss for r in up.run(updates)]
        results.append((losses, torch.cat([p.detach().flatten() for p in params]), graphs))
        up.close()
    (eager_losses, eager_params, _), (graph_losses, graph_params, graphs) = results
    # (bucket padding changes the FP32 matmul shapes: rounding, amplified by lr 1e-2 over 3 updates)
    assert graph_losses == pytest.approx(eager_losses, rel=1e-4)
    assert relative_error(graph_params, eager_params) < 1e-4
    stats = graphs.stats()
    assert stats.replays == 12 and stats.captures >= 2 and not stats.eager  # text and image shapes


class _StandInCapture:
    """A capture that records the pool it was handed and raises where told (torch.cuda's calls
    stood in for: the pool discipline of a failed capture, tested without a GPU)."""

    pools: list = []
    fail_next = False

    def __init__(self, fn, pool, emulate):  # as dohnuts.runtime.graphs._Captured
        if _StandInCapture.fail_next:
            _StandInCapture.fail_next = False
            raise RuntimeError("operation not permitted when stream is capturing")
        _StandInCapture.pools.append(pool)
        self.fn, self.output, self.loss = fn, fn(), None

    def replay(self):
        self.output = self.fn()

    def forward(self):
        self.loss = self.fn()
        return self.loss

    def backward(self):
        self.loss.backward()


class _StandInMicrobatchCapture(_StandInCapture):
    def __init__(self, forward, params, pool, emulate):  # as dohnuts.train.graphs._MicrobatchGraph
        super().__init__(forward, pool, emulate)


def _stand_in_cuda(monkeypatch):
    handles = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool", next(handles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 0)
    monkeypatch.setattr(_StandInCapture, "pools", [])
    monkeypatch.setattr(_StandInCapture, "fail_next", False)


def test_the_captures_after_a_failed_one_get_a_fresh_pool(monkeypatch):
    """Prediction's graphs: a capture that fails leaves its key eager for good, and the captures
    after it are handed a new pool (torch may leave the failed capture's pool recording); the
    graphs captured before keep replaying."""
    import dohnuts.runtime.graphs as runtime_graphs

    _stand_in_cuda(monkeypatch)
    monkeypatch.setattr(runtime_graphs, "_Captured", _StandInCapture)
    graphs = PassGraphs(api.load("tiny").model)  # its pool: ("pool", 0)
    one = lambda: torch.ones(2)  # noqa: E731
    assert graphs._replay(("a",), one) is not None
    _StandInCapture.fail_next = True
    assert graphs._replay(("b",), one) is None
    assert graphs._replay(("c",), one) is not None and graphs._replay(("a",), one) is not None
    assert graphs._replay(("b",), one) is None  # the failed key is not captured again
    assert _StandInCapture.pools == [("pool", 0), ("pool", 1)]
    stats = graphs.stats()
    assert (stats.captures, stats.replays, stats.eager) == (2, 3, {"graph budget or capture failure": 2})


def test_the_training_captures_after_a_failed_one_get_a_fresh_pool(monkeypatch):
    """Training's microbatch graphs, as above: a microbatch whose capture fails runs eagerly, one of
    another shape after it is captured into a new pool."""
    import dohnuts.train.graphs as train_graphs
    from dohnuts.runtime.pipeline import Pipeline
    from dohnuts.runtime.timing import NULL_TIMER
    from dohnuts.train.objective import RLCDConfig
    from dohnuts.train.step import MICROBATCHES, OptimConfig, make_optimizer

    _stand_in_cuda(monkeypatch)
    monkeypatch.setattr(train_graphs, "_MicrobatchGraph", _StandInMicrobatchCapture)
    session = adapted_tiny()
    opt = make_optimizer(session, OptimConfig())
    params = [p for g in opt.param_groups for p in g["params"]]
    graphs = train_graphs.MicrobatchGraphs(session.model, RLCDConfig(), params, divisor=MICROBATCHES)
    pipe = Pipeline(session.device)
    first, second = (pipe.wait(*pipe.transfer(session.prepare(r, train=True, bucket=True))) for r in
                     (synthetic_requests(1, questions=6, shared_prefix=300, seed=9)[0],
                      synthetic_requests(1, questions=3, shared_prefix=100, seed=11)[0]))
    assert first.ids.shape != second.ids.shape
    _StandInCapture.fail_next = True
    assert graphs.step(first, None, NULL_TIMER) is None
    assert graphs.step(second, None, NULL_TIMER) is not None
    assert graphs.step(first, None, NULL_TIMER) is None  # the failed shape stays eager
    assert _StandInCapture.pools == [("pool", 1)]
    stats = graphs.stats()
    assert (stats.captures, stats.replays, stats.eager) == (1, 1, {"graph budget or capture failure": 2})


def test_a_capture_that_fails_at_its_end_gives_the_caller_its_stream_back(monkeypatch):
    """`capturing`: torch's graph context leaves its capture stream current when `capture_end`
    raises (stood in for here: a context that sets the stream and raises on exit without restoring
    it); the caller's stream is current again after the failure, and after a capture that ends well."""
    import contextlib

    from dohnuts.runtime.graphs import capturing

    current = ["caller's stream"]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: current[0])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: current.__setitem__(0, s))

    @contextlib.contextmanager
    def graph(g, pool=None, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        current[0] = "capture stream"
        yield
        if g == "fails":
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        current[0] = "caller's stream"  # as torch's context exits when capture_end returns

    monkeypatch.setattr(torch.cuda, "graph", graph)
    with pytest.raises(RuntimeError, match="during capture"), capturing("fails", None):
        assert current[0] == "capture stream"
    assert current[0] == "caller's stream"
    with capturing("ends well", None):
        assert current[0] == "capture stream"
    assert current[0] == "caller's stream"
