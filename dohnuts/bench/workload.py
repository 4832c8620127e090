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
    max_repeat: 0               # ... but at most this many (0: 4 × repeat; at most 100000)
    seed: 0                     # 0..2³²−1
    hwspec: h200                # optional: hwspecs/<name>.yaml or a path (default: by device name)
    processes: 1                # one process per device, or a list ([1, 2]) to measure scaling: each
                                #   count above 1 is started by the `launcher` (torchrun), one process
                                #   per GPU (gloo processes on a CPU); counts over the machine's GPUs
                                #   are skipped with a message. Every record carries its rank.
    launcher: torchrun          # the launcher plugin that starts several processes
    shape: {...}                # the kind's own fields (see each kind's `fields`)
    on_gpu:                     # optional: what changes when the workload runs on a GPU, so one
      model: qwen3.5-2b         #   file measures a size that fits each device (the standard suite in
      shape: {questions: 32}    #   workloads/*.yaml: tiny on a CPU, 2b on a GPU); `shape` entries
                                #   replace the CPU ones key by key; any field but `kind` and `on_gpu`

Every size has an upper bound (above; each kind's `fields` list its own, e.g. questions ≤ 4096),
so a typo cannot ask for a run that never ends. The longest sequence a workload's calls hold
(its kind's `sequence_tokens(shape, model_config)`: `seq_tokens`, plus the image tokens of the
largest image for the image kinds) must fit the model's context: the smaller of the config's
`max_position_embeddings` (preset or checkpoint config.json) and the runtime's `max_len`
(`dohnuts.api.load`, 8192) — checked here, before anything is measured, for both the CPU and
the `on_gpu` variant.

The YAML is read strictly: a key written twice in one mapping is an error naming the key and
both lines (plain YAML would silently keep the last). Every error names the file and the field
(`ConfigError`); the CLI prints it on one line and exits with status 2.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dohnuts.errors import ConfigError, DohnutsError


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
    processes: tuple[int, ...] = (1,)  # process counts to measure (scaling), ascending
    launcher: str = "torchrun"

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "file": self.file, "file_hash": self.file_hash,
                "targets": [t.label for t in self.targets], "model": self.model, "device": self.device,
                "precision": self.precision, "warmup": self.warmup, "repeat": self.repeat,
                "min_duration_s": self.min_duration_s, "halfwidth": self.halfwidth, "max_repeat": self.max_repeat,
                "seed": self.seed, "shape": self.shape, "processes": list(self.processes), "launcher": self.launcher}


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
        try:
            value = float(value)
        except OverflowError:
            raise ConfigError("must be a finite number, got an integer too large for one", source=source,
                              field=name) from None
    if spec.type is object:  # checked by the field's own function
        return value
    if spec.type is list:
        if not isinstance(value, list):
            raise ConfigError(f"must be a list, got {_short(value)}", source=source, field=name)
        return value
    if not isinstance(value, spec.type) or (spec.type is not bool and isinstance(value, bool)):
        raise ConfigError(f"must be {spec.type.__name__}, got {_short(value)}", source=source, field=name)
    if spec.type is float and not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value!r}", source=source, field=name)
    if spec.min is not None and value < spec.min:
        raise ConfigError(f"must be >= {spec.min}, got {value!r}", source=source, field=name)
    if spec.max is not None and value > spec.max:
        raise ConfigError(f"must be <= {spec.max}, got {value!r}", source=source, field=name)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"must be one of {list(spec.choices)}, got {_short(value)}", source=source, field=name)
    return value


def _short(value: Any, limit: int = 80, convert=repr) -> str:
    """convert(value) (repr by default) on one line, cut to `limit` characters: an error message
    stays one readable line."""
    try:
        text = " ".join(convert(value).split())
    except ValueError:  # an integer too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_fields(data: dict, fields: dict[str, Field], *, source: str, prefix: str = "") -> dict:
    """Validate `data` against `fields` (unknown keys are errors); fill defaults."""
    if not isinstance(data, dict):
        raise ConfigError("must be a mapping", source=source, field=prefix.rstrip(".") or None)
    for key in data:
        if key not in fields:
            raise ConfigError(f"unknown field (known: {', '.join(fields)})", source=source,
                              field=f"{prefix}{_short(key) if not isinstance(key, str) else key}")
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
    "warmup": Field(int, 2, min=0, max=1000),
    "repeat": Field(int, 5, min=1, max=10_000),
    "min_duration_s": Field(float, 0.0, min=0.0, max=86_400.0),  # one day
    "halfwidth": Field(float, 0.05, min=0.0, max=1.0),
    "max_repeat": Field(int, 0, min=0, max=100_000),
    "seed": Field(int, 0, min=0, max=2**32 - 1),  # numpy's and torch's generators take it as it is
    "hwspec": Field(str, ""),
    "shape": Field(dict, {}),
    "on_gpu": Field(dict, {}),
    "processes": Field(object, 1),  # an int or a list of ints (check_processes)
    "launcher": Field(str, "torchrun"),
}
MAX_PROCESSES = 1024


def check_processes(value: Any, source: str) -> tuple[int, ...]:
    """`processes`: a count or a list of distinct counts in 1..MAX_PROCESSES, returned ascending."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError("must name at least one process count", source=source, field="processes")
    out = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_PROCESSES:
            raise ConfigError(f"must be a process count in 1..{MAX_PROCESSES} or a list of them, got {_short(v)}",
                              source=source, field="processes")
        if v in out:
            raise ConfigError(f"lists {v} twice", source=source, field="processes")
        out.append(v)
    return tuple(sorted(out))


MAX_TARGETS = 64


def _targets(raw: list, known: dict, kind: str, source: str) -> tuple[TargetSpec, ...]:
    if len(raw) > MAX_TARGETS:
        raise ConfigError(f"names {len(raw)} targets, more than {MAX_TARGETS}", source=source, field="targets")
    out, labels = [], set()
    for i, t in enumerate(raw):
        where = f"targets[{i}]"
        if isinstance(t, str):
            t = {"name": t}
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ConfigError("must be a target name or {name, label, options}", source=source, field=where)
        extra = set(t) - {"name", "label", "options"}
        if extra:
            raise ConfigError(f"unknown key {_short(min(extra, key=str))}", source=source, field=where)
        if t["name"] not in known:
            raise ConfigError(f"unknown target {_short(t['name'])} (known: {', '.join(sorted(known))})",
                              source=source, field=f"{where}.name")
        label = t.get("label", t["name"])
        if not isinstance(label, str) or not label.strip():
            raise ConfigError(f"must be a non-empty string, got {_short(label)}", source=source, field=f"{where}.label")
        if label in labels:
            raise ConfigError(f"label {_short(label)} is used twice", source=source, field=f"{where}.label")
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


# --------------------------------------------------------------------------------------------
# Reading YAML (workload files here, hardware specs in dohnuts.bench.analysis.hwspec)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that holds the same key twice (plain YAML keeps the last one, silently)."""

    def __init__(self, key: Any, first, again):
        super().__init__("while constructing a mapping", first, f"found duplicate key {_short(key)}", again)
        self.key = key


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses duplicate keys. Merge keys (`<<: *base`) may still be
    overridden: only the keys written in the mapping itself are compared."""

    def flatten_mapping(self, node):
        if not getattr(node, "_dohnuts_checked", False):  # before the merges are spliced in
            node._dohnuts_checked = True
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the constructor refuses it itself
                    continue
                if first is not None:
                    raise DuplicateKeyError(key, first, key_node.start_mark)
                seen[key] = key_node.start_mark
        super().flatten_mapping(node)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _escape(text: str | None) -> str | None:
    """`text` with every unprintable character (newline, NUL, ...) written as its escape."""
    if text is None or text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def one_line_error(exc: DohnutsError) -> DohnutsError:
    """`exc` as one line: a key, path or value holding a newline or another control character
    (a YAML key may hold anything) is written with escapes. Same class, same fields."""
    message, source, field = _escape(exc.message), _escape(exc.source), _escape(exc.field)
    if (message, source, field) == (exc.message, exc.source, exc.field):
        return exc
    return type(exc)(message, source=source, field=field)


def yaml_error(exc: BaseException, source: str) -> ConfigError:
    """One ConfigError line for whatever parsing a YAML file raised."""
    if isinstance(exc, DuplicateKeyError):
        return ConfigError(f"has the key {_short(exc.key)} twice (line {exc.context_mark.line + 1} and line "
                           f"{exc.problem_mark.line + 1}); a key may appear once per mapping", source=source,
                           field=exc.key if isinstance(exc.key, str) else _short(exc.key))
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character
        code = char if isinstance(char, int) else (char[0] if isinstance(char, bytes) else ord(char[:1] or "\0"))
        if exc.encoding == "unicode" or isinstance(char, str):  # decoded, but a character YAML refuses
            what = f"is not YAML text: unacceptable character #x{code:04x} at position {exc.position} ({exc.reason})"
        else:  # undecodable bytes (PyYAML gives the byte as an int)
            what = f"is not {exc.encoding} text (byte #x{code:02x} at offset {exc.position}: {exc.reason})"
        return ConfigError(one_line(what), source=source)
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "parse error"
        return ConfigError(one_line(f"is not valid YAML{where} ({problem})"), source=source)
    if isinstance(exc, RecursionError):
        return ConfigError("is not usable YAML (nested too deeply)", source=source)
    return ConfigError(one_line(f"is not valid YAML ({exc})"), source=source)


def read_yaml(path: str | Path) -> tuple[bytes, Any]:
    """(raw bytes, parsed document) of a YAML file; every failure is one ConfigError naming it:
    missing, a directory, unreadable, not text, not valid YAML, a duplicate key."""
    path = Path(path)
    source = str(path)
    try:
        if not path.exists():
            raise ConfigError("does not exist", source=source)
        if path.is_dir():
            raise ConfigError("is a directory, not a YAML file", source=source)
        if not path.is_file():  # a device or a pipe could be endless
            raise ConfigError("is not a regular file", source=source)
        raw = path.read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
        raise ConfigError(f"cannot be read ({getattr(exc, 'strerror', None) or exc})", source=source) from None
    try:
        # bytes: PyYAML decodes them (UTF-8, or UTF-16 with a byte-order mark) and says where it fails
        return raw, yaml.load(raw, Loader=StrictLoader)  # StrictLoader is a SafeLoader
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: an integer too long to read
        raise yaml_error(exc, source) from None


def load_workload(path: str | Path, kinds: dict, targets: dict, *, gpu: bool | None = None) -> WorkloadSpec:
    """Read and validate one workload file against the registered kinds and targets.

    `gpu`: build the variant for a GPU machine (the file's `on_gpu` fields applied); default: whether
    this machine has one. Both variants are validated either way, so a file that is wrong on the
    other kind of machine is refused here too."""
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    try:
        return _load_workload(Path(path), kinds, targets, gpu)
    except DohnutsError as exc:
        raise one_line_error(exc) from None


def _load_workload(path: Path, kinds: dict, targets: dict, gpu: bool) -> WorkloadSpec:
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
        raise ConfigError(f"unknown workload kind {_short(kind)} (known: {', '.join(sorted(kinds))})", source=source,
                          field="kind")
    shape = check_fields(common["shape"], kinds[kind].fields, source=source, prefix="shape.")
    kinds[kind].validate(shape, source=source)
    cfg = model_config(common["model"], source)
    check_context(kinds[kind], shape, cfg, common["model"], source)
    if common["hwspec"]:
        _check_hwspec(common["hwspec"], source)
    processes = check_processes(common["processes"], source)
    if not common["launcher"].strip():
        raise ConfigError("must name a launcher plugin (default: torchrun)", source=source, field="launcher")
    if max(processes) > 1 and getattr(kinds[kind], "distributed", True) is False:
        raise ConfigError(f"lists {max(processes)} processes, but {kind!r} workloads run in one process only",
                          source=source, field="processes")
    return WorkloadSpec(
        name=common["name"] or path.stem, kind=kind, file=source, file_hash=hashlib.sha256(raw_bytes).hexdigest()[:16],
        targets=_targets(common["targets"], targets, kind, source), model=common["model"], device=common["device"],
        precision=common["precision"], requires_gpu=common["requires_gpu"], warmup=common["warmup"],
        repeat=common["repeat"], min_duration_s=common["min_duration_s"], halfwidth=common["halfwidth"],
        max_repeat=common["max_repeat"], seed=common["seed"],
        hwspec=common["hwspec"] or None, shape=shape, processes=processes, launcher=common["launcher"],
    )


def model_config(model: str, source: str):
    """The ModelConfig of a workload's `model` (a preset, or a checkpoint directory's config.json);
    a ConfigError naming the workload file and its `model` field otherwise."""
    from dohnuts.config import preset

    if not model.strip() or "\x00" in model:
        raise ConfigError("must name a preset or a checkpoint directory", source=source, field="model")
    try:
        is_dir = Path(model).is_dir()
    except OSError as exc:  # e.g. a name too long for a path
        raise ConfigError(f"is neither a preset nor a readable directory ({exc.strerror or exc})", source=source,
                          field="model") from None
    if is_dir:
        from dohnuts.model.checkpoint import read_config

        try:
            return read_config(Path(model))
        except DohnutsError as exc:
            raise ConfigError(f"is not a usable checkpoint ({exc})", source=source, field="model") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"is not a usable checkpoint ({one_line(exc)})", source=source, field="model") from None
    return preset(model, source=source, field_name="model")  # raises ConfigError naming file and field


def runtime_max_len() -> int:
    """The longest sequence the runtime accepts: `dohnuts.api.load`'s `max_len` (8192), which both
    built-in targets run with."""
    import inspect

    import dohnuts.api

    default = inspect.signature(dohnuts.api.load).parameters["max_len"].default
    return default if isinstance(default, int) and default > 0 else 8192


def model_context(cfg) -> int:
    """The model's usable context: max_position_embeddings, capped by the runtime's max_len."""
    return min(int(cfg.text.max_position_embeddings), runtime_max_len())


def check_context(kind, shape: dict, cfg, model: str, source: str) -> None:
    """Refuse a workload whose longest sequence (the kind's `sequence_tokens`) is over the model's
    context. Kinds without `sequence_tokens` (plugins) are not checked here."""
    measure = getattr(kind, "sequence_tokens", None)
    if measure is None:
        return
    tokens = measure(shape, cfg, source=source)
    context = model_context(cfg)
    if tokens > context:
        seq = shape.get("seq_tokens")
        what = f"is {seq}" if tokens == seq else (
            f"is {seq}, and with the largest image's {tokens - seq} tokens (markers included) a sequence holds "
            f"{tokens}" if isinstance(seq, int)
            else f"makes sequences of {tokens} tokens")
        raise ConfigError(
            f"{what}: over the {context}-token context of model {model!r} (the smaller of its "
            f"max_position_embeddings {cfg.text.max_position_embeddings} and the runtime's max_len "
            f"{runtime_max_len()})", source=source, field="shape.seq_tokens")


def _check_hwspec(name: str, source: str) -> None:
    """The workload's `hwspec:` must load; its error names this workload file and field too."""
    from dohnuts.bench.analysis.hwspec import find_hwspec

    try:
        find_hwspec(name)
    except ConfigError as exc:
        raise ConfigError(f"cannot be used: {exc}", source=source, field="hwspec") from None
