#!/usr/bin/env bash
# Session 36's third call (scratch; main, .whl carried). On a fresh H200: the standard suite from an
# empty cache with its kernels recorded, the GPU tests, the table remade from that cache (the shared
# conv's entries; issue 45's accounting), then the conv's bandwidth on the H200. On an H100: the host
# preparation of a single call profiled on a GPU host (shared-prefix-2b, image-cache-warm-2b).
OUT=${OUT:-/tmp/out}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 LAB=conv_bandwidth BUDGET=400 \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -45
else
  HOSTPROF='workloads/gpu/shared-prefix-2b.yaml workloads/gpu/image-cache-warm-2b.yaml' BUDGET=150 \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\s*$' | tail -120
fi
