"""The run directory of `dohnuts train`: its checkpoints, their atomic switch, and what a resumed
run may change.

The run directory (`--out`):

    checkpoints/update-000040/   one checkpoint = one directory, complete or ignored:
        adapter.safetensors      LoRA + head (the adapter format of dohnuts.adapters)
        state.safetensors        optimizer tensors, torch (and CUDA) RNG states
        best.safetensors         the selected adapter as of this update (a hard link when possible)
        manifest.json            update, selection, config, data fingerprint, scheduler and
                                 optimizer hyper-parameters, Python RNG state (JSON, no pickle),
                                 the log's length and hash, and the size and SHA-256 of each file
    checkpoints/latest           the name of the committed checkpoint
    best.safetensors, train_log.jsonl, summary.json

A checkpoint is written into `checkpoints/.tmp-update-N/`, every file fsynced, renamed to
`update-N/`, and only then committed by atomically replacing `latest` (write, fsync, rename);
older checkpoints are deleted after the switch. An interruption at any point leaves `latest`
naming a complete checkpoint (the new one or the one before); anything it does not name is
ignored. Resume reads `latest`, verifies the files against the manifest, restores
`best.safetensors` as of that checkpoint and cuts `train_log.jsonl` back to the length it had
then (a new file renamed over the old one), so updates replayed after a resume are logged once.

A run continues only with the arguments it started with (`check_resumable`): `updates` may
change (not below the checkpoint's update; the learning-rate schedule keeps the span it was laid
out for, so updates beyond it run at its final rate) and `device` may change (the adapter's base
identity still has to match); anything that changes the objective, the schedule, the data, its
order, the selection or the adapters may not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import torch
from msgspec import Meta

from dohnuts.adapters import fsync_dir, read_adapter
from dohnuts.errors import CheckpointError, ConfigError
from dohnuts.schema import MIB, Finite, Invalid, NonNegative, convert, decode_json, read_file
from dohnuts.train.config import ARGUMENTS, SPLITS, Partitions, TrainConfig

CHECKPOINT_FORMAT = "dohnuts-checkpoint-1"
MAX_MANIFEST_BYTES = 16 * MIB
CHECKPOINTS = "checkpoints"
POINTER = "latest"
LOG = "train_log.jsonl"
BEST = "best.safetensors"
SUMMARY = "summary.json"
_NAME = re.compile(r"update-\d{6,}")
_OLD_LAYOUT = ("state.pt", "last.safetensors")

# What a resumed run may change (`updates` is checked on its own: not below the checkpoint; the
# data is compared by content, so a moved --data folder is the same data; `optim.checkpoint_layers`
# is a field of runs started before activation checkpointing became the fixed policy).
RESUME_MAY_CHANGE = ("out", "device", "updates", "schedule_updates", "optim.checkpoint_layers", "data")


# -- the manifest ------------------------------------------------------------------------------


Sha256 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[int, Meta(ge=0, le=2**62)]
CHECKPOINT_FILES = ("adapter.safetensors", "state.safetensors", "best.safetensors")


class FileEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bytes: Count
    sha256: Sha256


class Best(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The selection so far: the update of the best development accuracy (None before the first
    evaluation) and that accuracy (−1 before it)."""

    update: Count | None
    accuracy: Annotated[float, Meta(ge=-1.0, le=1.0)]


class SchedulerState(msgspec.Struct, frozen=True):
    """What resume reads of LambdaLR.state_dict(): where the schedule stands (its other entries are
    this run's scheduler's own: `scheduler_state`)."""

    last_epoch: Annotated[int, Meta(ge=-1, le=2**62)]
    base_lrs: Annotated[list[Annotated[float, Meta(gt=0.0, le=1e6)]], Meta(min_length=1)]
    step_count: Annotated[int, Meta(ge=0, le=2**62)] | None = msgspec.field(default=None, name="_step_count")
    last_lr: list[Annotated[float, Meta(ge=0.0, le=1e6)]] | None = msgspec.field(default=None, name="_last_lr")

    def __post_init__(self) -> None:
        if self.last_lr is not None and len(self.last_lr) != len(self.base_lrs):
            raise Invalid(f"holds {len(self.last_lr)} rates for {len(self.base_lrs)} base rates", field="_last_lr")


Rate = Annotated[float, Meta(ge=0.0, le=1e6)]


class ParamGroup(msgspec.Struct, frozen=True):
    """What resume reads of an optimizer parameter group: the rate the schedule had reached (the
    group's other hyper-parameters are this run's own: `optimizer_state`)."""

    lr: Rate
    initial_lr: Rate | None = None


class OptimizerMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    param_groups: Annotated[list[ParamGroup], Meta(min_length=1)]
    scalars: dict[str, Finite]


MT_WORD = Annotated[int, Meta(ge=0, le=2**32 - 1)]


class Manifest(msgspec.Struct, frozen=True):
    """A checkpoint's manifest.json (the module docstring): what `--resume` restores, and the size
    and SHA-256 of every file of the checkpoint. Every field is checked when it is read: a number
    out of its range (`update: -7`), a NaN (named by its field), a file outside the checkpoint, a
    selection after the checkpoint's own update are refused in one line."""

    format: Literal["dohnuts-checkpoint-1"]
    update: Count
    best: Best
    config: dict[str, Any]  # config_record: the flat config the run started with (compared, never run)
    data: dict[str, Sha256]  # data_fingerprint
    schedule_updates: Count  # the span of the lr schedule
    scheduler: dict[str, Any]  # LambdaLR.state_dict(), checked as SchedulerState
    optimizer: dict[str, Any]  # optimizer_tensors' meta: param_groups, scalars, checked as OptimizerMeta
    python_rng: tuple[Literal[3], Annotated[list[MT_WORD], Meta(min_length=625, max_length=625)], Finite | None]
    log: FileEntry  # train_log.jsonl as of this checkpoint
    files: dict[Literal["adapter.safetensors", "state.safetensors", "best.safetensors"], FileEntry]
    time: NonNegative = 0.0
    requests_per_microbatch: Annotated[int, Meta(ge=1, le=2**20)] = 1  # absent: written when it was always 1

    def __post_init__(self) -> None:
        if self.best.update is not None and self.best.update > self.update:
            raise Invalid(f"is update {self.best.update}, after the checkpoint's own update {self.update}",
                          field="best.update")
        for name in ("adapter.safetensors", "state.safetensors"):
            if name not in self.files:
                raise Invalid(f"does not list {name}", field="files")
        if (self.best.update is not None) != ("best.safetensors" in self.files):
            raise Invalid("lists best.safetensors if and only if a selection was made (best.update)", field="files")
        checked = []
        for value, type_, name in ((self.scheduler, SchedulerState, "scheduler"),
                                   (self.optimizer, OptimizerMeta, "optimizer")):
            try:
                checked.append(convert(value, type_, source=None, prefix=name))
            except ConfigError as exc:
                raise Invalid(exc.message, field=exc.field) from None
        scheduler, optimizer = checked
        if len(scheduler.base_lrs) != len(optimizer.param_groups):  # the scheduler steps each group
            raise Invalid(f"holds {len(scheduler.base_lrs)} rates for the optimizer's {len(optimizer.param_groups)} "
                          "parameter group(s)", field="scheduler.base_lrs")
        position = self.python_rng[1][-1]  # the Mersenne Twister's index into its 624 words
        if position > 624:
            raise Invalid(f"must be <= 624 (the generator's position in its state), got {position}",
                          field="python_rng[1][624]")


def data_fingerprint(data: Partitions) -> dict[str, str]:
    """SHA-256 of each partition's requests (ids, texts, candidates, rewards, images, prefixes)."""
    out = {}
    for split in SPLITS:
        h = hashlib.sha256()
        for req in getattr(data, split):
            obj = asdict(req) if dataclasses.is_dataclass(req) else repr(req)
            h.update(json.dumps(obj, sort_keys=True, default=str).encode())
            h.update(b"\n")
        out[split] = h.hexdigest()
    return out


# -- files -------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` by `data` all at once (write a temporary file, fsync, rename, fsync the folder)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write_durable(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


# -- the run directory ---------------------------------------------------------------------------


def run_contents(out: str | Path) -> list[str]:
    """What of a training run `out` holds ([] for a new folder, or one with nothing but checkpoint
    directories that were never committed: an interrupted first checkpoint)."""
    out = Path(out)
    found = []
    if (out / CHECKPOINTS / POINTER).exists():
        found.append(f"{CHECKPOINTS}/{POINTER}")
    found += [n for n in (LOG, BEST, SUMMARY, *_OLD_LAYOUT) if (out / n).exists()]
    return found


def latest_checkpoint(out: str | Path) -> Path | None:
    """The committed checkpoint directory of the run in `out` (what --resume restores), or None."""
    ptr = Path(out) / CHECKPOINTS / POINTER
    if not os.path.lexists(ptr):
        return None
    raw = read_file(ptr, max_bytes=4096, error=CheckpointError, what="a checkpoint pointer")
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError("is not UTF-8 text", source=str(ptr)) from None
    if not _NAME.fullmatch(name):
        raise CheckpointError(f"names {name!r}, not a checkpoint directory (update-NNNNNN)", source=str(ptr))
    ckpt = ptr.parent / name
    if not (ckpt / "manifest.json").is_file():
        raise CheckpointError(f"names {name}, which has no manifest.json (the checkpoint is missing or damaged)",
                              source=str(ptr))
    return ckpt


def check_run_dir(out: str | Path, *, resume: bool) -> Path | None:
    """Refuse to start over in a folder that holds a run, and to resume one with nothing to resume.
    Returns the checkpoint to resume from (None: a fresh start)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("exists and is not a directory", source=str(out))
    found = run_contents(out)
    if any(n in _OLD_LAYOUT for n in found) and f"{CHECKPOINTS}/{POINTER}" not in found:
        raise CheckpointError("holds a run of an older dohnuts layout (state.pt + last.safetensors), which cannot "
                              "be resumed safely; choose a new --out (its best.safetensors can seed it with "
                              "--initialize-from)", source=str(out))
    if not resume:
        if found:
            raise CheckpointError(f"already holds a training run ({', '.join(found)}); add --resume to continue it, "
                                  "or choose a new --out (nothing was overwritten)", source=str(out))
        return None
    ckpt = latest_checkpoint(out)
    if ckpt is None and found:
        raise CheckpointError(f"has nothing to resume: no committed checkpoint ({CHECKPOINTS}/{POINTER}) beside "
                              f"{', '.join(found)}; choose a new --out", source=str(out))
    return ckpt


def _plain(obj):
    """A config as nested dicts, field by field, defaults included."""
    if isinstance(obj, msgspec.Struct):
        return {name: _plain(getattr(obj, name)) for name in obj.__struct_fields__}
    return obj


def config_record(cfg: TrainConfig) -> dict:
    """The config as flat JSON values ('lora.rank': 2, …), paths made absolute."""
    raw = json.loads(json.dumps(_plain(cfg), default=str))  # tuples as lists, as the manifest holds
    flat = {}

    def walk(obj, prefix):
        for k, v in obj.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    walk(raw, "")
    for key in ("model", "data", "initialize_from", "out"):
        v = flat.get(key)
        if isinstance(v, str) and Path(v).exists():  # a path (a preset name or "synthetic:N" stays as it is)
            flat[key] = str(Path(v).resolve())
    return flat


def read_checkpoint(ckpt: Path) -> Manifest:
    """The manifest of a committed checkpoint, its files verified (size and SHA-256)."""
    mpath = ckpt / "manifest.json"
    raw = read_file(mpath, max_bytes=MAX_MANIFEST_BYTES, error=CheckpointError, what="a manifest")
    manifest = decode_json(raw, Manifest, source=str(mpath), error=CheckpointError)
    for name, info in manifest.files.items():
        path = ckpt / name
        try:
            intact = path.is_file() and path.stat().st_size == info.bytes and sha256_of(path) == info.sha256
        except OSError:
            intact = False
        if not intact:
            raise CheckpointError("does not match the checkpoint's manifest (missing or damaged)", source=str(path))
    return manifest


def check_resumable(manifest: Manifest, cfg: TrainConfig, fingerprint: dict, source: str) -> None:
    """Refuse to continue a run with arguments that change what it computes (naming the argument,
    the saved value and the new one)."""
    saved, new = manifest.config, config_record(cfg)
    for key in sorted(set(saved) | set(new)):
        if key in RESUME_MAY_CHANGE or saved.get(key) == new.get(key):
            continue
        arg = ARGUMENTS.get(key, key)
        raise ConfigError(f"{arg} is {new.get(key)!r} but the run was started with {arg} {saved.get(key)!r}; "
                          "--resume continues a run with its own arguments (only --updates and --device may "
                          "change) — resume with the saved value, or choose a new --out", source=source)
    if cfg.updates < manifest.update:
        raise ConfigError(f"--updates is {cfg.updates} but the checkpoint is already at update {manifest.update}; "
                          "a run cannot be shortened below its checkpoint", source=source)
    for split, digest in manifest.data.items():
        if fingerprint.get(split) != digest:
            raise ConfigError(f"--data: the {split} requests differ from those the run was started with "
                              f"(--data {manifest.config.get('data')}); resume with the original data, or choose "
                              "a new --out", source=source)


def optimizer_tensors(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            key = f"optimizer.{pid}.{k}"
            if torch.is_tensor(v):
                tensors[key] = v.detach().cpu().contiguous()
            else:
                scalars[key] = v
    groups = []
    for g in sd["param_groups"]:
        if any(torch.is_tensor(v) for v in g.values()):
            raise CheckpointError("an optimizer hyper-parameter is a tensor, which checkpoints do not store",
                                  source="optimizer")
        groups.append(dict(g))
    return tensors, {"param_groups": groups, "scalars": scalars}


def optimizer_state(tensors: dict[str, torch.Tensor], meta: dict, template: dict) -> dict:
    """The optimizer's state_dict for `load_state_dict`: the checkpoint's per-parameter state, and the
    parameter groups of this run's optimizer (`template`: built from the same configuration, which
    `check_resumable` compared) with the rates the checkpoint's groups had reached. Only the rates
    are read from the manifest: the other hyper-parameters are the configuration's, so a hand-edited
    `eps: [1, 2]` cannot reach the optimizer's step. A mismatch is a ValueError (the caller's one line)."""
    state: dict[int, dict] = {}
    for key, v in list(tensors.items()) + list(meta["scalars"].items()):
        if key.startswith("optimizer."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    saved, own = meta["param_groups"], template["param_groups"]
    if len(saved) != len(own):
        raise ValueError(f"the checkpoint holds {len(saved)} parameter group(s), this optimizer {len(own)}")
    groups = [{**t, "lr": g["lr"], **({"initial_lr": g["initial_lr"]} if g.get("initial_lr") is not None else {})}
              for g, t in zip(saved, own)]
    return {"state": state, "param_groups": groups}


def scheduler_state(saved: dict, template: dict) -> dict:
    """The scheduler's state_dict for `load_state_dict`: this run's scheduler's (`template`) with
    where the checkpoint's schedule stood (epoch, base rates, steps taken, last rates), each of them
    typed (SchedulerState); nothing else of the manifest reaches the scheduler."""
    s = msgspec.convert(saved, SchedulerState)  # checked when the manifest was read
    given = {"_step_count": s.step_count, "_last_lr": s.last_lr}
    return {**template, "last_epoch": s.last_epoch, "base_lrs": list(s.base_lrs),
            **{k: v for k, v in given.items() if v is not None}}


def prune_checkpoints(root: Path, keep: str) -> None:
    """Delete everything in checkpoints/ but the committed checkpoint `keep` and the pointer."""
    for child in root.iterdir():
        if child.name not in (keep, POINTER):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def checkpoint_adapter(out: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The adapter tensors and metadata of the run's committed checkpoint (the last trained state)."""
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        raise CheckpointError("has no committed checkpoint", source=str(out))
    return read_adapter(ckpt / "adapter.safetensors")
