"""Every hand-written Triton kernel, and the fla kernels the runtime calls, compile for the H200
(sm_90) and for the RX 7900 XTX (gfx1100, wave 32) — on the CPU, in CI.

Triton's interpreter (tests/ops/test_ops.py) checks what a kernel computes, but it does not type-check
the way the compiler does: a variable redefined with another shape inside an `if` runs in the
interpreter and fails to compile (it cost a device call on 2026-11-30). Triton's wheel carries both
back ends — ptxas for NVIDIA, LLVM's AMDGPU target and linker for AMD — so the whole pipeline
(Python AST → TTIR → TTGIR → LLVM IR → PTX and cubin, or AMDGCN and hsaco) runs here without a GPU.

What it proves: the kernels are valid Triton for both architectures at the configurations the
runtime launches — every flag combination and every autotuning configuration of the project's
kernels at Qwen3.5-2b's sizes (the slow lane), the most used one of each (the fast lane); fla's
kernels along the exact calls dohnuts makes (inference steps, and training's forward and backward),
each autotuner at its first configuration (tests/ops/triton_offline.py). A kernel that stops
compiling for either target fails the build.

What it cannot prove: nothing runs. It says nothing about results on the device (a miscompile that
compiles — fla #640 on Hopper — passes here), nothing about speed, registers spilled or occupancy,
and nothing about configurations chosen on the device: an autotuner picks by timing there, and fla
picks some of its config lists at import from the device it finds (here: a CPU, so its
small-memory lists). The AMD path has never run: the first run on the card (docs/gpu.md, "ROCm (AMD)")
is what proves it.

Time (2 CPU cores, Triton's cache empty / warm): the fast lane about 25 s / 2 s; the slow lane
(`-m slow`) a few minutes / seconds. Triton's cache (TRITON_CACHE_DIR) keeps every compiled kernel:
a kernel whose source changed compiles again, so a warm cache proves as much as a cold one.
"""

from __future__ import annotations

import os
import sys

import pytest

# Compile as the lent H200's Triton 3.6 does by default (FP fusion on); Triton 3.9 here warns that
# its default will change.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

triton = pytest.importorskip("triton")

from tests.ops.triton_offline import TARGETS, compile_kernel, flags, offline_launches  # noqa: E402

BF16, FP32, I32 = "*bf16", "*fp32", "i32"  # what the runtime passes: BF16 tensors, FP32 states, ints < 2³¹


def _types(kernel, pointers: dict[str, str], floats=("eps", "offset", "scale")) -> dict[str, str]:
    """Every argument of `kernel` typed: the given pointers, FP32 floats, i32 for the rest."""
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    return {n: pointers.get(n, "fp32" if n in floats else I32) for n in fn.arg_names}


def _bf16(*names) -> dict[str, str]:
    return dict.fromkeys(names, BF16)


# --- the project's kernels, at their configurations ----------------------------------------------

def _conv(target, flag, config):
    from dohnuts.ops._conv_kernel import _conv_kernel

    types = _types(_conv_kernel, _bf16("X", "Wt", "Y", "S0", "ST"))
    kernel = compile_kernel(_conv_kernel, target, dict(D=128, W=4, HP=4, BT=config.kwargs["BT"], **flag), types,
                            num_warps=config.num_warps)
    assert kernel.metadata.name == "_conv_kernel"


def _conv_shared(target, config):
    from dohnuts.ops._conv_kernel import _conv_shared_kernel

    types = _types(_conv_shared_kernel, _bf16("X", "Wt", "Y"))
    kernel = compile_kernel(_conv_shared_kernel, target, dict(D=128, W=4, NORM=True, BT=config.kwargs["BT"]), types,
                            num_warps=config.num_warps)
    assert kernel.metadata.name == "_conv_shared_kernel"


def _delta_h(target, flag, config, sizes=dict(H=16, HV=16, K=128, V=128)):
    from dohnuts.ops._delta_h_kernel import _delta_h_kernel

    types = _types(_delta_h_kernel, _bf16("q", "k", "v", "w", "v_new", "h", "o")
                   | dict.fromkeys(("g", "beta", "h0", "ht"), FP32))
    kernel = compile_kernel(_delta_h_kernel, target, dict(BT=64, BV=config.kwargs["BV"], **sizes, **flag), types,
                            num_warps=config.num_warps, num_stages=config.num_stages)
    assert kernel.metadata.name == "_delta_h_kernel"


def _delta_flags(fuse_o: bool, fuse_wu: bool, s0: bool = True, st: bool = True) -> dict:
    return dict(USE_INITIAL_STATE=s0, STORE_FINAL_STATE=st, FUSE_O=fuse_o, FUSE_WU=fuse_wu)


@pytest.mark.parametrize("target", TARGETS)
def test_small_kernels_compile(target):
    """Norms (the vision tower's LayerNorm too), the tower's attention, rotary, gate, SwiGLU, copies,
    the Gated DeltaNet gates, a PNG's unfilter, the device probe and the FP32 multiply-add microbenchmark, at the
    blocks and warps the runtime launches them with (2b: hidden 2048, 8 query heads of 256, 16
    value heads; the tower 1024 wide)."""
    from dohnuts.ops._copy_kernel import _copy4d_kernel
    from dohnuts.ops._fma_kernel import _fma_chain_kernel
    from dohnuts.ops._gate_kernel import _gate_kernel
    from dohnuts.ops._gdn_gates_kernel import _gdn_gates_kernel, _gdn_gates_varlen_kernel
    from dohnuts.ops._layer_norm_kernel import _layer_norm_kernel
    from dohnuts.ops._norm_kernels import _norm_rope_kernel, _rms_norm_kernel
    from dohnuts.ops._probe_kernel import _dot16_kernel
    from dohnuts.ops._segment_attention_kernel import BLOCK_M as SA_BLOCK_M
    from dohnuts.ops._segment_attention_kernel import BLOCK_N as SA_BLOCK_N
    from dohnuts.ops._segment_attention_kernel import STAGES as SA_STAGES
    from dohnuts.ops._segment_attention_kernel import WARPS as SA_WARPS
    from dohnuts.ops._segment_attention_kernel import _segment_attention_kernel
    from dohnuts.ops._swiglu_kernel import BLOCK, swiglu_packed_kernel
    from dohnuts.ops._unfilter_kernel import ROWS, _unfilter_kernel
    from dohnuts.ops._unfilter_kernel import warps as unfilter_warps

    t = TARGETS[target]
    for has_res in (True, False):
        compile_kernel(_rms_norm_kernel, t, dict(HAS_RES=has_res, BLOCK=2048),
                       _types(_rms_norm_kernel, _bf16("X", "R", "W", "Y", "RO")), num_warps=8)
    for has_res in (True, False):  # the vision tower's (1024 wide)
        compile_kernel(_layer_norm_kernel, t, dict(HAS_RES=has_res, BLOCK=1024),
                       _types(_layer_norm_kernel, _bf16("X", "R", "W", "B", "Y", "RO")), num_warps=4)
    for even in (True, False):  # the tower's attention: 16 heads of 64, 784 patches (a partial key block)
        compile_kernel(_segment_attention_kernel, t,
                       dict(D=64, BLOCK_M=SA_BLOCK_M, BLOCK_N=SA_BLOCK_N, EVEN=even),
                       _types(_segment_attention_kernel, _bf16("Q", "K", "V", "O")), num_warps=SA_WARPS,
                       num_stages=SA_STAGES)
    compile_kernel(_norm_rope_kernel, t, dict(BLOCK_H=8, BLOCK_D=256),
                   _types(_norm_rope_kernel, _bf16("X", "W", "COS", "SIN", "Y")), num_warps=4)
    compile_kernel(_gate_kernel, t, dict(BLOCK_H=8, BLOCK_D=256), _types(_gate_kernel, _bf16("O", "G", "Y")))
    compile_kernel(swiglu_packed_kernel, t, dict(BLOCK=BLOCK), _types(swiglu_packed_kernel, _bf16("gu", "y")))
    compile_kernel(_copy4d_kernel, t, dict(BR=16, BC=256), _types(_copy4d_kernel, _bf16("SRC", "DST")))
    compile_kernel(_copy4d_kernel, t, dict(BR=32, BC=128),
                   _types(_copy4d_kernel, dict.fromkeys(("SRC", "DST"), FP32)))
    gates = _bf16("A", "Bl", "A_log", "dt_bias") | dict.fromkeys(("G", "BETA"), FP32)
    for bh in (16, 32):
        kernel = compile_kernel(_gdn_gates_kernel, t, dict(BH=bh, BT=64), _types(_gdn_gates_kernel, gates))
        assert kernel.metadata.name == "_gdn_gates_kernel"
    # a shared pass's one launch over its prefix's and suffixes' chunks
    varlen = compile_kernel(_gdn_gates_varlen_kernel, t, dict(BH=16, BT=64), _types(
        _gdn_gates_varlen_kernel, gates | dict.fromkeys(("cu_seqlens", "chunk_indices"), "*i32")))
    assert varlen.metadata.name == "_gdn_gates_varlen_kernel"
    fma = compile_kernel(_fma_chain_kernel, t, dict(ITERS=256, BLOCK=1024), {"X": FP32, "Y": FP32, "N": I32},
                         num_warps=8)  # the FP32 vector microbenchmark (dohnuts.ops.fma), as microbench launches it
    assert fma.metadata.name == "_fma_chain_kernel"
    for rows in (448, 1024):  # a 448² image, and the tallest the kernel takes
        unfilter = compile_kernel(_unfilter_kernel, t, dict(BLOCK_T=triton.next_power_of_2(triton.cdiv(rows, ROWS))),
                                  _types(_unfilter_kernel, {"F": "*u8", "P": "*u8"}), num_warps=unfilter_warps(rows))
        assert unfilter.metadata.name == "_unfilter_kernel"
    probe = compile_kernel(_dot16_kernel, t, dict(N=16), {"A": BF16, "B": BF16, "C": FP32}, num_warps=1)
    assert probe.metadata.target == t
    assert set(probe.asm) >= ({"ptx", "cubin"} if t.backend == "cuda" else {"amdgcn", "hsaco"})


@pytest.mark.parametrize("target", TARGETS)
def test_backward_kernels_compile(target):
    """The backward kernels of the differentiable norms, norm + rotary, output gate and packed
    SwiGLU (training runs them), with every flag, at the 2b sizes and warps they launch with."""
    from dohnuts.ops._gate_kernel import _gate_bwd_kernel
    from dohnuts.ops._norm_kernels import _norm_rope_bwd_kernel, _rms_norm_bwd_kernel
    from dohnuts.ops._swiglu_kernel import BLOCK, swiglu_packed_bwd_kernel

    t = TARGETS[target]
    for flag in flags(HAS_DR=(False, True), HAS_RES=(False, True), STORE_DWP=(False, True)):
        compile_kernel(_rms_norm_bwd_kernel, t, dict(**flag, BLOCK=2048),
                       _types(_rms_norm_bwd_kernel, _bf16("DY", "S", "W", "DX", "DR", "DRES") | {"DWP": FP32}),
                       num_warps=8)
    for dwp in (False, True):
        compile_kernel(_norm_rope_bwd_kernel, t, dict(STORE_DWP=dwp, BLOCK_H=8, BLOCK_D=256),
                       _types(_norm_rope_bwd_kernel, _bf16("DY", "X", "W", "COS", "SIN", "DX") | {"DWP": FP32}),
                       num_warps=4)
    compile_kernel(_gate_bwd_kernel, t, dict(BLOCK_H=8, BLOCK_D=256),
                   _types(_gate_bwd_kernel, _bf16("DY", "O", "G", "DO", "DG")))
    kernel = compile_kernel(swiglu_packed_bwd_kernel, t, dict(BLOCK=BLOCK),
                            _types(swiglu_packed_bwd_kernel, _bf16("gu", "dy", "dgu")))
    assert kernel.metadata.name == "swiglu_packed_bwd_kernel"


@pytest.mark.parametrize("target", TARGETS)
def test_conv_and_delta_h_kernels_compile_at_their_main_config(target):
    """The conv kernel as a stateless pass launches it (q/k normalised, final state kept), the shared
    pass's conv kernel, and the fused delta-rule output kernel from a forked state (every autotuned kernel's first config)."""
    from dohnuts.ops._conv_kernel import _CONFIGS
    from dohnuts.ops._delta_h_kernel import _O_CONFIGS

    _conv(TARGETS[target], dict(NORM=True, HAS_S0=False, STORE_ST=True), _CONFIGS[1])
    _conv_shared(TARGETS[target], _CONFIGS[1])
    _delta_h(TARGETS[target], _delta_flags(fuse_o=True, fuse_wu=True), _O_CONFIGS[0])


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("target", TARGETS)
def test_conv_kernel_compiles_with_every_flag_and_config(target):
    from dohnuts.ops._conv_kernel import _CONFIGS

    for flag in flags(NORM=(True, False), HAS_S0=(True, False), STORE_ST=(True, False)):
        for config in _CONFIGS:  # (tokens per program, warps): the tuner may pick any
            _conv(TARGETS[target], flag, config)
    for config in _CONFIGS:  # a shared pass's conv (q and k normalised, as Gated DeltaNet launches it)
        _conv_shared(TARGETS[target], config)


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("target", TARGETS)
def test_delta_h_kernel_compiles_with_every_flag_and_config(target):
    from dohnuts.ops._delta_h_kernel import _CONFIGS, _O_CONFIGS

    t = TARGETS[target]
    calls = []
    modes = ((False, False, _CONFIGS), (True, False, _O_CONFIGS), (True, True, _O_CONFIGS))
    for fuse_o, fuse_wu, configs in modes:
        for config in configs:  # every config the tuner may pick, with a state in and out
            calls.append((t, _delta_flags(fuse_o, fuse_wu), config))
        for s0, st in ((True, False), (False, True), (False, False)):  # every state flag, per block
            for bv in sorted({c.kwargs["BV"] for c in configs}):
                calls.append((t, _delta_flags(fuse_o, fuse_wu, s0, st), next(c for c in configs if c.kwargs["BV"] == bv)))
    # K ≤ 64: the second block of K is compiled out
    for fuse_wu in (False, True):
        calls.append((t, _delta_flags(True, fuse_wu), _O_CONFIGS[2], dict(H=2, HV=4, K=64, V=64)))
    _in_processes(_delta_h, calls)


def _in_processes(fn, calls: list[tuple]) -> None:
    """fn(*args) for every args, in one process per core (compiling is CPU work that holds the
    GIL: the slow lane's longest compile check, KI-22). A failure is
    raised here, with its own traceback."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    workers = max(1, min(len(calls), os.cpu_count() or 1))
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for future in [pool.submit(fn, *args) for args in calls]:
            future.result()


def _conv_bwd(target, du_flag, dx_flag, du_config, dx_config):
    from dohnuts.ops._conv_bwd_kernel import _BWD_BT, _conv_bwd_du_kernel, _conv_bwd_dx_kernel

    grads = _bf16("X", "Wt", "S0", "DY0", "DY1", "DY2", "DST", "DX", "DU") | dict.fromkeys(("DWP", "DS0"), FP32)
    kernel = compile_kernel(_conv_bwd_du_kernel, target, dict(D=128, W=4, BT=_BWD_BT, **du_flag),
                            _types(_conv_bwd_du_kernel, grads), num_warps=du_config.num_warps)
    assert kernel.metadata.name == "_conv_bwd_du_kernel"
    kernel = compile_kernel(_conv_bwd_dx_kernel, target, dict(D=128, W=4, WP=4, BT=dx_config.kwargs["BT"], **dx_flag),
                            _types(_conv_bwd_dx_kernel, grads), num_warps=dx_config.num_warps)
    assert kernel.metadata.name == "_conv_bwd_dx_kernel"


@pytest.mark.parametrize("target", TARGETS)
def test_conv_and_gates_backward_kernels_compile(target):
    """The backward of the conv kernel (du and the weight's partials; dx and the state's gradient)
    as a training pass launches it — a prefix from no state returning its state, a frozen (LoRA)
    weight — and of the Gated DeltaNet gates, at 2b sizes (every autotuned kernel's first config)."""
    from dohnuts.ops._conv_bwd_kernel import _DU_CONFIGS
    from dohnuts.ops._conv_kernel import _CONFIGS
    from dohnuts.ops._gdn_gates_kernel import _gdn_gates_bwd_kernel

    t = TARGETS[target]
    _conv_bwd(t, dict(NORM=True, HAS_S0=False, STORE_DW=False), dict(HAS_DST=True, STORE_DS0=False), _DU_CONFIGS[0],
              _CONFIGS[1])
    grads = _bf16("A", "Bl", "A_log", "dt_bias", "DA", "DB") | dict.fromkeys(("DG", "DBETA", "DALOG", "DDT"), FP32)
    for bh in (16, 32):
        kernel = compile_kernel(_gdn_gates_bwd_kernel, t, dict(BH=bh, BT=64), _types(_gdn_gates_bwd_kernel, grads))
        assert kernel.metadata.name == "_gdn_gates_bwd_kernel"


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("target", TARGETS)
def test_conv_backward_kernels_compile_with_every_flag_and_config(target):
    from dohnuts.ops._conv_bwd_kernel import _DU_CONFIGS
    from dohnuts.ops._conv_kernel import _CONFIGS

    t = TARGETS[target]
    du_flags = list(flags(NORM=(True, False), HAS_S0=(True, False), STORE_DW=(True, False)))
    dx_flags = list(flags(HAS_DST=(True, False), STORE_DS0=(True, False)))
    for i, du_flag in enumerate(du_flags):  # every flag of each kernel, every config the tuner may pick
        _conv_bwd(t, du_flag, dx_flags[i % len(dx_flags)], _DU_CONFIGS[i % len(_DU_CONFIGS)],
                  _CONFIGS[i % len(_CONFIGS)])
    for i, dx_flag in enumerate(dx_flags):
        _conv_bwd(t, du_flags[i], dx_flag, _DU_CONFIGS[-1], _CONFIGS[-1 - i])


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

    for target in TARGETS.values():
        with pytest.raises(Exception, match="redefines"):
            compile_kernel(bad, target, {"FLAG": True}, {"X": FP32, "T": I32})


# --- fla's kernels, along the calls dohnuts makes ---------------------------------------------------

# The kernels the calls below launch (fla 0.6.0): a new name means fla launches a kernel this test
# does not know (look at it), a missing one that a call stopped launching it.
FLA_INFERENCE = {"layer_norm_gated_fwd_kernel", "l2norm_fwd_kernel", "chunk_gated_delta_rule_fwd_kkt_solve_kernel",
                 "recompute_w_u_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o"}
FLA_TRAINING = {"layer_norm_fwd_kernel_row", "layer_norm_bwd_kernel_row", "layer_norm_gated_fwd_kernel",
                "layer_norm_gated_bwd_kernel", "swiglu_fwd_kernel", "swiglu_fwdbwd_kernel", "causal_conv1d_fwd_kernel",
                "causal_conv1d_states_fwd_kernel", "causal_conv1d_bwd_kernel", "compute_dh0_kernel",
                "l2norm_fwd_kernel", "l2norm_bwd_kernel", "chunk_local_cumsum_scalar_kernel",
                "chunk_gated_delta_rule_fwd_kkt_solve_kernel", "recompute_w_u_fwd_kernel",
                "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o", "chunk_bwd_kernel_dv_local",
                "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64", "chunk_bwd_kernel_dqkwg",
                "prepare_wy_repr_bwd_kernel"}


@pytest.fixture
def fla_entry_points(monkeypatch):
    """dohnuts' door to fla (dohnuts.ops._fla), with fla importable: conftest hides it on a machine
    without a GPU, and every fla module this test imports is forgotten afterwards."""
    from dohnuts.ops import _fla

    before = set(sys.modules)
    monkeypatch.delitem(sys.modules, "fla", raising=False)
    _fla.fla.cache_clear()
    yield _fla.fla()
    _fla.fla.cache_clear()
    for name in set(sys.modules) - before:
        if name == "fla" or name.startswith("fla."):
            del sys.modules[name]


def _fla_inference(f, torch):
    """`dohnuts.ops.delta_rule.ChunkedDeltaRule`'s fla steps and the gated norm, without autograd."""
    from dohnuts.ops.delta_rule import _kkt_solve

    bf = torch.bfloat16
    B, T, H, K, V = 2, 128, 16, 128, 128  # Qwen3.5-2b's linear-attention heads
    with torch.no_grad():
        x, gate, w = torch.randn(B, T, H, V, dtype=bf), torch.randn(B, T, H, V, dtype=bf), torch.randn(V, dtype=bf)
        f.rms_norm_gated(x, gate, w, None, activation="swish", eps=1e-6)
        q, k, v = (torch.randn(B, T, H, d, dtype=bf) for d in (K, K, V))
        g, beta = torch.randn(B, T, H), torch.rand(B, T, H)
        q, k = f.l2norm_fwd(q)[0], f.l2norm_fwd(k)[0]
        _kkt_solve(f, k, g, beta)  # fla's kkt_solve kernel at the one config dohnuts launches
        w_, u, _ = f.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=64)
        h, v_new, _ = f.chunk_gated_delta_rule_fwd_h(k=k, w=w_, u=u, g=g, initial_state=torch.zeros(B, H, K, V),
                                                     output_final_state=True, chunk_size=64)
        f.chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=K ** -0.5, chunk_size=64)


def _fla_training(f, torch):
    """The fla calls of a training microbatch (dohnuts.ops under autograd), forward and backward."""
    from dohnuts.ops.activation import swiglu_fused  # fla's SwiGLU: imported where dohnuts calls it

    bf = torch.bfloat16
    B, T, H, K, V, D, I = 2, 128, 16, 128, 128, 2048, 6144  # noqa: E741 - Qwen3.5-2b
    x, res, w = (torch.randn(*s, dtype=bf, requires_grad=True) for s in ((B, T, D), (B, T, D), (D,)))
    f.rms_norm(x, w.float(), None, eps=1e-6).float().sum().backward()
    y, r = f.rms_norm(x, w.float(), None, residual=res, eps=1e-6, prenorm=True)
    (y.float().sum() + r.float().sum()).backward()
    xg, gg, wg = (torch.randn(*s, dtype=bf, requires_grad=True) for s in ((B, T, H, V), (B, T, H, V), (V,)))
    f.rms_norm_gated(xg, gg, wg, None, activation="swish", eps=1e-6).float().sum().backward()
    up, gate = (torch.randn(B, T, I, dtype=bf, requires_grad=True) for _ in range(2))
    swiglu_fused(gate, up).float().sum().backward()  # fla's SwiGLU, as dohnuts' unpacked path calls it
    xc, wc = torch.randn(B, T, 3 * H * K, dtype=bf, requires_grad=True), torch.randn(3 * H * K, 4, requires_grad=True)
    yc, _ = f.causal_conv1d(xc, wc.to(bf), None, initial_state=torch.randn(B, 3 * H * K, 4, dtype=bf),
                            output_final_state=True, activation="silu")
    yc.float().sum().backward()
    q, k, v = (torch.randn(B, T, H, d, dtype=bf, requires_grad=True) for d in (K, K, V))
    g = torch.randn(B, T, H, requires_grad=True)
    beta = torch.rand(B, T, H, dtype=bf, requires_grad=True)
    o, s = f.chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=torch.zeros(B, H, K, V),
                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    (o.float().sum() + s.sum()).backward()


@pytest.mark.slow
@pytest.mark.parametrize("target", [pytest.param(t, marks=pytest.mark.full) if t == "gfx1100" else t for t in TARGETS])
def test_fla_kernels_compile(target, fla_entry_points):
    import torch

    with offline_launches(target) as inference:
        _fla_inference(fla_entry_points, torch)
    with offline_launches(target) as training:
        _fla_training(fla_entry_points, torch)
    assert inference.names == FLA_INFERENCE
    assert training.names == FLA_TRAINING
