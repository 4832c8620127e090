"""The workload fields of the serving scenarios, the accuracy mode and the reference check.

    scenario: server            # single (default) | stream | server | offline (package docstring)
    serving:                    # the scenario's settings; every field has a default
      rates: [20, 40]           # server: offered rates to measure, requests/s (fixed load points)
      concurrency: [1, 2, 4]    # server: closed-loop points, N clients each (1..4096): a client sends its
                                #   next request when its previous one returned plus its think time
      think_ms: 0               # a closed-loop client's mean think time (exponential, seeded; 0: none)
      burstiness: 1             # open points' gamma shape k (vLLM's --burstiness): gaps Gamma(k, 1/(k·rate)),
                                #   mean 1/rate; 1: Poisson; below 1 burstier, above 1 more even
      slo_ms: 100               # server: search the highest load whose latency percentile is within this
      percentile: 99            # that percentile of the latency (arrival → response serialized)
      metric_percentiles: [50, 90, 99]   # the pNN_ metrics a point reports under vLLM's names (p99_e2el_ms,
                                #   p90_ttft_ms, p50_queue_ms; vLLM's --metric-percentiles); 1 to 16 of them
      search: {over: rate, low_rps: 1, high_rps: 0, points: 6, resolution: 0.05, step: 1.25, first_rps: 0,
               low_clients: 1, high_clients: 0, first_clients: 0}
                                # over: rate (open points) | concurrency (closed-loop points, think_ms);
                                # high_rps 0: the throughput ceiling of the measured single call × 1.5;
                                # first_rps 0: the M/D/1 rate of the measured single call (search.py);
                                # high_clients 0: 4 × the first; first_clients 0: the clients at which
                                # one server with the single call's time D reaches the SLO, (SLO + think) / D
      arrivals: poisson         # poisson | a trace file (JSONL of {"arrival_s": s}, relative to this file)
      queue: 64                 # requests waiting at most; an arrival finding it full is refused (a miss).
                                #   0: unbounded
      min_requests: 0           # a point's minimum (0: the scenario's: server the fewest for which the
                                #   percentile's 95 % interval is bounded — 368 at p99; stream 64; offline 256)
      min_duration_s: 1         # a point's minimum length (LoadGen: 600 s; scaled down, stated, enforced)
      max_duration_s: 120       # a point issues no arrival past this (then it is marked, and invalid when
                                #   short of its minimums): a point far past the capacity still ends
      budget_s: 0               # the search starts no probe past this many seconds (0: no limit)
      seed: null                # the arrivals' and the varied set's issue order's seed (default: the workload's)
      vary:                     # served requests that vary (absent: the workload's calls, cycled in order)
        distinct: 64            #   requests drawn into the served set (1..1024), from the workload's seed
        seq_tokens: [384, 640]  #   [min, max] tokens a question sequence (absent: shape.seq_tokens)
        questions: [2, 6]       #   [min, max] questions a request (absent: shape.questions)
        images:                 #   image kinds only (absent there: every request has an image, shape.resolution)
          fraction: 0.5         #     share of the requests that carry an image
          resolutions: [[224, 224], [448, 448]]   # [width, height] each (absent: shape.resolution)
    accuracy:                   # accuracy mode, in the same run: every target scores a labelled set
      set: digits               # digits (scikit-learn's handwritten digits, written into the run) or a
                                #   labelled request file (JSONL with `answer`/`rewards`, relative to this file)
      split: test               # digits: train | dev | calib | test
      limit: 0                  # requests scored (0: all)
    agreement:                  # every target with an FP32 reference path (the dohnuts variants)
      sample: 2                 # the workload's first N requests, scored by both (0: no check)
      tolerance: 0              # the largest probability gap allowed (0: 1e-4 at fp32, 0.05 at bf16)

`vary` draws the served set (dohnuts.bench.measure.serving.variety): `distinct` requests whose sizes
spread evenly over the ranges (both ends drawn), paired at random, issued in a seeded random order
(each request once before any comes round again) to the server, offline and stream scenarios and
the stream beside single calls. The single calls keep `shape:` (their bounds are the curve's floor).
Each corner of the ranges must be a valid `shape:` of the kind and fit the model's context.

A run that did not meet a point's minimums is marked invalid in its records and the report, never
silently short. Every problem is one ConfigError naming the workload file and the field.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from dohnuts.bench.measure.serving.arrivals import read_trace
from dohnuts.bench.measure.serving.stats import min_requests_for
from dohnuts.errors import ConfigError
from dohnuts.schema import Invalid

SCENARIOS = ("single", "stream", "server", "offline")
MAX_CLIENTS = 4096  # a closed loop's clients, at most
DEFAULT_MIN_REQUESTS = {"stream": 64, "offline": 256}  # server: stats.min_requests_for(percentile)
DEFAULT_TOLERANCE = {"fp32": 1e-4, "bf16": 0.05}  # the reference check's stated tolerance
MAX_RATE = 1e6
MAX_REQUESTS = 10_000_000
DAY = 86_400.0


class SearchFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    over: Annotated[Literal["rate", "concurrency"], Meta(description="what the search varies: the offered rate "
                                                                      "or the closed loop's clients")] = "rate"
    low_clients: Annotated[int, Meta(ge=1, le=MAX_CLIENTS, description="the fewest clients probed")] = 1
    high_clients: Annotated[int, Meta(ge=0, le=MAX_CLIENTS, description="the most clients probed (0: 4 × the "
                                                                         "first probe)")] = 0
    first_clients: Annotated[int, Meta(ge=0, le=MAX_CLIENTS, description="the first probe (0: (SLO + think) / "
                                                                          "the single call's time)")] = 0
    low_rps: Annotated[float, Meta(gt=0, le=MAX_RATE, description="the lowest rate probed")] = 1.0
    high_rps: Annotated[float, Meta(ge=0, le=MAX_RATE, description="the highest rate probed (0: 1.5 × the "
                                                                   "single call's ceiling)")] = 0.0
    points: Annotated[int, Meta(ge=1, le=64, description="probes at most")] = 6
    resolution: Annotated[float, Meta(gt=0, le=1, description="stop when the bracket is this narrow")] = 0.05
    step: Annotated[float, Meta(gt=1, le=10, description="the factor between probes before a bracket")] = 1.25
    first_rps: Annotated[float, Meta(ge=0, le=MAX_RATE, description="the first probe (0: M/D/1 estimate)")] = 0.0


Resolution = tuple[Annotated[int, Meta(ge=1, le=8192)], Annotated[int, Meta(ge=1, le=8192)]]
Range = Annotated[tuple[Annotated[int, Meta(ge=1, le=2**18)], Annotated[int, Meta(ge=1, le=2**18)]],
                  Meta(description="[min, max], both included")]


class ImageVary(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    fraction: Annotated[float, Meta(ge=0, le=1, description="share of the requests with an image")] = 1.0
    resolutions: Annotated[list[Resolution], Meta(max_length=1024,
                                                  description="[width, height] each (empty: the shape's)")] = []


class VaryFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    distinct: Annotated[int, Meta(ge=1, le=1024, description="requests in the served set")] = 64
    seq_tokens: Range | None = None
    questions: Range | None = None
    images: ImageVary | None = None

    def __post_init__(self) -> None:
        for name in ("seq_tokens", "questions"):
            span = getattr(self, name)
            if span is not None and span[0] > span[1]:
                raise Invalid(f"is [{span[0]}, {span[1]}]: the minimum is above the maximum", field=name)


class ServingFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    rates: Annotated[list[Annotated[float, Meta(gt=0, le=MAX_RATE)]], Meta(max_length=256)] = []
    concurrency: Annotated[list[Annotated[int, Meta(ge=1, le=MAX_CLIENTS)]], Meta(max_length=256)] = []
    think_ms: Annotated[float, Meta(ge=0, le=DAY * 1e3)] = 0.0
    burstiness: Annotated[float, Meta(ge=0.01, le=1000)] = 1.0
    slo_ms: Annotated[float, Meta(gt=0, le=DAY * 1e3)] | None = None
    percentile: Annotated[float, Meta(gt=0, lt=100)] = 99.0
    metric_percentiles: Annotated[list[Annotated[float, Meta(gt=0, lt=100)]], Meta(min_length=1, max_length=16)] = \
        msgspec.field(default_factory=lambda: [50.0, 90.0, 99.0])
    search: SearchFields = SearchFields()
    arrivals: str = "poisson"
    queue: Annotated[int, Meta(ge=0, le=MAX_REQUESTS)] = 64
    min_requests: Annotated[int, Meta(ge=0, le=MAX_REQUESTS)] = 0
    min_duration_s: Annotated[float, Meta(ge=0, le=DAY)] = 1.0
    max_duration_s: Annotated[float, Meta(gt=0, le=DAY)] = 120.0
    budget_s: Annotated[float, Meta(ge=0, le=DAY)] = 0.0
    seed: Annotated[int, Meta(ge=0, le=2**32 - 1)] | None = None
    vary: VaryFields | None = None

    def __post_init__(self) -> None:
        if self.max_duration_s < self.min_duration_s:
            raise Invalid(f"is {self.max_duration_s} s, below min_duration_s {self.min_duration_s} s: no point "
                          "could be valid", field="max_duration_s")
        if self.search.high_rps and self.search.high_rps < self.search.low_rps:
            raise Invalid(f"is below search.low_rps {self.search.low_rps}", field="search.high_rps")
        if self.search.high_clients and self.search.high_clients < self.search.low_clients:
            raise Invalid(f"is below search.low_clients {self.search.low_clients}", field="search.high_clients")
        if len(set(self.concurrency)) < len(self.concurrency):
            raise Invalid("lists a count of clients twice", field="concurrency")


class AccuracyFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    set: str
    split: Literal["train", "dev", "calib", "test"] = "test"
    limit: Annotated[int, Meta(ge=0, le=MAX_REQUESTS)] = 0


class AgreementFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    sample: Annotated[int, Meta(ge=0, le=1024)] = 2
    tolerance: Annotated[float, Meta(ge=0, le=1)] = 0.0

    def tolerance_for(self, precision: str) -> float:
        return self.tolerance or DEFAULT_TOLERANCE[precision]


def percentile_fraction(serving: ServingFields) -> float:
    return serving.percentile / 100.0


def min_requests(scenario: str, serving: ServingFields) -> int:
    """A point's minimum request count: the workload's, else the scenario's default."""
    if serving.min_requests:
        return serving.min_requests
    if scenario == "server":

        return min_requests_for(percentile_fraction(serving))
    return DEFAULT_MIN_REQUESTS.get(scenario, 1)


def check_serving(scenario: str, serving: ServingFields, workload_file: Path, *, source: str,
                  processes: tuple[int, ...], kind_is_train: bool) -> ServingFields:
    """Checks across fields and files: the scenario's needs, the trace file (read now, so a bad
    line is refused before anything is measured; its path is made absolute)."""
    if scenario == "single":
        return serving
    if kind_is_train:
        raise ConfigError(f"scenario {scenario!r} issues prediction requests; a train-step workload has none",
                          source=source, field="scenario")
    if max(processes) > 1:
        raise ConfigError(f"scenario {scenario!r} runs in one process (processes lists {max(processes)})",
                          source=source, field="scenario")
    closed = bool(serving.concurrency) or (serving.slo_ms is not None and serving.search.over == "concurrency")
    if scenario != "server" and (serving.concurrency or serving.burstiness != 1.0):
        field = "serving.concurrency" if serving.concurrency else "serving.burstiness"
        raise ConfigError(f"applies to the server scenario, not {scenario!r}", source=source, field=field)
    if serving.think_ms and not closed:
        raise ConfigError("is a closed-loop client's think time: give `concurrency` points (or search over "
                          "concurrency)", source=source, field="serving.think_ms")
    arrivals = serving.arrivals
    if arrivals != "poisson" and serving.burstiness != 1.0:
        raise ConfigError("shapes generated arrivals; a trace's arrivals are its own (leave burstiness at 1)",
                          source=source, field="serving.burstiness")
    if arrivals != "poisson":

        path = Path(arrivals)
        if not path.is_absolute():
            path = workload_file.parent / path
        if scenario != "server":
            raise ConfigError(f"arrival times apply to the server scenario, not {scenario!r}", source=source,
                              field="serving.arrivals")
        read_trace(path)  # a ConfigError naming the trace file and its line
        serving = msgspec.structs.replace(serving, arrivals=str(path.resolve()))
    if scenario == "server" and not serving.rates and not serving.concurrency and serving.slo_ms is None \
            and arrivals == "poisson":
        raise ConfigError("the server scenario needs `rates`, `concurrency`, `slo_ms` (a search) or a trace to "
                          "replay", source=source, field="serving")
    return serving


def check_accuracy(accuracy: AccuracyFields | None, workload_file: Path, *, source: str) -> AccuracyFields | None:
    """The labelled set must exist (a file) or be buildable (digits: scikit-learn installed)."""
    if accuracy is None:
        return None
    if accuracy.set == "digits":

        if importlib.util.find_spec("sklearn") is None:
            raise ConfigError("the digits set needs scikit-learn (pip install scikit-learn)", source=source,
                              field="accuracy.set")
        return accuracy
    path = Path(accuracy.set)
    if not path.is_absolute():
        path = workload_file.parent / path
    if not path.is_file():
        raise ConfigError(f"is neither `digits` nor a labelled request file ({path} does not exist)", source=source,
                          field="accuracy.set")
    return msgspec.structs.replace(accuracy, set=str(path.resolve()))
