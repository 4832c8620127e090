"""Sharing a prefix is decided by measuring both ways, per shape class (dohnuts.runtime.sharing)."""

from __future__ import annotations

import torch

import dohnuts.api as api
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.sharing import ShareTuner, share_key
from dohnuts.train.task import synthetic_requests
from tests.reference import relative_error


class ScriptedClock:
    """A `measure` that runs the variant and reports the next scripted time (shared first)."""

    def __init__(self, *times):
        self.times = list(times)
        self.calls = 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return self.times.pop(0)


def _scores(result):
    return torch.tensor([s for q in result.questions for s in q.scores])


def test_share_key_classes():
    assert share_key(3, 256, 300, 0) == (4, 256, 320, 0)
    assert share_key(4, 256, 320, 0) == share_key(3, 256, 301, 0)
    assert share_key(5, 256, 320, 0)[0] == 8 and share_key(1, 64, 65, 0)[0] == 1
    assert share_key(4, 256, 320, 0) != share_key(4, 192, 320, 0)  # another split: another decision


def _tuned(times):
    """`times` (shared, unshared) per decision: scripted once per interleaved repeat."""
    session = api.load("tiny")
    session.share_tuner = ShareTuner(ScriptedClock(*[t for pair in zip(times[::2], times[1::2])
                                                     for t in pair * 3]), repeats=3)
    return session


def test_unshared_measured_faster_is_used_and_remembered():
    session = _tuned([10.0, 5.0])  # shared 10 ms, unshared 5 ms
    reqs = synthetic_requests(3, questions=4, shared_prefix=300, seed=1)
    hb = session.prepare(reqs[0])
    assert hb.plan.prefix_len > 0 and hb.alternative is not None and hb.alternative.plan.prefix_len == 0
    pred = Predictor(session)
    res, work = pred.call(reqs[0])
    assert work.prefix_len == 0  # scored by the faster (unshared) variant
    (key,) = session.share_tuner.decisions
    assert session.share_tuner.decisions[key] is False and session.share_tuner.timings[key] == (10.0, 5.0)
    later = session.prepare(reqs[1])
    assert later.plan.prefix_len == 0 and later.alternative is None  # decided: no second measurement
    reference = api.load("tiny")
    reference.share_tuner = None
    for r in reqs:
        want = reference.predict([r], share_prefix=True)[0]
        assert relative_error(_scores(pred.call(r)[0]), _scores(want)) < 1e-5
    assert session.share_tuner.measure.calls == 6  # 3 interleaved repeats of each variant, once
    pred.close()


def test_shared_measured_faster_is_kept():
    session = _tuned([5.0, 10.0])
    reqs = synthetic_requests(2, questions=4, shared_prefix=300, seed=2)
    _, work = Predictor(session).call(reqs[0])
    assert work.prefix_len > 0
    hb = session.prepare(reqs[1])
    assert hb.plan.prefix_len > 0 and hb.alternative is None


def test_each_shape_class_is_measured_once_and_training_is_never_measured():
    session = _tuned([1.0, 2.0, 2.0, 1.0])
    small = synthetic_requests(1, questions=3, shared_prefix=300, seed=3)[0]
    wide = synthetic_requests(1, questions=9, shared_prefix=300, seed=4)[0]  # another rows class
    results = session.predict([small, wide, small, wide])
    assert len(session.share_tuner.decisions) == 2 and session.share_tuner.measure.calls == 12
    assert sorted(session.share_tuner.decisions.values()) == [False, True]
    assert torch.equal(_scores(results[0]), _scores(results[2]))
    assert session.prepare(small, train=True).alternative is None  # training follows the planner
    assert session.prepare(small, share_prefix=False).alternative is None


def test_decision_compares_minima_of_interleaved_repeats():
    tuner = ShareTuner(ScriptedClock(9.0, 5.0, 4.0, 6.0, 8.0, 5.5))  # shared min 4.0 < unshared min 5.0
    assert tuner.decide(("k",), lambda: None, lambda: None) is True
    assert tuner.timings[("k",)] == (4.0, 5.0)
