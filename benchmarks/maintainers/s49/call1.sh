#!/usr/bin/env bash
# Session 49, call 1 (asked as nvidia-h200), main at 1b0edfd: on an H200 the table remade from an
# empty cache (as s48/call4.sh: the suite and text-4b with their kernels recorded, the GPU tests, the
# tuned and compiled tables); on any other card the standard suite on main's final code (both of
# M61's levers) then the GPU tests whole.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=540 bash benchmarks/maintainers/gpu_session.sh
else
  WORKLOADS='workloads/*.yaml' TESTS=all TEST_WORKERS=8 BUDGET=470 bash benchmarks/maintainers/gpu_session.sh
fi
