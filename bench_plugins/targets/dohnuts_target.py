"""The `dohnuts` target: complete prediction calls and training updates of the product.

Options (per target entry in a workload file):
    share_prefix: true      compute a long shared prefix once (false: one batched pass)
    lora_rank: 16           adapters for train-step workloads
"""

from __future__ import annotations

from dataclasses import replace

from dohnuts.bench.calls import CallResult, PredictCall, TrainCall
from dohnuts.errors import ConfigError

OPTIONS = {"share_prefix", "lora_rank"}


class DohnutsTarget:
    def __init__(self, spec, device, dtype, options: dict):
        import dohnuts.api as api
        from dohnuts.model.lora import LoRAConfig
        from dohnuts.runtime.predict import Predictor

        unknown = set(options) - OPTIONS
        if unknown:
            raise ConfigError(f"unknown dohnuts target option {sorted(unknown)[0]!r} (known: {sorted(OPTIONS)})",
                              source=spec.file, field="targets")
        self.train = spec.kind == "train-step"
        lora = LoRAConfig(rank=int(options.get("lora_rank", 16))) if self.train else None
        self.model = api.load(spec.model, device=device, dtype=dtype, seed=spec.seed, lora=lora)
        # Prediction runs a deployed model (adapters merged: no adapter cost); training carries them.
        self.lora_info = ({"rank": lora.rank, "targets": list(lora.targets), "merged": False} if lora else None)
        self.predictor = Predictor(self.model, share_prefix=bool(options.get("share_prefix", True)), train=self.train)
        if self.train:
            from dohnuts.train.objective import RLCDConfig
            from dohnuts.train.step import OptimConfig, make_optimizer

            self.optim_cfg = OptimConfig()
            self.objective = RLCDConfig()
            self.optimizer = make_optimizer(self.model, self.optim_cfg)

    def run_call(self, call, timer) -> CallResult:
        if isinstance(call, PredictCall):
            if call.cold_cache and self.model.image_cache is not None:
                self.model.image_cache.clear()
            result, hb = self.predictor.call(call.request, timer, source=call.request.id)
            return CallResult(decisions=len(result.questions), work=hb.work)
        if isinstance(call, TrainCall):
            return self._train(call, timer)
        raise TypeError(f"dohnuts target cannot run {type(call).__name__}")

    def _train(self, call: TrainCall, timer) -> CallResult:
        from dohnuts.train.step import optimizer_update

        with timer.stage("prepare"):
            hbs = [self.predictor.prepare(r) for r in call.requests]
        with timer.stage("h2d"):
            devs = [self.predictor.device_batch(hb) for hb in hbs]
        res = optimizer_update(self.model, self.optimizer, devs, self.objective, self.optim_cfg, timer=timer)
        works = [hb.work for hb in hbs]
        if self.optim_cfg.checkpoint_layers:  # every layer's forward runs again in the backward
            works = [replace(w, recomputed_tokens=w.computed_tokens) for w in works]
        work = replace(
            works[0], sequences=sum(w.sequences for w in works), seq_lens=tuple(n for w in works for n in w.seq_lens),
            candidates=sum(w.candidates for w in works), train=True,
            recomputed_tokens=sum(w.recomputed_tokens for w in works),
            extra={"microbatches": [w.to_dict() for w in works]},
        )
        return CallResult(decisions=work.sequences, work=work, extra={"loss": res.loss, "grad_norm": res.grad_norm})

    def close(self) -> None:
        self.predictor.close()
        del self.model
