"""Workload files: YAML → a validated `WorkloadSpec`, and the calls a workload kind generates.

    name: text-2b               # default: the file name
    kind: text                  # text | shared-prefix | image | image-cache | train-step | (plugins)
    targets: [dohnuts, transformers]   # or {name, label, options} entries, e.g.
                                       # {name: dohnuts, label: dohnuts-unshared, options: {share_prefix: false}}
    model: qwen3.5-2b           # preset name or checkpoint directory
    device: auto                # auto | cpu | cuda
    precision: auto             # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    requires_gpu: false         # true: skipped (with a message) on machines without a GPU
    warmup: 3                   # unmeasured calls per target
    repeat: 10                  # measured calls per target, at least ...
    min_duration_s: 0           # ... and at least this long ...
    halfwidth: 0.05             # ... and as many as the observed spread needs for the median's 95 %
                                #     interval to be ±5 % (0: exactly `repeat`) ...
    max_repeat: 0               # ... but at most this many (0: 4 × repeat)
    seed: 0
    hwspec: h200                # optional: hwspecs/<name>.yaml or a path (default: by device name)
    shape: {...}                # the kind's own fields (see each kind's `fields`)
    on_gpu:                     # optional: what changes when the workload runs on a GPU, so one
      model: qwen3.5-2b         #   file measures a size that fits each device (the standard suite in
      shape: {questions: 32}    #   workloads/*.yaml: tiny on a CPU, 2b on a GPU); `shape` entries
                                #   replace the CPU ones key by key; any field but `kind` and `on_gpu`

Every error names the file and the field (`ConfigError`); the CLI prints it on one line and
exits with status 2.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dohnuts.errors import ConfigError


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
    shape: dict[str, Any]

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "file": self.file, "file_hash": self.file_hash,
                "targets": [t.label for t in self.targets], "model": self.model, "device": self.device,
                "precision": self.precision, "warmup": self.warmup, "repeat": self.repeat,
                "min_duration_s": self.min_duration_s, "halfwidth": self.halfwidth, "max_repeat": self.max_repeat,
                "seed": self.seed, "shape": self.shape}


@dataclass(frozen=True)
class Field:
    """One YAML field of a workload kind's `shape`."""

    type: type
    default: Any = None  # None = required
    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    help: str = ""


def check_field(value: Any, spec: Field, *, source: str, name: str) -> Any:
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if spec.type is list:
        if not isinstance(value, list):
            raise ConfigError(f"must be a list, got {value!r}", source=source, field=name)
        return value
    if not isinstance(value, spec.type) or (spec.type is not bool and isinstance(value, bool)):
        raise ConfigError(f"must be {spec.type.__name__}, got {value!r}", source=source, field=name)
    if spec.min is not None and value < spec.min:
        raise ConfigError(f"must be >= {spec.min}, got {value!r}", source=source, field=name)
    if spec.max is not None and value > spec.max:
        raise ConfigError(f"must be <= {spec.max}, got {value!r}", source=source, field=name)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"must be one of {list(spec.choices)}, got {value!r}", source=source, field=name)
    return value


def check_fields(data: dict, fields: dict[str, Field], *, source: str, prefix: str = "") -> dict:
    """Validate `data` against `fields` (unknown keys are errors); fill defaults."""
    if not isinstance(data, dict):
        raise ConfigError("must be a mapping", source=source, field=prefix.rstrip(".") or None)
    for key in data:
        if key not in fields:
            raise ConfigError(f"unknown field (known: {', '.join(fields)})", source=source, field=f"{prefix}{key}")
    out = {}
    for key, spec in fields.items():
        if key not in data or data[key] is None:
            if spec.default is None:
                raise ConfigError("is missing", source=source, field=f"{prefix}{key}")
            out[key] = spec.default
        else:
            out[key] = check_field(data[key], spec, source=source, name=f"{prefix}{key}")
    return out


COMMON = {
    "name": Field(str, ""),
    "kind": Field(str),
    "targets": Field(list, ["dohnuts"]),
    "model": Field(str, "tiny"),
    "device": Field(str, "auto", choices=("auto", "cpu", "cuda")),
    "precision": Field(str, "auto", choices=("auto", "bf16", "fp32")),
    "requires_gpu": Field(bool, False),
    "warmup": Field(int, 2, min=0),
    "repeat": Field(int, 5, min=1),
    "min_duration_s": Field(float, 0.0, min=0.0),
    "halfwidth": Field(float, 0.05, min=0.0, max=1.0),
    "max_repeat": Field(int, 0, min=0),
    "seed": Field(int, 0),
    "hwspec": Field(str, ""),
    "shape": Field(dict, {}),
    "on_gpu": Field(dict, {}),
}


def _targets(raw: list, known: dict, kind: str, source: str) -> tuple[TargetSpec, ...]:
    out, labels = [], set()
    for i, t in enumerate(raw):
        where = f"targets[{i}]"
        if isinstance(t, str):
            t = {"name": t}
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ConfigError("must be a target name or {name, label, options}", source=source, field=where)
        extra = set(t) - {"name", "label", "options"}
        if extra:
            raise ConfigError(f"unknown key {sorted(extra)[0]!r}", source=source, field=where)
        if t["name"] not in known:
            raise ConfigError(f"unknown target {t['name']!r} (known: {', '.join(sorted(known))})", source=source,
                              field=f"{where}.name")
        label = t.get("label", t["name"])
        if label in labels:
            raise ConfigError(f"label {label!r} is used twice", source=source, field=f"{where}.label")
        labels.add(label)
        kinds = getattr(known[t["name"]], "kinds", None)
        if kinds is not None and kind not in kinds:
            raise ConfigError(f"target {t['name']!r} cannot run {kind!r} workloads (only {', '.join(kinds)})",
                              source=source, field=f"{where}.name")
        opts = t.get("options", {})
        if not isinstance(opts, dict):
            raise ConfigError("must be a mapping", source=source, field=f"{where}.options")
        out.append(TargetSpec(t["name"], label, dict(opts)))
    if not out:
        raise ConfigError("names no target", source=source, field="targets")
    return tuple(out)


def load_workload(path: str | Path, kinds: dict, targets: dict, *, gpu: bool | None = None) -> WorkloadSpec:
    """Read and validate one workload file against the registered kinds and targets.

    `gpu`: build the variant for a GPU machine (the file's `on_gpu` fields applied); default: whether
    this machine has one. Both variants are validated either way, so a file that is wrong on the
    other kind of machine is refused here too."""
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise ConfigError("does not exist", source=source)
    raw_bytes = path.read_bytes()
    try:
        data = yaml.safe_load(raw_bytes)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"is not valid YAML{where} ({getattr(exc, 'problem', exc)})", source=source) from None
    if not isinstance(data, dict):
        raise ConfigError("must be a YAML mapping of workload fields", source=source)
    on_gpu = data.get("on_gpu") or {}
    if not isinstance(on_gpu, dict):
        raise ConfigError("must be a mapping of workload fields", source=source, field="on_gpu")
    for key in ("kind", "on_gpu"):
        if key in on_gpu:
            raise ConfigError("cannot change on a GPU", source=source, field=f"on_gpu.{key}")
    gpu_data = {**data, **on_gpu, "shape": {**(data.get("shape") or {}), **(on_gpu.get("shape") or {})}}
    cpu_spec = _spec(path, source, raw_bytes, data, kinds, targets)
    gpu_spec = _spec(path, source, raw_bytes, gpu_data, kinds, targets, prefix="on_gpu.") if on_gpu else cpu_spec
    return gpu_spec if gpu else cpu_spec


def _spec(path: Path, source: str, raw_bytes: bytes, data: dict, kinds: dict, targets: dict, *,
          prefix: str = "") -> WorkloadSpec:
    try:
        return _build_spec(path, source, raw_bytes, data, kinds, targets)
    except ConfigError as exc:
        if not prefix or exc.field is None or exc.field.startswith(prefix):
            raise
        raise ConfigError(exc.message, source=source, field=f"{prefix}{exc.field}") from None


def _build_spec(path: Path, source: str, raw_bytes: bytes, data: dict, kinds: dict, targets: dict) -> WorkloadSpec:
    common = check_fields(data, COMMON, source=source)
    kind = common["kind"]
    if kind not in kinds:
        raise ConfigError(f"unknown workload kind {kind!r} (known: {', '.join(sorted(kinds))})", source=source,
                          field="kind")
    shape = check_fields(common["shape"], kinds[kind].fields, source=source, prefix="shape.")
    kinds[kind].validate(shape, source=source)
    _check_model(common["model"], source)
    return WorkloadSpec(
        name=common["name"] or path.stem, kind=kind, file=source, file_hash=hashlib.sha256(raw_bytes).hexdigest()[:16],
        targets=_targets(common["targets"], targets, kind, source), model=common["model"], device=common["device"],
        precision=common["precision"], requires_gpu=common["requires_gpu"], warmup=common["warmup"],
        repeat=common["repeat"], min_duration_s=common["min_duration_s"], halfwidth=common["halfwidth"],
        max_repeat=common["max_repeat"], seed=common["seed"],
        hwspec=common["hwspec"] or None, shape=shape,
    )


def _check_model(model: str, source: str) -> None:
    from dohnuts.config import preset

    if Path(model).is_dir():
        return
    preset(model, source=source, field_name="model")  # raises ConfigError naming file and field
