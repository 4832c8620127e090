"""Adapter checkpoints: unmerged LoRA + scalar head weights, bound to the base they adapt.

One safetensors file. Its metadata holds the format, the LoRA config, the calibration
temperature and the base identity (architecture hash + weights fingerprint); loading verifies
the identity and refuses a mismatch naming the file and the field.

Reading is bounded and checked before anything is used: the file must be a regular file within
MAX_ADAPTER_BYTES (a FIFO or a device is refused by its stat, unopened); its metadata is decoded
as `AdapterMeta` (dohnuts.schema: the LoRA config within its bounds — rank, a finite positive
alpha, dropout, a list of target names —, a finite positive temperature, JSON objects for the
base identity and `extra`); every tensor must be floating point and finite. Each refusal is one
CheckpointError line naming the file and the field or tensor.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import msgspec
import safetensors.torch
import torch
from safetensors import SafetensorError, safe_open

from dohnuts.errors import CheckpointError
from dohnuts.model.lora import Alpha, Dropout, LoRAConfig, Rank, Targets, lora_state_dict
from dohnuts.schema import GIB, MIB, Positive, convert, dumps, open_file, short

FORMAT = "dohnuts-adapter-1"


def fsync_file(path: str | Path) -> None:
    """Flush a written file's data to the disk (before a rename makes it visible)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def created_mode() -> int:
    """The mode `open()` gives a new file here: 0o666 less the process's umask. safetensors creates
    its files 0600 whatever the umask; the files it writes for us are given this mode instead, the
    mode of every other file of a run (summary.json, train_log.jsonl)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:  # Linux: read without changing it
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (a rename or a new file in it) to the disk; a no-op where
    directories cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def adapter_tensors(session) -> dict[str, torch.Tensor]:
    model = session.model
    tensors = {f"backbone.{k}": v for k, v in lora_state_dict(model.backbone).items()}
    tensors["head.weight"] = model.head.weight.detach()
    return {k: v.float().contiguous().cpu() for k, v in tensors.items()}


def save_adapter(session, path: str | Path, extra: dict | None = None) -> None:
    """Write the session's adapters, head, temperature and base identity to one file, atomically
    (an OSError when it cannot be written: the previous file, if any, is intact)."""
    lora = session.lora
    if lora is None:
        raise CheckpointError("the model has no LoRA adapters to save (it was merged or never adapted)",
                              source=str(path))
    meta = {
        "format": FORMAT,
        "base_identity": dumps(session.base_identity, sort_keys=True),
        "lora": dumps({"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout, "targets": list(lora.targets)}),
        "temperature": repr(float(session.temperature)),
        "extra": dumps(extra or {}),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        save_safetensors(adapter_tensors(session), tmp, metadata=meta)
        os.replace(tmp, path)  # atomic: an interrupted save never leaves a half-written adapter
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict | None = None) -> None:
    """safetensors' save_file, with the process's usual file mode, fsynced; its own error type (a full disk is a `SafetensorError`) is
    raised as the OSError it is, so every caller's handling of a failed write covers it."""
    try:
        safetensors.torch.save_file(tensors, str(path), metadata=metadata)  # looked up here: tests replace it
    except SafetensorError as exc:
        text = " ".join(str(exc).split())
        code = errno.ENOSPC if "No space left" in text else errno.EFBIG if "too large" in text else errno.EIO
        raise OSError(code, f"{os.strerror(code)} (safetensors: {short(text, 160, str)})") from None
    _sort_metadata(path)
    os.chmod(path, created_mode())  # not safetensors' 0600: the mode of every other file written
    fsync_file(path)


def _sort_metadata(path: str | Path) -> None:
    """The header's `__metadata__` keys in sorted order, so the same tensors and metadata always
    give the same bytes: safetensors writes them in its hash map's order, which varies from
    process to process (three saves of one adapter gave three SHA-256s). Rewritten in place; the
    header keeps its length (the same keys and values, reordered), so the data is never moved."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        raw = f.read(n)
        header = json.loads(raw, object_pairs_hook=dict)
        meta = header.get("__metadata__")
        if not meta:
            return
        header["__metadata__"] = dict(sorted(meta.items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > n:  # a different escaping than safetensors' own: leave the file as written
            return
        f.seek(8)
        f.write(text + b" " * (n - len(text)))  # safetensors pads its header with spaces


MAX_ADAPTER_BYTES = 4 * GIB  # an adapter of a 9B model at rank 64 is ≈ 1.3 GB
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


class AdapterLoRA(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The `lora` metadata of an adapter file: LoRAConfig's fields and bounds, every field written
    (a default would silently change the adapters' scale)."""

    rank: Rank
    alpha: Alpha
    dropout: Dropout
    targets: Targets

    def config(self) -> LoRAConfig:
        return LoRAConfig(rank=self.rank, alpha=self.alpha, dropout=self.dropout, targets=self.targets)


class AdapterMeta(msgspec.Struct, frozen=True, kw_only=True):
    """An adapter file's metadata, each field checked (`read_adapter_meta`): LoRA config within its
    bounds, a finite positive temperature, the base identity and `extra` as JSON objects."""

    lora: AdapterLoRA
    base_identity: dict[str, str]
    temperature: Positive = 1.0
    extra: dict[str, Any] = {}


def _json_field(meta: dict, key: str, path: str, default: str | None = None) -> Any:
    raw = meta.get(key, default)
    if raw is None:
        raise CheckpointError("is missing", source=path, field=key)
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise CheckpointError(f"is not valid JSON ({short(exc, 100, str)})", source=path, field=key) from None


def _parse_meta(meta: dict, path: str) -> AdapterMeta:
    """The raw safetensors metadata (a dict of strings) as an AdapterMeta; one CheckpointError line
    naming the file and the field (`lora.alpha`, `temperature`, ...) otherwise."""
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"is {short(meta.get('format'))}, expected {FORMAT!r}", source=path, field="format")
    raw_t = meta.get("temperature", "1.0")
    try:
        temperature = float(raw_t)
    except ValueError:
        raise CheckpointError(f"must be a number, got {short(raw_t)}", source=path, field="temperature") from None
    fields = {"lora": _json_field(meta, "lora", path), "base_identity": _json_field(meta, "base_identity", path),
              "temperature": temperature, "extra": _json_field(meta, "extra", path, "{}")}
    return convert(fields, AdapterMeta, source=path, error=CheckpointError)


def read_adapter_meta(path: str | Path) -> AdapterMeta:
    """The checked metadata of an adapter file (its header only: no tensor is read). The file must
    be a regular file within MAX_ADAPTER_BYTES (a FIFO or a device is refused before it is opened)."""
    path = str(path)
    raw = _header(path)
    return _parse_meta(raw.get("__metadata__") or {}, path)


def _header(path: str) -> dict:
    """The safetensors header (JSON) of a checked regular file, read with bounds: 8 bytes of length,
    then at most that many (≤ 100 MiB, and within the file)."""
    with open_file(path, max_bytes=MAX_ADAPTER_BYTES, error=CheckpointError, what="an adapter file") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(100 * MIB, size - 8):
            raise CheckpointError("cannot be read as safetensors (its header length is invalid)", source=path)
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot be read as safetensors (header: {short(exc, 100, str)})", source=path) from None
    if not isinstance(header, dict):
        raise CheckpointError("cannot be read as safetensors (its header is not an object)", source=path)
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError("cannot be read as safetensors (its metadata is not a map of strings)", source=path)
    return header


def read_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], AdapterMeta]:
    """The tensors and checked metadata of an adapter file: every tensor floating point and finite
    (a NaN in a LoRA tensor would make every score NaN), named in the error otherwise."""
    meta = read_adapter_meta(path)
    path = str(path)
    try:
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                dtype = f.get_slice(k).get_dtype()
                if dtype not in _FLOAT_DTYPES:
                    raise CheckpointError(f"tensor {k!r} is {dtype}; adapter tensors must be floating point", source=path)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"cannot be read as safetensors ({short(exc, 200, str)})", source=path) from None
    for k, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"tensor {k!r} holds non-finite values (NaN or infinite)", source=path)
    return tensors, meta


def load_adapter(session, path: str | Path) -> dict:
    """Attach the file's LoRA config to the session (Session.attach_lora: the one way adapters are
    attached) and load its weights and temperature; returns its `extra` metadata."""
    tensors, meta = read_adapter(path)
    path = str(path)
    want, have = session.base_identity, meta.base_identity
    for key in sorted(set(want) | set(have)):
        if want.get(key) != have.get(key):
            raise CheckpointError(
                f"belongs to a base with {key}={have.get(key)!r}, but the loaded base has {key}={want.get(key)!r}",
                source=path, field=f"base_identity.{key}",
            )
    cfg = meta.lora.config()
    if session.lora is not None and session.lora != cfg:
        raise CheckpointError(f"has LoRA config {cfg} but the model carries {session.lora}", source=path,
                              field="lora")
    if session.lora is None:
        session.attach_lora(cfg)
    model = session.model
    own = {f"backbone.{k}": v for k, v in lora_state_dict(model.backbone).items()}
    own["head.weight"] = model.head.weight
    if set(own) != set(tensors):
        missing = sorted(set(own) - set(tensors)) or sorted(set(tensors) - set(own))
        raise CheckpointError(f"tensor set differs from the model's adapters (first: {missing[0]!r})", source=path)
    for k, dst in own.items():
        if tuple(tensors[k].shape) != tuple(dst.shape):
            raise CheckpointError(f"tensor {k!r} has shape {tuple(tensors[k].shape)}, expected {tuple(dst.shape)}",
                                  source=path)
    with torch.no_grad():
        for k, dst in own.items():
            dst.copy_(tensors[k].to(dst.dtype))
    session.temperature = meta.temperature
    return dict(meta.extra)
