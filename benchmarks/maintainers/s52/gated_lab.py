"""Session 52 lab (scratch, branch cutlass-gated-s52): CUTLASS 4.6's Hopper GEMM with a gated SiLU
epilogue (`.gl/libgated_gemm.so`, built by `s52/build_gated_gemm.sh` from `s52/gated_gemm.cu`:
examples/113's kernel in BF16 in six tile, cluster and schedule variants) against main's
path — cuBLAS's x · [W_g; W_u]ᵀ then `swiglu_packed` — and the branch linear-swiglu-s51's Triton
kernel. Per shape: each form's largest error against FP32 (silu(x W_gᵀ) · (x W_uᵀ) in FP32), then
the medians of seven interleaved rounds of 20 launches each (CUDA events); a variant CUTLASS
cannot implement at a shape is recorded as failed there. The packed weight is
handed to CUTLASS as [W_u; W_g]: the example's K-major gated stride reads the two halves, and
its reference applies the activation to the second (each form's error against the other pairing is
kept too, `errors_other_half`, in case that reading is wrong).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s52/gated_lab.py OUT.json
"""

from __future__ import annotations

import ctypes
import json
import statistics
import sys
from pathlib import Path

import torch

SHAPES = {"2b-text": (16384, 2048, 6144), "2b-suffixes": (2048, 2048, 6144), "2b-prefix": (448, 2048, 6144),
          "4b-text": (16384, 2560, 9216), "2b-odd-rows": (1000, 2048, 6144)}


def load():
    lib = ctypes.CDLL(str(Path(".gl/libgated_gemm.so").resolve()))
    vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.gated_gemm_run.argtypes = [i, vp, vp, vp, vp, i, i, i, i, vp, sz, vp]
    lib.gated_gemm_run.restype = i
    lib.gated_gemm_workspace.argtypes = [i, i, i, i, i]
    lib.gated_gemm_workspace.restype = sz
    lib.gated_gemm_name.argtypes = [i]
    lib.gated_gemm_name.restype = ctypes.c_char_p
    return lib


def variants(lib) -> dict[str, int]:
    return {lib.gated_gemm_name(v).decode(): v for v in range(lib.gated_gemm_variants())}


def cutlass_form(lib, v, x, w, bias, h, sms):
    n, k = x.shape
    m2 = w.shape[0]
    size = lib.gated_gemm_workspace(v, m2, n, k, sms)
    ws = torch.empty(max(size, 1), dtype=torch.uint8, device=x.device)

    def call():
        rc = lib.gated_gemm_run(v, w.data_ptr(), x.data_ptr(), bias.data_ptr(), h.data_ptr(), m2, n, k, sms,
                                ws.data_ptr(), size, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"variant {v}: status {rc}")
        return h
    return call


def time_ms(fn, n=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


def main(out_path):
    from dohnuts.ops._swiglu_kernel import swiglu_packed_fn

    lib = load()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for label, (M, K, I) in SHAPES.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2 * I, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        bias = torch.zeros(2 * I, device="cuda", dtype=torch.bfloat16)
        g32, u32 = x.float() @ w[:I].float().T, x.float() @ w[I:].float().T
        ref = torch.nn.functional.silu(g32) * u32
        ref_other = torch.nn.functional.silu(u32) * g32  # the activation on the other half
        del g32, u32
        # The example's reference (activation_kernel.cuh) applies the activation to the second half of
        # each output column's 2I values and multiplies by the first: CUTLASS is handed [W_u; W_g].
        w_cutlass = torch.cat([w[I:], w[:I]]).contiguous()
        forms = {"main": lambda: swiglu_packed_fn(torch.nn.functional.linear(x, w), 0),  # noqa: E731
                 "gemm_only": lambda: torch.nn.functional.linear(x, w)}  # noqa: E731
        for name, v in variants(lib).items():
            forms[f"cutlass {name}"] = cutlass_form(lib, v, x, w_cutlass, bias, torch.empty(M, I, device="cuda",
                                                                                           dtype=torch.bfloat16), sms)
        try:
            from dohnuts.ops._linear_swiglu_kernel import linear_swiglu_triton  # the branch linear-swiglu-s51

            forms["triton_s51"] = lambda: linear_swiglu_triton(x, w)  # noqa: E731
        except ImportError:
            pass
        row = {"M": M, "K": K, "I": I, "errors": {}, "errors_other_half": {}, "failed": {}}
        for name, fn in list(forms.items()):
            if name == "gemm_only":
                continue
            try:
                got = fn()
                torch.cuda.synchronize()
                row["errors"][name] = (got.float() - ref).abs().max().item()
                row["errors_other_half"][name] = (got.float() - ref_other).abs().max().item()
            except Exception as exc:  # noqa: BLE001 - a lab: record and go on
                row["failed"][name] = str(exc)[:200]
                forms.pop(name)
        rounds = {k: [] for k in forms}
        for _ in range(7):
            for name, fn in forms.items():
                fn()
                rounds[name].append(time_ms(fn))
        row["medians_ms"] = {k: round(statistics.median(v), 4) for k, v in rounds.items()}
        row["rounds_ms"] = {k: [round(t, 4) for t in v] for k, v in rounds.items()}
        report["shapes"][label] = row
        print(label, json.dumps(row["medians_ms"]), "errors", {k: f"{v:.3g}" for k, v in row["errors"].items()},
              row["failed"] or "", flush=True)
        forms.clear()
        del ref, ref_other, w_cutlass
        torch.cuda.empty_cache()
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
