"""One optimizer update = 4 microbatches at one parameter snapshot, fed by the runtime pipeline.

A microbatch is one request, or `requests_per_microbatch` consecutive requests when the training
requests hold few questions (the trainer picks it so that an update sees about
`QUESTIONS_PER_UPDATE` questions: one digits request is one question, one synthetic request 8).
The optimizer sees the average of the update's request losses (each the mean over its questions):
gradients of all of them accumulate, the global gradient norm is clipped once, and AdamW steps once.
Only LoRA adapters and the scalar head train (FP32 master weights); on the GPU the forward runs
under BF16 autocast over the BF16 frozen base.

`Updater` is the one training loop of the project (`dohnuts train` and the bench's train-step
workload both run it). Its batches come from exactly the calls prediction uses:

    worker threads  Session.prepare of the update's requests (and of the next update's,
                    while this one computes)
    vision          Session.image_features over all its microbatches at once: one cache call, misses
                    encoded together, a repeated image once (the same 128 MiB cache prediction uses)
    transfer stream request i+1 is copied while request i runs forward and backward
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec
import torch
from msgspec import Meta

from dohnuts.model.lora import refresh_adapter_copies
from dohnuts.runtime.collectives import all_reduce_gradients, all_reduce_sum
from dohnuts.runtime.pipeline import Pipeline
from dohnuts.runtime.process_group import SINGLE, World
from dohnuts.runtime.requests import Request
from dohnuts.runtime.timing import NULL_TIMER
from dohnuts.runtime.work import WorkCounts
from dohnuts.schema import NonNegative, Positive, number_in
from dohnuts.train.graphs import MicrobatchGraphs
from dohnuts.train.loss import microbatch_loss
from dohnuts.train.objective import RLCDConfig

MICROBATCHES = 4
# The questions an update averages, what the defaults (lr 2e-3, 200 updates) were tuned with: 4
# requests of 8 questions. Four 1-question requests give an update whose gradient points along
# the true one with cosine ≈ 0.07 (32 questions: ≈ 0.2–0.3); at lr 2e-3 such updates collapse the
# SCORE hidden states (docs/history/known-issues-2026-12-01.md KI-10), so the trainer groups
# requests to reach this.
QUESTIONS_PER_UPDATE = 32


def requests_per_microbatch(requests: Sequence[Request]) -> int:
    """How many requests one microbatch takes so that an update (4 microbatches) averages about
    QUESTIONS_PER_UPDATE questions: ceil(QUESTIONS_PER_UPDATE / (4 · mean questions per request)),
    at least 1 (1 for the synthetic task's 8-question requests, 8 for the digits' 1-question ones)."""
    if not requests:
        return 1
    mean = sum(len(r.questions) for r in requests) / len(requests)
    return max(1, math.ceil(QUESTIONS_PER_UPDATE / (MICROBATCHES * mean) - 1e-9))


Beta = number_in("a number in [0, 1)", ge=0.0, lt=1.0)  # AdamW's moment decay (torch refuses others)


class OptimConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """AdamW and the clip; the bounds are checked when a TrainConfig is (dohnuts.train.config)."""

    lr: Positive = 2e-3  # finite, > 0
    weight_decay: NonNegative = 0.0  # finite, ≥ 0
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    max_grad_norm: Annotated[float, Meta(gt=0.0)] = 1.0  # inf: no clipping


def make_optimizer(session, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the adapters and the head; on a GPU the fused (one-kernel-per-group) step."""
    params = session.trainable_parameters()
    if not params:
        raise ValueError("the model has no trainable parameters (load it with lora=LoRAConfig(...))")
    fused = session.device.type == "cuda"
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused)


@dataclass(frozen=True)
class UpdateResult:
    loss: float
    grad_norm: float  # before clipping
    work: WorkCounts | None  # this rank's microbatches (with their image-cache outcomes); None: it ran none


class Updater:
    """Optimizer updates of a session's adapters, 4 microbatches of `requests_per_microbatch`
    requests (default one) per update: an update is given 4 · requests_per_microbatch requests,
    microbatch i being requests[i·r : (i+1)·r]."""

    def __init__(self, session, optimizer: torch.optim.Optimizer, objective: RLCDConfig, cfg: OptimConfig, *,
                 workers: int = 2, world: World = SINGLE, requests_per_microbatch: int = 1,
                 _graphs: MicrobatchGraphs | None = None):
        """`_graphs`: tests inject emulated microbatch graphs (CPU); otherwise the session decides."""
        if requests_per_microbatch < 1:
            raise ValueError(f"requests_per_microbatch must be ≥ 1, got {requests_per_microbatch}")
        self.per = requests_per_microbatch
        self.divisor = MICROBATCHES * requests_per_microbatch  # the update's loss is the mean over its requests
        self.session = session
        self.world = world  # several processes: each runs its share of the microbatches (runtime.collectives)
        self.optimizer = optimizer
        self.objective = objective
        self.cfg = cfg
        self.pipeline = Pipeline(session.device, workers=workers)
        # Microbatches replay CUDA graphs on a GPU when the session does (not with LoRA dropout,
        # whose masks are random); the graphs hold the recomputation of the backward pass too.
        params = [p for g in optimizer.param_groups for p in g["params"]]
        lora = session.lora
        graphs = _graphs
        if graphs is None and session.graphs is not None and (lora is None or lora.dropout == 0):
            graphs = MicrobatchGraphs(session.model, objective, params, divisor=self.divisor)
        self.graphs = graphs

    def close(self) -> None:
        self.pipeline.close()

    def _submit(self, requests: Sequence[Request]) -> list:
        if len(requests) != self.divisor:
            raise ValueError(f"an update takes exactly {MICROBATCHES} microbatches of {self.per} request(s), "
                             f"{self.divisor} requests, got {len(requests)}")
        bucket = self.graphs is not None
        mine = [i * self.per + j for i in self.world.microbatches(MICROBATCHES) for j in range(self.per)]
        return [self.pipeline.submit(self.session.prepare, requests[i], train=True, bucket=bucket) for i in mine]

    def update(self, requests: Sequence[Request], timer=NULL_TIMER) -> UpdateResult:
        """One update over 4 · requests_per_microbatch requests (prepared by the workers, copied one
        request ahead). With several processes every rank is given the same requests and runs the
        microbatches i with i mod size == rank."""
        return self._update(self._submit(requests), timer)

    def run(self, updates: Iterable[Sequence[Request]], *, timer_for=None,
            trace: dict[int, dict] | None = None) -> Iterator[UpdateResult]:
        """Updates in order; the workers prepare update u+1 while update u computes.

        `timer_for(u)`: update u's stage timer (default none). `trace`, filled per update u:
        `submitted` (its requests given to the workers), `started` (it began: waiting for them,
        then the device), `done` (its result ready), host perf_counter seconds."""
        updates = iter(updates)
        nxt = next(updates, None)
        u = 0
        pending = self._submit(nxt) if nxt is not None else None
        if trace is not None and pending is not None:
            trace[u] = {"submitted": time.perf_counter()}
        while pending is not None:
            current = pending
            nxt = next(updates, None)
            pending = self._submit(nxt) if nxt is not None else None
            if trace is not None:
                if pending is not None:
                    trace[u + 1] = {"submitted": time.perf_counter()}
                trace[u]["started"] = time.perf_counter()
            result = self._update(current, timer_for(u) if timer_for is not None else NULL_TIMER)
            if trace is not None:
                trace[u]["done"] = time.perf_counter()
            yield result
            u += 1

    def _update(self, futures: list, timer) -> UpdateResult:
        session, model, pipe = self.session, self.session.model, self.pipeline
        with timer.stage("prepare"):  # waiting for the workers (zero when they were ahead)
            hbs = [f.result() for f in futures]
        staged = [pipe.transfer(hbs[0], timer)] if hbs else []  # (`h2d` is timed on the copy stream)
        with timer.stage("vision"):  # one cache call for the whole update
            uses = session.image_features([(hb, staged[0][0] if i == 0 else None) for i, hb in enumerate(hbs)])
        model.train()
        # Captured backward graphs add into fixed .grad tensors: zero them in place, never drop them.
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        total = torch.zeros((), device=session.device)
        for i, hb in enumerate(hbs):
            if i + 1 < len(hbs):
                staged.append(pipe.transfer(hbs[i + 1], timer))  # one microbatch ahead, on the copy stream
            dev = pipe.wait(*staged[i])
            feats = uses[i].features if uses[i] is not None else None
            loss = self.graphs.step(dev, feats, timer) if self.graphs is not None else None
            if loss is None:
                with timer.stage("forward"):
                    loss = microbatch_loss(model, dev, self.objective, image_features=feats) / self.divisor
                with timer.stage("backward"):
                    loss.backward()
            total += loss.detach()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        if self.world.distributed:
            with timer.stage("allreduce"):  # every rank then holds the sum over all microbatches
                all_reduce_gradients(params, self.world)
                all_reduce_sum(total, self.world)
        with timer.stage("optimizer"):
            norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
            self.optimizer.step()
            # The adapters' BF16 copies for the next update, issued now, while the GPU still runs
            # this update's last backward: made at the next forward instead, their small launches
            # sat on the critical path (measured: docs/history/evolution.md M28).
            refresh_adapter_copies()
        model.eval()
        works = [hb.work if use is None else use.counted(hb.work) for hb, use in zip(hbs, uses)]
        work = WorkCounts.of_update(works) if works else None
        return UpdateResult(loss=float(total), grad_norm=float(norm), work=work)
