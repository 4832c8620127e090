#!/usr/bin/env bash
# Session 49, call 6 (asked as nvidia-h200), main: on an H200 the tuned table remade from an empty
# cache (the suite and text-4b with their kernels recorded, then the tuned and compiled tables; no GPU
# tests: the session's device time left, 590 s, does not hold s48/call4.sh's 540-s budget); on any
# other card nothing.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=400 bash benchmarks/maintainers/gpu_session.sh
else
  echo "not an H200: nothing to run"
fi
