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
from pathlib import Path

import torch
from torch import nn

from dohnuts.config import ModelConfig
from dohnuts.hf_config import from_hf_config
from dohnuts.errors import CheckpointError, ConfigError

_TEXT_PREFIXES = ("model.language_model.", "language_model.", "model.")
_VISION_PREFIXES = ("model.visual.", "visual.")
_SKIPPED_PREFIXES = ("lm_head.", "mtp.", "model.mtp.")


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


def _read_index(root: Path) -> dict[str, Path]:
    """tensor name → file holding it."""
    single = root / "model.safetensors"
    index = root / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"is not a safetensors index ({exc})", source=str(index)) from None
        files = {}
        for tensor, shard in weight_map.items():
            path = root / shard
            if not path.exists():
                raise CheckpointError(f"shard {shard!r} (holding tensor {tensor!r}) is missing", source=str(index))
            files[tensor] = path
        return files
    if single.exists():
        from safetensors import safe_open

        try:
            with safe_open(single, framework="pt") as f:
                return {k: single for k in f.keys()}
        except Exception as exc:  # safetensors raises several error types for corrupt headers
            raise CheckpointError(f"cannot be read as safetensors ({exc})", source=str(single)) from None
    raise CheckpointError("holds neither model.safetensors nor model.safetensors.index.json", source=str(root))


def read_config(root: Path) -> ModelConfig:
    path = root / "config.json"
    if not path.exists():
        raise CheckpointError("config.json is missing", source=str(root))
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"is not valid JSON ({exc})", source=str(path)) from None
    return from_hf_config(data, source=str(path), name=root.name)


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
    """Read every tensor once: (text backbone state dict, vision tower state dict)."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for tensor, path in files.items():
        by_file.setdefault(path, []).append(tensor)
    text, vision = Tensors(), Tensors()
    for path, names in by_file.items():
        try:
            with safe_open(path, framework="pt") as f:
                available = set(f.keys())
                for name in names:
                    if name.startswith(_SKIPPED_PREFIXES):
                        continue
                    if name not in available:
                        raise CheckpointError(f"tensor {name!r} listed in the index is not in the file", source=str(path))
                    v = _strip(name, _VISION_PREFIXES)
                    if v is not None:
                        vision.put(v, f.get_tensor(name), path)
                        continue
                    t = _strip(name, _TEXT_PREFIXES)
                    text.put(name if t is None else t, f.get_tensor(name), path)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"cannot be read as safetensors ({exc})", source=str(path)) from None
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
