"""A training microbatch's forward (loss) and backward as two CUDA graphs per shape.

An eager training microbatch of the 2b model issues a few thousand kernels (forward, LoRA
adapters under autocast, backward, the recomputation): eager, an update waits on the host, not on
the GPU (docs/history/evolution.md M8). Here each microbatch shape is captured once:

    forward graph   static batch → scores → RLCD loss / 4           (the loss is a static output)
    backward graph  loss.backward(): gradients ADD into the parameters' .grad in place

so an update is 4 × (copy inputs, replay forward, replay backward) + clip + one fused AdamW
step. The forward's saved activations live in the graph pool between the two replays (the
backward graph reads them; `retain_graph` keeps them referenced). Parameters are read in place,
so optimizer steps need no recapture. A shape is captured on its first microbatch: two eager
warm-up passes (autotuning, fla's kernel guards, lazy initialisation), whose gradients are
discarded, then the two captures; the microbatch itself then replays. Shapes outside the
buckets, or past the graph budget, or LoRA dropout (random masks), run eagerly and are counted.
Without a GPU (`emulate=True`) a replay re-runs the pass from the static buffers: the CPU tests
check the buffer discipline that way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from dohnuts.model.lora import refresh_adapter_copies
from dohnuts.runtime.batch import Batch
from dohnuts.runtime.graphs import GraphStats, ShapeBuckets, capturing
from dohnuts.train.loss import microbatch_loss
from dohnuts.train.objective import RLCDConfig


class _MicrobatchGraph:
    def __init__(self, forward: Callable[[], torch.Tensor], params: list[torch.nn.Parameter], pool, emulate: bool):
        self.forward_fn = forward
        self.emulate = emulate
        if emulate:
            self.loss = None
            return
        saved = [None if p.grad is None else p.grad.clone() for p in params]
        try:
            for _ in range(2):  # autotune, lift kernel guards, initialise lazily: outside the capture
                forward().backward()
            torch.cuda.synchronize()
            self.fwd, self.bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            # the next update's preparation runs on a worker thread meanwhile (`capturing`)
            with capturing(self.fwd, pool):
                self.loss = forward()
            with capturing(self.bwd, pool):
                self.loss.backward(retain_graph=True)  # accumulates into the existing .grad tensors
        finally:
            with torch.no_grad():  # the warm-up passes' gradients are not part of the update
                for p, g in zip(params, saved):
                    if p.grad is None:
                        continue
                    if g is None:
                        p.grad.zero_()
                    else:
                        p.grad.copy_(g)

    def forward(self) -> torch.Tensor:
        if self.emulate:
            self.loss = self.forward_fn()
        else:
            refresh_adapter_copies()  # an optimizer step since the last replay: the adapters' BF16 copies
            self.fwd.replay()
        return self.loss

    def backward(self) -> None:
        if self.emulate:
            self.loss.backward()
        else:
            self.bwd.replay()


class MicrobatchGraphs:
    """Captured forward/backward of training microbatches, keyed by shape."""

    def __init__(self, model, objective: RLCDConfig, params: list[torch.nn.Parameter], *, divisor: int,
                 buckets: ShapeBuckets = ShapeBuckets(), max_graphs: int = 16, emulate: bool = False):
        self.model, self.objective, self.params, self.divisor = model, objective, params, divisor
        self.buckets = buckets
        self.max_graphs = max_graphs
        self.emulate = emulate
        self.stats_ = GraphStats()
        self._graphs: dict[tuple, _MicrobatchGraph] = {}
        self._failed: set[tuple] = set()
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._pool = None if emulate else torch.cuda.graph_pool_handle()

    def stats(self) -> GraphStats:
        return replace(self.stats_, eager=dict(self.stats_.eager), graphs=len(self._graphs))

    def _eager(self, reason: str) -> None:
        self.stats_.eager[reason] = self.stats_.eager.get(reason, 0) + 1

    def _static(self, batch: Batch, features: torch.Tensor | None) -> tuple[Batch, torch.Tensor | None]:
        def buf(name: str, t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            key = (name, tuple(t.shape), t.dtype)
            if key not in self._buffers:
                self._buffers[key] = torch.empty_like(t)
            b = self._buffers[key]
            b.copy_(t)
            return b

        static = replace(batch, **{n: buf(n, getattr(batch, n)) for n in
                                   ("ids", "score_index", "cand_matrix", "prefix_ids", "positions", "rewards",
                                    "score_rows", "score_slot")},
                         pixel_patches=None)
        return static, buf("image_features", features)

    def _loss_fn(self, batch: Batch, features: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        model, objective, divisor = self.model, self.objective, self.divisor

        def forward() -> torch.Tensor:  # the eager microbatch's loss, exactly
            return microbatch_loss(model, batch, objective, image_features=features, autocast_cache=False) / divisor

        return forward

    def step(self, batch: Batch, features: torch.Tensor | None, timer) -> torch.Tensor | None:
        """Forward and backward of one microbatch by replay (gradients added into .grad); returns
        the static loss / divisor, or None when the shape runs eagerly (the caller does it)."""
        B, L = batch.ids.shape
        if self.buckets.fit(B, L) != (B, L):
            self._eager("no bucket")
            return None
        key = tuple((n, None if getattr(batch, n) is None else tuple(getattr(batch, n).shape))
                    for n in ("ids", "score_index", "cand_matrix", "prefix_ids", "positions", "score_rows"))
        key += (batch.image_tokens if features is not None else 0, batch.prefix_next_position)
        static, feats = self._static(batch, features)
        g = self._graphs.get(key)
        if g is None:
            if key in self._failed or len(self._graphs) >= self.max_graphs:
                self._eager("graph budget or capture failure")
                return None
            t0 = time.perf_counter()
            try:
                g = _MicrobatchGraph(self._loss_fn(static, feats), self.params, self._pool, self.emulate)
            except Exception as exc:
                self._failed.add(key)
                if not self.emulate:  # the failed capture's pool may be left recording: later ones get a new pool
                    self._pool = torch.cuda.graph_pool_handle()
                print(f"dohnuts: a training microbatch of shape {B}×{L} cannot be captured as CUDA graphs and runs "
                      f"eagerly ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
                      file=sys.stderr)
                self._eager("graph budget or capture failure")
                return None
            self.stats_.captures += 1
            self.stats_.capture_ms += (time.perf_counter() - t0) * 1e3
            self._graphs[key] = g
        with timer.stage("forward"):
            loss = g.forward()
        with timer.stage("backward"):
            g.backward()
        self.stats_.replays += 1
        return loss
