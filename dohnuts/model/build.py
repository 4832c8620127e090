"""Where a model comes from: a preset name (seeded random weights) or a checkpoint directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import torch

from dohnuts.config import ModelConfig, preset, preset_aliases, preset_names
from dohnuts.errors import CheckpointError
from dohnuts.model.checkpoint import (
    Tensors, allocate, assign_weights, checkpoint_files, init_weights, load_state_dicts, read_config,
)
from dohnuts.model.text import TextBackbone
from dohnuts.schema import kind_of, stat_path


def resolve_source(source: str | Path) -> tuple[ModelConfig, Path | None]:
    """A preset name or a checkpoint directory → (config, directory or None).

    A directory wins when it holds a config.json; a preset name (`tiny`, `2b`) that also names a
    directory without one in the working directory is the preset (write `./tiny/` for such a
    directory: its missing config.json is then reported)."""
    name, path = str(source), Path(source)
    if isinstance(source, str) and name in (*preset_names(), *preset_aliases()) and \
            not os.path.lexists(path / "config.json"):
        return preset(name, field_name="model"), None
    if "/" not in name and not os.path.lexists(path):  # a name, not a path: the known presets are listed
        return preset(name, field_name="model"), None
    st = stat_path(path, error=CheckpointError)  # a path that cannot be looked up says why (too long, ...)
    if stat.S_ISDIR(st.st_mode):
        return read_config(path), path
    raise CheckpointError(f"is {kind_of(st.st_mode)}, not a preset ({', '.join(preset_names())}) or a checkpoint "
                          "directory", source=name)


def build_text_backbone(cfg: ModelConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                        seed: int = 0, checkpoint_dir: Path | None = None) -> tuple[TextBackbone, Tensors | None]:
    """The backbone with seeded random or checkpoint weights (and the checkpoint's vision tensors)."""
    if checkpoint_dir is None:
        with torch.device("meta"):
            model = TextBackbone(cfg.text).to(dtype=dtype)
        allocate(model, device)  # once, in the final dtype, on the final device
        init_weights(model, seed)
        return model, None
    files = checkpoint_files(checkpoint_dir)
    text, vision = load_state_dicts(checkpoint_dir, files)
    with torch.device("meta"):
        model = TextBackbone(cfg.text)
    assign_weights(model, text, source=str(checkpoint_dir), what="text")
    return model.to(device=device, dtype=dtype), vision
