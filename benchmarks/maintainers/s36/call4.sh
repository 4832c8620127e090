#!/usr/bin/env bash
# Session 36's fourth call (scratch; main, .whl carried). On a fresh H200: the standard suite from an
# empty cache with its kernels recorded, the GPU tests, the table remade (the shared conv's entries).
# On an H100: the GPU tests, then shared-prefix-2b and image-cache-warm-2b profiled (the
# zero fill of A and the conv weight's copy gone; the reference check beside).
OUT=${OUT:-/tmp/out}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 BUDGET=330 \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | tail -45
else
  TESTS=all TEST_WORKERS=8 PROFILE_RUN=1 BUDGET=280 \
    WORKLOADS='workloads/gpu/shared-prefix-2b.yaml workloads/gpu/image-cache-warm-2b.yaml' \
    bash benchmarks/maintainers/gpu_session.sh 2>&1 | grep -v '^\[gpu test\] passed' | grep -E '^==|passed|failed|FAILED|ms$|agrees|differs' | head -80
fi
