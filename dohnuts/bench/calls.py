"""What a workload hands a target: one measured call's input, and what the target reports back
(the target itself: dohnuts.bench.contracts.Target)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dohnuts.runtime.requests import Request
from dohnuts.runtime.work import WorkCounts


@dataclass(frozen=True)
class PredictCall:
    """One complete prediction call: one request, prepared, transferred, scored, serialized."""

    request: Request
    cold_cache: bool = False  # a new image: the session forgets every image before the call


@dataclass(frozen=True)
class TrainCall:
    """One optimizer update: 4 microbatches (one request each) at one parameter snapshot."""

    requests: tuple[Request, ...]


@dataclass(frozen=True)
class CallResult:
    decisions: int  # questions answered (or trained on)
    work: WorkCounts  # what the call processed (for the cost model)
    extra: dict = field(default_factory=dict)  # target-specific facts (cache stats, losses, ...)
    # What the call answered (a prediction's RequestResult: per question scores, probabilities,
    # choice), never written into a record: the accuracy mode and the reference check read it.
    # None: the target does not report it (neither check can run on it).
    output: object = None
