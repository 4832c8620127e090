"""The peers at their best: which implementation transformers ran each op with is read off
transformers itself and recorded; the training peer (transformers + PEFT) computes dohnuts' loss
on the same weights, trains only its adapters and the head, and checkpointing changes nothing but
the time."""

from __future__ import annotations

import random
import textwrap

import pytest
import torch

from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.runtime.timing import NULL_TIMER
from dohnuts_bench_plugins.targets.transformers_target import _bound_implementation, peer_facts


@pytest.fixture
def hub_kernels():
    """transformers' kernel binding, imported by the tests that use it (not at collection, where
    every test process of the test command would import transformers)."""
    return pytest.importorskip("transformers.integrations.hub_kernels")


def _reference_conv(x):  # stands for transformers' own reference code
    return x


def test_bound_implementation_reads_transformers_own_binding(hub_kernels):
    """transformers' real decorator: a package that imports is the bound implementation (fast); one
    that does not leaves transformers' reference function (a fallback)."""
    bind = hub_kernels.use_kernel_func_from_hub_with_fallback
    fast = bind("dumps", "json")(_reference_conv)  # `json.dumps` stands for causal_conv1d_fn
    impl, is_fast = _bound_implementation(fast)
    assert is_fast and impl.__module__ == "json"
    slow = bind("causal_conv1d_fn", "a_package_that_is_not_installed")(_reference_conv)
    impl, is_fast = _bound_implementation(slow)
    assert not is_fast and impl is _reference_conv
    assert _bound_implementation(lambda x: x) is None  # not bound by transformers: unknown


def test_peer_facts_name_each_path_and_label_fallbacks(hub_kernels):
    import types

    bind = hub_kernels.use_kernel_func_from_hub_with_fallback
    modeling = types.SimpleNamespace(
        torch_chunk_gated_delta_rule=bind("dumps", "json")(_reference_conv),
        causal_conv1d_fn=bind("causal_conv1d_fn", "a_package_that_is_not_installed")(_reference_conv))
    facts = peer_facts(modeling, "sdpa", torch.device("cuda"))
    assert facts["paths"] == {"delta_rule": "json", "conv": "torch", "attention": "sdpa", "norms": "torch"}
    assert facts["fallbacks"] == ["conv"]
    assert facts["messages"] == ["conv: transformers' reference PyTorch code (causal_conv1d is not installed or "
                                 "does not import)"]
    unknown = peer_facts(types.SimpleNamespace(), "sdpa", torch.device("cuda"))
    assert unknown["paths"]["delta_rule"] == unknown["paths"]["conv"] == "unknown" and not unknown["fallbacks"]


def _train_target(tmp_path, options):
    pytest.importorskip("peft")
    path = tmp_path / "train.yaml"
    path.write_text(textwrap.dedent("""\
        kind: train-step
        targets: [dohnuts, transformers+peft]
        model: tiny
        shape: {requests: 4, questions: 3, seq_tokens: 48, candidates: 3, candidate_tokens: 2}
    """))
    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(path, kinds, targets)
    factory = targets["transformers+peft"]
    torch.manual_seed(0)  # PEFT draws its adapters from torch's generator
    target = factory.factory(spec, torch.device("cpu"), torch.float32, factory.options(options, source="test"))
    ctx = WorkloadContext(spec=spec, tokenizer=target.ours.tokenizer, model_cfg=target.ours.cfg, workdir=tmp_path,
                          rng=random.Random(spec.seed))
    (call,) = kinds["train-step"].calls(ctx)
    return target, call


def test_training_peer_computes_dohnuts_loss_and_trains_only_adapters_and_head(tmp_path):
    from dohnuts.model.scorer import candidate_logits
    from dohnuts.train.objective import RLCDConfig, rlcd_loss

    target, call = _train_target(tmp_path, {})
    session = target.ours
    base = {k: v.clone() for k, v in session.model.backbone.state_dict().items()}
    head = session.model.head.weight.detach().clone()
    # dohnuts' own loss of the update on the same weights (its B start at zero: the base model)
    with torch.no_grad():
        losses = []
        for req in call.requests:
            dev = session.prepare(req, train=True).tensors
            scores = session.model(dev.score_inputs(None))
            losses.append(rlcd_loss(candidate_logits(scores, dev.cand_matrix), dev.rewards, RLCDConfig()))
        expected = float(torch.stack(losses).mean())
    result = target.run_call(call, NULL_TIMER)
    assert result.extra["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert result.extra["grad_norm"] > 0
    after = session.model.backbone.state_dict()
    assert all(torch.equal(base[k], after[k]) for k in base)  # the shared frozen base is untouched
    assert not torch.equal(head, session.model.head.weight)  # the head stepped
    lora_b = [p for n, p in target.model.named_parameters() if "lora_B" in n]
    targets = {n.split(".")[-4] for n, _ in target.model.named_parameters() if "lora_B" in n}
    assert targets == set(target.lora_info["targets"])  # every projection dohnuts adapts
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # adapters stepped off zero
    assert result.work.recomputed_tokens == 0 and result.work.train
    assert result.extra["peer"]["gradient_checkpointing"] is False
    assert result.extra["peer"]["fallbacks"] == ["delta_rule", "conv"]  # the CPU: transformers' reference code


def test_training_peer_checkpointing_changes_nothing_but_recomputation(tmp_path):
    plain, call = _train_target(tmp_path, {})
    ckpt, call2 = _train_target(tmp_path, {"gradient_checkpointing": True})
    assert call == call2
    a, b = plain.run_call(call, NULL_TIMER), ckpt.run_call(call, NULL_TIMER)
    assert a.extra["loss"] == pytest.approx(b.extra["loss"], rel=1e-6)
    assert a.extra["grad_norm"] == pytest.approx(b.extra["grad_norm"], rel=1e-4)
    pa = dict(plain.model.named_parameters())
    for name, p in ckpt.model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p, pa[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ckpt.ours.model.head.weight, plain.ours.model.head.weight, rtol=1e-5, atol=1e-6)
    assert b.work.recomputed_tokens == b.work.computed_tokens > 0 and a.work.recomputed_tokens == 0


def test_prediction_peer_lists_each_questions_scores_as_dohnuts_does(tmp_path):
    """The transformers prediction peer on the CPU (its reference code), on dohnuts' own weights,
    serializes the same results as dohnuts for a request whose questions have different numbers
    of candidates: each question its own candidates' scores in order (within FP32 rounding of
    two implementations), its probabilities and choice."""
    pytest.importorskip("transformers")
    from dohnuts.bench.calls import PredictCall
    from dohnuts.runtime.predict import Predictor
    from dohnuts.runtime.requests import Question, Request

    path = tmp_path / "text.yaml"
    path.write_text("kind: text\ntargets: [transformers]\nmodel: tiny\n")
    pm = plugin_manager()
    kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
    spec = load_workload(path, kinds, targets)
    factory = targets["transformers"]
    target = factory.factory(spec, torch.device("cpu"), torch.float32, factory.options({}, source="test"))
    req = Request(id="r", questions=(Question("a", "two?", ("x", "yy")), Question("b", "four?", ("p", "qq", "r", "s")),
                                     Question("c", "one?", ("only",))))
    got = target.run_call(PredictCall(req), NULL_TIMER).output
    pred = Predictor(target.ours)
    try:
        want, _ = pred.call(req)
    finally:
        pred.close()
    assert [q.id for q in got.questions] == ["a", "b", "c"]
    for g, w in zip(got.questions, want.questions):
        assert len(g.scores) == len(w.scores) == len(g.probabilities)
        assert g.scores == pytest.approx(w.scores, rel=1e-4, abs=1e-5)
        assert g.probabilities == pytest.approx(w.probabilities, abs=1e-5) and g.choice == w.choice
