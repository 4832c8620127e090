"""Compiling Triton kernels for a GPU this machine does not have (tests/ops/test_kernels_compile.py).

Two ways in, both ending in `triton.compile(..., target=GPUTarget(...))`, which needs no driver:

- `compile_kernel`: one kernel from its source (`ASTSource`) with a signature written out — the
  project's own kernels, whose arguments the tests name.
- `offline_launches(target)`: a context in which Triton believes `target` is the active device
  (an `OfflineDriver`) and every kernel launch only compiles (`JITFunction.run` with
  `warmup=True`), so calling a library's Python entry point on CPU tensors compiles exactly the
  kernels it launches, with the arguments, heuristics and specialisation it computes. An
  autotuner compiles its first configuration (a representative one: which one the tuner picks is
  decided by timing on the device). Used for fla, whose kernels have long argument lists and
  heuristics.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from triton.runtime import driver
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

H200 = GPUTarget("cuda", 90, 32)
RX7900XTX = GPUTarget("hip", "gfx1100", 32)  # RDNA 3, wave 32
TARGETS = {"sm_90": H200, "gfx1100": RX7900XTX}
# What the host code of a library may ask the device (fla: shared memory, multiprocessors).
DEVICE_PROPERTIES = {
    "sm_90": {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32},
    "gfx1100": {"max_shared_mem": 65536, "multiprocessor_count": 96, "max_num_regs": 65536, "warpSize": 32},
}
# Device ids for the offline driver's caches, far from any real device's (JITFunction keeps a binder
# per device id: a real GPU 0 of the same process must never meet an offline target).
_OFFLINE_DEVICE = {"sm_90": 1_000_090, "gfx1100": 1_001_100}


def compile_kernel(kernel, target: GPUTarget, constexprs: dict, types: dict[str, str], *,
                   num_warps: int = 4, num_stages: int | None = None):
    """`kernel` (a JITFunction, or an Autotuner around one) compiled for `target`: `constexprs`
    give the constexpr arguments, `types` the type of each other argument (`*bf16`, `i32`, `fp32`).
    Returns the CompiledKernel; a kernel that does not compile raises."""
    fn = kernel.fn if isinstance(kernel, Autotuner) else kernel  # unwrap the tuner
    missing = [n for n in fn.arg_names if n not in constexprs and n not in types]
    assert not missing, f"{fn.__name__}: no type for {missing}"
    signature = {n: "constexpr" if n in constexprs else types[n] for n in fn.arg_names}
    options = {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=target,
                          options=options)


def flags(**choices):
    """Every combination of the given flag values, as dicts."""
    keys = list(choices)
    for values in itertools.product(*(choices[k] for k in keys)):
        yield dict(zip(keys, values))


class OfflineDriver:
    """The parts of a Triton driver that compiling needs: the target, a device id and a stream
    (never used), and the device properties a library's host code reads."""

    def __init__(self, name: str):
        self.target = TARGETS[name]
        self.device = _OFFLINE_DEVICE[name]
        props = DEVICE_PROPERTIES[name]
        self.utils = type("OfflineUtils", (), {"get_device_properties": staticmethod(lambda i: dict(props))})()

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


@dataclass
class Compiled:
    """The kernels compiled inside `offline_launches`: (kernel name, its constexpr and integer
    arguments, options) in launch order."""

    launches: list = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        return {name for name, _, _ in self.launches}


@contextlib.contextmanager
def offline_launches(name: str):
    """Inside: Triton targets `TARGETS[name]`, and every launch compiles its kernel and returns
    without running anything (the tensors are CPU tensors; their contents stay undefined)."""
    compiled = Compiled()
    run = JITFunction.run
    tuners = [Autotuner, *Autotuner.__subclasses__()]  # fla subclasses it (CachedAutotuner)
    saved = {cls: cls.__dict__.get("run") for cls in tuners}

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        consts = {k: v for k, v in kwargs.items() if isinstance(v, (bool, int)) and k[:1].isupper()}
        opts = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
        compiled.launches.append((self.fn.__name__, consts, opts))
        return kernel

    def first_config(self, *args, **kwargs):  # an autotuner: its first configuration only
        return self.fn.run(*args, **kwargs, **self.configs[0].all_kwargs())

    active = driver._active
    driver.set_active(OfflineDriver(name))
    JITFunction.run = compile_only
    for cls in tuners:
        cls.run = first_config
    try:
        yield compiled
    finally:
        JITFunction.run = run
        for cls, original in saved.items():
            if original is None:
                del cls.run
            else:
                cls.run = original
        driver._active = active
