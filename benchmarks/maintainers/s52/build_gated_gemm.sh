#!/usr/bin/env bash
# Scratch (session 52): build .gl/libgated_gemm.so from s52/gated_gemm.cu on the CPU machine (nvcc 13.0
# is there; no GPU needed), against CUTLASS's headers at $CUTLASS (a checkout of NVIDIA/cutlass at
# 7107b0553 or later: its include/, tools/util/include and examples/113_hopper_gemm_activation_fusion).
# 92 s on the 2-core machine (six variants); the library links cudart statically (needs GLIBC 2.34).
set -euo pipefail
CUTLASS=${CUTLASS:?the path of a NVIDIA/cutlass checkout}
mkdir -p .gl
nvcc -std=c++17 -O3 -DNDEBUG -Xcompiler -fPIC -shared -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
  -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include" -I"$CUTLASS/examples/113_hopper_gemm_activation_fusion" \
  -o .gl/libgated_gemm.so benchmarks/maintainers/s52/gated_gemm.cu
ls -la .gl/libgated_gemm.so
