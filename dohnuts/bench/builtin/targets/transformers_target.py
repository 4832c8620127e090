"""The `transformers` target: the same weights run by transformers' own `Qwen3_5TextModel`.

It is the plain peer a user would write: tokenise with dohnuts' planner (no shared prefix),
pad, one `model(input_ids, attention_mask)` forward over every full sequence, gather the
hidden states at the SCORE tokens, and the same scalar head. The backbone tensors are shared
with a dohnuts model built from the same source, so both targets score with identical weights.
On the GPU transformers picks its own kernels (fla's, when importable); on the CPU it must not
see fla (it would try fla's GPU kernels), so this target hides fla there before importing it.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from dohnuts.bench.calls import CallResult, PredictCall
from dohnuts.bench.contracts import NoOptions
from dohnuts.errors import ConfigError
from dohnuts.runtime.policy import ExecutionPolicy
from dohnuts.runtime.predict import Predictor

TEXT_KINDS = ("text", "shared-prefix")


def _import_transformers(device: torch.device):
    if device.type != "cuda" and "transformers.models.qwen3_5.modeling_qwen3_5" not in sys.modules:
        sys.modules.setdefault("fla", None)  # type: ignore[assignment]
    try:
        from transformers import Qwen3_5TextConfig, Qwen3_5TextModel
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding
    except ImportError as exc:
        raise ConfigError(f"the transformers target needs transformers with Qwen3.5 ({exc}); "
                          "install dohnuts[peer]", field="targets") from None
    return Qwen3_5TextConfig, Qwen3_5TextModel, Qwen3_5TextRotaryEmbedding


class TransformersTarget:
    """Takes no options (no `Options`: the contract's NoOptions)."""

    kinds = TEXT_KINDS  # checked when the workload file is validated

    @staticmethod
    def unavailable() -> str | None:
        """Why this target cannot run on this machine (the runner skips it and says so), or None."""
        import importlib.util

        if importlib.util.find_spec("transformers") is None:
            return "transformers is not installed (pip install 'dohnuts[peer]')"
        return None

    def __init__(self, spec, device, dtype, options: NoOptions):
        if spec.kind not in TEXT_KINDS:
            raise ConfigError(f"the transformers target runs text workloads only ({', '.join(TEXT_KINDS)}), "
                              f"not {spec.kind!r}", source=spec.file, field="targets")
        import dohnuts.api as api
        from dohnuts.hf_config import to_hf_text_config

        Config, Model, Rotary = _import_transformers(device)
        self.device = device
        # dohnuts' planner and head over the same weights, planning plain batches (no shared prefix)
        self.ours = api.load(spec.model, device=device, dtype=dtype, seed=spec.seed,
                             _policy=ExecutionPolicy(share_prefix=False, cuda_graphs=False))
        hf_cfg = Config(**to_hf_text_config(self.ours.cfg.text))
        hf_cfg._attn_implementation = "sdpa"
        with torch.device("meta"):
            model = Model(hf_cfg)
        model.load_state_dict(self.ours.model.backbone.state_dict(), assign=True)  # the same tensors
        model.rotary_emb = Rotary(config=hf_cfg).to(device)  # non-persistent buffers are not in the state dict
        self.model = model.eval()

    @torch.inference_mode()
    def run_call(self, call, timer) -> CallResult:
        if not isinstance(call, PredictCall):
            raise TypeError(f"transformers target cannot run {type(call).__name__}")
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
            probs, choice = self.ours.decide(scores, dev.cand_matrix)
            host = [probs.cpu(), choice.cpu(), scores.cpu()]
        with timer.stage("serialize"):
            result = Predictor.serialize(hb, host, None)
            result.to_json()
        # transformers computes every position of its last layer: no pruned rows (WorkCounts).
        return CallResult(decisions=len(result.questions), work=dataclasses.replace(hb.work, scored_rows=0),
                          output=result)

    def close(self) -> None:
        del self.model, self.ours
