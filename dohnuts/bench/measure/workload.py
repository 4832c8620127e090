"""Workload files: YAML → a validated `WorkloadSpec`, and the calls a workload kind generates.

    name: text-2b               # default: the file name
    kind: text                  # text | shared-prefix | image | image-cache | train-step | (plugins)
    targets: [dohnuts, transformers]   # or {name, label, options} entries, e.g.
                                       # {name: dohnuts, label: dohnuts-unshared, options: {share_prefix: false}}
    model: qwen3.5-2b           # preset name or checkpoint directory
    device: auto                # auto | cpu | cuda
    precision: auto             # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    requires_gpu: false         # true: skipped (with a message) on machines without a GPU
    warmup: 3                   # unmeasured calls per target (0..1000)
    repeat: 10                  # measured calls per target, at least ... (1..10000)
    min_duration_s: 0           # ... and at least this long (finite, 0..86400: one day) ...
    halfwidth: 0.05             # ... and as many as the observed spread needs for the median's 95 %
                                #     interval to be ±5 % (0: exactly `repeat`) ...
    max_repeat: 0               # ... but at most this many (0: 4 × repeat; at most 100000), and no
                                #     more than 20 s of measured calls past `repeat` (asv's max_time)
    seed: 0                     # 0..2³²−1
    hwspec: h200                # optional: hwspecs/<name>.yaml or a path (default: by device name)
    processes: 1                # one process per device, or a list ([1, 2]) to measure scaling: each
                                #   count above 1 is started by the `launcher` (torchrun), one process
                                #   per GPU (gloo processes on a CPU); counts over the machine's GPUs
                                #   are skipped with a message. Every record carries its rank.
    launcher: torchrun          # the launcher plugin that starts several processes
    shape: {...}                # the kind's own fields (each kind's `Shape`, a msgspec Struct)
    scenario: single            # single | stream | server | offline: how the calls are issued after the
                                #   single calls (dohnuts.bench.measure.serving; default: as always, single calls
                                #   and a pipelined stream)
    serving: {...}              # the scenario's settings: rates, concurrency (closed loops), burstiness,
                                #   slo_ms, percentile, search, arrivals, queue, minimums
                                #   (dohnuts/bench/measure/serving/config.py documents them)
    accuracy: {set: digits}     # optional: every target also scores a labelled request set (accuracy mode)
    agreement: {sample: 2}      # every dohnuts variant against the FP32 reference path (sample 0: off)
    on_gpu:                     # optional: what changes when the workload runs on a GPU, so one
      model: qwen3.5-2b         #   file measures a size that fits each device (the standard suite in
      shape: {questions: 32}    #   workloads/*.yaml: tiny on a CPU, 2b on a GPU); `shape` entries
                                #   replace the CPU ones key by key; any field but `kind` and `on_gpu`

Every size has an upper bound (above; each kind's `Shape` declares its own, e.g. questions ≤ 4096),
so a typo cannot ask for a run that never ends. What every record copies is bounded too: names and
labels (200 characters) and a target's `options` (4096 bytes as JSON: YAML aliases can make a few
hundred bytes stand for megabytes), and the options are checked against the target's `Options`. The longest sequence a workload's calls hold
(its kind's `sequence_tokens(shape, model_config)`: `seq_tokens`, plus the image tokens of the
largest image for the image kinds) must fit the model's context: the smaller of the config's
`max_position_embeddings` (preset or checkpoint config.json) and the runtime's `max_len`
(`dohnuts.api.load`, 8192) — checked here, before anything is measured, for both the CPU and
the `on_gpu` variant.

The YAML is read strictly (dohnuts.schema.read_yaml): a key written twice in one mapping is an
error naming the key and both lines (plain YAML would silently keep the last). The fields are
declared by `WorkloadFile` and the kind's `Shape` (msgspec Structs, dohnuts.schema.convert); a key
left empty takes its default. Every error names the file and the field (`ConfigError`), e.g.
`w.yaml: field 'shape.questions': must be <= 4096, got 100000000`; the CLI prints it on one line
and exits with status 2.

`check_workload_file` runs every check that needs neither a model nor torch (the file, its YAML,
each field's name, type and bounds, the kind, the shape, the targets' names, the serving settings);
`dohnuts-bench run` calls it before it imports torch, so a typo in a path or a key is reported in
about a second rather than after torch's import (18–30 s on a busy 2-core machine).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import msgspec.inspect
from msgspec import Meta

from dohnuts.bench.analysis.hwspec import find_hwspec
from dohnuts.bench.measure.serving.config import (
    SCENARIOS, AccuracyFields, AgreementFields, ServingFields, check_accuracy, check_serving,
)
from dohnuts.config import preset, preset_aliases, preset_names
from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema import Invalid, NonBlank, convert, dumps, one_line_error, read_yaml, short


@dataclass(frozen=True)
class TargetSpec:
    name: str  # registered target
    label: str  # how results are labelled (unique within a workload)
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    kind: str
    file: str
    file_hash: str
    targets: tuple[TargetSpec, ...]
    model: str
    device: str
    precision: str
    requires_gpu: bool
    warmup: int
    repeat: int
    min_duration_s: float
    halfwidth: float
    max_repeat: int
    seed: int
    hwspec: str | None
    shape: msgspec.Struct  # the kind's `Shape`, validated
    processes: tuple[int, ...] = (1,)  # process counts to measure (scaling), ascending
    launcher: str = "torchrun"
    scenario: str = "single"  # dohnuts.bench.measure.serving.config.SCENARIOS
    serving: ServingFields = ServingFields()
    accuracy: AccuracyFields | None = None
    agreement: AgreementFields = AgreementFields()

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "file": self.file, "file_hash": self.file_hash,
                "targets": [t.label for t in self.targets], "model": self.model, "device": self.device,
                "precision": self.precision, "warmup": self.warmup, "repeat": self.repeat,
                "min_duration_s": self.min_duration_s, "halfwidth": self.halfwidth, "max_repeat": self.max_repeat,
                "seed": self.seed, "shape": msgspec.to_builtins(self.shape), "processes": list(self.processes),
                "launcher": self.launcher, "scenario": self.scenario, "serving": msgspec.to_builtins(self.serving),
                "accuracy": msgspec.to_builtins(self.accuracy), "agreement": msgspec.to_builtins(self.agreement)}


MAX_PROCESSES = 1024
MAX_TARGETS = 64
# What is copied into every record is bounded: a workload's name and a target's label and options
# (a few hundred bytes of YAML could otherwise put megabytes into each of thousands of records).
MAX_NAME_CHARS = 200
MAX_OPTIONS_BYTES = 4096
Name = Annotated[str, Meta(max_length=MAX_NAME_CHARS)]
ProcessCount = Annotated[int, Meta(ge=1, le=MAX_PROCESSES)]


class TargetEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`{name, label, options}`: a registered target, how its results are labelled (default: its
    name; unique within the workload) and its options."""

    name: Name
    label: Annotated[NonBlank, Meta(max_length=MAX_NAME_CHARS)] | None = None
    options: dict[str, Any] = {}

    def __post_init__(self) -> None:
        size = len(dumps(self.options, default=str))  # as every record of the target carries them
        if size > MAX_OPTIONS_BYTES:
            raise Invalid(f"are {size} bytes as JSON, over the {MAX_OPTIONS_BYTES} bytes a record carries",
                          field="options")


class WorkloadFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The fields of a workload file (the module docstring); `shape` is checked against its kind's
    `Shape` and `targets` against the registered targets by `load_workload`."""

    kind: Name
    name: Name = ""
    targets: Annotated[list[str | TargetEntry], Meta(min_length=1, max_length=MAX_TARGETS)] = \
        msgspec.field(default_factory=lambda: ["dohnuts"])
    model: str = "tiny"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    requires_gpu: bool = False
    warmup: Annotated[int, Meta(ge=0, le=1000)] = 2
    repeat: Annotated[int, Meta(ge=1, le=10_000)] = 5
    min_duration_s: Annotated[float, Meta(ge=0.0, le=86_400.0)] = 0.0  # one day
    halfwidth: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.05
    max_repeat: Annotated[int, Meta(ge=0, le=100_000)] = 0
    seed: Annotated[int, Meta(ge=0, le=2**32 - 1)] = 0  # numpy's and torch's generators take it as it is
    hwspec: str = ""
    shape: dict[str, Any] = {}
    on_gpu: dict[str, Any] = {}
    processes: Annotated[ProcessCount | Annotated[list[ProcessCount], Meta(min_length=1)], Meta(
        description=f"a process count in 1..{MAX_PROCESSES}, or a list of at least one")] = 1
    launcher: NonBlank = "torchrun"  # the launcher plugin that starts several processes
    scenario: Literal[SCENARIOS] = "single"  # type: ignore[valid-type]
    serving: ServingFields = ServingFields()
    accuracy: AccuracyFields | None = None
    agreement: AgreementFields = AgreementFields()

    def __post_init__(self) -> None:
        counts = self.processes if isinstance(self.processes, list) else [self.processes]
        for i, v in enumerate(counts):
            if v in counts[:i]:
                raise Invalid(f"lists {v} twice", field="processes")

    def process_counts(self) -> tuple[int, ...]:
        """`processes`: a count or a list of distinct counts, ascending."""
        return tuple(sorted(self.processes if isinstance(self.processes, list) else [self.processes]))


def standard_files() -> list[Path]:
    """The standard suite (workloads/*.yaml, embedded as package data): text, shared prefix, image,
    cold/warm image cache and train step, each sized for a CPU and (its `on_gpu` fields) a GPU."""
    root = resources.files("dohnuts.bench") / "standard"
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml"))


def shape_fields(kind) -> list[str]:
    """A kind's `shape` fields in words, as `dohnuts-bench list` shows them:
    `questions 1..4096 = 8 (questions per request)`; a field without a default is required."""
    out = []
    for f in msgspec.inspect.type_info(kind.Shape).fields:
        t, about = f.type, None
        if isinstance(t, msgspec.inspect.Metadata):
            t, about = t.type, (t.extra_json_schema or {}).get("description")
        lo = next((getattr(t, k) for k in ("ge", "gt") if getattr(t, k, None) is not None), None)
        hi = next((getattr(t, k) for k in ("le", "lt") if getattr(t, k, None) is not None), None)
        bounds = f" {lo}..{'' if hi is None else hi}" if lo is not None or hi is not None else ""
        if isinstance(t, msgspec.inspect.LiteralType):
            bounds = " " + "|".join(map(str, t.values))
        default = f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default
        given = " (required)" if f.required else f" = {default}"
        out.append(f"{f.encode_name}{bounds}{given}" + (f": {about}" if about else ""))
    return out


def _given(data: dict) -> dict:
    """The fields written with a value: a key left empty (`hwspec:`) takes its default."""
    return {k: v for k, v in data.items() if v is not None}


def _targets(entries: list, known: dict, kind: str, source: str) -> tuple[TargetSpec, ...]:
    """The workload's targets checked against the registered ones (names, kinds, unique labels)."""
    out, labels = [], set()
    for i, t in enumerate(entries):
        where = f"targets[{i}]"
        if isinstance(t, str):
            t = TargetEntry(t)
        if t.name not in known:
            raise ConfigError(f"unknown target {short(t.name)} (known: {', '.join(sorted(known))})",
                              source=source, field=f"{where}.name")
        label = t.label if t.label is not None else t.name
        if label in labels:
            raise ConfigError(f"label {short(label)} is used twice", source=source, field=f"{where}.label")
        labels.add(label)
        kinds = known[t.name].kinds
        if kinds is not None and kind not in kinds:
            raise ConfigError(f"target {t.name!r} cannot run {kind!r} workloads (only {', '.join(kinds)})",
                              source=source, field=f"{where}.name")
        out.append(TargetSpec(t.name, label, dict(t.options)))
    return tuple(out)


def load_workload(path: str | Path, kinds: dict, targets: dict, *, gpu: bool | None = None) -> WorkloadSpec:
    """Read and validate one workload file against the registered kinds and targets.

    `gpu`: build the variant for a GPU machine (the file's `on_gpu` fields applied); default: whether
    this machine has one. Both variants are validated either way, so a file that is wrong on the
    other kind of machine is refused here too."""
    if gpu is None:
        # imports torch: workload files are checked before torch (check_workload_file), the model after
        import torch

        gpu = torch.cuda.is_available()
    try:
        return _load_workload(Path(path), kinds, targets, gpu)
    except DohnutsError as exc:
        raise one_line_error(exc) from None


def check_workload_file(path: str | Path, kinds: dict, targets: dict) -> None:
    """The checks of `load_workload` that need neither a model nor torch, on both variants (the
    module docstring): a missing file or a misspelt key is one ConfigError naming the file and the
    field, before anything heavy is imported. `load_workload` then checks the rest."""
    try:
        _load_workload(Path(path), kinds, targets, gpu=False, models=False)
    except DohnutsError as exc:
        raise one_line_error(exc) from None


def _load_workload(path: Path, kinds: dict, targets: dict, gpu: bool, *, models: bool = True) -> WorkloadSpec:
    source = str(path)
    raw_bytes, data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("must be a YAML mapping of workload fields", source=source)
    on_gpu = data.get("on_gpu") or {}
    if not isinstance(on_gpu, dict):
        raise ConfigError("must be a mapping of workload fields", source=source, field="on_gpu")
    for key in ("kind", "on_gpu"):
        if key in on_gpu:
            raise ConfigError("cannot change on a GPU", source=source, field=f"on_gpu.{key}")
    shape, gpu_shape = data.get("shape") or {}, on_gpu.get("shape") or {}
    gpu_data = {**data, **on_gpu}
    if isinstance(shape, dict) and isinstance(gpu_shape, dict):  # else the field check says what is wrong
        gpu_data["shape"] = {**shape, **gpu_shape}
    cpu_spec = _spec(path, source, raw_bytes, data, kinds, targets, models=models)
    gpu_spec = (_spec(path, source, raw_bytes, gpu_data, kinds, targets, prefix="on_gpu.", models=models)
                if on_gpu else cpu_spec)
    return gpu_spec if gpu else cpu_spec


def _spec(path: Path, source: str, raw_bytes: bytes, data: dict, kinds: dict, targets: dict, *,
          prefix: str = "", models: bool = True) -> WorkloadSpec:
    try:
        return _build_spec(path, source, raw_bytes, data, kinds, targets, models)
    except ConfigError as exc:
        if not prefix or exc.field is None or exc.field.startswith(prefix):
            raise
        raise ConfigError(exc.message, source=source, field=f"{prefix}{exc.field}") from None


def _build_spec(path: Path, source: str, raw_bytes: bytes, data: dict, kinds: dict, targets: dict,
                models: bool) -> WorkloadSpec:
    """One variant's spec; `models=False` leaves out the checks that load the model's config (and
    torch with it): the context and `serving.vary` against the model."""
    common = convert(_given(data), WorkloadFile, source=source)
    if common.kind not in kinds:
        raise ConfigError(f"unknown workload kind {short(common.kind)} (known: {', '.join(sorted(kinds))})",
                          source=source, field="kind")
    kind = kinds[common.kind]  # a RegisteredKind (dohnuts.bench.plugins): its members checked and resolved
    shape = convert(_given(common.shape), kind.Shape, source=source, prefix="shape")
    if kind.validate is not None:  # a kind's own checks beyond its Shape
        kind.validate(shape, source=source)
    if models:
        cfg = model_config(common.model, source)
        check_context(kind, shape, cfg, common.model, source)
        check_vary(kind, shape, common.serving.vary, cfg, common.model, source)
    if common.hwspec:
        _check_hwspec(common.hwspec, source)
    processes = common.process_counts()
    if max(processes) > 1 and not kind.distributed:
        raise ConfigError(f"lists {max(processes)} processes, but {common.kind!r} workloads run in one process only",
                          source=source, field="processes")
    serving = check_serving(common.scenario, common.serving, path, source=source, processes=processes,
                            kind_is_train=common.kind == "train-step")
    accuracy = check_accuracy(common.accuracy, path, source=source)
    return WorkloadSpec(
        name=common.name or path.stem, kind=common.kind, file=source,
        file_hash=hashlib.sha256(raw_bytes).hexdigest()[:16], targets=_targets(common.targets, targets, common.kind,
                                                                                source),
        model=common.model, device=common.device, precision=common.precision, requires_gpu=common.requires_gpu,
        warmup=common.warmup, repeat=common.repeat, min_duration_s=common.min_duration_s, halfwidth=common.halfwidth,
        max_repeat=common.max_repeat, seed=common.seed, hwspec=common.hwspec or None, shape=shape,
        processes=processes, launcher=common.launcher, scenario=common.scenario, serving=serving, accuracy=accuracy,
        agreement=common.agreement,
    )


def check_unique_names(specs: list[WorkloadSpec]) -> None:
    """The workloads of one run name themselves apart: a name is what identifies a workload in the
    records, the reports and the store, so two files (or one file given twice) of one name — or a
    name that reads as another's at N processes (`text ×2`) — would be pooled into one row without a
    word. Refused in one line naming both files, before anything is measured."""
    seen: dict[str, WorkloadSpec] = {}
    for spec in specs:
        labels = [spec.name] + [f"{spec.name} ×{n}" for n in spec.processes if n > 1]
        for label in labels:
            other = seen.get(label)
            if other is not None:
                same = " (the same file given twice)" if other.file == spec.file else ""
                raise ConfigError(f"names its workload {short(label, 120, str)}, as {other.file} does{same}: the "
                                  "workloads of one run need names of their own (set `name:` in one of them)",
                                  source=spec.file, field="name")
        for label in labels:
            seen[label] = spec


def model_config(model: str, source: str):
    """The ModelConfig of a workload's `model` (a preset, or a checkpoint directory's config.json);
    a ConfigError naming the workload file and its `model` field otherwise."""
    # imports torch: workload files are checked before torch (check_workload_file), the model after
    from dohnuts.model.build import resolve_source

    if not model.strip() or "\x00" in model:
        raise ConfigError("must name a preset or a checkpoint directory", source=source, field="model")
    if "/" not in model and model not in (*preset_names(), *preset_aliases()) and not os.path.lexists(model):
        return preset(model, source=source, field_name="model")  # unknown: ConfigError naming file and field
    try:
        return resolve_source(model)[0]  # the rule of `dohnuts predict --model` (dohnuts.model.build)
    except DohnutsError as exc:
        raise ConfigError(f"is not a usable checkpoint ({exc})", source=source, field="model") from None


def runtime_max_len() -> int:
    """The longest sequence the runtime accepts: `dohnuts.api.load`'s `max_len` (8192), which both
    built-in targets run with."""
    # imports torch: workload files are checked before torch (check_workload_file), the model after
    import dohnuts.api

    default = inspect.signature(dohnuts.api.load).parameters["max_len"].default
    return default if isinstance(default, int) and default > 0 else 8192


def model_context(cfg) -> int:
    """The model's usable context: max_position_embeddings, capped by the runtime's max_len."""
    return min(int(cfg.text.max_position_embeddings), runtime_max_len())


def check_context(kind, shape, cfg, model: str, source: str) -> None:
    """Refuse a workload whose longest sequence (the kind's `sequence_tokens`) is over the model's
    context. Kinds without `sequence_tokens` (plugins) are not checked here."""
    measure = kind.sequence_tokens
    if measure is None:
        return
    tokens = measure(shape, cfg, source=source)
    context = model_context(cfg)
    if tokens > context:
        seq = getattr(shape, "seq_tokens", None)
        what = f"is {seq}" if tokens == seq else (
            f"is {seq}, and with the largest image's {tokens - seq} tokens (markers included) a sequence holds "
            f"{tokens}" if isinstance(seq, int)
            else f"makes sequences of {tokens} tokens")
        raise ConfigError(
            f"{what}: over the {context}-token context of model {model!r} (the smaller of its "
            f"max_position_embeddings {cfg.text.max_position_embeddings} and the runtime's max_len "
            f"{runtime_max_len()})", source=source, field="shape.seq_tokens")


VARIED_FIELDS = {"seq_tokens": "serving.vary.seq_tokens", "questions": "serving.vary.questions",
                 "requests": "serving.vary.distinct", "resolution": "serving.vary.images.resolutions",
                 "distinct_images": "serving.vary.images"}


def check_vary(kind, shape, vary, cfg, model: str, source: str) -> None:
    """`serving.vary` against the kind: it must build varied sets (`varied_calls`), and every corner
    of the ranges — the shortest and longest sequences with the fewest and most questions, the set's
    images — must be a valid shape of the kind (its bounds and checks, with `requests` the set's
    size) whose longest sequence fits the model's context. An error names the `serving.vary` field."""
    if vary is None:
        return
    if kind.varied_calls is None:
        raise ConfigError(f"{kind.name!r} workloads cannot vary their requests (the kind has no `varied_calls`)",
                          source=source, field="serving.vary")
    fields = type(shape).__struct_fields__
    if vary.images is not None and "resolution" not in fields:
        raise ConfigError(f"{kind.name!r} requests carry no image: vary images in an image kind", source=source,
                          field="serving.vary.images")
    for name in ("seq_tokens", "questions"):
        if name not in fields:
            raise ConfigError(f"the {kind.name!r} shape has no `{name}` to vary", source=source,
                              field=f"serving.vary.{name}" if getattr(vary, name) else "serving.vary")
    base = msgspec.to_builtins(shape)
    seqs = vary.seq_tokens or (shape.seq_tokens,) * 2
    questions = vary.questions or (shape.questions,) * 2
    images = {}
    if "resolution" in fields:
        fraction = vary.images.fraction if vary.images is not None else 1.0
        if vary.images is not None and vary.images.resolutions:
            images["resolution"] = [list(r) for r in vary.images.resolutions]
        images["distinct_images"] = max(1, round(fraction * vary.distinct))  # the set's images: its pixel budget
    for seq in seqs:
        for q in questions:
            try:
                corner = convert(base | images | {"seq_tokens": seq, "questions": q, "requests": vary.distinct},
                                 kind.Shape, source=source, prefix="shape")
                if kind.validate is not None:
                    kind.validate(corner, source=source)
                check_context(kind, corner, cfg, model, source)
            except ConfigError as exc:
                field = (exc.field or "").removeprefix("shape.").split("[")[0]
                raise ConfigError(f"at {seq} tokens and {q} questions a request, {field or 'the shape'} {exc.message}",
                                  source=source, field=VARIED_FIELDS.get(field, "serving.vary")) from None


def _check_hwspec(name: str, source: str) -> None:
    """The workload's `hwspec:` must load; its error names this workload file and field too."""
    try:
        find_hwspec(name)
    except ConfigError as exc:
        raise ConfigError(f"cannot be used: {exc}", source=source, field="hwspec") from None
