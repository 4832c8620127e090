"""The contracts between dohnuts-bench and its plugins: what a workload kind, a target (and its
factory), a launcher, a telemetry sampler, an analyzer and a reporter are, and what each is handed.

Each contract is a `typing.Protocol` holding the *required* members: a plugin object need not
inherit from anything, it only has them. The *optional* members of a contract are the fields of a
frozen dataclass beside it (`WorkloadKindCapabilities`, ...), whose defaults say what an absent
member means. `dohnuts.bench.plugins.collect` checks every registered object against its contract
when the plugin manager collects it — a missing required member, or an optional one of the wrong
type, is a `PluginError` naming the object and the member — and reads each optional member once,
through `capabilities()`, the one place that looks for them.

docs/plugins.md documents every member of every contract (tests/test_docs.py checks it).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import msgspec

from dohnuts.errors import DohnutsError
from dohnuts.schema import short

if TYPE_CHECKING:
    import torch

    from dohnuts.bench.analysis.records import CallRecord
    from dohnuts.bench.calls import CallResult, PredictCall, TrainCall
    from dohnuts.bench.measure.workload import WorkloadSpec
    from dohnuts.bench.sections import Section
    from dohnuts.bench.sink import RecordSink
    from dohnuts.runtime.process_group import World
    from dohnuts.runtime.timing import StageTimer
    from dohnuts.runtime.work import WorkCounts


class PluginError(DohnutsError):
    """A registered plugin object that does not keep its contract (a required member missing, an
    optional one of the wrong type)."""


# -- what plugins are handed ---------------------------------------------------------------------


@dataclass
class RunContext:
    """One `dohnuts-bench run`, as the prepare hook and the launchers see it."""

    run_id: str
    run_dir: Path
    device: torch.device
    hwspec: object | None  # dohnuts.bench.analysis.HwSpec
    console: object  # rich.console.Console
    measured: dict = field(default_factory=dict)  # measured ceilings etc., written to run.json
    notes: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # {"workload", "file", "target", "error"}: written to run.json
    profile: bool = False  # `run --profile`: a torch.profiler trace a workload and target (dohnuts.bench.measure.trace)
    traces: list = field(default_factory=list)  # {"workload", "target", "path", "calls"[, "ranks"]}: to run.json
    # `run --nvtx`: each stage of a measured (steady) call an NVTX range in the domain `dohnuts`
    nvtx: bool = False
    # A rank of a multi-process `--profile` run: the launch's trace folder (RUN/traces/<workload>-p<N>)
    trace_dir: Path | None = None
    # Tests only: called as before_call(world, i) before measured call i (a fault injected into a rank).
    before_call: Callable[[World, int], None] | None = None


@dataclass(frozen=True)
class WorkloadContext:
    """What a workload kind needs to build its calls."""

    spec: WorkloadSpec
    tokenizer: object
    model_cfg: object
    workdir: Path  # a folder for generated inputs (e.g. images)
    rng: random.Random


class StreamRow(TypedDict):
    """One request of a target's pipelined stream (`run_stream`); times are host perf_counter seconds."""

    decisions: int
    work: WorkCounts | None  # None: the request failed (no record is written for it)
    submitted: float  # entered the pipeline
    started: float | None  # its device work was issued (None: unknown, taken as `done`)
    done: float  # its result was ready


@dataclass(frozen=True)
class NoOptions:
    """The options of a target that takes none (the default `Options`)."""


# -- optional members: declared with their defaults, read in one place ---------------------------


def _optional_member(default: Any, must_be: str, check: Callable[[Any], bool]):
    """A dataclass field for an optional contract member: its default (what absence means), what a
    value must be (said in the error) and the check of a value found on a plugin object."""
    return field(default=default, metadata={"must_be": must_be, "check": check})


def _never(spec) -> bool:
    return False


def _available() -> str | None:
    return None


def _callable_or_none(v) -> bool:
    return v is None or callable(v)


def _is_dataclass_type(v) -> bool:
    return isinstance(v, type) and dataclasses.is_dataclass(v)


def _kinds(v) -> bool:
    return v is None or (isinstance(v, tuple) and all(isinstance(k, str) for k in v))


def capabilities(obj: object, declared: type, what: str):
    """The optional members of `obj` as the dataclass `declared` (e.g. `TargetCapabilities`): each
    field read from `obj` when it has it, else the field's default; a value of the wrong type is a
    PluginError naming `what` (e.g. "target 'dohnuts' (dohnuts_bench_plugins.targets...)")."""
    values = {}
    for f in dataclasses.fields(declared):
        value = getattr(obj, f.name, f.default)  # the one read of an optional member
        if not f.metadata["check"](value):
            raise PluginError(f"`{f.name}` must be {f.metadata['must_be']}, got {short(value, 60)} "
                              f"(dohnuts.bench.contracts.{declared.__name__})", source=what)
        values[f.name] = value
    return declared(**values)


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The required members of a contract (its annotated attributes and methods, in order)."""
    names = list(protocol.__dict__.get("__annotations__", {}))
    names += [n for n, v in protocol.__dict__.items()
              if callable(v) and (not n.startswith("_") or n == "__call__") and n not in names]
    return tuple(names)


def missing_members(obj: object, protocol: type) -> list[str]:
    """The required members of `protocol` that `obj` lacks (a method must be callable)."""
    methods = {n for n, v in protocol.__dict__.items() if callable(v)}
    return [n for n in protocol_members(protocol)
            if not hasattr(obj, n) or (n in methods and not callable(getattr(obj, n)))]


# -- the contracts ---------------------------------------------------------------------------------


class NoShape(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The shape of a kind that declares none: no fields."""


def _struct_class(v) -> bool:
    return isinstance(v, type) and issubclass(v, msgspec.Struct)


class WorkloadKind(Protocol):
    """A kind of workload (`kind:` in a workload file): its `shape:` fields and the calls it builds.
    Registered by `dohnuts_bench_register_workload_kinds` as {kind name: WorkloadKind}."""

    def calls(self, ctx: WorkloadContext) -> list[PredictCall | TrainCall]:
        """The calls every target of the workload is measured on (the same for all)."""


@dataclass(frozen=True)
class WorkloadKindCapabilities:
    """The optional members of a `WorkloadKind`, and what their absence means."""

    # The `shape:` fields as a frozen msgspec Struct class (types, `msgspec.Meta` bounds, defaults,
    # checks across fields in `__post_init__`), converted by the harness (dohnuts.schema). Absent:
    # the kind takes no shape fields.
    Shape: type = _optional_member(NoShape, "a msgspec Struct class", _struct_class)
    # (shape, source) -> None: checks beyond the Shape's own (raise ConfigError(..., source=source,
    # field="shape.<field>")). Absent: none.
    validate: Callable[..., None] | None = _optional_member(None, "a method or None", _callable_or_none)
    # (shape, model_cfg, *, source) -> int: the longest sequence its calls hold, checked against the
    # model's context when the file is validated. Absent: not checked.
    sequence_tokens: Callable[..., int] | None = _optional_member(None, "a method or None", _callable_or_none)
    # (ctx, vary) -> list of calls: the varied served set a workload's `serving.vary` asks for
    # (dohnuts.bench.measure.serving.variety.draw_sizes draws the sizes; `ctx.rng` the text); its Shape has
    # `seq_tokens` and `questions` (and `resolution` for images). Absent: None, `serving.vary` is refused.
    varied_calls: Callable[..., list] | None = _optional_member(None, "a method or None", _callable_or_none)
    # (spec) -> bool: warm every distinct call once (e.g. a warm cache). Absent: never.
    warmup_every_call: Callable[[WorkloadSpec], bool] = _optional_member(_never, "a method", callable)
    # Several processes share each call (the train step's update). Absent: False, the ranks shard the calls.
    collective: bool = _optional_member(False, "a bool", lambda v: isinstance(v, bool))
    # False: the kind runs in one process only (`processes` above 1 is refused). Absent: True.
    distributed: bool = _optional_member(True, "a bool", lambda v: isinstance(v, bool))


class Target(Protocol):
    """An implementation under test, built per workload by its `TargetFactory`. It gives every call
    the treatment it would get in production (no results cached between calls)."""

    def run_call(self, call: PredictCall | TrainCall, timer: StageTimer) -> CallResult:
        """Run one call, each part bracketed by `timer.stage(name)` (canonical, disjoint stages)."""

    def close(self) -> None:
        """Release the model and its memory (the next target is built in the same process)."""


@dataclass(frozen=True)
class TargetCapabilities:
    """The optional members of a `Target`, read once after it is built."""

    # A measurement-only variant of the product (dohnuts.runtime.policy), written to every record.
    # Absent: None, the product.
    variant: str | None = _optional_member(None, "a string or None", lambda v: v is None or isinstance(v, str))
    # {"rank", "targets", "merged"} of the adapters it runs, written to every record. Absent: None.
    lora_info: dict | None = _optional_member(None, "a dict or None", lambda v: v is None or isinstance(v, dict))
    # (calls, timer_for) -> list[StreamRow] | None: the calls as one pipelined stream, as users run
    # them; `timer_for(i)` times request i's stages; None: this workload cannot be streamed.
    # Absent: no `phase: stream` records.
    run_stream: Callable[..., list[StreamRow] | None] | None = _optional_member(
        None, "a method or None", _callable_or_none)
    # (calls, arrivals, *, capacity, timer_for, deadline) -> [ServedRequest]: serve requests arriving
    # at `arrivals` (seconds from now, or a closed loop of clients: take them from
    # dohnuts.bench.measure.serving.server.admission) through a bounded queue of `capacity`, as the target serves
    # users (dohnuts.bench.measure.serving.pipelined). Absent: the harness serves them one at a time through
    # `run_call` (dohnuts.bench.measure.serving.server.serve_serial).
    serve: Callable[..., list] | None = _optional_member(None, "a method or None", _callable_or_none)
    # () -> {"captures", "capture_ms", "replays", "eager": {reason: passes}} | None: the target's CUDA
    # graph counts so far (None: it captures none, e.g. eager or on a CPU); a serving point or stream
    # states the captures that happened while it was measured. Absent: no graphs ("—" in the report).
    graph_stats: Callable[[], dict | None] | None = _optional_member(None, "a method or None", _callable_or_none)


class TargetFactory(Protocol):
    """Builds a `Target` for one workload (usually the target's class). Registered by
    `dohnuts_bench_register_targets` as {target name: TargetFactory}."""

    def __call__(self, spec: WorkloadSpec, device: torch.device, dtype: torch.dtype, options: Any) -> Target:
        """`options`: an instance of the factory's `Options`, validated from the workload's `options:`."""


@dataclass(frozen=True)
class TargetFactoryCapabilities:
    """The optional members of a `TargetFactory`, read when it registers."""

    # A dataclass of the options the target takes (a workload target entry's `options:`), with types
    # and defaults: unknown keys and wrong types are refused, naming the file and field, before
    # anything is measured. Absent: NoOptions, the target takes none.
    Options: type = _optional_member(NoOptions, "a dataclass", _is_dataclass_type)
    # The workload kinds it can run; a workload pairing it with another kind is refused at
    # validation. Absent: None, any kind.
    kinds: tuple[str, ...] | None = _optional_member(None, "a tuple of kind names or None", _kinds)
    # () -> str | None: why it cannot run on this machine (a missing library): `run` skips it and says
    # why. Absent: it can always run.
    unavailable: Callable[[], str | None] = _optional_member(_available, "a function", callable)
    # (options) -> options: the options of this factory's FP32 reference path for a target built with
    # `options` (built at FP32 and run inside dohnuts.ops._dispatch.reference()); the harness scores the
    # workload's first requests on both and records the probability gap. Absent: None, no check.
    reference_options: Callable[[Any], Any] | None = _optional_member(None, "a function or None", _callable_or_none)


class Launcher(Protocol):
    """Starts several processes for a workload whose `processes` lists a count above 1. Registered
    by `dohnuts_bench_register_launchers` as {launcher name: Launcher}. It has no optional members."""

    def unavailable(self, processes: int, device: torch.device) -> str | None:
        """Why `processes` processes cannot run here (the count is then skipped), or None."""

    def launch(self, run: RunContext, spec: WorkloadSpec, processes: int, out: RecordSink, *, gpu: bool,
               telemetry_interval: float) -> int:
        """Start the processes, write their records to `out`, return how many it wrote; a failure
        goes into `run.failures` (the run goes on)."""


class TelemetrySampler(Protocol):
    """A source of readings taken in the background while a run measures (base class with the
    defaults: dohnuts.bench.measure.telemetry.Sampler). Registered by `dohnuts_bench_register_telemetry`."""

    name: str  # the key of its readings in each telemetry row

    def sample(self) -> dict:
        """One reading (a flat dict); it runs on the telemetry thread, and its errors are recorded."""


@dataclass(frozen=True)
class TelemetrySamplerCapabilities:
    """The optional members of a `TelemetrySampler`."""

    # Why it cannot sample here (library or device absent): said once, then it is left out.
    # Absent: None, it samples.
    unavailable: str | None = _optional_member(None, "a string or None", lambda v: v is None or isinstance(v, str))
    # () -> float: the device's cumulative energy counter in joules, read right before and right
    # after each call for the record's `energy` (raises, saying why, when it cannot be read).
    # Absent: None, the sampler has no energy counter.
    energy_counter: Callable[[], float] | None = _optional_member(None, "a method or None", _callable_or_none)
    # () -> dict: facts of the device for provenance (driver, power limit, maximum clocks), read once.
    # Absent: None, nothing to add.
    device_facts: Callable[[], dict] | None = _optional_member(None, "a method or None", _callable_or_none)


class Analyzer(Protocol):
    """A plugin implementing the analyze hook (it may implement any other hook too, e.g. the
    measured ceilings in `dohnuts_bench_prepare_run`)."""

    def dohnuts_bench_analyze(self, records: list[CallRecord], hwspec, measured: dict,
                              run_dir: Path) -> list[Section] | None:
        """Sections computed from the records alone (any run can be re-analysed later)."""


class Reporter(Protocol):
    """A plugin implementing the report hook."""

    def dohnuts_bench_report(self, console, records: list[CallRecord], sections: list[Section], run_dir: Path) -> None:
        """Print to `console` and write files into `run_dir`."""


# Every contract and the dataclass of its optional members (None: it has none).
CONTRACTS: dict[type, type | None] = {
    WorkloadKind: WorkloadKindCapabilities,
    TargetFactory: TargetFactoryCapabilities,
    Target: TargetCapabilities,
    Launcher: None,
    TelemetrySampler: TelemetrySamplerCapabilities,
    Analyzer: None,
    Reporter: None,
}
