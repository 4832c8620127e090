"""CUDA graphs of the inference passes: the host issues one replay instead of ~1,000 kernels.

A 24-layer pass launches about a thousand kernels, each costing tens of µs of host time from
Python, so every pass below ~16k tokens waited on the host, not on the GPU (measured:
docs/history/evolution.md M5, M8). Here each pass shape is captured once and replayed:

    shared   (1, P) + (B_b, L_b) → hidden states of the prefix and its forked suffixes in one
                                   pass (`TextBackbone.forward_shared`)   key (P, B_b, L_b, Q, image)
    forward  (B_b, L_b)          → hidden states of one batched pass      key (B_b, L_b, Q, image)
    vision   (N, C·P·P) uint8    → merged image features: the pixels normalised and the whole tower
                                   (`encode`)                             key (the images' grids)

The vision tower of one 448² image is ≈ 500 small launches, host-bound as the text passes were;
its graph is keyed by the exact grids (attention spans a whole image, so patches cannot be
padded to a bucket): one graph a resolution, within the same budget.

Which pass a request runs is `dohnuts.model.scorer.choose_pass`'s answer: a graph captures the
pass it names and never decides again.

The hidden states are those of the request's (B_b, Q) grid of scored positions (Q candidates a
row at most; `ScoreInputs.score_rows`, a static buffer like the token ids): the last layer runs
its query side there alone.

Shapes are bucketed (`ShapeBuckets`): batched-pass lengths on a grid that widens with the length
(16 tokens up to 512, then 1/32 of the octave: padding under 1/16 of a row; the prefix is already
a multiple of 64, the planner's split), batch rows on a short ladder. The collate step pads a request to its bucket — whole padding
rows and right-padding, both counted as padded work — so a handful of graphs serve every
request. A shape outside every bucket, or past the graph budget, runs eagerly and is counted.

Static buffers. A graph reads its inputs from fixed tensors (one per name and shape, shared by
the graphs that take that shape) and writes fixed outputs; `hidden()` copies each request's
inputs into the buffers before replaying. A shared prefix's state lives only inside the shared
pass's graph and is overwritten by the next replay (no state outlives its request). Parameters
are read in place, so optimizer steps
need no recapture; replacing modules (LoRA merge or attach) does, and the session clears the
graphs then.

Capture. On the first request of a shape the pass runs eagerly twice (Triton autotuning and
lazy initialisation happen outside the capture), is captured into the shared memory pool, and
is then replayed. A capture that fails leaves its shape eager (said once on stderr) and the
captures after it go into a fresh pool (torch may leave the failed capture's pool recording,
which failed the next capture into it), on the caller's stream (`capturing`). Capture time, the pool's growth, replays and eager
fallbacks are counted in `GraphStats`. Without a GPU (`emulate=True`, the CPU tests) a "graph"
re-runs its pass on the static buffers and copies the result into its static outputs: the same
buffer discipline, so a stale buffer shows up on the CPU too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from dohnuts.model.inputs import ScoreInputs
from dohnuts.model.lora import refresh_adapter_copies
from dohnuts.model.scorer import ScoringModel, choose_pass, no_stage
from dohnuts.runtime.images import pixel_values


@dataclass(frozen=True)
class ShapeBuckets:
    """Which (rows, length) a batched pass is padded to. None: no bucket (runs eagerly)."""

    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
    length_step: int = 16  # the finest length grid (short passes)
    per_octave: int = 32  # lengths in (2^k, 2^(k+1)] step by max(length_step, 2^(k+1) / per_octave)
    max_length: int = 4096

    def step(self, length: int) -> int:
        """The grid of lengths near `length`: padding stays under 1/16 of a row past 256 tokens
        (2/per_octave) and under `length_step` tokens below, with 16 lengths an octave at most.
        (A fixed 32-token grid padded a 262-token image suffix by 26 tokens a row, 9 % of the
        pass; this one pads it by 10.)"""
        top = 1 << max(length - 1, 1).bit_length()  # the power of two at or above `length`
        return max(self.length_step, top // self.per_octave)

    def fit(self, rows: int, length: int) -> tuple[int, int] | None:
        b = next((r for r in self.rows if r >= rows), None)
        step = self.step(length)
        L = -(-length // step) * step
        if b is None or L > self.max_length:
            return None
        return b, L


@dataclass
class GraphStats:
    captures: int = 0
    capture_ms: float = 0.0  # warm-up + capture, summed
    pool_bytes: int = 0  # growth of reserved device memory over all captures (graph pool + static buffers)
    replays: int = 0  # passes replayed
    eager: dict[str, int] = field(default_factory=dict)  # passes run eagerly, by reason
    graphs: int = 0  # graphs held now

    def to_dict(self) -> dict:
        return {"captures": self.captures, "capture_ms": self.capture_ms, "pool_bytes": self.pool_bytes,
                "replays": self.replays, "eager": dict(self.eager), "graphs": self.graphs}


@contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool) -> Iterator[None]:
    """`torch.cuda.graph` in thread_local mode — a preparing thread's pinned allocation or wait on
    its own stream, at any moment, must not end this capture (the default mode refuses them from
    every thread) — with the caller's stream current again however it ends: torch's context
    leaves its capture stream current when `capture_end` raises (a failed capture), and the
    thread's eager work would then run there."""
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            yield
    finally:
        torch.cuda.set_stream(stream)


class _Captured:
    """One captured pass: replay() recomputes `output` in place from the static buffers."""

    def __init__(self, fn: Callable[[], object], pool, emulate: bool):
        self.fn = fn
        self.emulate = emulate
        if emulate:
            self.graph = None
            self.output = fn()
            return
        for _ in range(2):  # autotune, compile and lazily initialise outside the capture
            fn()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with capturing(self.graph, pool):
            self.output = fn()

    def replay(self) -> None:
        if self.graph is not None:
            refresh_adapter_copies()  # the graph reads unmerged adapters' compute copies in place
            self.graph.replay()
            return
        self.output.copy_(self.fn())


class PassGraphs:
    """The captured passes of one model, keyed by pass shape (see the module docstring)."""

    def __init__(self, model: ScoringModel, *, buckets: ShapeBuckets = ShapeBuckets(), max_graphs: int = 48,
                 emulate: bool = False):
        self.model = model
        self.buckets = buckets
        self.max_graphs = max_graphs
        self.emulate = emulate
        self.stats_ = GraphStats()
        self._graphs: dict[tuple, _Captured] = {}
        self._failed: dict[tuple, str] = {}
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._pool = None if emulate else torch.cuda.graph_pool_handle()

    def stats(self) -> GraphStats:
        return replace(self.stats_, eager=dict(self.stats_.eager), graphs=len(self._graphs))

    def clear(self) -> None:
        """Drop every graph and buffer (the model's modules changed: LoRA merged or attached)."""
        self._graphs.clear()
        self._failed.clear()
        self._buffers.clear()
        self._pool = None if self.emulate else torch.cuda.graph_pool_handle()

    # -- static buffers -------------------------------------------------------------------------

    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        key = (name, tuple(like.shape), like.dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = torch.empty_like(like)
        return buf

    def _static(self, x: ScoreInputs) -> ScoreInputs:
        """Copy the request's inputs into the static buffers; returns the inputs graphs read."""
        out = {}
        for name in ("ids", "prefix_ids", "positions", "image_features", "score_rows"):
            t = getattr(x, name)
            if t is not None:
                buf = self._buffer(name, t)
                buf.copy_(t)
                t = buf
            out[name] = t
        return replace(x, **out)

    # -- passes ---------------------------------------------------------------------------------

    def _eager(self, reason: str) -> None:
        self.stats_.eager[reason] = self.stats_.eager.get(reason, 0) + 1

    def _get(self, key: tuple, fn: Callable[[], object]) -> _Captured | None:
        g = self._graphs.get(key)
        if g is not None:
            return g
        if key in self._failed:
            return None
        if len(self._graphs) >= self.max_graphs:
            return None
        if not self.emulate:
            # torch.cuda.graph empties the allocator's cache when a capture begins; do it first, so
            # the growth of reserved memory measures what the capture (and its warm-up) kept.
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        before = 0 if self.emulate else torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        try:
            g = _Captured(fn, self._pool, self.emulate)
        except Exception as exc:  # a pass that cannot be captured runs eagerly, said once
            self._failed[key] = f"{type(exc).__name__}: {exc}"
            if not self.emulate:  # the failed capture's pool may be left recording: later ones get a new pool
                self._pool = torch.cuda.graph_pool_handle()
            print(f"dohnuts: a pass of shape {key} cannot be captured as a CUDA graph and runs eagerly "
                  f"({self._failed[key].splitlines()[0]})", file=sys.stderr)
            return None
        self.stats_.captures += 1
        self.stats_.capture_ms += (time.perf_counter() - t0) * 1e3
        if not self.emulate:
            self.stats_.pool_bytes += max(0, torch.cuda.memory_reserved() - before)
        self._graphs[key] = g
        return g

    def hidden(self, x: ScoreInputs, stage=no_stage) -> torch.Tensor | None:
        """Hidden states (B_b, L_b, H) — (B_b, Q, H) at `x.score_rows` — of the request's passes
        by graph replay, or None when the shape has no graph (then the caller runs the passes
        eagerly). The returned tensor is the graph's static output: use it before the next call."""
        B, L = x.ids.shape
        if self.buckets.fit(B, L) != (B, L):
            self._eager("no bucket")
            return None
        img = (x.image_tokens, x.prefix_next_position) if x.image_features is not None and x.image_tokens else None
        Q = None if x.score_rows is None else x.score_rows.shape[1]  # scored positions a row (the output's shape)
        kind = choose_pass(x)
        with stage(kind):
            xs = self._static(x)
            g = self._replay((kind, x.prefix_len, B, L, Q, img), lambda: self.model.run_pass(kind, xs))
        return None if g is None else g.output

    def encode(self, patches: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """Merged features (Σ tokens, H) of uint8 patches (N, C·P·P) on the device, by replaying the
        tower's graph for these grids ((n, 3) long, on the host), eagerly where there is none. The
        result is the caller's own (the image cache keeps it), never the graph's static output."""
        temporal = self.model.cfg.vision.temporal_patch_size
        key = ("vision", tuple(map(tuple, grids.tolist())))  # a long tensor's list holds ints
        static = self._buffer("patches", patches)
        held: list = []  # the grids' positions and rotary, computed at the first (eager) warm-up call

        def encode():
            if not held:  # a replay reads them in place; the captured closure keeps them alive
                visual = self.model.visual
                held.append(None if visual is None else visual.grid_inputs(grids))
            return self.model.encode_images(pixel_values(static, temporal), grids, held[0])

        # In inference mode: a prediction's capture (in inference mode) made the static buffer and
        # output inference tensors, which training's encode (autograd on, under no_grad) may not
        # write outside it; the clone below is made in the caller's mode.
        with torch.inference_mode():
            static.copy_(patches)
            g = self._replay(key, encode)
        if g is None:
            return self.model.encode_images(pixel_values(patches, temporal), grids)
        return g.output.clone()

    def _replay(self, key: tuple, fn: Callable[[], object]) -> _Captured | None:
        """Replay the graph of `key` (captured from `fn` on first use); None, counted as eager,
        when the budget is spent or the pass cannot be captured."""
        g = self._get(key, fn)
        if g is None:
            self._eager("graph budget or capture failure")
            return None
        g.replay()
        self.stats_.replays += 1
        return g
