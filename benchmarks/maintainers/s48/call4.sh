#!/usr/bin/env bash
# Session 48, call 4 (asked as nvidia-h200), main's code: on an H200 the table remade from an empty
# cache as s40/call_a.sh did (the suite and text-4b with their kernels recorded, the GPU tests, the
# tuned table from the cache); on an H100 nothing.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=540 bash benchmarks/maintainers/gpu_session.sh
else
  echo "not an H200: nothing to run"
fi
