"""How an op chooses its path: the device decides; tests may ask for the reference explicitly.

GPU tensors take the fused path (fla / Triton / SDPA-flash) when their device runs the fused
kernels; everything else takes the plain-torch reference path with the same signature.

Whether a GPU runs the fused kernels is decided once per device, at the first fused call on it
(`DeviceKernels`, the one cache the design names here): fla's entry points must import and a tiny
Triton kernel with a BF16 `tl.dot` must compile, run and match torch (`probe_fused_kernels`). That
is what fails on a GPU this project has no kernels for — a Triton without a backend for the
architecture, a fla that does not import there. Such a device is marked reference-only: every op
on it takes its reference path, and one line on stderr says so, once per device; results stay
correct, nothing crashes. It is the device deciding, not a switch. A device whose probe passes
runs the fused paths, and a kernel failing there later fails loudly (the CI compile checks,
tests/ops/test_kernels_compile.py, catch that for sm_90 and gfx1100 before a GPU does). The first
fused call of a process also seeds Triton's cache from the tuned-configuration table
(dohnuts.ops._tuned).

`reference()` is the one explicit switch, private to the parity tooling (the tests, the bench's
FP32 reference check, the benchmarks; `dohnuts.ops` does not export it): inside the block every op
runs its plain-torch reference, on any device, to compare fused and reference paths on the same
tensors. The runtime never uses it. It is a context variable, so it applies to the thread (and
async task) that entered it and nowhere else.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from dohnuts.ops._fla import fla
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


def in_reference() -> bool:
    """Whether this code runs inside `reference()` (every op on its plain-torch path)."""
    return _REFERENCE.get()


def probe_fused_kernels(device: torch.device) -> None:
    """Raise when `device` cannot run the fused paths: fla's entry points must import, and a 16 × 16
    BF16 `tl.dot` kernel must compile for the device, run, and match torch's matmul."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from dohnuts.ops._probe_kernel import dot16_triton

    if device.type != "cuda":
        raise RuntimeError(f"{device} is not a GPU")
    fla()  # fla's ops import (and pick their kernels) for this platform
    # the first fused call may come under a caller's autocast or autograd (a training step): the
    # probe's own arithmetic must not follow them (under autocast its FP32 check would be BF16)
    with torch.cuda.device(device), torch.autocast(device.type, enabled=False), torch.no_grad():
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(16, 16, device=device, generator=gen).to(torch.bfloat16)
        b = torch.randn(16, 16, device=device, generator=gen).to(torch.bfloat16)
        out = dot16_triton(a, b)
        ref = a.float() @ b.float()
        if not torch.allclose(out, ref, rtol=1e-2, atol=1e-2):
            raise RuntimeError(f"a probe kernel ran but computed wrong results (max error "
                               f"{(out - ref).abs().max().item():.3g})")


class DeviceKernels:
    """Per device, whether the fused kernels run there: `probe(device)` once (raises when not),
    the verdict kept for the process. A failed probe prints one line on stderr."""

    def __init__(self, probe: Callable[[torch.device], None] = probe_fused_kernels):
        self._probe = probe
        self._verdicts: dict[tuple[str, int | None], str | None] = {}  # device → None (fused) or why not
        self._lock = threading.Lock()

    @staticmethod
    def _key(device: torch.device) -> tuple[str, int | None]:
        index = device.index
        if device.type == "cuda" and index is None and torch.cuda.is_available():
            index = torch.cuda.current_device()
        return device.type, index

    def fused(self, device: torch.device) -> bool:
        """Whether ops on `device` take their fused paths (probing it on first use)."""
        key = self._key(device)
        if key not in self._verdicts:
            if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return True  # no probe inside a graph capture; the eager pass before it decided already
            with self._lock:
                if key not in self._verdicts:
                    self._verdicts[key] = self._decide(device)
        return self._verdicts[key] is None

    def status(self, device: torch.device) -> str:
        """`fused`, or `reference (why)` — probing the device if no op has yet."""
        self.fused(device)
        reason = self._verdicts[self._key(device)]
        return "fused" if reason is None else f"reference ({reason})"

    def _decide(self, device: torch.device) -> str | None:
        try:
            self._probe(device)
        except Exception as exc:  # whatever the platform raises: the device is reference-only
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())
            reason = reason if len(reason) <= 240 else reason[:239] + "…"
            print(f"dohnuts: {_describe(device)} has no working fused kernels ({reason}); every op runs its "
                  "plain-torch reference path there", file=sys.stderr)
            return reason
        return None


def _describe(device: torch.device) -> str:
    try:
        props = torch.cuda.get_device_properties(device)
        arch = getattr(props, "gcnArchName", None) or f"sm_{props.major}{props.minor}"
        return f"{device} ({props.name}, {arch})"
    except Exception:
        return str(device)


_KERNELS = DeviceKernels()


def kernel_status(device: torch.device) -> str:
    """How ops run on `device`: `fused`, or `reference (why)` for a GPU without working kernels;
    `reference` on a CPU."""
    if device.type != "cuda":
        return "reference"
    return _KERNELS.status(device)


def use_fused(x: torch.Tensor) -> bool:
    if x.is_cuda and not _REFERENCE.get() and _KERNELS.fused(x.device):
        seed()  # once a process, before the first tuned kernel: the tuned-configuration table
        return True
    return False


def recording(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records an op on these tensors (None entries ignored). The inference-only
    kernels (no backward) run only where it does not; training keeps the differentiable paths."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
