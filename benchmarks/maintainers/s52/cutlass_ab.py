"""Session 52 (scratch, branch cutlass-gated-s52): whole prediction calls with the MLP's gate/up
GEMM and SwiGLU as CUTLASS's gated-SiLU Hopper GEMM (`.gl/libgated_gemm.so`, one variant) against
main's (cuBLAS's GEMM, then `swiglu_packed`): `ops.linear_swiglu` patched in each of two 2b sessions
of one seed before it captures its CUDA graphs, the sessions taking turns call by call (as
`s51/mlp_ab.py`). Where the CUTLASS form cannot take a call (spare columns, a dtype other than BF16)
it falls back to main's, and the count says so. CUTLASS reads a copy of each packed weight with
its halves swapped, made once (prediction's weights do not change). Walls, stages, the scores' largest difference.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s52/cutlass_ab.py OUT.json VARIANT WORKLOAD.yaml ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s51"))

import gated_lab  # noqa: E402
import mlp_ab  # noqa: E402

FALLBACKS = {"calls": 0, "fallbacks": 0}


def cutlass_op(variant: int):
    lib = gated_lab.load()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    zeros: dict[tuple, torch.Tensor] = {}
    workspaces: dict[tuple, tuple[torch.Tensor, int]] = {}
    swapped: dict[int, torch.Tensor] = {}  # the packed weight as [W_u; W_g] (gated_lab.py says why), once a weight

    def op(x, weight, spare=0):
        FALLBACKS["calls"] += 1
        if spare or x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or not x.is_cuda:
            FALLBACKS["fallbacks"] += 1
            return mlp_ab.unfused(x, weight, spare)
        K = x.shape[-1]
        m2 = weight.shape[0]
        x2 = x.reshape(-1, K).contiguous()
        if weight.data_ptr() not in swapped:
            half = m2 // 2
            swapped[weight.data_ptr()] = torch.cat([weight[half:], weight[:half]]).contiguous()
        w = swapped[weight.data_ptr()]
        h = torch.empty(*x.shape[:-1], m2 // 2, dtype=x.dtype, device=x.device)
        if x2.shape[0] == 0:
            return h
        key = (m2, x.device)
        if key not in zeros:
            zeros[key] = torch.zeros(m2, dtype=x.dtype, device=x.device)
        wkey = (m2, x2.shape[0], K, x.device)
        if wkey not in workspaces:  # the size CUTLASS asks for (0 for these schedulers, but asked)
            size = lib.gated_gemm_workspace(variant, m2, x2.shape[0], K, sms)
            workspaces[wkey] = (torch.empty(max(size, 1), dtype=torch.uint8, device=x.device), size)
        ws, size = workspaces[wkey]
        rc = lib.gated_gemm_run(variant, w.data_ptr(), x2.data_ptr(), zeros[key].data_ptr(), h.data_ptr(), m2,
                                x2.shape[0], K, sms, ws.data_ptr(), size, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"CUTLASS variant {variant}: status {rc}")
        return h
    return op


def main(path, variant, workloads):
    out = {"variant": variant, "name": gated_lab.load().gated_gemm_name(variant).decode()}
    op = cutlass_op(variant)
    from dohnuts import ops

    for w in workloads:
        n = 30 if "4b" in w else 60 if "text" in w else 150
        ops.linear_swiglu = op  # mlp_ab.one takes the patched op as its "fused" variant
        out[w] = mlp_ab.one(w, n)
        out[w]["fallbacks"] = dict(FALLBACKS)
        v = out[w]["variants"]
        print(w, {n_: (v[n_]["wall_ms"]["median"], (v[n_].get("forward") or v[n_].get("shared") or {}).get("median"))
                  for n_ in v}, "scores diff", out[w]["scores_max_abs_diff"], FALLBACKS, flush=True)
        json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
