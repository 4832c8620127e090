"""The runtime on the GPU: CUDA-graph replay against eager passes, the stage timer's events, and
pinned batches moved in one copy."""

from __future__ import annotations

import pytest
import torch

from dohnuts.runtime.policy import EAGER
from tests.gpu.helpers import DEV, _wide_tiny, busy_preparing_thread
from tests.reference import relative_error, unshared

pytestmark = pytest.mark.gpu


def test_graph_replay_equals_eager_with_changing_inputs(monkeypatch, tmp_path):
    """CUDA-graph replay of the shared and full passes against the eager passes, request
    after request of the same shape bucket (a graph reading a stale static buffer fails), with and
    without a shared prefix and with an image cut by the prefix split."""
    import numpy as np
    from PIL import Image

    import dohnuts.api as api
    from dohnuts.runtime.requests import Question, Request
    from dohnuts.train.task import synthetic_requests

    _wide_tiny(monkeypatch)
    graphed = api.load("tiny", device=DEV, dtype=torch.bfloat16)
    eager = api.load("tiny", device=DEV, dtype=torch.bfloat16, _policy=EAGER)
    assert graphed.graphs is not None and eager.graphs is None
    texts = synthetic_requests(3, questions=6, shared_prefix=300, seed=5)
    rng = np.random.default_rng(0)
    images = []
    for i in range(2):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
        qs = (Question("a", "what?", ("red", "green")), Question("b", "how many?", ("one", "two", "three")),
              Question("c", "where?", ("here", "there")))
        images.append(Request(id=f"img{i}", questions=qs, prefix="a photo", image=str(path)))
    reqs = [texts[0], texts[1], texts[0], texts[2], images[0], images[1], images[0]]
    for share in (True, False):
        if share:
            got, want = graphed.predict(reqs), eager.predict(reqs)
        else:
            with unshared(graphed), unshared(eager):
                got, want = graphed.predict(reqs), eager.predict(reqs)
        for g, w in zip(got, want):
            gs = torch.tensor([s for q in g.questions for s in q.scores])
            ws = torch.tensor([s for q in w.questions for s in q.scores])
            assert relative_error(gs, ws) < 1e-3, (share, g.id)
        first, second = (torch.tensor([s for q in r.questions for s in q.scores]) for r in got[:2])
        assert relative_error(first, second) > 1e-3  # different requests, different scores
    stats = graphed.graphs.stats()
    # shared: one shared pass a shape (text, image); unshared: one full pass a shape
    assert stats.captures >= 4 and stats.replays >= 2 * len(reqs) and not stats.eager


def test_stage_timer_reuses_its_events_and_keeps_each_stage_s_time():
    """Timing events go back to a pool when read and serve the next timer; each stage still gets
    its own device time (a sleep kernel of ≈ 2 ms against an empty stage), and a stage entered
    after a read adds to its earlier time."""
    from dohnuts.runtime import timing

    dev = torch.device(DEV)
    cycles = 4_000_000  # ≈ 2 ms at the H200's 1.98 GHz (longer at lower clocks, or on a first launch)
    first = timing.StageTimer(dev)
    with first.stage("sleep"):
        torch.cuda._sleep(cycles)
    assert first.result()["sleep"].device_ms > 1.0
    reused = timing._EVENT_POOLS[torch.cuda.current_device()][-1]
    second = timing.StageTimer(dev)
    with second.stage("empty"):
        pass
    assert all(a is b for a, b in zip(second._events["empty"][0], reused))  # the same two events
    with second.stage("sleep"):
        torch.cuda._sleep(cycles)
    got = second.result()
    assert got["empty"].device_ms < 0.1 and got["sleep"].device_ms > 1.0
    with second.stage("sleep"):
        torch.cuda._sleep(cycles)
    again = second.result()["sleep"]
    assert again.count == 2 and again.device_ms > got["sleep"].device_ms + 1.0


def test_a_prepared_batch_is_pinned_in_one_buffer_and_moves_in_one_copy(monkeypatch):
    """On a GPU, `Session.prepare` collates the batch's integer tensors straight into one
    page-locked buffer (never packed again after); `to(device)` (one asynchronous copy, then
    views) gives the same tensors."""
    import dohnuts.api as api
    from dohnuts.runtime.batch import Batch
    from dohnuts.train.task import synthetic_requests

    session = api.load("tiny", device=DEV)
    (req,) = synthetic_requests(1, questions=3, shared_prefix=200, seed=1)

    def repacked(*a, **k):
        raise AssertionError("the collated batch was packed again")

    monkeypatch.setattr(Batch, "packed", repacked)
    t = session.prepare(req).tensors
    buf, layout = t.__dict__["_packed"]
    assert buf.is_pinned() and layout and all(getattr(t, n).is_pinned() for n in layout)
    d = t.to(session.device)
    torch.cuda.synchronize()
    on_device, same = d.__dict__["_packed"]  # the device batch's one buffer (`Pipeline.wait` records it once)
    assert same is layout and on_device.device.type == "cuda" and torch.equal(on_device.cpu(), buf)
    for n in layout:
        assert getattr(d, n).device.type == "cuda" and torch.equal(getattr(d, n).cpu(), getattr(t, n)), n
        assert getattr(d, n).untyped_storage().data_ptr() == on_device.untyped_storage().data_ptr(), n


def test_the_microbenchmark_timings_are_the_stage_timer_s():
    """`device_times_ms` times each call alone; `device_ms_each` gives every entry of a stage run
    back to back, whose sum is the stage's time (the ceilings and benchmarks/*.py time with them)."""
    from dohnuts.runtime import timing

    cycles = 4_000_000  # ≈ 2 ms at the H200's 1.98 GHz
    times = timing.device_times_ms(lambda: torch.cuda._sleep(cycles), warmup=1, repeat=3)
    assert len(times) == 3 and all(t > 1.0 for t in times)
    timer = timing.StageTimer(torch.device(DEV))
    for n in (1, 2):
        with timer.stage("sleep"):
            torch.cuda._sleep(n * cycles)
    each = timer.device_ms_each("sleep")
    assert len(each) == 2 and each[0] > 1.0 and each[1] > each[0] + 0.5
    assert timer.result()["sleep"].device_ms == pytest.approx(sum(each))


def test_vision_graph_replays_the_eager_tower(tmp_path):
    """The vision tower's graph (uint8 patches normalised on the device, then the tower) against
    the eager tower, two images of one size in turn (a stale static buffer fails), the first
    result untouched by the second replay (the image cache keeps it), at 2b's vision widths."""
    import numpy as np
    from PIL import Image

    import dohnuts.api as api
    from dohnuts.runtime.images import pixel_values, prepare_image

    session = api.load("qwen3.5-2b", device=DEV, dtype=torch.bfloat16)
    vision = session.cfg.vision
    rng = np.random.default_rng(0)
    imgs = []
    for i in range(2):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
        imgs.append(prepare_image(path, vision))
    grids = torch.tensor([imgs[0].grid_thw])
    with torch.no_grad():
        eager = [session.model.encode_images(pixel_values(img.patches.to(DEV), vision.temporal_patch_size), grids)
                 for img in imgs]
        first = session.graphs.encode(imgs[0].patches.to(DEV), grids)
        kept = first.clone()
        second = session.graphs.encode(imgs[1].patches.to(DEV), grids)
    assert relative_error(first, eager[0]) < 1e-3 and relative_error(second, eager[1]) < 1e-3
    assert torch.equal(first, kept) and relative_error(first, second) > 1e-2
    stats = session.graphs.stats()
    assert stats.captures == 1 and stats.replays == 2 and not stats.eager



def test_a_capture_survives_another_thread_s_device_work(monkeypatch, tmp_path):
    """Passes captured while a worker thread prepares new images on the same session (tests.gpu.
    helpers.busy_preparing_thread) are captured — not run eagerly for good — and replay the eager
    passes."""
    import dohnuts.api as api
    from dohnuts.train.task import synthetic_requests

    _wide_tiny(monkeypatch)
    graphed = api.load("tiny", device=DEV, dtype=torch.bfloat16)
    eager = api.load("tiny", device=DEV, dtype=torch.bfloat16, _policy=EAGER)
    reqs = synthetic_requests(2, questions=4, shared_prefix=200, seed=3)
    with busy_preparing_thread(graphed, tmp_path):  # a preparation before, during and after the captures
        got = graphed.predict(reqs)
    want = eager.predict(reqs)
    for g, w in zip(got, want):
        gs = torch.tensor([s for q in g.questions for s in q.scores])
        ws = torch.tensor([s for q in w.questions for s in q.scores])
        assert relative_error(gs, ws) < 1e-3, g.id
    stats = graphed.graphs.stats()
    assert stats.captures >= 1 and not stats.eager, stats


def test_passes_after_a_failed_capture_are_captured(monkeypatch):
    """A capture that fails (here a pass that synchronises the device, which no capture allows)
    leaves its own key eager, and the passes captured after it are captured and replay the eager
    passes: the failed capture's pool is not reused (torch may leave it recording) and its stream
    is not left current."""
    import dohnuts.api as api
    from dohnuts.train.task import synthetic_requests

    _wide_tiny(monkeypatch)
    graphed = api.load("tiny", device=DEV, dtype=torch.bfloat16)
    eager = api.load("tiny", device=DEV, dtype=torch.bfloat16, _policy=EAGER)

    def uncapturable():
        y = torch.ones(8, device=DEV) * 2
        torch.cuda.synchronize()  # refused inside a capture: this capture fails
        return y

    stream = torch.cuda.current_stream()
    assert graphed.graphs._replay(("a pass that cannot be captured",), uncapturable) is None
    assert torch.cuda.current_stream() == stream  # not the failed capture's stream
    reqs = synthetic_requests(2, questions=4, shared_prefix=200, seed=5)
    got, want = graphed.predict(reqs), eager.predict(reqs)
    for g, w in zip(got, want):
        gs = torch.tensor([s for q in g.questions for s in q.scores])
        ws = torch.tensor([s for q in w.questions for s in q.scores])
        assert relative_error(gs, ws) < 1e-3, g.id
    stats = graphed.graphs.stats()
    assert stats.captures >= 1 and stats.eager == {"graph budget or capture failure": 1}, stats
