"""The Python API: `dohnuts.load(...)` → a runtime `Session`; `model.predict(requests)`.

    import dohnuts
    model = dohnuts.load("qwen3.5-2b")            # a preset, or a HF Qwen3.5 checkpoint directory
    results = model.predict(requests)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import safe_open

from dohnuts.adapters import load_adapter
from dohnuts.errors import DohnutsError
from dohnuts.model.build import build_text_backbone, resolve_source
from dohnuts.model.checkpoint import MAX_HEADER_BYTES, checkpoint_files
from dohnuts.model.lora import LoRAConfig
from dohnuts.model.scorer import ScoringModel
from dohnuts.model.vision import build_vision_tower
from dohnuts.runtime.policy import PRODUCT, ExecutionPolicy
from dohnuts.runtime.session import Session
from dohnuts.runtime.tokenizer import check_vocabulary, tokenizer_for


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """BF16 weights on accelerators, FP32 on the CPU (where BF16 matmuls are slow and inexact)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def check_device(spec: str | None) -> str | None:
    """A `--device` argument checked before anything is built: cpu, cuda or cuda:N of a visible GPU;
    anything else (tpu, foo:bar, cuda on a torch without CUDA) is one DohnutsError line."""
    if spec is None:
        return None
    where = f"--device {spec}"
    try:
        dev = torch.device(spec)
    except (RuntimeError, ValueError):
        raise DohnutsError("is not a device (use cpu, cuda or cuda:N)", source=where) from None
    if dev.type == "cpu":
        return spec
    if dev.type != "cuda":
        raise DohnutsError(f"device type '{dev.type}' is not supported (use cpu, cuda or cuda:N)", source=where)
    if not torch.cuda.is_available():
        raise DohnutsError("CUDA is not available (this torch has no CUDA, or no GPU is visible); use --device cpu",
                           source=where)
    n = torch.cuda.device_count()
    if dev.index is not None and dev.index >= n:
        raise DohnutsError(f"only {n} CUDA device(s) are visible (cuda:0 to cuda:{n - 1})", source=where)
    return spec


def _weights_fingerprint(root: Path) -> str:
    """A cheap identity of a checkpoint's weights: the safetensors headers of the files that hold the
    model (those the index names, or model.safetensors; any other file is not read) + every 1-D
    tensor's bytes."""
    h = hashlib.sha256()
    for f in sorted(set(checkpoint_files(root).values())):
        with open(f, "rb") as fh:  # a regular file (checkpoint_files checked it) with a valid header length
            n = int.from_bytes(fh.read(8), "little")
            h.update(fh.read(min(n, MAX_HEADER_BYTES)))
        with safe_open(str(f), framework="pt") as st:
            for k in sorted(st.keys()):
                t = st.get_slice(k)
                if len(t.get_shape()) == 1:
                    h.update(st.get_tensor(k).float().numpy().tobytes())
    return h.hexdigest()[:16]


def load(source: str | Path = "tiny", *, adapter: str | Path | None = None, lora: LoRAConfig | None = None,
         merge: bool = False, device: str | torch.device | None = None, dtype: torch.dtype | None = None,
         seed: int = 0, max_len: int = 8192, _policy: ExecutionPolicy = PRODUCT) -> Session:
    """A scoring session from a preset name or a checkpoint directory.

    `adapter` loads a saved LoRA + head file (verified against this base); with `merge` its
    adapters are then folded into the base (deployment: no adapter cost). `lora` attaches fresh
    adapters for training. Without either the model scores with its (random) head. A preset has
    seeded random weights: its scores mean nothing until it is trained.

    The session runs the one execution policy (dohnuts.runtime.policy); `_policy` is internal,
    for the benchmark's measurement-only variants and tests.
    """
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    cfg, ckpt = resolve_source(source)
    if device.type == "cuda":  # the recorded kernels compile on threads while the model is built
        # Triton: on a GPU only
        from dohnuts.ops._precompile import precompile

        precompile(device)
    tokenizer = tokenizer_for(cfg, ckpt)
    check_vocabulary(cfg, tokenizer, ckpt)  # before any weight is read: an id past the embedding is refused now
    backbone, vision_tensors = build_text_backbone(cfg, device=device, dtype=dtype, seed=seed, checkpoint_dir=ckpt)
    # Preset weights are drawn on the device (dohnuts.model.checkpoint.init_weights): the identity
    # says which kind of device drew them.
    weights = f"preset:{cfg.name}:seed{seed}:{device.type}" if ckpt is None else f"checkpoint:{_weights_fingerprint(ckpt)}"
    visual = _build_visual(cfg, vision_tensors, ckpt, device=device, dtype=dtype, seed=seed)
    model = ScoringModel(cfg, backbone, visual=visual)
    gen = torch.Generator().manual_seed(seed + 1)  # the head is tiny: drawn on the CPU, same on every device
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=gen) * cfg.text.hidden_size ** -0.5)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    session = Session(model, tokenizer=tokenizer,
                      base_identity={"config_hash": cfg.config_hash(), "weights": weights}, max_len=max_len,
                      _policy=_policy)
    if adapter is not None:

        load_adapter(session, adapter)
        if merge:
            session.merge_lora()
    elif lora is not None:
        session.attach_lora(lora)
    return session


def _build_visual(cfg, vision_tensors, ckpt, *, device, dtype, seed):
    """The vision tower when the config has one (seeded, or from the checkpoint's tensors)."""
    if cfg.vision is None:
        return None

    if ckpt is not None and not vision_tensors:
        return None  # a text-only checkpoint: requests with images are refused clearly
    return build_vision_tower(cfg.vision, tensors=vision_tensors if ckpt is not None else None, seed=seed + 7,
                              device=device, dtype=dtype, source=str(ckpt) if ckpt else "<vision tower>")
