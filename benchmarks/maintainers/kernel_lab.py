"""Kernel experiments at the text-2b shape (32 × 512 tokens), before a kernel changes in dohnuts.

Each experiment times candidates against what dohnuts runs today, interleaved (A, B, A, B, ...
medians of `triton.testing.do_bench`), and checks the candidate's numbers against the current
path. It answers, on the machine at hand, whether a change is worth making:

- `delta_ho`: the delta rule's state recurrence with the chunk outputs computed in the same
  kernel, against fla's state kernel + output kernel, at the workloads' pass shapes.
- `conv_parts`: Gated DeltaNet's q, k and v convs in one launch (M21) against one launch a part,
  at the workloads' pass shapes, in CUDA graphs.
- `delta_configs`: each tuning config of the fused delta-rule kernel (FUSE_O, and FUSE_WU) in a
  process of its own, at full and partial last chunks, checked against fla's kernels: a config
  that faults (illegal address on Triton 3.6) takes only its own CUDA context.
- `conv_bandwidth`: the conv kernel at each of its tuning configs and at a few configs outside
  them, against torch's copy of the same bytes (the strided q/k/v columns of the projection into a
  contiguous buffer) and a dense copy of as many (the device's copy bound at that size), at the
  workloads' pass shapes, in CUDA graphs: how far the conv is from the memory bound it could
  reach, before a kernel change is tried.
- `conv_shared`: a shared pass's conv — the shared kernel's one launch over its rows (each
  suffix's history the prefix's last rows) against the two launches it replaced (the prefix's, the
  suffixes' from its forked state, then the concatenation of k the shared delta rule's one
  kkt_solve launch read) and one launch over the same rows as one sequence (the bound: the same
  bytes, no group boundaries).
- `kkt_configs`: fla's kkt_solve kernel at each of its candidate configs, at the fused path's
  shapes (2b and 4b heads): which config each shape wants, against the one fla's size-blind
  autotuning key keeps.
- `train_ops`: forward + backward of each op a training microbatch runs (train-step-2b: 8 × 512
  tokens, 2b sizes, frozen weights as under LoRA), the one kernel set against the fla autograd
  ops training ran before it, gradients compared: which op the backward (two thirds of an
  update, KI-18) spends its time in, and whether each beats the op it replaced.
- `bwd_configs`: the three fla backward kernels training keeps (dq/dk/dw/dg, the WY backward,
  the state gradient; KI-20) at configs beyond fla's candidate set (8 warps, 1 stage, BV 128),
  each against fla's own pick in the delta rule's forward + backward at train-step-2b's shape,
  gradients compared; one process a kernel (a faulting config takes only its own context).

    python benchmarks/maintainers/kernel_lab.py --out lab.json [--only delta_ho,conv_parts]

The experiments that answered their question and were closed (the conv's tile configs, SwiGLU or
the residual add in a GEMM epilogue, torch.compile's GEMMs) left this file with their answers in
docs/history/evolution.md (M17–M21); git history keeps their code.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess


def _clock() -> str:
    """The GPU clock and power now, from the harness's sampler of this GPU (NVML or amdsmi)."""
    try:
        from dohnuts.bench.plugins import plugin_manager

        telemetry = plugin_manager().get_plugin("telemetry")  # the harness's own samplers
        sampler = telemetry.own_gpu_sampler()
        if sampler.unavailable:
            return "?"
        reading = sampler.sample()
        return f"{telemetry.clock_mhz(reading)} MHz, {reading.get('power_w')} W"
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


def _delta_inputs(f, N: int, T: int, state: str | None, H: int = 16, K: int = 128, HV: int | None = None):
    """Delta-rule inputs (K = V; H key heads, HV value heads, 2b's H = HV = 16 by default): unit q
    and k, the gates from random logits, fla's w and u, and a forked (stride-0) initial state when
    `state` is "forked"."""
    import torch

    from dohnuts.ops._gdn_gates_kernel import gdn_gates_triton

    HV = HV or H
    gen = torch.Generator(device="cuda").manual_seed(N * 1000 + T)
    q, k = (torch.nn.functional.normalize(torch.randn(N, T, H, K, device="cuda", generator=gen), dim=-1)
            .bfloat16() for _ in range(2))
    v = torch.randn(N, T, HV, K, device="cuda", generator=gen).bfloat16()
    a, b = (torch.randn(N, T, HV, device="cuda", generator=gen).bfloat16() for _ in range(2))
    A_log = torch.empty(HV, device="cuda").uniform_(1, 16, generator=gen).log()
    dt_bias = torch.randn(HV, device="cuda", generator=gen)
    g, beta = gdn_gates_triton(a, b, A_log, dt_bias, chunk_size=64, scale=f.RCP_LN2)
    w, u, _ = f.chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=64)
    s0 = None
    if state == "forked":
        s0 = (torch.randn(1, HV, K, K, device="cuda", generator=gen) * 0.1).expand(N, -1, -1, -1)
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


def lab_conv_bandwidth(out: dict) -> None:
    """The conv kernel's time at 2b's pass shapes (text, a prefix returning its state, suffixes from
    a forked state) at each tile config — its tuning configs and a few outside them — against a
    torch copy of the same bytes (the strided columns read, a contiguous buffer written) and a
    dense copy of as many bytes: the kernel's distance from memory-bound, in CUDA graphs."""
    import torch
    import triton

    from dohnuts.config import preset
    from dohnuts.ops import _conv_kernel as ck

    cfg = preset("qwen3.5-2b").text
    K = cfg.linear_key_head_dim
    sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
    D, W = sum(sizes), cfg.linear_conv_kernel_dim
    configs = [(c.kwargs["BT"], c.num_warps) for c in ck._CONFIGS] + [(16, 2), (32, 2), (32, 4), (64, 4), (256, 16)]
    res = {}
    for N, T, state in ((32, 512, None), (1, 448, "out"), (32, 64, "forked")):
        gen = torch.Generator(device="cuda").manual_seed(N + T)
        x = torch.randn(N, T, D + 32, device="cuda", generator=gen).bfloat16()[..., :D]
        w = (0.3 * torch.randn(D, W, device="cuda", generator=gen)).bfloat16().t().contiguous().t()
        s0 = torch.randn(1, D, W, device="cuda", generator=gen).bfloat16().expand(N, -1, -1) if state == "forked" else None
        fin = torch.empty(N, D, W, device="cuda", dtype=torch.bfloat16) if state == "out" else None
        y = torch.empty(N * T * D, device="cuda", dtype=torch.bfloat16)
        landed = ck.conv_silu_parts_triton(x, w, K, sizes, normalized_parts=2, initial_state=s0, final_state=fin)
        args = (x, w, y, s0 if s0 is not None else y, fin if fin is not None else y, T, D,
                min(triton.next_power_of_2(T), 4096), x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                *((0, s0.stride(1), s0.stride(2)) if s0 is not None else (0, 0, 0)),
                *(fin.stride() if fin is not None else (0, 0, 0)), 1e-6, sizes[0], sizes[0] + sizes[1], sizes[0] + sizes[1])
        flags = dict(D=K, W=W, HP=max(2, triton.next_power_of_2(W - 1)), NORM=True, HAS_S0=s0 is not None,
                     STORE_ST=fin is not None)

        def config(bt, warps):
            def run():
                ck._conv_kernel.fn[(D // K, triton.cdiv(T, bt), N)](*args, **flags, BT=bt, num_warps=warps)
            return run

        fns = {f"BT {bt} warps {w_}": config(bt, w_) for bt, w_ in configs}
        copy_to = torch.empty(N, T, D, device="cuda", dtype=torch.bfloat16)
        dense = torch.empty(N * T * D, device="cuda", dtype=torch.bfloat16)
        fns["copy of the same bytes"] = lambda: copy_to.copy_(x)  # the strided columns read, as the conv does
        fns["dense copy of as many bytes"] = lambda: dense.copy_(y)  # the device's copy bound at this size
        # each config's largest difference from the landed call (the per-row L2 norm's reduction
        # order follows the tile: a last-bit difference is expected between configs)
        flat = torch.cat([t.reshape(-1) for t in landed]).float()
        diff = {}
        for (bt, w_), k in zip(configs, fns):
            fns[k]()
            diff[k] = (y.float() - flat).abs().max().item()
        ms = _ab(fns, rounds=3, graph=True)
        gbytes = 2 * N * T * D * 2 / 1e9
        key = f"{N}x{T}" + (f" {state}" if state else "")
        res[key] = {"us": {k: round(v * 1e3, 2) for k, v in ms.items()},
                    "tb_per_s": {k: round(gbytes / v, 2) for k, v in ms.items()}, "max_difference_from_landed": diff}
        print(f"conv_bandwidth {key:12s} " + "  ".join(f"{k} {v * 1e3:6.1f} us" for k, v in ms.items())
              + f"  largest difference from the landed call {max(diff.values()):.3g}")
    out["conv_bandwidth"] = {"clock": _clock(), "shapes": res}


def lab_conv_shared(out: dict) -> None:
    """A shared pass's conv at shared-prefix-2b's shape (a 448-token prefix, 32 suffixes of 64), in
    CUDA graphs: the shared kernel (`conv_silu_shared_triton`) against the prefix's launch returning
    its state, the suffixes' launch from it (forked), then the k concatenation `SharedDeltaRule`
    made for its one kkt_solve launch; and one launch over the same 2,496 rows as one sequence (the
    same bytes, no group boundaries: the bound)."""
    import torch

    from dohnuts.config import preset
    from dohnuts.ops._conv_kernel import conv_silu_parts_triton, conv_silu_shared_triton

    cfg = preset("qwen3.5-2b").text
    K = cfg.linear_key_head_dim
    sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
    D, W = sum(sizes), cfg.linear_conv_kernel_dim
    P, n, L = 448, 32, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = torch.randn(P + n * L, D + 32, device="cuda", generator=gen).bfloat16()[..., :D]
    w = (0.3 * torch.randn(D, W, device="cuda", generator=gen)).bfloat16().t().contiguous().t()
    fin = torch.empty(1, D, W, device="cuda", dtype=torch.bfloat16)

    def two_launches():
        _, k_p, _ = conv_silu_parts_triton(rows[:P].unsqueeze(0), w, K, sizes, normalized_parts=2, final_state=fin)
        _, k_s, _ = conv_silu_parts_triton(rows[P:].view(n, L, D), w, K, sizes, normalized_parts=2,
                                           initial_state=fin.expand(n, -1, -1))
        return torch.cat([k_p.reshape(-1), k_s.reshape(-1)])

    def one_launch():
        return conv_silu_parts_triton(rows.unsqueeze(0), w, K, sizes, normalized_parts=2, final_state=fin)

    def shared():
        return conv_silu_shared_triton(rows, w, K, sizes, P, L, normalized_parts=2)

    ms = _ab({"prefix + suffixes + cat of k": two_launches, "the shared kernel": shared,
              "one launch over every row": one_launch}, graph=True)
    out["conv_shared"] = {"clock": _clock(), "us": {k: round(v * 1e3, 2) for k, v in ms.items()}}
    print("conv_shared " + "  ".join(f"{k} {v * 1e3:6.1f} us" for k, v in ms.items()))


def _fwd_bwd(fn, inputs: list, seed: int):
    """A closure running fn(*inputs) and the gradients of the inputs that require them, for a fixed
    random output gradient; and those gradients once (for comparing candidates)."""
    import torch

    def flat(out):
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o for o in out if isinstance(o, torch.Tensor) and o.requires_grad]

    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    grads = [torch.randn(o.shape, device="cuda", generator=gen).to(o.dtype) for o in flat(fn(*inputs))]

    def run():
        return torch.autograd.grad(flat(fn(*inputs)), wrt, grads)

    return run, run()


def _time_fwd_bwd(runs: dict) -> tuple[dict, str]:
    """Median ms of each fwd+bwd closure: in CUDA graphs as training runs them, else eagerly."""
    try:
        return _ab(runs, graph=True), "cuda graphs"
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot be captured: time all eagerly
        return _ab(runs), f"eager ({type(exc).__name__} in capture)"


def lab_train_ops(out: dict) -> None:
    """Forward + backward of each op of a training microbatch at train-step-2b's shape (8 × 512
    tokens, 2b sizes; weights frozen, as LoRA training leaves them): the one kernel set (dohnuts'
    autograd functions, the serving forwards) against the fla autograd ops training ran before it.
    Gradients of the pair compared (max relative error); per op the ms of each and the ratio."""
    import torch
    import torch.nn.functional as F

    from dohnuts.config import preset
    from dohnuts.ops._fla import allow_hopper_backward_for_bk128, fla
    from dohnuts.ops.activation import swiglu_packed_fused
    from dohnuts.ops.conv import causal_conv1d_qkv
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits
    from dohnuts.ops.norm import add_rms_norm_fused, rms_norm_fused

    f = fla()
    allow_hopper_backward_for_bk128()  # fla's own delta-rule backward at BK=128 (KI-1)
    cfg = preset("qwen3.5-2b").text
    N, T, Hd, I, eps = 8, 512, cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps
    H, K = cfg.linear_num_key_heads, cfg.linear_key_head_dim
    HV, V = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    sizes = [cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim]
    D, W = sum(sizes), cfg.linear_conv_kernel_dim
    gen = torch.Generator(device="cuda").manual_seed(101)

    def rnd(*shape, scale=1.0, grad=True):
        t = (scale * torch.randn(*shape, device="cuda", generator=gen)).bfloat16()
        return t.requires_grad_(grad)

    w_norm = rnd(Hd, scale=0.1, grad=False)
    x, res = rnd(N, T, Hd), rnd(N, T, Hd)
    gu = rnd(N, T, 2 * I)
    packed = rnd(N, T, D + 2 * HV)  # the q/k/v projection with the b and a columns (a strided slice)
    w_conv = rnd(D, W, scale=0.3, grad=False)
    a_log = torch.empty(HV, device="cuda").uniform_(1, 16, generator=gen).log()
    dt_bias = torch.randn(HV, device="cuda", generator=gen)
    q, k = (F.normalize(rnd(N, T, H, K, grad=False).float(), dim=-1).bfloat16().requires_grad_() for _ in range(2))
    v, ab = rnd(N, T, HV, V), rnd(N, T, 2 * HV)

    def conv_ours(p):
        (cq, ck, cv), _, _ = causal_conv1d_qkv(p[..., :D], w_conv, sizes, K)
        return cq, ck, cv

    def conv_fla(p):
        y, _ = f.causal_conv1d(p[..., :D], w_conv, None, activation="silu")
        return y

    def delta_ours(q, k, v, ab):
        return gated_delta_rule_from_logits(q, k, v, ab[..., HV:], ab[..., :HV], a_log, dt_bias,
                                            use_qk_l2norm=False)[0]

    def delta_fla(q, k, v, ab):
        return f.chunk_gated_delta_rule(q, k, v, ab[..., HV:], ab[..., :HV], use_qk_l2norm_in_kernel=False,
                                        use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                                        use_beta_sigmoid_in_kernel=True)[0]

    def core_ours(p):  # conv (+ L2 norm of q and k) then the delta rule: the Gated DeltaNet core
        cq, ck, cv = conv_ours(p)
        shape = (N, T, -1, K)
        return gated_delta_rule_from_logits(cq.view(shape), ck.view(shape), cv.view(N, T, HV, V), p[..., D + HV:],
                                            p[..., D:D + HV], a_log, dt_bias, use_qk_l2norm=False)[0]

    def core_fla(p):  # fla's conv, then its delta rule normalising q and k in its kernel (M23)
        y = conv_fla(p)
        cq, ck, cv = y.split(sizes, dim=-1)
        return f.chunk_gated_delta_rule(cq.reshape(N, T, H, K), ck.reshape(N, T, H, K), cv.reshape(N, T, HV, V),
                                        p[..., D + HV:], p[..., D:D + HV], use_qk_l2norm_in_kernel=True,
                                        use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                                        use_beta_sigmoid_in_kernel=True)[0]

    pairs = {
        "rms_norm": ((lambda x: rms_norm_fused(x, w_norm, eps, 1.0)),
                     (lambda x: f.rms_norm(x, 1.0 + w_norm.float(), None, eps=eps)), [x]),
        "add_rms_norm": ((lambda x, r: add_rms_norm_fused(x, r, w_norm, eps, 1.0)),
                         (lambda x, r: f.rms_norm(x, 1.0 + w_norm.float(), None, residual=r, eps=eps, prenorm=True)),
                         [x, res]),
        "swiglu": (swiglu_packed_fused, (lambda g: f.swiglu(g[..., :I], g[..., I:])), [gu]),
        "conv (ours + L2 norm)": (conv_ours, conv_fla, [packed]),
        "delta_rule": (delta_ours, delta_fla, [q, k, v, ab]),
        "gdn_core": (core_ours, core_fla, [packed]),
    }
    res_out = {}
    for name, (ours, theirs, inputs) in pairs.items():
        try:
            run_o, g_o = _fwd_bwd(ours, inputs, 7)
            run_f, g_f = _fwd_bwd(theirs, inputs, 7)
            err = max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
                      for a, b in zip(g_o, g_f))
            ms, how = _time_fwd_bwd({"one kernel set": run_o, "fla autograd": run_f})
            res_out[name] = {"ms": ms, "timed": how, "grad_rel_err": err}
            print(f"train_ops {name:22s} " + "  ".join(f"{k} {v * 1e3:8.1f} us" for k, v in ms.items())
                  + f"  ratio {ms['one kernel set'] / ms['fla autograd']:.2f}  grad rel err {err:.1e}  ({how})")
        except Exception as exc:  # noqa: BLE001 - one op's failure must not lose the others
            res_out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"train_ops {name}: {type(exc).__name__}: {exc}")
    out["train_ops"] = {"clock": _clock(), "shape": f"{N}x{T}", "ops": res_out}


# Shapes for `delta_configs`: the text pass, partial last chunks (a test's 8 × 333, the image
# prefix's 452) and a forked suffix pass.
# (N, T, initial state, key heads H, value heads HV): 2b's heads (16, 16), then 4b's (16, 32).
_CONFIG_SHAPES = ((32, 512, None, 16, 16), (8, 333, None, 16, 16), (1, 452, None, 16, 16), (32, 64, "forked", 16, 16),
                  (32, 512, None, 16, 32), (32, 64, "forked", 16, 32))


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
    K = V = 128
    for N, T, state, H, HV in _CONFIG_SHAPES:
        q, k, v, g, beta, w, u, s0 = _delta_inputs(f, N, T, state, H, K, HV)
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
            shape = f"{N}x{T}" + (f" {state}" if state else "") + (f" HV{HV}" if HV != H else "")
            print(json.dumps({"variant": "FUSE_WU" if wu else "FUSE_O", "shape": shape,
                              "rel_err": err, "us": us}), flush=True)


def _child(flag: str, arg: str, timeout: int) -> dict:
    """This file run again as one experiment's child (`flag arg`): its JSON lines, exit code and, if
    it failed, the end of its stderr. A config that faults takes only the child's CUDA context."""
    import sys

    p = subprocess.run([sys.executable, __file__, flag, arg], capture_output=True, text=True, timeout=timeout,
                       check=False)
    return {"rc": p.returncode, "runs": [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")],
            "err": p.stderr.strip().splitlines()[-3:] if p.returncode else []}


def lab_delta_configs(out: dict) -> None:
    from dohnuts.ops._delta_h_kernel import _O_CONFIGS

    specs = [f"{c.kwargs['BV']},{c.num_warps},{c.num_stages}" for c in _O_CONFIGS] + [
        "32,4,1", "64,8,2", "64,8,1", "128,8,1", "128,8,2", "128,4,1", "64,2,2", "32,2,2"]
    res = {}
    for spec in specs:
        res[spec] = _child("--config-child", spec, timeout=180)
        for r in res[spec]["runs"]:
            print(f"delta_configs BV,w,s={spec:8s} {r['variant']:8s} {r['shape']:14s} {r['us']:8.1f} us  "
                  f"rel err {r['rel_err']:.1e}")
        if res[spec]["rc"]:
            print(f"delta_configs BV,w,s={spec:8s} exit {res[spec]['rc']}: {' | '.join(res[spec]['err'])[:200]}")
    out["delta_configs"] = {"clock": _clock(), "configs": res}


# fla's backward kernels training keeps (KI-20): its wrapper, the kernel, configs beyond its candidates
# ((kwargs, warps, stages); fla's own: 2 or 4 warps, 2–4 stages, BV 32 or 64 for the state gradient).
_BWD_KERNELS = {
    "dqkwg": ("chunk_bwd_dqkwg", "chunk_bwd_kernel_dqkwg", [({}, 8, s) for s in (1, 2, 3)] + [({}, 4, 1)]),
    "wy_bwd": ("prepare_wy_repr_bwd", "prepare_wy_repr_bwd_kernel",
               [({}, 8, s) for s in (1, 2, 3, 4)] + [({}, 4, 1)]),
    "dhu": ("chunk_gated_delta_rule_bwd_dhu", "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64",
            [({"BV": bv}, 8, s) for bv in (32, 64) for s in (1, 2, 3)]
            + [({"BV": 32}, 4, 1), ({"BV": 64}, 4, 1), ({"BV": 128}, 4, 1), ({"BV": 128}, 8, 1)]),
}


def _bwd_child(name: str) -> None:
    """One of `_BWD_KERNELS` at each extra config against fla's own pick: the delta rule's forward +
    backward (dohnuts' autograd function) at train-step-2b's shape, timed in CUDA graphs, round-robin;
    prints one JSON line per config (ms of the whole pass, max relative gradient error)."""
    import inspect

    import torch
    import triton
    from triton.runtime.autotuner import Autotuner

    from dohnuts.config import preset
    from dohnuts.ops._fla import allow_hopper_backward_for_bk128, fla
    from dohnuts.ops.delta_rule import gated_delta_rule_from_logits

    f = fla()
    allow_hopper_backward_for_bk128()
    wrapper, kernel, extra = _BWD_KERNELS[name]
    tuner = inspect.unwrap(getattr(f, wrapper)).__globals__[kernel]
    while not isinstance(tuner, Autotuner):
        tuner = tuner.fn
    cfg = preset("qwen3.5-2b").text
    N, T, H, K = 8, 512, cfg.linear_num_key_heads, cfg.linear_key_head_dim
    HV, V = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    gen = torch.Generator(device="cuda").manual_seed(101)
    q, k = (torch.nn.functional.normalize(torch.randn(N, T, H, K, device="cuda", generator=gen), dim=-1)
            .bfloat16().requires_grad_() for _ in range(2))
    v = torch.randn(N, T, HV, V, device="cuda", generator=gen).bfloat16().requires_grad_()
    ab = torch.randn(N, T, 2 * HV, device="cuda", generator=gen).bfloat16().requires_grad_()
    a_log = torch.empty(HV, device="cuda").uniform_(1, 16, generator=gen).log()
    dt_bias = torch.randn(HV, device="cuda", generator=gen)

    def delta(q, k, v, ab):
        return gated_delta_rule_from_logits(q, k, v, ab[..., HV:], ab[..., :HV], a_log, dt_bias,
                                            use_qk_l2norm=False)[0]

    run, ref = _fwd_bwd(delta, [q, k, v, ab], 7)  # tunes fla's own candidates
    own = (list(tuner.configs), dict(tuner.cache))
    pick = next(iter(own[1].values()), own[0][0])

    def label(c):
        return f"{c.kwargs.get('BV', '')} w{c.num_warps} s{c.num_stages}".strip()

    def use(configs, cache):
        def go():
            tuner.configs, tuner.cache = configs, cache
            return run()
        return go

    fns, errs = {f"fla {label(pick)}": use(*own)}, {f"fla {label(pick)}": 0.0}
    for kw, nw, ns in extra:
        c = triton.Config(kw, num_warps=nw, num_stages=ns)
        try:
            grads = use([c], {})()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - out of shared memory and the like: this config only
            print(json.dumps({"kernel": name, "config": label(c), "error": f"{type(exc).__name__}: {exc}"[:200]}),
                  flush=True)
            continue
        fns[label(c)] = use([c], {})
        errs[label(c)] = max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
                             for a, b in zip(grads, ref))
    for config, ms in _ab(fns, graph=True).items():
        print(json.dumps({"kernel": name, "config": config, "us": ms * 1e3, "grad_rel_err": errs[config]}), flush=True)


def lab_bwd_configs(out: dict) -> None:
    res = {}
    for name in _BWD_KERNELS:
        res[name] = _child("--bwd-child", name, timeout=240)
        for r in res[name]["runs"]:
            what = r.get("error") or f"{r['us']:8.1f} us  grad rel err {r['grad_rel_err']:.1e}"
            print(f"bwd_configs {name:7s} {r['config']:12s} {what}")
        if res[name]["rc"]:
            print(f"bwd_configs {name} exit {res[name]['rc']}: {' | '.join(res[name]['err'])[:300]}")
    out["bwd_configs"] = {"clock": _clock(), "shape": "8x512 2b", "kernels": res}


def lab_kkt_configs(out: dict) -> None:
    """fla's kkt_solve kernel (the delta rule's intra-chunk solve) at each of fla's six candidate
    configs, at the fused path's shapes (2b and 4b heads). fla's autotuner keys it by head counts
    and sizes only, so whichever shape launches it first picks the config for every later one."""
    import torch
    import triton

    from dohnuts.ops._fla import fla

    f = fla()
    fn = f.chunk_gated_delta_rule_fwd_kkt_solve_kernel
    while not isinstance(fn, triton.runtime.JITFunction):
        fn = fn.fn
    res = {}
    for N, T, H, HV in ((32, 512, 16, 16), (8, 512, 16, 16), (32, 64, 16, 16), (8, 256, 16, 16),
                        (32, 512, 16, 32), (8, 512, 16, 32), (32, 64, 16, 32)):
        _, k, _, g, beta, _, _, _ = _delta_inputs(f, N, T, None, H, 128, HV)
        A = torch.zeros(N, T, HV, 64, device="cuda", dtype=k.dtype)

        def launch(bk, nw, k=k, g=g, beta=beta, A=A, T=T, H=H, HV=HV, N=N):
            fn[(triton.cdiv(T, 64), N * HV)](k=k, g=g, beta=beta, A=A, cu_seqlens=None, chunk_indices=None, T=T,
                                              H=H, HV=HV, K=128, BT=64, BC=16, BK=bk, USE_G=True, IS_VARLEN=False,
                                              num_warps=nw)
            return A

        ref = launch(64, 1).clone()
        fns = {f"BK{bk} w{nw}": functools.partial(launch, bk, nw) for bk in (32, 64) for nw in (1, 2, 4)}
        err = {name: float((fn_().float() - ref.float()).nan_to_num().abs().max()) for name, fn_ in fns.items()}
        ms = _ab(fns, graph=True)
        key = f"{N}x{T} H{H} HV{HV}"
        res[key] = {"us": {k_: v * 1e3 for k_, v in ms.items()}, "max_abs_diff": err}
        print(f"kkt_configs {key:18s} " + "  ".join(f"{k_} {v * 1e3:7.1f}" for k_, v in ms.items()))
    out["kkt_configs"] = {"clock": _clock(), "shapes": res}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="kernel_lab.json")
    p.add_argument("--only", default="delta_ho,conv_parts")
    p.add_argument("--config-child", help=argparse.SUPPRESS)  # delta_configs' per-config process
    p.add_argument("--bwd-child", help=argparse.SUPPRESS)  # bwd_configs' per-kernel process
    a = p.parse_args(argv)
    if a.config_child:
        _config_child(a.config_child)
        return 0
    if a.bwd_child:
        _bwd_child(a.bwd_child)
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
