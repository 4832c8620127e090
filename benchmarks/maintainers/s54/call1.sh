#!/usr/bin/env bash
# Session 54, call 1 (scratch): on an H200, the tuned table's remake from an empty Triton cache — the
# standard suite and text-4b with the compiled-kernel list recorded, the GPU tests, then the table made from the cache;
# on any other card, the early-tower A/B (s53) and then the standard suite, the first live pick of
# hwspecs/h100.yaml by the device's name.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 BUDGET=575 \
    bash benchmarks/maintainers/gpu_session.sh
else
  OUT=$OUT/early TOTAL=200 CALLS=150 bash benchmarks/maintainers/s53/call_early.sh
  WORKLOADS='workloads/*.yaml' BUDGET=$((575 - ($(date +%s) - START))) bash benchmarks/maintainers/gpu_session.sh
fi
echo "call done at $(($(date +%s) - START)) s"
