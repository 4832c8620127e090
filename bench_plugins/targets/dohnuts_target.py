"""The `dohnuts` target: complete prediction calls and training updates of the product.

The workload's `model` is a preset or a checkpoint directory. Options (per target entry in a
workload file; `DohnutsTarget.Options`, typed and checked before anything is measured):
    lora_rank: 16           fresh adapters for train-step workloads
    adapter: PATH           an adapter file saved by `dohnuts train`: prediction merges it into the
                            base (as `dohnuts predict --adapter` serves it); a train-step workload
                            continues training it (as `dohnuts train --initialize-from` does)
Measurement-only variants (dohnuts.runtime.policy; never what a user runs, and labelled so in every
record — `variant` — and report):
    share_prefix: false     one batched pass even where the sharing rule shares (`unshared`)
    cuda_graphs: false      the inference passes and training microbatches launched eagerly (`eager`)

Each record's `extra.graphs` counts the call's graph replays (inference passes, or training
microbatches), captures and eager passes; `graph_stats` gives the totals so far, so a serving
point states the captures that happened while it was measured.

Serving scenarios run through the pipelined predictor (`serve`: dohnuts.bench.measure.serving.pipelined);
the reference check builds the FP32 reference path from `reference_options` (no sharing, eager,
the plain-torch ops) over the same weights and adapter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dohnuts.bench.calls import CallResult, PredictCall, TrainCall
from dohnuts.bench.report.status import log
from dohnuts.runtime.policy import ExecutionPolicy
from dohnuts.runtime.work import WorkCounts
from dohnuts.schema import Invalid


class DohnutsTarget:
    @dataclass(frozen=True)
    class Options:
        """The dohnuts target's options (a workload target entry's `options:`), checked by the harness."""

        lora_rank: int = 16  # fresh adapters of this rank (train-step workloads without `adapter`)
        adapter: str | None = None  # an adapter file saved by `dohnuts train`
        share_prefix: bool = True  # false: the measurement-only `unshared` variant
        cuda_graphs: bool = True  # false: the measurement-only `eager` variant

        def __post_init__(self) -> None:
            """Checked with the workload, before a run directory exists: the rank within LoRAConfig's
            bounds, and the adapter file and its metadata (header only; the base identity is
            verified when the model is loaded)."""
            # torch: not while the plugins are collected (before the command's checks); loaded where it runs
            from dohnuts.model.lora import LoRAConfig

            try:
                LoRAConfig(rank=self.lora_rank)
            except Invalid as exc:
                raise Invalid(exc.message, field="lora_rank") from None
            if self.adapter is not None:
                # torch: not while the plugins are collected (before the command's checks); loaded where it runs
                from dohnuts.adapters import read_adapter_meta

                read_adapter_meta(self.adapter)

    @staticmethod
    def reference_options(options: Options) -> Options:
        """The FP32 reference path of a target built with `options`: the same weights and adapter,
        one batched pass a request (no sharing), eager passes; the harness builds it at FP32 inside
        dohnuts.ops._dispatch.reference() (the plain-torch ops)."""
        return dataclasses.replace(options, share_prefix=False, cuda_graphs=False)

    def __init__(self, spec, device, dtype, options: Options):
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        import dohnuts.api as api
        from dohnuts.model.lora import LoRAConfig
        from dohnuts.runtime.predict import Predictor

        self.train = spec.kind == "train-step"
        self._first_extra: dict = {}  # what the first call's record also carries
        adapter = options.adapter
        policy = ExecutionPolicy(share_prefix=options.share_prefix, cuda_graphs=options.cuda_graphs)
        self.variant = policy.variant  # None: the product
        lora = LoRAConfig(rank=options.lora_rank) if self.train and adapter is None else None
        # Prediction runs a deployed model (adapters merged: no adapter cost); training carries them.
        self.model = api.load(spec.model, device=device, dtype=dtype, seed=spec.seed, lora=lora, adapter=adapter,
                              merge=adapter is not None and not self.train, _policy=policy)
        self._kernels_compiled(self.model.device)
        cfg = self.model.lora
        self.lora_info = {"rank": cfg.rank, "targets": list(cfg.targets), "merged": False} if cfg else None
        if cfg is None and adapter is not None:  # merged into the base for prediction: the file says what it was
            # torch: not while the plugins are collected (before the command's checks); loaded where it runs
            from dohnuts.adapters import read_adapter_meta

            meta = read_adapter_meta(adapter).lora
            self.lora_info = {"rank": meta.rank, "targets": list(meta.targets), "merged": True}
        if self.train:
            # torch: not while the plugins are collected (before the command's checks); loaded where it runs
            from dohnuts.runtime.collectives import gradient_bytes
            from dohnuts.runtime.process_group import current_world
            from dohnuts.train.objective import RLCDConfig
            from dohnuts.train.step import OptimConfig, Updater, make_optimizer

            optim = OptimConfig()
            # Under a launcher every rank runs its share of each update's microbatches, and the
            # gradients meet in one all-reduce (its bytes go into the records for the analysis).
            world = current_world()
            self.updater = Updater(self.model, make_optimizer(self.model, optim), RLCDConfig(), optim, world=world)
            self.allreduce = ({"allreduce_bytes": gradient_bytes(self.model.trainable_parameters()) + 4}
                              if world.distributed else {})
        else:
            self.predictor = Predictor(self.model)

    def _kernels_compiled(self, device) -> None:
        """Wait for the recorded kernels `api.load` set compiling on threads (dohnuts.ops._precompile):
        no call this target runs, warm-up or measured, shares the CPU with them. The reference
        check's build (inside `reference()`: plain-torch ops, no call measured) does not wait: the
        compiles run beside it, and the first measured target waits for what is left."""
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        from dohnuts.ops._dispatch import in_reference
        from dohnuts.ops._precompile import precompile

        if in_reference():
            return
        started = precompile(device) if device.type == "cuda" else None
        if started is not None and started.finished is None:  # the first target of the process to wait
            done = started.wait()
            self._first_extra = {"kernels_precompiled": done}  # in this target's first-call record
            log.info("compiled %d recorded kernels on %d threads in %.1f s%s", done["kernels"], done["threads"],
                     done["seconds"], f" ({done['failed']} failed: {done['first_failure']})" if done["failed"] else "")

    def _take_first_extra(self) -> dict:
        extra, self._first_extra = self._first_extra, {}
        return extra

    def run_call(self, call, timer) -> CallResult:
        if isinstance(call, PredictCall) and not self.train:
            if call.cold_cache:
                self.model.forget_images()  # a new image: not in the feature cache, its file not seen
            before = self._graph_stats()
            result, work = self.predictor.call(call.request, timer, source=call.request.id)
            extra = self._cache_stats(work) | self._graph_delta(before) | self._take_first_extra()
            return CallResult(decisions=len(result.questions), work=work, extra=extra, output=result)
        if isinstance(call, TrainCall) and self.train:
            before = self._graph_stats()
            res = self.updater.update(call.requests, timer)
            extra = ({"loss": res.loss, "grad_norm": res.grad_norm} | self.allreduce | self._cache_stats(res.work)
                     | self._graph_delta(before) | self._take_first_extra())
            if res.work is None:  # more ranks than microbatches: this one only joined the all-reduce

                return CallResult(decisions=0, work=WorkCounts(0, (), 0, train=True), extra=extra)
            return CallResult(decisions=res.work.sequences, work=res.work, extra=extra)
        raise TypeError(f"dohnuts target cannot run {type(call).__name__} in a {'train' if self.train else 'predict'}"
                        " workload")

    def run_stream(self, calls, timer_for) -> list[dict] | None:
        """The calls as one pipelined stream, as the product runs them: predictions through
        `Predictor.run` (as `dohnuts predict` runs a file), updates through `Updater.run` (as
        `dohnuts train` runs its updates: the workers prepare the next update's requests while one
        computes). Per request or update its decisions, work counts and trace (submitted /
        started / done, host clock).

        A cold-cache workload streams as a user's stream of new images does: the session forgets
        every image as each request enters the pipeline (its feature cache and file memo emptied),
        so the workers read, hash and decode its image while the
        device runs the requests before it, and its features are encoded when it reaches the device
        (each row's work counts say whether it encoded; a workload whose in-flight requests share
        an image would show hits)."""
        if self.train:
            return self._update_stream(calls, timer_for)
        if any(not isinstance(c, PredictCall) for c in calls):
            return None

        def entering():
            for c in calls:
                if c.cold_cache:
                    self.model.forget_images()
                yield c.request.id, c.request

        trace: dict[int, dict] = {}
        results = list(self.predictor.run(entering(), timer_for=timer_for, trace=trace))
        return [{"decisions": len(getattr(r, "questions", ())), "work": trace[i].get("work"),
                 "submitted": trace[i]["submitted"], "started": trace[i].get("started"), "done": trace[i]["done"]}
                for i, r in enumerate(results)]

    def _update_stream(self, calls, timer_for) -> list[dict] | None:
        if any(not isinstance(c, TrainCall) for c in calls):
            return None
        trace: dict[int, dict] = {}
        results = list(self.updater.run((c.requests for c in calls), timer_for=timer_for, trace=trace))
        # a rank past the microbatches only joined the all-reduce: no work, as its single calls say
        return [{"decisions": r.work.sequences if r.work is not None else 0,
                 "work": r.work if r.work is not None else WorkCounts(0, (), 0, train=True),
                 "submitted": trace[i]["submitted"], "started": trace[i]["started"], "done": trace[i]["done"]}
                for i, r in enumerate(results)]

    def serve(self, calls, arrivals, *, capacity, timer_for, deadline=None) -> list | None:
        """Requests arriving at `arrivals` (times, or a closed loop of clients; request i is
        `calls[i % len(calls)]`) served by the pipelined predictor from a bounded queue
        (dohnuts.bench.measure.serving.pipelined). None where the workload cannot be served so (training; a
        cache cleared per call)."""
        if self.train or any(not isinstance(c, PredictCall) or c.cold_cache for c in calls):
            return None
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        from dohnuts.bench.measure.serving.pipelined import serve_pipelined

        return serve_pipelined(self.predictor, [c.request for c in calls], arrivals, capacity=capacity,
                               timer_for=timer_for, deadline=deadline)

    def _graph_stats(self):
        graphs = self.updater.graphs if self.train else self.model.graphs
        return graphs.stats() if graphs is not None else None

    def graph_stats(self) -> dict | None:
        """The CUDA graph counts so far (captures, capture_ms, replays, eager passes by reason, ...);
        None where passes run eagerly (a CPU, the `eager` variant)."""
        stats = self._graph_stats()
        return None if stats is None else stats.to_dict()

    def _graph_delta(self, before) -> dict:
        """What this call did with CUDA graphs: replays, captures (and their time), eager passes."""
        if before is None:
            return {}
        after = self._graph_stats()
        eager = {k: v - before.eager.get(k, 0) for k, v in after.eager.items() if v - before.eager.get(k, 0)}
        return {"graphs": {"replays": after.replays - before.replays, "captures": after.captures - before.captures,
                           "capture_ms": after.capture_ms - before.capture_ms, "eager": eager,
                           "held": after.graphs, "pool_bytes": after.pool_bytes}}

    def _cache_stats(self, work) -> dict:
        """The image-feature cache's counters after a call that used images."""
        if not any(w.image_tokens for w in work.passes()):
            return {}
        return {"image_cache": vars(self.model.image_cache.stats())}

    def close(self) -> None:
        (self.updater if self.train else self.predictor).close()
        del self.model
