"""Every hand-written Triton kernel compiles for the H200 (sm_90), on the CPU.

Triton's interpreter (tests/ops/test_ops.py) checks what a kernel computes, but it does not type-check
the way the compiler does: a variable redefined with another shape inside an `if` runs in the
interpreter and fails to compile (it cost a device call on 2026-11-30). Triton's wheel ships
ptxas, so the whole pipeline — Python AST → TTIR → TTGIR → PTX → cubin — runs here without a GPU,
for every combination of each kernel's flags.
"""

from __future__ import annotations

import itertools
import os

import pytest

# Compile as the lent H200's Triton 3.6 does by default (FP fusion on); Triton 3.9 here warns that
# its default will change.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

H200 = GPUTarget("cuda", 90, 32)
POINTERS = {"X", "Wt", "Y", "S0", "ST", "SRC", "DST", "W", "RO", "COS", "SIN", "O", "G", "gu", "y"}  # + per kernel
FLOATS = {"eps", "offset", "scale"}


def _compile(kernel, constexprs: dict, pointers=frozenset(), pointer_dtype: str = "*bf16",
             floats_as: str = "fp32"):
    """`pointers`: more argument names that are pointers (of `pointer_dtype`), or a dict name → type."""
    typed = pointers if isinstance(pointers, dict) else dict.fromkeys(pointers, pointer_dtype)
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel  # unwrap the tuner
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in typed:
            sig[name] = typed[name]
        elif name in POINTERS:
            sig[name] = pointer_dtype
        elif name in FLOATS:
            sig[name] = floats_as
        else:
            sig[name] = "i64"
    missing = [n for n in fn.arg_names if sig[n] == "constexpr" and n not in constexprs]
    assert not missing, missing
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=H200)


def _flags(**choices):
    keys = list(choices)
    for values in itertools.product(*(choices[k] for k in keys)):
        yield dict(zip(keys, values))


def test_conv_kernel_compiles_with_every_flag():
    from dohnuts.ops._conv_kernel import _CONFIGS, _conv_kernel

    blocks = sorted({c.kwargs["BT"] for c in _CONFIGS})
    for flags in _flags(NORM=(True, False), HAS_S0=(True, False), STORE_ST=(True, False), BT=blocks):
        assert _compile(_conv_kernel, dict(D=128, W=4, HP=4, **flags)).metadata.name == "_conv_kernel", flags


def test_norm_gate_swiglu_and_copy_kernels_compile():
    from dohnuts.ops._copy_kernel import _copy4d_kernel
    from dohnuts.ops._gate_kernel import _gate_kernel
    from dohnuts.ops._norm_kernels import _norm_rope_kernel, _rms_norm_kernel
    from dohnuts.ops._swiglu_kernel import BLOCK, swiglu_packed_kernel

    for has_res in (True, False):
        _compile(_rms_norm_kernel, dict(HAS_RES=has_res, BLOCK=2048), pointers=frozenset({"R"}))  # R: residual
    _compile(_norm_rope_kernel, dict(BLOCK_H=8, BLOCK_D=256))  # R: the rotary width
    _compile(_gate_kernel, dict(BLOCK_H=8, BLOCK_D=256))
    _compile(swiglu_packed_kernel, dict(BLOCK=BLOCK))
    _compile(_copy4d_kernel, dict(BR=16, BC=256))
    _compile(_copy4d_kernel, dict(BR=32, BC=128), pointer_dtype="*fp32")


def test_delta_h_kernel_compiles():
    from dohnuts.ops._delta_h_kernel import _CONFIGS, _O_CONFIGS, _delta_h_kernel

    ptr = (dict.fromkeys(("q", "k", "v", "w", "v_new", "h", "o"), "*bf16")
           | dict.fromkeys(("g", "beta", "h0", "ht"), "*fp32"))
    for fuse_o, fuse_wu, configs in ((False, False, _CONFIGS), (True, False, _O_CONFIGS), (True, True, _O_CONFIGS)):
        for bv in sorted({c.kwargs["BV"] for c in configs}):
            for s0, st in ((True, False), (False, True), (True, True), (False, False)):
                flags = dict(H=16, HV=16, K=128, V=128, BT=64, BV=bv, USE_INITIAL_STATE=s0, STORE_FINAL_STATE=st,
                             FUSE_O=fuse_o, FUSE_WU=fuse_wu)
                kernel = _compile(_delta_h_kernel, flags, pointers=ptr)
                assert kernel.metadata.name == "_delta_h_kernel"
    # K ≤ 64: the second block of K is compiled out
    for fuse_wu in (False, True):
        flags = {"H": 2, "HV": 4, "K": 64, "V": 64, "BT": 64, "BV": 32, "USE_INITIAL_STATE": True,
                 "STORE_FINAL_STATE": True, "FUSE_O": True, "FUSE_WU": fuse_wu}
        assert _compile(_delta_h_kernel, flags, pointers=ptr).metadata.name == "_delta_h_kernel"


def test_gdn_gates_kernel_compiles():
    from dohnuts.ops._gdn_gates_kernel import _gdn_gates_kernel

    ptr = dict.fromkeys(("A", "Bl", "A_log", "dt_bias"), "*bf16") | dict.fromkeys(("G", "BETA"), "*fp32")
    for bh in (16, 32):
        kernel = _compile(_gdn_gates_kernel, dict(BH=bh, BT=64), pointers=ptr, floats_as="fp32")
        assert kernel.metadata.name == "_gdn_gates_kernel"


def test_the_compile_check_catches_a_shape_redefined_in_a_branch():
    """The bug the interpreter let through: a name bound to a 2-D block, rebound to a 1-D block
    inside an `if`. The compile check must reject it (or it guards nothing)."""
    import triton.language as tl

    @triton.jit
    def bad(X, T, FLAG: tl.constexpr):
        t = tl.arange(0, 32)[:, None]
        tl.store(X + t, t.to(tl.float32))
        if FLAG:
            if tl.program_id(0) == T:
                t = tl.arange(0, 64)
                tl.store(X + t, t.to(tl.float32))

    with pytest.raises(Exception, match="redefines"):
        triton.compile(ASTSource(fn=bad, signature={"X": "*fp32", "T": "i64", "FLAG": "constexpr"},
                                 constexprs={"FLAG": True}), target=H200)
