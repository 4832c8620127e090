"""Kernel experiments at the text-2b shape (32 × 512 tokens), before a kernel changes in dohnuts.

Each experiment times candidates against what dohnuts runs today, interleaved (A, B, A, B, ...
medians of `triton.testing.do_bench`), and checks the candidate's numbers against the current
path. It answers, on the machine at hand, whether a change is worth making:

- `conv`: the Gated DeltaNet conv kernel (dohnuts/ops/_conv_kernel.py) over its tile configs,
  beside the access pattern's own ceiling (a strided column slice copied to a dense tensor).
- `swiglu_gemm`: the MLP's gate/up GEMM with SwiGLU in its epilogue (a Triton GEMM with two
  accumulators), against cuBLAS's GEMM followed by dohnuts' SwiGLU kernel.
- `addmm`: the residual add in the down/out projection's GEMM epilogue (`addmm_` into the
  residual stream, then a plain RMSNorm), against GEMM then the fused add + RMSNorm kernel.
- `delta_ho`: the delta rule's state recurrence with the chunk outputs computed in the same
  kernel, against fla's state kernel + output kernel, at the workloads' pass shapes.
- `swiglu_inductor`: the gate/up GEMM + SwiGLU compiled by torch.compile (max-autotune, Triton
  templates with the SwiGLU in their epilogue) against cuBLAS + the SwiGLU kernel (not yet run).
- `small_m_gemm`: the 2b projections at a lone prefix's and a suffix's row counts, cuBLAS against
  torch.compile's max-autotune choice (not yet run).
- `conv_parts`: Gated DeltaNet's q, k and v convs in one launch (M21) against one launch a part,
  at the workloads' pass shapes, in CUDA graphs.
- `delta_configs`: each tuning config of the fused delta-rule kernel (FUSE_O, and FUSE_WU) in a
  process of its own, at full and partial last chunks, checked against fla's kernels: a config
  that faults (illegal address on Triton 3.6) takes only its own CUDA context.

    python benchmarks/kernel_lab.py --out lab.json [--only conv,addmm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess


def _clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"],
                              check=False, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - telemetry is optional here
        return "?"


def _ab(fns: dict, rounds: int = 5, graph: bool = False) -> dict[str, float]:
    """Median ms of each fn, measured round-robin (clock drift hits every candidate alike).
    `graph`: each fn replayed in a CUDA graph, as the runtime runs it — without the host's launch
    cost, which dominates small passes of multi-kernel candidates (fla's Python wrappers)."""
    from triton.testing import do_bench, do_bench_cudagraph

    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(do_bench_cudagraph(f, rep=40) if graph else do_bench(f, warmup=5, rep=40))
    return {k: statistics.median(v) for k, v in times.items()}


DIAG_ONLY = False  # --only conv_diag: the copy ceiling, the current kernel and the diagnostics alone


def lab_conv_diag(out: dict) -> None:
    global DIAG_ONLY
    DIAG_ONLY = True
    lab_conv(out)


def lab_conv(out: dict) -> None:
    import torch
    import triton
    import triton.language as tl

    from dohnuts.ops._conv_kernel import _conv_kernel, conv_silu_triton

    B, T, C, D, W = 32, 512, 2048, 128, 4
    packed = torch.randn(B, T, 3 * C + 32, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3 * C, W, device="cuda", dtype=torch.bfloat16) * 0.5
    x = packed[..., :C]
    moved = 2 * B * T * C * 2  # bytes read + written per part

    @triton.jit
    def _copy(X, Y, T, C, sxb, sxt, D: tl.constexpr, BT: tl.constexpr):
        h = tl.program_id(0).to(tl.int64)
        i_t = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        t = i_t * BT + tl.arange(0, BT)[:, None]
        c = h * D + tl.arange(0, D)[None, :]
        v = tl.load(X + b * sxb + t * sxt + c, mask=t < T)
        tl.store(Y + b * T * C + t * C + c, v, mask=t < T)

    @triton.jit
    def _conv_variant(X, Wt, Y, T, C, sxb, sxt, swc, swk, eps, D: tl.constexpr, W: tl.constexpr,
                      BT: tl.constexpr, IEEE: tl.constexpr, MATH: tl.constexpr, CM: tl.constexpr, EV: tl.constexpr):
        """The stateless conv + SiLU + L2 norm with one thing changed at a time: IEEE — M16's
        IEEE divisions, else the approximate SiLU division and one reciprocal per row; MATH=False
        — store the sum of the four shifted inputs (loads alone: no weights, SiLU or norm); CM, EV
        — a cache modifier / eviction policy on the shifted loads; the weight through strides
        (swc, swk): (C, W) as the model stores it, or tap-major (W, C)."""
        h = tl.program_id(0).to(tl.int64)
        i_t = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        t = i_t * BT + tl.arange(0, BT)[:, None]
        c = h * D + tl.arange(0, D)[None, :]
        acc = tl.zeros((BT, D), dtype=tl.float32)
        for k in tl.static_range(W):
            tt = t - (W - 1) + k
            xk = tl.load(X + b * sxb + tt * sxt + c, mask=(tt >= 0) & (tt < T), other=0.0, cache_modifier=CM,
                         eviction_policy=EV).to(tl.float32)
            if MATH:
                acc += xk * tl.load(Wt + c * swc + k * swk).to(tl.float32)
            else:
                acc += xk
        yv = acc
        if MATH:
            if IEEE:
                yv = acc * tl.sigmoid(acc)
                yv = yv / tl.sqrt(tl.sum(yv * yv, axis=1) + eps)[:, None]
            else:
                yv = tl.fdiv(acc, 1.0 + tl.exp(-acc))
                yv = yv * (1.0 / tl.sqrt(tl.sum(yv * yv, axis=1) + eps))[:, None]
        tl.store(Y + b * T * C + t * C + c, yv.to(Y.dtype.element_ty), mask=t < T)

    @triton.jit
    def _conv_dot(X, Wt, Y, T, C, sxb, sxt, eps, D: tl.constexpr, W: tl.constexpr, BT: tl.constexpr):
        """The input tile loaded once (BT rows, W − 1 of them shared with the previous program);
        the W shifted copies made on the tensor cores, exactly: S_k @ x with S_k a 0/1 shift."""
        h = tl.program_id(0).to(tl.int64)
        i_t = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        first = i_t * (BT - (W - 1))  # this program's first output row
        j = tl.arange(0, BT)
        rin = first - (W - 1) + j  # tile row j holds input row first − (W − 1) + j
        c = h * D + tl.arange(0, D)
        x = tl.load(X + b * sxb + rin[:, None] * sxt + c[None, :], mask=((rin >= 0) & (rin < T))[:, None],
                    other=0.0)
        i = tl.arange(0, BT)[:, None]
        jj = tl.arange(0, BT)[None, :]
        acc = tl.zeros((BT, D), dtype=tl.float32)
        for k in tl.static_range(W):
            shift = (jj == i + k).to(x.dtype)  # output i reads tile row i + k
            acc += tl.dot(shift, x) * tl.load(Wt + c * W + k).to(tl.float32)[None, :]
        yv = acc * tl.sigmoid(acc)
        yv = yv / tl.sqrt(tl.sum(yv * yv, axis=1) + eps)[:, None]
        t = first + i
        tl.store(Y + b * T * C + t * C + c[None, :], yv.to(Y.dtype.element_ty), mask=(i < BT - (W - 1)) & (t < T))

    y = torch.empty(B, T, C, device="cuda", dtype=torch.bfloat16)
    y2 = torch.empty_like(y)
    y3 = torch.empty_like(y)
    wt = w[:C].t().contiguous()  # (W, C)

    def run_variant(bt, nw, dst, *, ieee=True, math=True, cm="", ev="", tap_major=False):
        grid = (C // D, triton.cdiv(T, bt), B)
        wv = wt.t() if tap_major else w[:C]  # (C, W) either way; strides (W, 1) or (1, C)
        return lambda: _conv_variant[grid](x, wv, dst, T, C, x.stride(0), x.stride(1), wv.stride(0), wv.stride(1),
                                           1e-6, D=D, W=W, BT=bt, IEEE=ieee, MATH=math, CM=cm, EV=ev,
                                           num_warps=nw)

    def run_dot(bt, nw):
        grid = (C // D, triton.cdiv(T, bt - (W - 1)), B)
        return lambda: _conv_dot[grid](x, w[:C], y3, T, C, x.stride(0), x.stride(1), 1e-6, D=D, W=W, BT=bt,
                                       num_warps=nw)

    def run_cfg(bt, nw, norm):  # dohnuts' kernel at one tile, with the tap-major weight the runtime passes
        grid = (C // D, triton.cdiv(T, bt), B)
        wv = wt.t()
        return lambda: _conv_kernel.fn[grid](x, wv, y, y, y, T, C, 512, x.stride(0), x.stride(1), wv.stride(0),
                                             wv.stride(1), 0, 0, 0, 0, 0, 0, 1e-6, C, C, C if norm else 0,
                                             D=D, W=W, HP=4, NORM=norm,
                                             HAS_S0=False, STORE_ST=False, BT=bt, num_warps=nw)

    fns = {"torch contiguous() copy": lambda: x.contiguous(),
           "triton tile copy BT=64": lambda: _copy[(C // D, T // 64, B)](x, y, T, C, x.stride(0), x.stride(1),
                                                                         D=D, BT=64, num_warps=4),
           "current (autotuned), norm": lambda: conv_silu_triton(x, wt.t(), D, normalize=True),
           "current (autotuned), no norm": lambda: conv_silu_triton(x, wt.t(), D, normalize=False)}
    for bt, nw in ((8, 1), (64, 8)):
        fns[f"BT={bt} warps={nw} norm"] = run_cfg(bt, nw, True)
        fns[f"fast math BT={bt} warps={nw}"] = run_variant(bt, nw, y2, ieee=False)
        for cm, ev in ((".ca", ""), (".cg", ""), ("", "evict_last")):
            fns[f"loads {cm or ev} BT={bt} warps={nw}"] = run_variant(bt, nw, y2, cm=cm, ev=ev)
    if not DIAG_ONLY:
        for bt, nw in ((32, 4), (64, 4), (64, 8), (128, 8)):
            fns[f"dot shifts BT={bt} warps={nw}"] = run_dot(bt, nw)
    else:
        fns = {k: v for k, v in fns.items() if "copy" in k or "current" in k or k.startswith("BT=")}
    for bt, nw in ((8, 1), (16, 2), (32, 4), (64, 4), (64, 8)):
        fns[f"weight (W, C) BT={bt} warps={nw}"] = run_variant(bt, nw, y3, tap_major=True)
        fns[f"4 loads only BT={bt} warps={nw}"] = run_variant(bt, nw, y3, math=False)
    errs = {}
    run_variant(64, 8, y)()
    variants = (("weight (W, C)", run_variant(16, 2, y3, tap_major=True), y3),
                ("fast math", run_variant(64, 8, y2, ieee=False), y2),
                ("dot shifts BT=64", run_dot(64, 4), y3), ("dot shifts BT=32", run_dot(32, 4), y3),
                ("loads .ca", run_variant(64, 8, y2, cm=".ca"), y2))
    for name, f, out_ in variants:
        try:
            f()
            torch.cuda.synchronize()
            errs[name] = float((y.float() - out_.float()).abs().max())
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is reported
            errs[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            fns = {k: v for k, v in fns.items() if not k.startswith(name.split(" BT")[0])}
    res = _ab(fns)
    out["conv"] = {"shape": [B, T, C], "bytes_per_part": moved, "clock": _clock(), "max_abs_diff": errs,
                   "ms": res, "TB/s": {k: moved / (v * 1e-3) / 1e12 for k, v in res.items()}}
    print("conv  max |variant − M16| (bf16 outputs):", errs)
    for k, v in res.items():
        print(f"conv  {k:32s} {v * 1e3:8.1f} µs  {moved / (v * 1e-3) / 1e12:5.2f} TB/s")


def _report_mlp(out: dict, key: str, shape: tuple, res: dict[str, float], **notes: dict) -> None:
    """Record and print the gate/up (+ SwiGLU) timings `res` of an (M, K, I) MLP shape, with the
    per-candidate notes (errors, compile facts) given by name."""
    M, K, I = shape
    flops = 2 * M * K * 2 * I
    out[key] = {"shape": list(shape), "clock": _clock(), "ms": res, **notes,
                "TFLOP/s": {k: flops / (v * 1e-3) / 1e12 for k, v in res.items()}}
    for k, v in res.items():
        note = "  ".join(str(n[k]) for n in notes.values() if k in n)
        print(f"mlp   {k:48s} {v:7.3f} ms  {flops / (v * 1e-3) / 1e12:6.1f} TFLOP/s  {note}")


def lab_swiglu_gemm(out: dict) -> None:
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl

    from dohnuts.ops._swiglu_kernel import swiglu_packed_triton

    M, K, I = 32 * 512, 2048, 6144
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    wp = torch.randn(2 * I, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5

    @triton.jit
    def _gate_up(X, Wt, Y, M, N, K, I, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
        pid = tl.program_id(0)
        n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        group = pid // (GROUP * n_n)
        first_m = group * GROUP
        size_m = min(n_m - first_m, GROUP)
        pm = first_m + (pid % (GROUP * n_n)) % size_m
        pn = (pid % (GROUP * n_n)) // size_m
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        a_ptr = X + rm[:, None].to(tl.int64) * K + rk[None, :]
        g_ptr = Wt + rn[:, None].to(tl.int64) * K + rk[None, :]
        u_ptr = Wt + (rn[:, None] + I).to(tl.int64) * K + rk[None, :]
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = tl.load(a_ptr + k)
            acc_g = tl.dot(a, tl.trans(tl.load(g_ptr + k)), acc_g)
            acc_u = tl.dot(a, tl.trans(tl.load(u_ptr + k)), acc_u)
        yv = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(Y + rm[:, None].to(tl.int64) * N + rn[None, :], yv.to(Y.dtype.element_ty))

    y = torch.empty(M, I, device="cuda", dtype=torch.bfloat16)

    def fused(bm, bn, bk, nw, ns):
        grid = (triton.cdiv(M, bm) * triton.cdiv(I, bn),)
        return lambda: _gate_up[grid](x, wp, y, M, I, K, I, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=nw, num_stages=ns)

    ref = swiglu_packed_triton(F.linear(x, wp))
    fns = {"cuBLAS GEMM + swiglu kernel": lambda: swiglu_packed_triton(F.linear(x, wp)),
           "cuBLAS GEMM alone": lambda: F.linear(x, wp)}
    errs = {}
    for cfg in ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (128, 128, 32, 8, 4),
                (64, 128, 64, 4, 4), (128, 256, 64, 8, 3)):
        name = "triton gate/up+swiglu BM={} BN={} BK={} w={} s={}".format(*cfg)
        try:
            f = fused(*cfg)
            f()
            torch.cuda.synchronize()
            errs[name] = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
            fns[name] = f
        except Exception as exc:  # noqa: BLE001 - a config that does not fit is reported, not fatal
            errs[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    _report_mlp(out, "swiglu_gemm", (M, K, I), _ab(fns), rel_err=errs)


def lab_swiglu_inductor(out: dict) -> None:
    """The MLP's gate/up GEMM + SwiGLU as torch.compile compiles them (inductor, max-autotune: its
    Triton GEMM templates, persistent TMA ones on Hopper, against ATen's cuBLAS, each with the
    SwiGLU fused into the epilogue where it can) against cuBLAS + dohnuts' SwiGLU kernel, at
    text-2b's shape. Two forms: the packed projection (gate and up one GEMM, SwiGLU across its two
    halves — not a per-tile epilogue) and two GEMMs (the up GEMM's output read by the gate GEMM's
    epilogue). Written after M18's last device call: not yet run."""
    import time

    import torch
    import torch._inductor.config as inductor_config
    import torch.nn.functional as F

    from dohnuts.ops._swiglu_kernel import swiglu_packed_triton

    M, K, I = 32 * 512, 2048, 6144
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    wp = torch.randn(2 * I, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    wg, wu = wp[:I].contiguous(), wp[I:].contiguous()
    inductor_config.max_autotune_gemm_backends = "ATEN,TRITON"
    if hasattr(inductor_config.triton, "enable_persistent_tma_matmul"):
        inductor_config.triton.enable_persistent_tma_matmul = True

    def packed(x, wp):
        g, u = F.linear(x, wp).split(I, dim=-1)
        return F.silu(g) * u

    def split(x, wg, wu):
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)

    ref = swiglu_packed_triton(F.linear(x, wp))
    fns = {"cuBLAS GEMM + swiglu kernel": lambda: swiglu_packed_triton(F.linear(x, wp)),
           "cuBLAS GEMM alone": lambda: F.linear(x, wp)}
    info: dict = {}
    for name, fn, args in (("inductor packed", packed, (x, wp)), ("inductor two GEMMs", split, (x, wg, wu))):
        try:
            compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            t0 = time.perf_counter()
            y = compiled(*args)
            torch.cuda.synchronize()
            info[name] = {"compile_s": time.perf_counter() - t0,
                          "rel_err": float((y.float() - ref.float()).abs().max() / ref.float().abs().max())}
            fns[name] = lambda compiled=compiled, args=args: compiled(*args)
        except Exception as exc:  # noqa: BLE001 - a failed compile is reported, not fatal
            info[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    _report_mlp(out, "swiglu_inductor", (M, K, I), _ab(fns, graph=True), compiled=info)


def lab_small_m_gemm(out: dict) -> None:
    """The 2b projections at the row counts of a lone prefix (452 tokens: the image-warm prefix,
    2.8 ms against a 0.70 ms bound, its GEMMs at ≈ 260 TFLOP/s) and of a suffix (2,048), cuBLAS
    (`F.linear`) against torch.compile's max-autotune choice (its Triton templates or ATen).
    Written after M18's last device call: not yet run."""
    import torch
    import torch._inductor.config as inductor_config
    import torch.nn.functional as F

    inductor_config.max_autotune_gemm_backends = "ATEN,TRITON"
    shapes = {"gate/up": (12288, 2048), "down": (2048, 6144), "GDN qkv+b+a": (6176, 2048),
              "GDN z / out, attn o": (2048, 2048), "attn q+k+v": (5120, 2048)}
    res: dict = {}
    for m in (452, 2048):
        for name, (n, k) in shapes.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
            fns = {"cuBLAS": lambda x=x, w=w: F.linear(x, w)}
            key = f"{m} x {name}"
            try:
                compiled = torch.compile(lambda x, w: F.linear(x, w), mode="max-autotune-no-cudagraphs", dynamic=False)
                compiled(x, w)
                fns["inductor max-autotune"] = lambda x=x, w=w, c=compiled: c(x, w)
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                res[key + " (inductor)"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            ms = _ab(fns, graph=True)
            res[key] = {"ms": ms, "TFLOP/s": {c: 2 * m * n * k / (t * 1e-3) / 1e12 for c, t in ms.items()}}
            for c, t in ms.items():
                print(f"gemm  {key:28s} {c:22s} {t * 1e3:8.1f} us  {2 * m * n * k / (t * 1e-3) / 1e12:6.1f} TFLOP/s")
    out["small_m_gemm"] = {"clock": _clock(), "shapes": res}


def lab_addmm(out: dict) -> None:
    import torch
    import torch.nn.functional as F

    from dohnuts.ops._norm_kernels import rms_norm_triton

    M, K, H = 32 * 512, 6144, 2048
    h = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    wd = torch.randn(H, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    nw = torch.zeros(H, device="cuda", dtype=torch.bfloat16)
    xs = x.clone()

    def current():
        return rms_norm_triton(F.linear(h, wd), nw, 1e-6, 1.0, residual=x)

    def fused():
        xs.copy_(x)  # (counted in both: the baseline's extra copy is subtracted below)
        xs.addmm_(h, wd.t())
        return rms_norm_triton(xs, nw, 1e-6, 1.0), xs

    _, ra = current()
    _, rb = fused()
    err = float((ra.float() - rb.float()).abs().max())
    res = _ab({"GEMM + add_rms_norm": current, "addmm_ + rms_norm (+ copy)": fused, "copy alone": lambda: xs.copy_(x)})
    out["addmm"] = {"shape": [M, K, H], "clock": _clock(), "ms": res, "residual_max_abs_diff": err}
    for k, v in res.items():
        print(f"addmm {k:32s} {v:7.3f} ms")
    print(f"addmm residual max |diff| {err:.3g}")


def _delta_inputs(f, N: int, T: int, state: str | None, H: int = 16, K: int = 128):
    """Delta-rule inputs at 2b head sizes (H = HV, K = V): unit q and k, the gates from random logits,
    fla's w and u, and a forked (stride-0) initial state when `state` is "forked"."""
    import torch

    from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton

    gen = torch.Generator(device="cuda").manual_seed(N * 1000 + T)
    q, k = (torch.nn.functional.normalize(torch.randn(N, T, H, K, device="cuda", generator=gen), dim=-1)
            .bfloat16() for _ in range(2))
    v = torch.randn(N, T, H, K, device="cuda", generator=gen).bfloat16()
    a, b = (torch.randn(N, T, H, device="cuda", generator=gen).bfloat16() for _ in range(2))
    A_log = torch.empty(H, device="cuda").uniform_(1, 16, generator=gen).log()
    dt_bias = torch.randn(H, device="cuda", generator=gen)
    g, beta = gdn_gates_triton(a, b, A_log, dt_bias, chunk_size=64, scale=f.RCP_LN2)
    w, u, _ = f.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=64)
    s0 = None
    if state == "forked":
        s0 = (torch.randn(1, H, K, K, device="cuda", generator=gen) * 0.1).expand(N, -1, -1, -1)
    return q, k, v, g, beta, w, u, s0


def lab_delta_ho(out: dict) -> None:
    """The delta rule's state recurrence with each chunk's output computed in the same kernel
    (dohnuts.ops._delta_h_kernel, FUSE_O) against fla's two kernels (chunk_gated_delta_rule_fwd_h
    writing every chunk's state, then chunk_fwd_o reading it back) and against dohnuts' state
    kernel + fla's output kernel (today's forked path), at the shapes the workloads run: the
    text-2b pass, a shared prefix, and suffix passes from a forked state. With fla's intra-chunk
    step included: its kkt_solve + recompute_w_u + the fused kernel against kkt_solve + the kernel
    that folds recompute_w_u in (FUSE_WU, M19)."""
    from dohnuts.ops._delta_h_kernel import delta_h_triton, delta_rule_output_triton, delta_rule_output_wy_triton
    from dohnuts.ops._fla import fla
    from dohnuts.ops.delta_rule import _kkt_solve

    f = fla()
    H, K = 16, 128  # = HV, V
    scale = K ** -0.5
    res = {}
    for N, T, state in ((32, 512, None), (1, 448, None), (1, 452, None), (32, 64, "forked"), (8, 256, "forked"),
                        (8, 64, "forked"), (4, 512, None)):
        q, k, v, g, beta, w, u, s0 = _delta_inputs(f, N, T, state, H, K)
        dense = s0.contiguous() if s0 is not None else None
        fin = s0 is not None

        def fla_pair(dense=dense, q=q, k=k, w=w, u=u, g=g, fin=fin):
            h, vn, st = f.chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g, initial_state=dense,
                                                       output_final_state=fin, chunk_size=64)
            return f.chunk_fwd_o(q=q, k=k, v=vn, h=h, g=g, scale=scale, chunk_size=64), st

        def ours_pair(s0=s0, q=q, k=k, w=w, u=u, g=g, fin=fin):
            h, vn, st = delta_h_triton(k, w, u, g, s0, fin)
            return f.chunk_fwd_o(q=q, k=k, v=vn, h=h, g=g, scale=scale, chunk_size=64), st

        def fused(s0=s0, q=q, k=k, w=w, u=u, g=g, fin=fin):
            return delta_rule_output_triton(q, k, w, u, g, scale, s0, fin)

        o_ref, st_ref = fla_pair()
        o_f, st_f = fused()
        err = float((o_f.float() - o_ref.float()).norm() / o_ref.float().norm())
        serr = float((st_f - st_ref).norm() / st_ref.norm()) if fin else 0.0
        def intra_fused(s0=s0, q=q, k=k, v=v, g=g, beta=beta, fin=fin):  # M18's path, w and u from fla
            w_, u_, _ = f.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=64)
            return delta_rule_output_triton(q, k, w_, u_, g, scale, s0, fin)

        def kkt_fused_wy(s0=s0, q=q, k=k, v=v, g=g, beta=beta, fin=fin):  # recompute_w_u folded in (M19)
            return delta_rule_output_wy_triton(q, k, v, beta, _kkt_solve(f, k, g, beta), g, scale, s0, fin)

        o_wy, _ = kkt_fused_wy()
        err_wy = float((o_wy.float() - o_ref.float()).norm() / o_ref.float().norm())
        fns = {"fla h + fla o": fla_pair, "fused h+o": fused, "intra + fused h+o": intra_fused,
               "kkt_solve + fused w/u+h+o": kkt_fused_wy}
        if s0 is not None:
            fns["dohnuts h + fla o"] = ours_pair
        ms = _ab(fns, graph=True)
        key = f"{N}x{T}" + (f" {state}" if state else "")
        res[key] = {"ms": ms, "rel_err_o": err, "rel_err_state": serr, "rel_err_o_wy": err_wy}
        for name, t in ms.items():
            print(f"delta_ho {key:14s} {name:20s} {t * 1e3:8.1f} us")
        print(f"delta_ho {key:14s} fused vs fla: o rel err {err:.2e}, state {serr:.2e}; w/u folded: o {err_wy:.2e}")
    from dohnuts.ops._delta_h_kernel import _tuned_o

    out["delta_ho"] = {"clock": _clock(), "shapes": res,
                       "fused_configs": {str(k_): str(c) for k_, c in _tuned_o.cache.items()}}


def lab_conv_parts(out: dict) -> None:
    """q, k and v (2b sizes) through the conv kernel in one launch (`conv_silu_parts_triton`, M21)
    against three launches, one a part (the runtime before M21), in CUDA graphs: the text-2b pass,
    a lone prefix returning its state, and suffixes from a forked state; outputs compared exactly."""
    import torch

    from dohnuts.config import preset
    from dohnuts.ops._conv_kernel import conv_silu_parts_triton, conv_silu_triton

    cfg = preset("qwen3.5-2b").text
    K = cfg.linear_key_head_dim
    sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
    D, W = sum(sizes), cfg.linear_conv_kernel_dim
    res = {}
    for N, T, state in ((32, 512, None), (1, 448, "out"), (1, 200, "out"), (32, 64, "forked"), (8, 256, "forked")):
        gen = torch.Generator(device="cuda").manual_seed(N + T)
        x = torch.randn(N, T, D + 32, device="cuda", generator=gen).bfloat16()[..., :D]
        w = (0.3 * torch.randn(D, W, device="cuda", generator=gen)).bfloat16().t().contiguous().t()
        s0 = torch.randn(1, D, W, device="cuda", generator=gen).bfloat16().expand(N, -1, -1) if state == "forked" else None
        fin = torch.empty(N, D, W, device="cuda", dtype=torch.bfloat16) if state == "out" else None

        def one(x=x, w=w, s0=s0, fin=fin):
            return conv_silu_parts_triton(x, w, K, sizes, normalized_parts=2, initial_state=s0, final_state=fin)

        def three(x=x, w=w, s0=s0, fin=fin):
            outs, start = [], 0
            for i, n in enumerate(sizes):
                ch = slice(start, start + n)
                outs.append(conv_silu_triton(x[..., ch], w[ch], K, normalize=i < 2,
                                             initial_state=None if s0 is None else s0[:, ch],
                                             final_state=None if fin is None else fin[:, ch]))
                start += n
            return outs

        same = all(torch.equal(a, b) for a, b in zip(one(), three()))
        ms = _ab({"one launch": one, "three launches": three}, graph=True)
        key = f"{N}x{T}" + (f" {state}" if state else "")
        res[key] = {"ms": ms, "equal": same}
        print(f"conv_parts {key:12s} " + "  ".join(f"{k} {v * 1e3:7.1f} us" for k, v in ms.items()) + f"  equal {same}")
    out["conv_parts"] = {"clock": _clock(), "shapes": res}


# Shapes for `delta_configs`: the text pass, partial last chunks (a test's 8 × 333, the image
# prefix's 452) and a forked suffix pass.
_CONFIG_SHAPES = ((32, 512, None), (8, 333, None), (1, 452, None), (32, 64, "forked"))


def _config_child(spec: str) -> None:
    """One fused delta-rule config (`BV,warps,stages`), FUSE_O and FUSE_WU, at `_CONFIG_SHAPES`:
    prints one JSON line per (variant, shape) with the error against fla's chain and the time."""
    import torch
    import triton

    from dohnuts.ops._delta_h_kernel import _delta_h_kernel
    from dohnuts.ops._fla import fla
    from dohnuts.ops.delta_rule import _kkt_solve

    bv, nw, ns = (int(x) for x in spec.split(","))
    f = fla()
    H = HV = 16
    K = V = 128
    for N, T, state in _CONFIG_SHAPES:
        q, k, v, g, beta, w, u, s0 = _delta_inputs(f, N, T, state, H, K)
        A = _kkt_solve(f, k, g, beta)
        h, vn, _ = f.chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g, chunk_size=64,
                                                  initial_state=None if s0 is None else s0.contiguous())
        ref = f.chunk_fwd_o(q=q, k=k, v=vn, h=h, g=g, scale=K ** -0.5, chunk_size=64).float()
        for wu in (False, True):
            o = torch.empty_like(v)
            args = (q, k, v if wu else u, A if wu else w, o, g, beta, o, o, s0 if s0 is not None else o, o,
                    T, 0, K ** -0.5, (N * HV - 1).bit_length())  # s0n 0: a forked state
            flags = dict(H=H, HV=HV, K=K, V=V, BT=64, BV=bv, USE_INITIAL_STATE=s0 is not None,
                         STORE_FINAL_STATE=False, FUSE_O=True, FUSE_WU=wu, num_warps=nw, num_stages=ns)
            grid = (triton.cdiv(V, bv) * N * HV,)

            def run(grid=grid, args=args, flags=flags):
                _delta_h_kernel[grid](*args, **flags)

            run()
            torch.cuda.synchronize()
            err = float((o.float() - ref).norm() / ref.norm())
            us = triton.testing.do_bench(run, warmup=5, rep=30) * 1e3
            print(json.dumps({"variant": "FUSE_WU" if wu else "FUSE_O", "shape": f"{N}x{T}" + (f" {state}" if state else ""),
                              "rel_err": err, "us": us}), flush=True)


def lab_delta_configs(out: dict) -> None:
    import sys

    from dohnuts.ops._delta_h_kernel import _O_CONFIGS

    specs = [f"{c.kwargs['BV']},{c.num_warps},{c.num_stages}" for c in _O_CONFIGS] + ["32,4,1", "64,8,2"]
    res = {}
    for spec in specs:
        p = subprocess.run([sys.executable, __file__, "--config-child", spec], capture_output=True, text=True,
                           timeout=180, check=False)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        res[spec] = {"rc": p.returncode, "runs": rows, "err": p.stderr.strip().splitlines()[-2:] if p.returncode else []}
        for r in rows:
            print(f"delta_configs BV,w,s={spec:8s} {r['variant']:8s} {r['shape']:14s} {r['us']:8.1f} us  "
                  f"rel err {r['rel_err']:.1e}")
        if p.returncode:
            print(f"delta_configs BV,w,s={spec:8s} exit {p.returncode}: {' | '.join(res[spec]['err'])[:200]}")
    out["delta_configs"] = {"clock": _clock(), "configs": res}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="kernel_lab.json")
    p.add_argument("--only", default="conv,swiglu_gemm,addmm")
    p.add_argument("--config-child", help=argparse.SUPPRESS)  # delta_configs' per-config process
    a = p.parse_args(argv)
    if a.config_child:
        _config_child(a.config_child)
        return 0
    out: dict = {}
    for name in a.only.split(","):
        try:
            globals()[f"lab_{name}"](out)
        except Exception as exc:  # noqa: BLE001 - one failed experiment must not lose the others
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {type(exc).__name__}: {exc}")
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
