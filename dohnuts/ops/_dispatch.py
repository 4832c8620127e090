"""How an op chooses its path: the device decides; tests may ask for the reference explicitly.

CUDA tensors take the fused path (fla / Triton / SDPA-flash); everything else takes the
plain-torch reference path with the same signature. The first fused call of a process seeds
Triton's cache from the tuned-configuration table (dohnuts.ops._tuned). On a CUDA device without fla installed the
fused path fails loudly rather than falling back silently to a slow reference.

`reference()` is the one explicit switch: inside the block every op runs its plain-torch
reference, on any device. It exists for parity tests and benchmarks (fused vs reference on the
same tensors); the runtime never uses it. It is a context variable, so it applies to the thread
(and async task) that entered it and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from dohnuts.ops._tuned import seed

_REFERENCE: ContextVar[bool] = ContextVar("dohnuts_ops_reference", default=False)


@contextmanager
def reference() -> Iterator[None]:
    """Run every dohnuts op on its plain-torch reference path inside this block."""
    token = _REFERENCE.set(True)
    try:
        yield
    finally:
        _REFERENCE.reset(token)


def use_fused(x: torch.Tensor) -> bool:
    if x.is_cuda and not _REFERENCE.get():
        seed()  # once a process, before the first kernel: the tuned-configuration table (dohnuts.ops._tuned)
        return True
    return False


def recording(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records an op on these tensors (None entries ignored). The inference-only
    kernels (no backward) run only where it does not; training keeps the differentiable paths."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
