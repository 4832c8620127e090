#!/usr/bin/env bash
# Session 43 (from s40), call A. On an H200 (none lent since session 31): the
# table remade from an empty cache — the suite and text-4b with their kernels recorded
# (COMPILED_TABLE), the GPU tests after them, the tuned table from the cache (TUNE_TABLE). On an
# H100: nothing.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=560 bash benchmarks/maintainers/gpu_session.sh
else
  echo "not an H200: nothing to run (an H100 gets nothing)"
fi
