"""Where a model comes from: a preset name (seeded random weights) or a checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import torch

from dohnuts.config import ModelConfig, preset, preset_names
from dohnuts.errors import CheckpointError
from dohnuts.model.checkpoint import Tensors, _read_index, assign_weights, init_weights, load_state_dicts, read_config
from dohnuts.model.text import TextBackbone


def resolve_source(source: str | Path) -> tuple[ModelConfig, Path | None]:
    """A preset name or a checkpoint directory → (config, directory or None)."""
    path = Path(source)
    if path.is_dir():
        return read_config(path), path
    if isinstance(source, str) and ("/" not in source or not path.suffix):
        try:
            return preset(source, field_name="model"), None
        except Exception:
            if not path.exists() and "/" not in source:
                raise
    raise CheckpointError(f"is neither a preset ({', '.join(preset_names())}) nor a checkpoint directory",
                          source=str(source))


def build_text_backbone(cfg: ModelConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                        seed: int = 0, checkpoint_dir: Path | None = None) -> tuple[TextBackbone, Tensors | None]:
    """The backbone with seeded random or checkpoint weights (and the checkpoint's vision tensors)."""
    if checkpoint_dir is None:
        with torch.device("meta"):
            model = TextBackbone(cfg.text).to(dtype=dtype)
        model.to_empty(device=device)  # allocate once, in the final dtype, on the final device
        init_weights(model, seed)
        return model, None
    files = _read_index(checkpoint_dir)
    text, vision = load_state_dicts(checkpoint_dir, files)
    with torch.device("meta"):
        model = TextBackbone(cfg.text)
    assign_weights(model, text, source=str(checkpoint_dir), what="text")
    return model.to(device=device, dtype=dtype), vision
