#!/usr/bin/env bash
# Session 41, call 2 (any GPU; on an H200 the table's remake comes first, as call 1's): the GPU
# tests on the adapted groups' one GEMM over a widened input, then its train-step A/B
# (lora_wide_ab.py).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  WORKLOADS='workloads/*.yaml workloads/gpu/text-4b.yaml' TESTS=all TEST_WORKERS=8 TUNE_TABLE=1 COMPILED_TABLE=1 \
    BUDGET=400 bash benchmarks/maintainers/gpu_session.sh
else
  TESTS=all TEST_WORKERS=8 BUDGET=300 bash benchmarks/maintainers/gpu_session.sh
fi
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=$PWD/.triton_cache
timeout 240 python3 benchmarks/maintainers/s41/lora_wide_ab.py "$OUT/lora_wide_ab.json" 2>&1 | tail -15
