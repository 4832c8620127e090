"""The `transformers+peft` target: the training update a user would write instead of dohnuts'.

transformers' `Qwen3_5TextModel` over the same weights (`build_peer_backbone`: fla's delta rule
and the `causal_conv1d` package's convolution wherever they import, as the inference peer), PEFT
LoRA adapters on the projections, the rank and the alpha the dohnuts target trains (LoRAConfig's
targets and alpha; `lora_rank` as DohnutsTarget's), dohnuts' scalar head on the candidate
positions and the RLCD loss, and the update dohnuts runs: 4 microbatches whose losses are
averaged, one gradient clip, one AdamW step (OptimConfig's defaults; fused on a GPU). The frozen
base is BF16 under BF16 autocast on a GPU and the adapters FP32 (PEFT's default for a BF16 base),
as dohnuts keeps them. Each question's whole sequence is one row of a padded batch: no shared
prefix, every position of the last layer computed.

Options:
    lora_rank: 16                 the adapters' rank (the dohnuts target's default)
    gradient_checkpointing: false transformers' activation checkpointing (non-reentrant), what a
                                  user turns on when the activations do not fit: the forward runs
                                  again in the backward pass (counted as repeated work)
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dohnuts.bench.calls import CallResult, TrainCall
from dohnuts.errors import ConfigError
from dohnuts.runtime.policy import ExecutionPolicy
from dohnuts.runtime.work import WorkCounts
from dohnuts.schema import Invalid
from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget
from dohnuts_bench_plugins.targets.transformers_target import build_peer_backbone

if TYPE_CHECKING:  # torch is imported where it runs (transformers_target says why)
    import torch

KINDS = ("train-step",)


class TransformersPeftTarget:
    kinds = KINDS  # checked when the workload file is validated

    @dataclass(frozen=True)
    class Options:
        """The training peer's options (a workload target entry's `options:`), checked by the harness."""

        lora_rank: int = DohnutsTarget.Options.lora_rank
        gradient_checkpointing: bool = False

        def __post_init__(self) -> None:
            # torch: not while the plugins are collected (before the command's checks); loaded where it runs
            from dohnuts.model.lora import LoRAConfig

            try:
                LoRAConfig(rank=self.lora_rank)
            except Invalid as exc:
                raise Invalid(exc.message, field="lora_rank") from None

    @staticmethod
    def unavailable() -> str | None:
        """Why this target cannot run on this machine (the runner skips it and says so), or None."""
        missing = [m for m in ("transformers", "peft") if importlib.util.find_spec(m) is None]
        return f"{' and '.join(missing)} not installed (pip install 'dohnuts[peer]')" if missing else None

    def __init__(self, spec, device, dtype, options: Options):
        if spec.kind not in KINDS:
            raise ConfigError(f"the transformers+peft target runs train-step workloads only, not {spec.kind!r}",
                              source=spec.file, field="targets")
        # an optional dependency (the `peer` extra): imported where the peer runs
        import peft
        import torch

        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        import dohnuts.api as api
        from dohnuts.model.lora import LoRAConfig
        from dohnuts.ops import prepare_delta_rule_backward
        from dohnuts.train.objective import RLCDConfig
        from dohnuts.train.step import OptimConfig

        self.device = device
        # dohnuts' planner and head over the same weights, planning plain batches (no shared prefix)
        self.ours = api.load(spec.model, device=device, dtype=dtype, seed=spec.seed,
                             _policy=ExecutionPolicy(share_prefix=False, cuda_graphs=False))
        backbone, facts = build_peer_backbone(self.ours, device)
        lora = LoRAConfig(rank=options.lora_rank)
        if backbone.config.use_cache:
            backbone.config.use_cache = False
        with warnings.catch_warnings():  # transformers 5.2x renamed these; the old names (5.17's) warn there
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*checkpointing.*")
            if options.gradient_checkpointing:
                backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model = peft.get_peft_model(backbone, peft.LoraConfig(
                r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.targets),
                bias="none"))
        if device.type == "cuda" and facts["paths"]["delta_rule"] == "fla":
            # fla refuses its gated delta rule's backward on Hopper with some Tritons (fla #640);
            # transformers' path runs the same backward kernels dohnuts does, at the same key head
            # dim: lifted exactly as dohnuts lifts it, or refused for a head dim dohnuts refuses.
            prepare_delta_rule_backward(self.ours.cfg.text.linear_key_head_dim)
        head = self.ours.model.head
        head.weight.requires_grad_(True)
        self.head_scores = self.ours.model.head_scores
        self.params = [p for p in self.model.parameters() if p.requires_grad] + [head.weight]
        self.optim = OptimConfig()
        self.objective = RLCDConfig()
        self.optimizer = torch.optim.AdamW(self.params, lr=self.optim.lr, betas=self.optim.betas,
                                           weight_decay=self.optim.weight_decay, fused=device.type == "cuda")
        self.checkpointing = options.gradient_checkpointing
        adapters = sum(p.numel() for p in self.params) - head.weight.numel()
        self.peer = facts | {"peft": _version("peft"), "gradient_checkpointing": options.gradient_checkpointing,
                             "adapter_parameters": adapters}
        self.lora_info = {"rank": lora.rank, "targets": list(lora.targets), "merged": False}
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and
                         dtype == torch.bfloat16 else nullcontext())

    def run_call(self, call, timer) -> CallResult:
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        import torch

        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        from dohnuts.model.scorer import candidate_logits
        from dohnuts.train.objective import rlcd_loss
        from dohnuts.train.step import MICROBATCHES

        if not isinstance(call, TrainCall) or len(call.requests) != MICROBATCHES:
            raise TypeError(f"the transformers+peft target runs updates of {MICROBATCHES} requests")
        with timer.stage("prepare"):
            hbs = [self.ours.prepare(r, train=True) for r in call.requests]
            masks = [_padding_mask(hb) for hb in hbs]
        with timer.stage("h2d"):
            devs = [hb.tensors.to(self.device, non_blocking=False) for hb in hbs]
            masks = [m.to(self.device) if m is not None else None for m in masks]
        self.model.train()  # transformers checkpoints only in training mode
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for dev, mask in zip(devs, masks):
            with timer.stage("forward"):
                with self.autocast:
                    h = self.model(input_ids=dev.ids, attention_mask=mask, use_cache=False).last_hidden_state
                    scores = self.head_scores(h, dev.score_index)
                loss = rlcd_loss(candidate_logits(scores, dev.cand_matrix), dev.rewards, self.objective) / MICROBATCHES
            with timer.stage("backward"):
                loss.backward()
            total += loss.detach()
        with timer.stage("optimizer"):
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.optim.max_grad_norm)
            self.optimizer.step()
        self.model.eval()
        # transformers computes every position of its last layer (no pruned rows); the forward runs
        # again in the backward pass only under checkpointing.
        work = WorkCounts.of_update([dataclasses.replace(hb.work, scored_rows=0) for hb in hbs])
        if not self.checkpointing:
            work = dataclasses.replace(work, microbatches=tuple(dataclasses.replace(m, recomputed_tokens=0)
                                                                for m in work.microbatches),
                                       recomputed_tokens=0)
        return CallResult(decisions=work.sequences, work=work,
                          extra={"loss": float(total), "grad_norm": float(norm), "peer": self.peer})

    def close(self) -> None:
        del self.model, self.ours, self.optimizer, self.params


def _padding_mask(hb) -> torch.Tensor | None:
    """(B, L) 1 on real tokens, 0 on right-padding; None when every row is full."""
    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    import torch

    lengths = torch.tensor(hb.plan.lengths)
    if not bool((lengths != lengths.max()).any()):
        return None
    return (torch.arange(hb.tensors.ids.shape[1])[None] < lengths[:, None]).long()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
