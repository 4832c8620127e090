"""The `transformers` target: the same weights run by transformers' own `Qwen3_5TextModel`.

It is the plain peer a user would write: tokenise with dohnuts' planner (no shared prefix),
pad, one `model(input_ids, attention_mask)` forward over every full sequence, gather the
hidden states at the SCORE tokens, and the same scalar head. The backbone tensors are shared
with a dohnuts model built from the same source, so both targets score with identical weights.

The peer runs at its best: transformers binds each of Qwen3.5's hot ops, when its module is
imported, to the fast package it recommends if that imports — fla's chunked gated delta rule,
the `causal_conv1d` package's convolution — and otherwise to its own reference PyTorch code,
with a warning. `peer_facts` reads which implementation each op was bound to and every record
carries it (`extra.peer`); a reference path is a `fallback`, labelled so in every report.
transformers' own "falling back" warnings are kept out of the run's output: the recorded facts
say it once. On the CPU transformers must not see fla (it would try fla's GPU kernels), so this
target hides fla there before importing it: its delta rule and conv fall back, as recorded.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import sys
from typing import TYPE_CHECKING

from dohnuts.bench.calls import CallResult, PredictCall
from dohnuts.bench.contracts import NoOptions
from dohnuts.errors import ConfigError
from dohnuts.hf_config import to_hf_text_config
from dohnuts.runtime.policy import ExecutionPolicy

if TYPE_CHECKING:  # torch is imported where it runs: the plugin manager imports this module to learn
    import torch  # the target's name, and `dohnuts-bench run` checks workload files before torch loads

TEXT_KINDS = ("text", "shared-prefix")


MODELING = "transformers.models.qwen3_5.modeling_qwen3_5"
# The module functions transformers binds to a fast package at import (hub_kernels'
# `use_kernel_func_from_hub_with_fallback`), by the op they compute.
BOUND_OPS = {"delta_rule": "torch_chunk_gated_delta_rule", "conv": "causal_conv1d_fn"}
FAST_PACKAGE = {"delta_rule": "fla", "conv": "causal_conv1d"}  # what transformers recommends for each
FALLBACK_WARNING = "is falling back to its reference PyTorch implementation"


def _import_transformers(device: torch.device):
    if device.type != "cuda" and MODELING not in sys.modules:
        sys.modules.setdefault("fla", None)  # type: ignore[assignment]
    _quiet_fallback_warnings()
    try:
        # an optional dependency (the `peer` extra): imported where the peer runs
        from transformers import Qwen3_5TextConfig, Qwen3_5TextModel
        from transformers.models.qwen3_5 import modeling_qwen3_5
    except ImportError as exc:
        raise ConfigError(f"the transformers target needs transformers with Qwen3.5 ({exc}); "
                          "install dohnuts[peer]", field="targets") from None
    return Qwen3_5TextConfig, Qwen3_5TextModel, modeling_qwen3_5


class _FallbackWarnings(logging.Filter):
    """Drops transformers' "falling back to its reference PyTorch implementation" warnings: the
    peer's recorded facts (`peer_facts`) say the same once per run instead of once per process."""

    def filter(self, record: logging.LogRecord) -> bool:
        return FALLBACK_WARNING not in record.getMessage()


def _quiet_fallback_warnings() -> None:
    """Installs `_FallbackWarnings` on the logger transformers warns through (once)."""
    logger = logging.getLogger("transformers.integrations.hub_kernels")
    if not any(isinstance(f, _FallbackWarnings) for f in logger.filters):
        logger.addFilter(_FallbackWarnings())


def _bound_implementation(fn) -> tuple[object, bool] | None:
    """(the implementation transformers bound `fn` to, whether it is a fast package's rather than
    its own reference code), read from the closure of hub_kernels' wrapper — found through any
    wrapper around it (`__wrapped__`, closures, the module the `kernels` package makes of a
    function, whose `forward` closes over it); None where this transformers binds its functions
    some other way."""
    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        code, closure = getattr(f, "__code__", None), getattr(f, "__closure__", None)
        if code is not None and closure:
            cells = dict(zip(code.co_freevars, closure))
            if "implementation" in cells and "torch_function" in cells:
                impl = cells["implementation"].cell_contents
                return impl, impl is not cells["torch_function"].cell_contents
            todo += [c.cell_contents for c in closure if callable(c.cell_contents)]
        if callable(getattr(f, "__wrapped__", None)):
            todo.append(f.__wrapped__)
        if code is None and callable(getattr(type(f), "forward", None)):
            todo.append(type(f).forward)
    return None


def _package_of(impl) -> str:
    module = getattr(impl, "__module__", None) or "?"
    return module.split(".")[0]


def peer_facts(modeling, attention: str, device: torch.device) -> dict:
    """Which implementation transformers runs each hot op of Qwen3.5 with: a package name (`fla`,
    `causal_conv1d`), `torch` for transformers' own reference code (a fallback when a fast package
    exists for the op), or `unknown`. `attention` is the attention implementation the model was
    configured with; RMSNorm and the gated RMSNorm are plain PyTorch in transformers' Qwen3.5
    (its hub kernels are downloaded at run time, which a benchmark does not do)."""
    paths, fallbacks = {}, []
    for op, name in BOUND_OPS.items():
        bound = _bound_implementation(getattr(modeling, name, None))
        if bound is None:
            paths[op] = "unknown"
            continue
        impl, fast = bound
        paths[op] = _package_of(impl) if fast else "torch"
        if not fast:
            fallbacks.append(op)
    paths["attention"] = attention
    paths["norms"] = "torch"
    why = "runs on CUDA GPUs only" if device.type != "cuda" else "is not installed or does not import"
    messages = [f"{op}: transformers' reference PyTorch code ({FAST_PACKAGE[op]} {why})" for op in fallbacks]
    return {"library": "transformers", "version": _version("transformers"), "paths": paths,
            "fallbacks": fallbacks, "messages": messages}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_peer_backbone(ours, device: torch.device):
    """transformers' Qwen3_5TextModel over the backbone tensors of the dohnuts session `ours`
    (shared, not copied), with SDPA attention, and the peer facts of how it runs."""
    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    import torch


    Config, Model, modeling = _import_transformers(device)
    hf_cfg = Config(**to_hf_text_config(ours.cfg.text))
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = Model(hf_cfg)
    model.load_state_dict(ours.model.backbone.state_dict(), assign=True)  # the same tensors
    # non-persistent buffers are not in the state dict
    model.rotary_emb = modeling.Qwen3_5TextRotaryEmbedding(config=hf_cfg).to(device)
    return model, peer_facts(modeling, "sdpa", device)


class TransformersTarget:
    """Takes no options (no `Options`: the contract's NoOptions)."""

    kinds = TEXT_KINDS  # checked when the workload file is validated

    @staticmethod
    def unavailable() -> str | None:
        """Why this target cannot run on this machine (the runner skips it and says so), or None."""
        if importlib.util.find_spec("transformers") is None:
            return "transformers is not installed (pip install 'dohnuts[peer]')"
        return None

    def __init__(self, spec, device, dtype, options: NoOptions):
        if spec.kind not in TEXT_KINDS:
            raise ConfigError(f"the transformers target runs text workloads only ({', '.join(TEXT_KINDS)}), "
                              f"not {spec.kind!r}", source=spec.file, field="targets")
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        import dohnuts.api as api

        self.device = device
        # dohnuts' planner and head over the same weights, planning plain batches (no shared prefix)
        self.ours = api.load(spec.model, device=device, dtype=dtype, seed=spec.seed,
                             _policy=ExecutionPolicy(share_prefix=False, cuda_graphs=False))
        model, self.peer = build_peer_backbone(self.ours, device)
        self.model = model.eval()

    def run_call(self, call, timer) -> CallResult:
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        import torch

        if not isinstance(call, PredictCall):
            raise TypeError(f"transformers target cannot run {type(call).__name__}")
        with torch.inference_mode():
            return self._run_call(call, timer)

    def _run_call(self, call, timer) -> CallResult:
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        import torch

        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        from dohnuts.runtime.predict import Predictor

        with timer.stage("prepare"):
            hb = self.ours.prepare(call.request)
            lengths = torch.tensor(hb.plan.lengths)
            padded = bool((lengths != lengths.max()).any())
            mask = (torch.arange(hb.tensors.ids.shape[1])[None] < lengths[:, None]).long() if padded else None
        with timer.stage("h2d"):
            dev = hb.tensors.to(self.device, non_blocking=False)
            mask = mask.to(self.device) if mask is not None else None
        with timer.stage("forward"):
            h = self.model(input_ids=dev.ids, attention_mask=mask, use_cache=False).last_hidden_state
        with timer.stage("head"):
            scores = self.ours.model.head_scores(h, dev.score_index)
        with timer.stage("d2h"):
            host = [t.cpu() for t in self.ours.decide(scores, dev.cand_matrix)]  # probs, choice, scores by question
        with timer.stage("serialize"):
            result = Predictor.serialize(hb, host, None)
            result.to_json()
        # transformers computes every position of its last layer: no pruned rows (WorkCounts).
        return CallResult(decisions=len(result.questions), work=dataclasses.replace(hb.work, scored_rows=0),
                          extra={"peer": self.peer}, output=result)

    def close(self) -> None:
        del self.model, self.ours
