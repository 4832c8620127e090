"""The one place that imports flash-linear-attention (fla) and Triton.

fla is imported lazily, on the first fused call on a CUDA device: importing dohnuts costs
nothing, and CPU-only machines never import Triton.

Hopper note (fla issue #640, see docs/known-issues.md KI-1): fla 0.6.0 refuses the gated
delta rule's backward kernel `chunk_bwd_dqkwg` on Hopper GPUs with Triton in [3.4, 3.7.1),
because that Triton miscompiles it at block size BK=64. Qwen3.5's key head dim is 128, for
which Hopper selects BK=128; fla's guard does not distinguish the two. We lift the guard only
for head dims whose block size is 128 on Hopper, and only because our own GPU gradient-parity
tests (tests/gpu/test_ops.py::test_gated_delta_rule_grad_parity_qwen_sizes,
tests/gpu/test_delta_rule.py::test_delta_rule_gradients_qwen_sizes) compare that exact backward
against an FP32 reference on every GPU test run. dohnuts.ops.delta_rule.ChunkedDeltaRule checks
the head dim in its forward when a backward will follow: for any other head dim it raises. The
lift is announced once on stderr; it is never silent.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
import types
from types import SimpleNamespace


# fla's two umbrella packages: each one's __init__ imports every op or module fla has, most of what a
# plain `from fla.ops.gated_delta_rule import ...` would load (the ledger, M39, has the counts).
DEFERRED_PACKAGES = ("fla.ops", "fla.modules")


class _DeferredPackage(types.ModuleType):
    """A package of fla whose own __init__ has not run yet: its submodules import as usual (the
    import system needs only its `__path__`), and the first name asked of it that a submodule
    import has not set — `from fla.modules import FusedRMSNormGated`, `fla.ops.__all__`, `dir()` —
    runs the real __init__ in this same module object, which from then on is an ordinary module. (A
    bare `import fla.ops` asks the package for nothing: its __init__ waits for the first name.)"""

    _lock = threading.RLock()

    def _complete(self) -> None:
        with _DeferredPackage._lock:
            if type(self) is _DeferredPackage:  # not completed by another thread meanwhile
                self.__class__ = types.ModuleType
                try:
                    self.__spec__.loader.exec_module(self)
                except BaseException:
                    self.__class__ = _DeferredPackage  # as it was: the next use tries again
                    raise

    def __getattr__(self, name: str):
        self._complete()
        return getattr(self, name)  # an ordinary module now (its own module-level __getattr__ included)

    def __dir__(self):
        self._complete()
        return dir(self)


def defer_package_inits(root: str = "fla", names: tuple[str, ...] = DEFERRED_PACKAGES) -> None:
    """Put a `_DeferredPackage` in `sys.modules` for each of `names` (packages under `root`) not
    yet imported. `root` itself is imported as usual (fla's own __init__ imports fla.layers and
    fla.models where flash-linear-attention installed them)."""
    importlib.import_module(root)
    for name in names:
        if name in sys.modules:
            continue  # imported already (by the user, or another library): nothing to save
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            continue  # not a package here: the imports below say what is missing
        package = _DeferredPackage(name)
        package.__spec__, package.__loader__, package.__package__ = spec, spec.loader, name
        package.__file__, package.__path__ = spec.origin, list(spec.submodule_search_locations)
        sys.modules[name] = package
        head, _, tail = name.rpartition(".")
        setattr(sys.modules[head], tail, package)


@functools.cache
def fla() -> SimpleNamespace:
    """The fla entry points dohnuts uses (imported on first use).

    Only the modules these names live in are imported: fla.ops and fla.modules are left deferred
    (`_DeferredPackage`), so the process does not import the ops dohnuts never calls."""
    defer_package_inits()
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    from fla.modules.causal_conv1d import causal_conv1d
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.modules.norm.layernorm import rms_norm
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    # the steps of chunk_gated_delta_rule's forward and backward, for dohnuts' own autograd Function
    # (dohnuts.ops.delta_rule.ChunkedDeltaRule: dohnuts' forward kernels, fla's backward)
    from fla.modules.norm.l2norm import l2norm_bwd, l2norm_fwd
    from fla.ops.common.chunk_delta_h import (
        chunk_gated_delta_rule_bwd_dhu,
        chunk_gated_delta_rule_fwd_h,
        chunk_gated_delta_rule_fwd_kernel_h_blockdim64,
    )
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg, chunk_bwd_dv_local, chunk_fwd_kernel_o, chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import (
        chunk_gated_delta_rule_fwd_intra,
        chunk_gated_delta_rule_fwd_kkt_solve_kernel,
    )
    from fla.ops.gated_delta_rule.wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd
    from fla.ops.utils.constant import RCP_LN2

    return SimpleNamespace(**locals())  # every name imported above, as itself


@functools.cache
def hopper_backward_hazard() -> bool:
    """Whether this machine has the #640 hazard (Hopper GPU and Triton in [3.4, 3.7.1)).

    Read once, before any lift, from fla's own flags."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    import fla.ops.common.chunk_o as chunk_o

    return bool(chunk_o.IS_NVIDIA_HOPPER and chunk_o.TRITON_ABOVE_3_4_0 and not chunk_o.TRITON_ABOVE_3_7_1)


@functools.cache
def allow_hopper_backward_for_bk128() -> None:
    """Lift fla's #640 guard once (see module docstring); callers check the head dim first."""
    # Triton and fla: on a GPU only (the CPU runs the reference path without them)
    import fla.ops.common.chunk_o as chunk_o
    import triton

    if not hopper_backward_hazard():
        return
    chunk_o.TRITON_ABOVE_3_7_1 = True  # the guard reads this module global at call time
    print(
        "dohnuts: lifting fla's Hopper guard (fla #640) on the gated delta-rule backward for key head "
        f"dims with block size BK=128, Triton {triton.__version__}; proven by the GPU gradient-parity "
        "test, see docs/known-issues.md KI-1",
        file=sys.stderr,
    )
