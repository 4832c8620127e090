"""Adapter checkpoints: unmerged LoRA + scalar head weights, bound to the base they adapt.

One safetensors file. Its metadata holds the format, the LoRA config, the calibration
temperature and the base identity (architecture hash + weights fingerprint); loading verifies
the identity and refuses a mismatch naming the file and the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dohnuts.errors import CheckpointError
from dohnuts.model.lora import LoRAConfig, lora_state_dict
from dohnuts.schema import dumps

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
    """Write the session's adapters, head, temperature and base identity to one file, atomically."""
    from safetensors.torch import save_file

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
    save_file(adapter_tensors(session), str(tmp), metadata=meta)
    os.chmod(tmp, created_mode())  # not safetensors' 0600
    fsync_file(tmp)
    os.replace(tmp, path)  # atomic: an interrupted save never leaves a half-written adapter
    fsync_dir(path.parent)


def read_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise CheckpointError("does not exist", source=str(path))
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:
        raise CheckpointError(f"cannot be read as safetensors ({exc})", source=str(path)) from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"is {meta.get('format')!r}, expected {FORMAT!r}", source=str(path), field="format")
    return tensors, meta


def load_adapter(session, path: str | Path) -> dict:
    """Attach the file's LoRA config to the session (Session.attach_lora: the one way adapters are
    attached) and load its weights and temperature; returns its `extra` metadata."""
    tensors, meta = read_adapter(path)
    want = session.base_identity
    try:
        have = json.loads(meta["base_identity"])
    except (KeyError, json.JSONDecodeError):
        raise CheckpointError("is missing or unreadable", source=str(path), field="base_identity") from None
    for key in sorted(set(want) | set(have)):
        if want.get(key) != have.get(key):
            raise CheckpointError(
                f"belongs to a base with {key}={have.get(key)!r}, but the loaded base has {key}={want.get(key)!r}",
                source=str(path), field=f"base_identity.{key}",
            )
    lora = json.loads(meta["lora"])
    cfg = LoRAConfig(rank=lora["rank"], alpha=lora["alpha"], dropout=lora["dropout"], targets=tuple(lora["targets"]))
    if session.lora is None:
        session.attach_lora(cfg)
    elif session.lora != cfg:
        raise CheckpointError(f"has LoRA config {cfg} but the model carries {session.lora}", source=str(path),
                              field="lora")
    model = session.model
    own = {f"backbone.{k}": v for k, v in lora_state_dict(model.backbone).items()}
    own["head.weight"] = model.head.weight
    if set(own) != set(tensors):
        missing = sorted(set(own) - set(tensors)) or sorted(set(tensors) - set(own))
        raise CheckpointError(f"tensor set differs from the model's adapters (first: {missing[0]!r})", source=str(path))
    with torch.no_grad():
        for k, dst in own.items():
            if tuple(tensors[k].shape) != tuple(dst.shape):
                raise CheckpointError(f"tensor {k!r} has shape {tuple(tensors[k].shape)}, expected {tuple(dst.shape)}",
                                      source=str(path))
            dst.copy_(tensors[k].to(dst.dtype))
    session.temperature = float(meta.get("temperature", "1.0"))
    return json.loads(meta.get("extra", "{}"))
