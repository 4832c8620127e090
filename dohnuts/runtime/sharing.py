"""Whether to compute a shared prefix once is decided by measurement, per request shape.

Computing P shared tokens once saves dense work — P + B·(L − P) tokens instead of B·L — but
costs a second pass (a fixed cost per pass: kernel launches, or at least the ~1,000 kernels of a
graph replay at batch 1), B copies of the prefix keys/values joined to the suffix's, and
attention over them (in inference the conv and recurrent states fork as views, not copies;
under autograd, B copies). Which side wins depends on the machine, the execution mode and the shape: on the
H200 with eager launches sharing lost (182.9 vs 103.4 ms, docs/evolution.md M5), with CUDA
graphs it wins 4.2×. A token threshold cannot know that.

`ShareTuner` measures instead: the first prediction request of a shape class — (batch rows,
shared prefix P, longest sequence, image tokens), with the longest rounded to 32 tokens (one or
two of the graph buckets' length steps) — is run both ways (once untimed: graph capture, kernel tuning; then three
times each, interleaved and timed on the device; the minima are compared), and the faster
variant is remembered for every later request of that class. A request planned before its class was decided carries both batches and
is resolved at scoring time. Training follows the planner (no alternative is measured there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Key = tuple[int, int, int, int]


def share_key(rows: int, prefix_len: int, longest: int, image_tokens: int, step: int = 32) -> Key:
    """The shape class a sharing decision holds for."""
    rows_class = 1 << max(0, rows - 1).bit_length()  # next power of two
    return rows_class, prefix_len, -(-longest // step) * step, image_tokens


def device_time_ms(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Time one call of `fn` (CUDA events on a GPU, the host clock on the CPU), in ms."""
    if device.type != "cuda":
        def measure(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return measure

    def measure_cuda(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    return measure_cuda


@dataclass
class ShareTuner:
    """Measured sharing decisions by shape class (thread-safe: prepare workers read them)."""

    measure: Callable[[Callable[[], object]], float]
    repeats: int = 3
    decisions: dict[Key, bool] = field(default_factory=dict)  # True: share
    timings: dict[Key, tuple[float, float]] = field(default_factory=dict)  # (shared ms, unshared ms)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def decision(self, key: Key) -> bool | None:
        with self._lock:
            return self.decisions.get(key)

    def decide(self, key: Key, shared: Callable[[], object], unshared: Callable[[], object]) -> bool:
        """Run each variant once untimed (captures, tuning), then `repeats` times interleaved;
        the minimum of each is compared (robust to interference), remembered and returned."""
        shared()
        unshared()
        times = [(self.measure(shared), self.measure(unshared)) for _ in range(self.repeats)]
        t_shared, t_unshared = min(t for t, _ in times), min(t for _, t in times)
        with self._lock:
            self.decisions[key] = t_shared <= t_unshared
            self.timings[key] = (t_shared, t_unshared)
        return t_shared <= t_unshared
