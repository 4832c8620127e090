"""Served requests that vary: the seeded served set, its issue order, and what a run of it met.

A server meets requests of many sizes, and every new pass shape costs it something once (on a
GPU, a CUDA graph captured on the first request of a shape bucket: dohnuts.runtime.graphs). A
served set of one shape cycled in order is captured entirely in warm-up, so the latency curve
never meets a new shape. With `serving.vary` (dohnuts.bench.measure.serving.config) the workload kind
builds a *varied* served set instead:

- sizes (`draw_sizes`): `distinct` requests whose sequence lengths and question counts spread
  evenly over the ranges asked for (both ends drawn: `spread`) and are paired at random; for
  image kinds a `fraction` of them carry an image, at the resolutions cycled. Seeded by the
  workload's seed: the same seed draws the same set.
- order (`issue_order`): the set issued in a seeded random order, every request once before any
  comes round again (a fresh permutation each round), from the serving seed. The same order
  starts every load point: points differ by their rate, not their luck.

Without `vary` the served set is the workload's calls cycled in order, as it always was.

What a run of the set met (`ServedFacts`, written into the records of a load point or stream):
the distinct requests served, the distinct *pass shapes* they ran (`pass_shape`: the key a CUDA
graph is captured under — prefix, rows, padded length, scored positions a row, image tokens — read
from each request's work counts, so on a GPU it is the bucketed shape and on a CPU, where nothing
is bucketed, the shape as planned), and the target's graph captures while it was measured (None:
a target or device without graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ORDER_STREAM = 1  # numpy SeedSequence streams: the issue order ...
SIZE_STREAM = 2  # ... and the sizes, apart from the arrivals (which take the seed alone)


@dataclass(frozen=True)
class RequestSize:
    """The sizes of one request of a varied set."""

    seq_tokens: int  # tokens a question sequence
    questions: int
    resolution: tuple[int, int] | None = None  # (width, height) of its image; None: no image


def spread(lo: int, hi: int, n: int) -> np.ndarray:
    """`n` integers spread evenly over [lo, hi], ascending, both ends included (n ≥ 2): each
    integer equally often (±1) when there are at least as many draws as integers, else `n`
    evenly spaced distinct ones."""
    k = hi - lo + 1
    if n >= k:
        return lo + (np.arange(n) * k) // n
    return np.rint(np.linspace(lo, hi, n)).astype(np.int64)


def draw_sizes(vary, *, seq_tokens: int, questions: int, resolutions: Sequence[tuple[int, int]] | None,
               seed: int) -> list[RequestSize]:
    """The sizes of a varied set (module docstring). `seq_tokens`, `questions`: the shape's, for a
    range `vary` leaves out; `resolutions`: the kind's image resolutions (None: a text kind, no
    images); `vary.images` absent on an image kind: every request has an image."""
    n = vary.distinct
    rng = np.random.default_rng((seed, SIZE_STREAM))
    lo, hi = vary.seq_tokens or (seq_tokens, seq_tokens)
    seqs = rng.permutation(spread(lo, hi, n))
    lo, hi = vary.questions or (questions, questions)
    qs = rng.permutation(spread(lo, hi, n))
    images: list[tuple[int, int] | None] = [None] * n
    if resolutions is not None:
        fraction = vary.images.fraction if vary.images is not None else 1.0
        res = [tuple(r) for r in (vary.images.resolutions if vary.images is not None else ())] or list(resolutions)
        with_image = sorted(rng.permutation(n)[:round(fraction * n)].tolist())
        for j, r in enumerate(with_image):
            images[r] = res[j % len(res)]
    return [RequestSize(int(s), int(q), im) for s, q, im in zip(seqs, qs, images)]


def issue_order(n_set: int, n: int, seed: int) -> list[int]:
    """Which request of a set of `n_set` each of `n` issued requests is: seeded permutations of
    the set, one after another (each request once a round)."""
    rng = np.random.default_rng((seed, ORDER_STREAM))
    rounds = -(-n // n_set)
    return np.concatenate([rng.permutation(n_set) for _ in range(rounds)])[:n].tolist()


@dataclass(frozen=True)
class ServedSet:
    """The calls a serving scenario issues: `calls`, and which of them the i-th request is."""

    calls: list  # distinct calls
    varied: bool  # drawn by serving.vary; else the workload's calls in order
    seed: int = 0  # the issue order's (a varied set)
    offset: int = 0  # the first call issued (the workload's calls: the one after the warm-up's)

    def issue(self, n: int) -> list[int]:
        if self.varied:
            return issue_order(len(self.calls), n, self.seed)
        return [(self.offset + i) % len(self.calls) for i in range(n)]


def pass_shape(work) -> tuple[int, int, int, int, int]:
    """The pass shape a request ran (its work counts): (prefix tokens, batch rows with padding
    rows, padded length, scored positions a row, image tokens) — the key of its CUDA graph."""
    rows = work.sequences + work.padded_rows
    per_row = work.scored_rows // rows if work.scored_rows and rows else 0  # 0: every row scored
    return (work.prefix_len, rows, work.padded_len, per_row, work.image_tokens)


def graph_counts(stats: dict | None) -> dict | None:
    """The cumulative graph counts a target reports (`graph_stats()`), reduced to what a point
    states: captures, their time, eager passes."""
    if stats is None:
        return None
    return {"captures": int(stats["captures"]), "capture_ms": float(stats["capture_ms"]),
            "eager": int(sum((stats.get("eager") or {}).values()))}


@dataclass(frozen=True)
class ServedFacts:
    """What one load point or stream served of its set (module docstring)."""

    varied: bool
    set_size: int
    requests: int  # distinct requests of the set served
    shapes: int  # distinct pass shapes served
    graph_captures: int | None  # captures while it was measured (None: the target has no graphs)
    graph_capture_ms: float | None
    graph_eager: int | None  # passes run eagerly (no bucket, or past the graph budget)

    @classmethod
    def of(cls, served: ServedSet, set_indices: Sequence[int], works: Sequence, before: dict | None,
           after: dict | None) -> ServedFacts:
        """From the set indices and work counts of the requests served, and the target's graph
        counts before and after (`graph_counts`)."""
        g = None if before is None or after is None else {k: after[k] - before[k] for k in before}
        return cls(served.varied, len(served.calls), len(set(set_indices)),
                   len({pass_shape(w) for w in works if w is not None}),
                   None if g is None else g["captures"], None if g is None else g["capture_ms"],
                   None if g is None else g["eager"])

    def to_dict(self) -> dict:
        return dict(self.__dict__)
