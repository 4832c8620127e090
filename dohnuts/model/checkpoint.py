"""Weights: seeded random initialisation for presets, and Hugging Face checkpoint directories.

A checkpoint directory holds `config.json` and either `model.safetensors` or sharded files
listed by `model.safetensors.index.json`. Both transformers layouts load:

- text-only (`qwen3_5_text`): keys `layers.*`, `embed_tokens.weight`, `norm.weight`
  (or the same under `model.` when saved from a *ForCausalLM);
- full model (`qwen3_5`): keys under `model.language_model.*` and `model.visual.*`.

`lm_head.*` and `mtp.*` tensors are skipped: dohnuts never computes vocabulary logits.
Every failure names the file and the tensor (CheckpointError).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import msgspec
import torch
from safetensors import safe_open
from torch import nn

from dohnuts.config import ModelConfig
from dohnuts.errors import CheckpointError, ConfigError
from dohnuts.hf_config import from_hf_config
from dohnuts.schema import MIB, check_file, convert, open_file, read_file, short

_TEXT_PREFIXES = ("model.language_model.", "language_model.", "model.")
_VISION_PREFIXES = ("model.visual.", "visual.")
_SKIPPED_PREFIXES = ("lm_head.", "mtp.", "model.mtp.")


def allocate(module: nn.Module, device: torch.device | str) -> nn.Module:
    """`module.to_empty(device=device)` for a module built on the meta device: its parameters and
    buffers allocated, uninitialised, in their dtype. to_empty's `empty_like` of a meta tensor runs
    torch's Python reference, which imports sympy: 0.4 of the 0.5 s the tiny preset took to build
    on a 2-core CPU; `torch.empty` of the shape does the same allocation without it."""
    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


@torch.no_grad()
def init_weights(module: nn.Module, seed: int) -> None:
    """Seeded random weights in the style of transformers' Qwen3.5 init (normal 0.02 for matrices,
    zero-centred norms at 0, gated norm at 1, A_log = log U(1, 16), dt_bias = 1).

    Values are drawn on the parameters' device (a 2B model initialises in milliseconds on a GPU
    instead of half a minute on a CPU), so the same seed gives different weights on a CPU and on
    a GPU; the base identity of a preset records the device type for that reason."""
    devices = {p.device for p in module.parameters()}
    dev = devices.pop() if len(devices) == 1 else torch.device("cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            vals = torch.empty(p.shape, device=dev).uniform_(1, 16, generator=gen).log()
        elif leaf == "dt_bias":
            vals = torch.ones(p.shape, device=dev)
        elif name.endswith("linear_attn.norm.weight"):
            vals = torch.ones(p.shape, device=dev)
        elif p.ndim == 1 and "norm" in name and leaf == "weight":
            # Zero-centred RMSNorm (1 + w) weights start at 0; LayerNorm (vision) weights at 1.
            vals = torch.zeros(p.shape, device=dev) if _is_zero_centred(name) else torch.ones(p.shape, device=dev)
        elif p.ndim == 1:  # biases (LayerNorm biases included)
            vals = torch.zeros(p.shape, device=dev)
        elif "conv1d" in name:
            bound = 1.0 / math.sqrt(p.shape[-1])
            vals = torch.empty(p.shape, device=dev).uniform_(-bound, bound, generator=gen)
        else:
            vals = torch.empty(p.shape, device=dev).normal_(0.0, 0.02, generator=gen)
        p.copy_(vals.to(p.dtype))


def _is_zero_centred(name: str) -> bool:
    return not name.startswith(("visual.", "model.visual.")) and "blocks." not in name and "merger." not in name


MAX_CONFIG_BYTES = 4 * MIB  # config.json, model.safetensors.index.json: text files of a few KB
MAX_HEADER_BYTES = 100 * MIB  # safetensors' own limit on a header
WEIGHT_DTYPES = ("F64", "F32", "F16", "BF16")


def _read_json(path: Path) -> object:
    """A checkpoint's JSON file: a regular file within MAX_CONFIG_BYTES (checked before it is
    opened), UTF-8, one JSON value; one error line naming the file otherwise. NaN and Infinity are
    read as numbers here, so that the typed check names the field that holds them."""
    raw = read_file(path, max_bytes=MAX_CONFIG_BYTES, error=CheckpointError, what="a JSON file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                          source=str(path)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                          source=str(path)) from None
    except (RecursionError, ValueError) as exc:  # nesting, an integer with too many digits
        raise ConfigError(f"is not usable JSON ({short(exc, 100, str)})", source=str(path)) from None


class SafetensorsIndex(msgspec.Struct):
    """model.safetensors.index.json: which file holds each tensor (other keys are ignored)."""

    weight_map: Annotated[dict[str, str], msgspec.Meta(min_length=1)]


def checkpoint_files(root: Path) -> dict[str, Path]:
    """tensor name → file holding it; every file a regular file inside `root` (checked by stat:
    a FIFO or a device named by the index is refused, never opened)."""
    single = root / "model.safetensors"
    index = root / "model.safetensors.index.json"
    if os.path.lexists(index):
        weight_map = convert(_read_json(index), SafetensorsIndex, source=str(index), error=CheckpointError).weight_map
        files = {}
        for tensor, shard in weight_map.items():
            if not shard or Path(shard).name != shard or shard in (".", ".."):
                raise CheckpointError(f"names {short(shard)} for tensor {short(tensor)}: a shard must be a file "
                                      "name in the checkpoint directory", source=str(index), field="weight_map")
            path = root / shard
            if not os.path.lexists(path):
                raise CheckpointError(f"shard {shard!r} (holding tensor {tensor!r}) is missing", source=str(index))
            files[tensor] = path
        for path in set(files.values()):
            check_file(path, error=CheckpointError, what="a safetensors file")
        return files
    if os.path.lexists(single):
        check_file(single, error=CheckpointError, what="a safetensors file")
        return {k: single for k in safetensors_header(single)}
    raise CheckpointError("holds neither model.safetensors nor model.safetensors.index.json", source=str(root))


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensor entries of a safetensors file's header ({name: {"dtype", "shape", ...}}), read with
    bounds — the 8-byte length, then at most that many bytes (≤ MAX_HEADER_BYTES and within the
    file) — from a regular file checked before it is opened; CheckpointError otherwise."""
    with open_file(path, error=CheckpointError, what="a safetensors file") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError("cannot be read as safetensors (its header length is invalid)", source=str(path))
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot be read as safetensors (header: {short(exc, 100, str)})",
                              source=str(path)) from None
    if not isinstance(header, dict) or not all(isinstance(v, dict) for k, v in header.items() if k != "__metadata__"):
        raise CheckpointError("cannot be read as safetensors (its header is not a map of tensors)", source=str(path))
    return {k: v for k, v in header.items() if k != "__metadata__"}


def read_config(root: Path) -> ModelConfig:
    path = root / "config.json"
    if not os.path.lexists(path):
        raise CheckpointError("config.json is missing", source=str(root))
    return from_hf_config(_read_json(path), source=str(path), name=root.name)


def _strip(name: str, prefixes: tuple[str, ...]) -> str | None:
    for p in prefixes:
        if name.startswith(p):
            return name[len(p):]
    return None


class Tensors(dict):
    """A state dict that remembers which file each tensor came from (for error messages)."""

    def __init__(self):
        super().__init__()
        self.origin: dict[str, str] = {}

    def put(self, key: str, value: torch.Tensor, path: Path) -> None:
        self[key] = value
        self.origin[key] = str(path)


def load_state_dicts(root: Path, files: dict[str, Path]) -> tuple[Tensors, Tensors]:
    """Read every tensor once: (text backbone state dict, vision tower state dict). Every weight must
    be floating point (its dtype read from the header, before the tensor) and finite: a NaN or an
    infinity in a weight makes every score NaN, so it is refused here naming the tensor and file."""
    by_file: dict[Path, list[str]] = {}
    for tensor, path in files.items():
        by_file.setdefault(path, []).append(tensor)
    text, vision = Tensors(), Tensors()
    for path, names in by_file.items():
        header = safetensors_header(path)
        for name in names:
            if name.startswith(_SKIPPED_PREFIXES):
                continue
            if name not in header:
                raise CheckpointError(f"tensor {name!r} listed in the index is not in the file", source=str(path))
            dtype = header[name].get("dtype")
            if dtype not in WEIGHT_DTYPES:
                raise CheckpointError(f"tensor {name!r} is {short(dtype, convert=str)}; weights must be floating point "
                                      f"({', '.join(WEIGHT_DTYPES)})", source=str(path))
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in names:
                    if name.startswith(_SKIPPED_PREFIXES):
                        continue
                    t = f.get_tensor(name)
                    if not bool(torch.isfinite(t).all()):
                        raise CheckpointError(f"tensor {name!r} holds non-finite values (NaN or infinite)",
                                              source=str(path))
                    v = _strip(name, _VISION_PREFIXES)
                    if v is not None:
                        vision.put(v, t, path)
                        continue
                    s = _strip(name, _TEXT_PREFIXES)
                    text.put(name if s is None else s, t, path)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"cannot be read as safetensors ({short(exc, 200, str)})", source=str(path)) from None
    return text, vision


def assign_weights(module: nn.Module, tensors: Tensors, *, source: str, what: str) -> None:
    """Check names and shapes against `module`, then assign (meta-device modules become real)."""
    expected = dict(module.state_dict(keep_vars=True))
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise CheckpointError(f"{what} tensor {missing[0]!r} is missing ({len(missing)} missing in all)", source=source)
    unexpected = [k for k in tensors if k not in expected]
    if unexpected:
        k = unexpected[0]
        raise CheckpointError(f"unexpected {what} tensor {k!r} ({len(unexpected)} in all)",
                              source=tensors.origin.get(k, source))
    for k, p in expected.items():
        if tuple(tensors[k].shape) != tuple(p.shape):
            raise CheckpointError(
                f"{what} tensor {k!r} has shape {tuple(tensors[k].shape)} but the config expects {tuple(p.shape)}",
                source=tensors.origin.get(k, source),
            )
    module.load_state_dict(dict(tensors), strict=True, assign=True)
